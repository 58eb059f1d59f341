"""A plan's result for people and programs: the console text (:func:`format_plan`) and the files
(:func:`write_plan`: plan.json and plan.csv).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic
from servesim.studies.plan.results import CandidateResult, PlanResult
from servesim.studies.plan.spec import CSV_COLUMNS, SHORT_SPAN_S

_OBJECTIVE_TEXT = {
    "cost": "cost per hour, lowest first",
    "throughput_per_gpu": "output tokens/s per GPU, highest first",
    "goodput": "goodput (requests/s within SLO), highest first",
    "cost_per_million_tokens": "USD per million output tokens, lowest first",
    "ttft_p99_ms": "TTFT p99, lowest first",
    "tpot_p99_ms": "TPOT p99, lowest first",
    "itl_p99_ms": "ITL p99, lowest first",
    "e2e_p99_ms": "E2E p99, lowest first",
    "fitness": "fitness (the plan's weighted score), highest first",
    "energy_per_million_tokens": "kWh per million output tokens at the plan's power, lowest first",
}


def _slo_text(slo: Mapping[str, Mapping[str, int]]) -> str:
    parts = []
    for cls, t in slo.items():
        limits = [
            f"{dim} ≤ {_duration(t[f'{dim}_us'])}"
            for dim in ("ttft", "itl", "e2e")
            if t[f"{dim}_us"]
        ]
        parts.append(f"{cls} {', '.join(limits)}")
    return "; ".join(parts)


def _duration(us: int) -> str:
    if us >= 1_000_000 and us % 1_000_000 == 0:
        return f"{us // 1_000_000} s"
    return f"{us / 1000:g} ms"


def _workload_text(w: Mapping[str, Any]) -> str:
    kind = w.get("kind", "workload")
    if kind == "synthetic":
        arrival = (w.get("arrival") or {}).get("process", "")
        return f"{w.get('preset') or 'synthetic'} at {w.get('rate', 0):g} req/s ({arrival})"
    return str(kind)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _column(plan: Any) -> str:
    """The header of the objective's own column, for objectives the table has none for."""
    if plan.metric is not None:
        return str(plan.objective)
    return "kWh/M tok" if plan.objective == "energy_per_million_tokens" else ""


def _value(r: CandidateResult, plan: Any) -> float | None:
    if plan.metric is not None:
        return r.objective_value
    return r.energy_per_million_tokens


def _objective_text(plan: Any) -> str:
    if plan.metric is not None:
        return f"summary field {plan.metric[0]}, {plan.metric[1]} first"
    return _OBJECTIVE_TEXT[plan.objective]


def _space_text(plan: Any) -> str:
    """``3 GPU × 2 tp × 2 max_num_seqs × 2 routing``, with the other fields the plan lists."""
    from servesim.studies.plan.space import dimension_sizes

    names = {"gpu": "GPU", "max_num_batched_tokens": "max_num_batched_tokens"}
    always = ("gpu", "tp", "max_num_seqs", "routing")
    return " × ".join(
        f"{n} {names.get(field, field)}"
        for field, n in dimension_sizes(plan)
        if field in always or field in plan.space.shown
    )


def _extra_header(shown: frozenset[str]) -> tuple[str, str]:
    """The table's headers for the searched pp and ep (after tp) and max_num_batched_tokens
    (after seqs)."""
    return (
        (f" {'pp':>2}" if "pp" in shown else "") + (f" {'ep':>2}" if "ep" in shown else ""),
        f" {'mbt':>6}" if "max_num_batched_tokens" in shown else "",
    )


def _extra_cells(r: CandidateResult, shown: frozenset[str]) -> tuple[str, str]:
    return (
        (f" {r.pp:>2}" if "pp" in shown else "") + (f" {r.ep:>2}" if "ep" in shown else ""),
        f" {r.max_num_batched_tokens:>6}" if "max_num_batched_tokens" in shown else "",
    )


def format_plan(result: PlanResult) -> str:
    """The console report: header, ranked table, Pareto front, rejected candidates."""
    plan = result.plan
    shown = plan.space.shown
    lines = [
        f"plan {plan.name}: {plan.model.name}, {_workload_text(plan.workload)}, "
        f"{plan.requests if plan.requests is not None else 'all the'} requests per simulation, "
        f"seed {plan.seed}",
        f"SLO: {_slo_text(plan.slo)}; required attainment {plan.attainment:.0%} per class",
        "cost per GPU-hour (USD): "
        + ", ".join(f"{g.name} {g.usd_per_gpu_hour:.2f} ({g.cost_source})" for g in plan.gpus),
        *(
            [
                "power per GPU (W, the plan's): "
                + ", ".join(f"{g} {w:g}" for g, w in plan.power.items())
            ]
            if plan.power
            else []
        ),
        f"searched {plan.candidate_count} candidates ({_space_text(plan)}), instances "
        f"{plan.instances_min}-{plan.instances_max}"
        + (f", budget ${plan.budget:.2f}/hour" if plan.budget is not None else "")
        + f": {len(result.ranked)} feasible, "
        f"{len(result.rejected)} rejected; {result.simulations} simulations "
        f"({result.simulated_requests:,} requests, {result.cache_hits} cache hits) in "
        f"{result.wall_s:.1f} s wall ({result.simulated_requests / max(result.wall_s, 1e-9):,.0f} "
        "requests/s)",
    ]
    span = result.arrival_span_s
    if span is not None and span < SHORT_SPAN_S:
        lines.append(
            f"note: the simulated requests arrive over {span:.0f} s only; a fleet slightly too "
            "small shows once its queue has had time to grow, so check the answer with more "
            "requests (--requests)"
        )
    lines.append("")
    ranked = result.ranked
    if ranked:
        lines.append(f"ranked by {plan.objective} ({_objective_text(plan)}):")
        layout, batched = _extra_header(shown)
        header = (
            f"{'rank':>4}  {'gpu':<12} {'tp':>2}{layout} {'seqs':>5}{batched}  "
            f"{'routing':<14} " + (f"{'pd':<5} " if "pd" in shown else "") + f"{'latency':<15} "
            f"{'inst':>4} {'GPUs':>4} {'$/hour':>8} {'tok/s/GPU':>9} {'goodput':>8} "
            f"{'attain':>7} {'TTFT p99':>9} {'TPOT p99':>9} {'ITL p99':>8}"
            + (f" {_column(plan):>12}" if _column(plan) else "")
        )
        lines.append(header)
        for r in ranked:
            layout, batched = _extra_cells(r, shown)
            lines.append(
                f"{r.rank:>4}  {r.gpu:<12} {r.tp:>2}{layout} "
                f"{r.max_num_seqs:>5}{batched}  {r.routing:<14} "
                + (f"{r.pd:<5} " if "pd" in shown else "")
                + f"{r.latency_model or '-':<15} {r.instances:>4} {r.gpus:>4} "
                f"{_fmt(r.cost_per_hour, '.2f'):>8} {_fmt(r.throughput_per_gpu, '.0f'):>9} "
                f"{_fmt(r.goodput_rps, '.2f'):>8} {_fmt(r.attainment, '.1%'):>7} "
                f"{_fmt(r.ttft_p99_ms, '.0f'):>9} {_fmt(r.tpot_p99_ms, '.1f'):>9} "
                f"{_fmt(r.itl_p99_ms, '.1f'):>8}"
                + (f" {_fmt(_value(r, plan), '.4g'):>12}" if _column(plan) else "")
                + ("  *" if r.pareto else "")
            )
        lines.append(
            "  * on the Pareto front. goodput: requests/s within SLO at the offered "
            f"{ranked[0].offered_rps:.2f} req/s; tok/s/GPU: output tokens/s per GPU at that load;"
        )
        lines.append(
            "  latencies in ms; TPOT p99: of each request's mean inter-token time (what an itl "
            "target judges); ITL p99: of every gap"
        )
        lines.append("")
        lines.append("Pareto front over cost per hour (lower) and goodput (higher):")
        front: dict[tuple, list[CandidateResult]] = {}
        for r in result.pareto:  # one line for the fleets that differ only in seqs or routing
            key = (r.cost_per_hour, r.goodput_rps, r.instances, r.gpu, r.tp, r.pp, r.ep, r.pd)
            front.setdefault(key, []).append(r)
        for (cost, goodput, instances, gpu, tp, *_), members in front.items():
            seqs = "/".join(str(s) for s in sorted({m.max_num_seqs for m in members}))
            routings = "/".join(dict.fromkeys(m.routing for m in members))
            lines.append(
                f"  ${cost:.2f}/hour  goodput {goodput:.2f} req/s  {instances} × {gpu} "
                f"tp{tp}{_layout(members[0], shown)}, max_num_seqs {seqs}"
                + _batched(members, shown)
                + f", {routings}"
            )
        best = ranked[0]
        lines.append("")
        lines.append(
            f"best by {plan.objective}: {best.instances} × {best.gpu} (tp {best.tp}"
            + "".join(f", {k} {getattr(best, k)}" for k in ("pp", "ep") if k in shown)
            + ", "
            f"{best.gpus} GPU{'' if best.gpus == 1 else 's'}), max_num_seqs {best.max_num_seqs}"
            + _batched([best], shown)
            + f", routing {best.routing}"
            + (f", pd {best.pd}" if "pd" in shown else "")
            + ": "
            f"${best.cost_per_hour:.2f}/hour, attainment {best.attainment:.1%}"
            + (f", fitness {best.fitness:.3f}" if best.fitness is not None else "")
            + _below(best, plan.instances_min)
        )
    else:
        lines.append("no candidate meets the SLO: see the reasons below")
    if result.rejected:
        lines.append("")
        lines.append("rejected:")
        groups: dict[tuple, list[CandidateResult]] = {}
        for r in result.rejected:  # one line for the candidates one reason rejects alike
            groups.setdefault((r.gpu, r.tp, r.pp, r.ep, r.reason), []).append(r)
        for (gpu, tp, _, _, reason), members in groups.items():
            if len(members) == 1:
                lines.append(f"  {members[0].label}: {reason}")
                continue
            lines.append(
                f"  {gpu} tp{tp}{_layout(members[0], shown)} ({_members(members, shown)}): {reason}"
            )
    return "\n".join(lines)


def _layout(r: CandidateResult, shown: frozenset[str]) -> str:
    """`` pp2 ep4``: the searched parallel fields of ``r`` ('' when the plan lists none)."""
    return (f" pp{r.pp}" if "pp" in shown else "") + (f" ep{r.ep}" if "ep" in shown else "")


def _batched(members: list[CandidateResult], shown: frozenset[str]) -> str:
    if "max_num_batched_tokens" not in shown:
        return ""
    values = sorted({m.max_num_batched_tokens or 0 for m in members})
    return f", max_num_batched_tokens {'/'.join(str(v) for v in values)}"


def _members(members: list[CandidateResult], shown: frozenset[str]) -> str:
    """``seqs 64/256, least-loaded/round-robin``: what the candidates of one rejection line
    differ in (with ``mbt`` and ``pd`` when the plan searches them)."""
    parts = ["seqs " + "/".join(str(s) for s in sorted({m.max_num_seqs for m in members}))]
    if "max_num_batched_tokens" in shown:
        parts.append(_batched(members, shown)[2:].replace("max_num_batched_tokens", "mbt"))
    parts.append("/".join(dict.fromkeys(m.routing for m in members)))
    if "pd" in shown:
        parts.append("pd " + "/".join(dict.fromkeys(str(m.pd) for m in members)))
    return ", ".join(parts)


def _below(r: CandidateResult, minimum: int) -> str:
    """What the largest simulated count below the answer reached (with a PD split the counts
    step by whole units)."""
    below = [(n, a) for n, a, _ in r.evaluated if n < (r.instances or 0)]
    if below:
        n, attainment = max(below)
        return f" ({n} instance(s) reach {attainment:.1%})"
    return f" ({minimum} is the search's minimum count)"


def _csv_text(result: PlanResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in result.candidates:
        d = c.to_dict()
        row = []
        for column in CSV_COLUMNS:
            value = d.get(column)
            if isinstance(value, float):
                value = f"{value:.6g}"
            elif isinstance(value, bool):
                value = int(value)
            row.append("" if value is None else value)
        writer.writerow(row)
    return buffer.getvalue()


def write_plan(result: PlanResult, out_dir: str | Path) -> list[Path]:
    """Write ``plan.json`` (everything) and ``plan.csv`` (one row per candidate), each
    atomically (a temporary file renamed into place); returns the paths."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError("--out", str(out_dir), f"cannot create the directory ({exc})") from None
    if not out.is_dir():
        raise ScenarioError("--out", str(out_dir), "is not a directory")
    json_path, csv_path = out / "plan.json", out / "plan.csv"
    text = json.dumps(_finite(result.to_dict()), indent=2, sort_keys=False) + "\n"
    write_atomic(json_path, text)
    write_atomic(csv_path, _csv_text(result))
    return [json_path, csv_path]


def _finite(value: Any) -> Any:
    """NaN and infinities as null, so plan.json is strict JSON."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
