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


def format_plan(result: PlanResult) -> str:
    """The console report: header, ranked table, Pareto front, rejected candidates."""
    plan = result.plan
    lines = [
        f"plan {plan.name}: {plan.model.name}, {_workload_text(plan.workload)}, "
        f"{plan.requests if plan.requests is not None else 'all the'} requests per simulation, "
        f"seed {plan.seed}",
        f"SLO: {_slo_text(plan.slo)}; required attainment {plan.attainment:.0%} per class",
        "cost per GPU-hour (USD): "
        + ", ".join(f"{g.name} {g.usd_per_gpu_hour:.2f} ({g.cost_source})" for g in plan.gpus),
        f"searched {plan.candidate_count} candidates ({len(plan.gpus)} GPU × {len(plan.tps)} tp × "
        f"{len(plan.max_num_seqs)} max_num_seqs × {len(plan.routings)} routing), instances "
        f"{plan.instances_min}-{plan.instances_max}: {len(result.ranked)} feasible, "
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
        lines.append(f"ranked by {plan.objective} ({_OBJECTIVE_TEXT[plan.objective]}):")
        header = (
            f"{'rank':>4}  {'gpu':<12} {'tp':>2} {'seqs':>5}  {'routing':<14} {'latency':<15} "
            f"{'inst':>4} {'GPUs':>4} {'$/hour':>8} {'tok/s/GPU':>9} {'goodput':>8} "
            f"{'attain':>7} {'TTFT p99':>9} {'TPOT p99':>9} {'ITL p99':>8}"
        )
        lines.append(header)
        for r in ranked:
            lines.append(
                f"{r.rank:>4}  {r.gpu:<12} {r.tp:>2} {r.max_num_seqs:>5}  {r.routing:<14} "
                f"{r.latency_model or '-':<15} {r.instances:>4} {r.gpus:>4} "
                f"{_fmt(r.cost_per_hour, '.2f'):>8} {_fmt(r.throughput_per_gpu, '.0f'):>9} "
                f"{_fmt(r.goodput_rps, '.2f'):>8} {_fmt(r.attainment, '.1%'):>7} "
                f"{_fmt(r.ttft_p99_ms, '.0f'):>9} {_fmt(r.tpot_p99_ms, '.1f'):>9} "
                f"{_fmt(r.itl_p99_ms, '.1f'):>8}" + ("  *" if r.pareto else "")
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
            key = (r.cost_per_hour, r.goodput_rps, r.instances, r.gpu, r.tp)
            front.setdefault(key, []).append(r)
        for (cost, goodput, instances, gpu, tp), members in front.items():
            seqs = "/".join(str(s) for s in sorted({m.max_num_seqs for m in members}))
            routings = "/".join(dict.fromkeys(m.routing for m in members))
            lines.append(
                f"  ${cost:.2f}/hour  goodput {goodput:.2f} req/s  {instances} × {gpu} tp{tp}, "
                f"max_num_seqs {seqs}, {routings}"
            )
        best = ranked[0]
        lines.append("")
        lines.append(
            f"best by {plan.objective}: {best.instances} × {best.gpu} (tp {best.tp}, "
            f"{best.gpus} GPU{'' if best.gpus == 1 else 's'}), max_num_seqs {best.max_num_seqs}, "
            f"routing {best.routing}: "
            f"${best.cost_per_hour:.2f}/hour, attainment {best.attainment:.1%}"
            + (f", fitness {best.fitness:.3f}" if best.fitness is not None else "")
            + _below(best, plan.instances_min)
        )
    else:
        lines.append("no candidate meets the SLO: see the reasons below")
    if result.rejected:
        lines.append("")
        lines.append("rejected:")
        groups: dict[tuple[str, int, str], list[CandidateResult]] = {}
        for r in result.rejected:  # one line for the candidates one reason rejects alike
            groups.setdefault((r.gpu, r.tp, r.reason), []).append(r)
        for (gpu, tp, reason), members in groups.items():
            if len(members) == 1:
                lines.append(f"  {members[0].label}: {reason}")
                continue
            seq_list = "/".join(str(s) for s in sorted({m.max_num_seqs for m in members}))
            routing_list = "/".join(dict.fromkeys(m.routing for m in members))
            lines.append(f"  {gpu} tp{tp} (seqs {seq_list}, {routing_list}): {reason}")
    return "\n".join(lines)


def _below(r: CandidateResult, minimum: int) -> str:
    """What the count below the answer reached (it was simulated to check the answer)."""
    for n, attainment, _ in r.evaluated:
        if n == (r.instances or 0) - 1:
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
