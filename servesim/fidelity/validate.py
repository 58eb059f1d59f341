"""``servesim validate MEASURED``: replay a measured run and report simulated vs measured.

The run's exact arrivals and token counts are replayed with its server settings (read from the
run's own metadata; flags override them); the report puts the mean/p50/p90/p99 of TTFT, TPOT and
E2E and the throughput side by side, says which latency model and coefficients priced the steps
and which settings were assumed, and is written as ``validation.json`` (plus ``validation.png``,
the predicted and measured CDFs, when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from servesim.fidelity.readers import read_measured
from servesim.fidelity.readers.common import MeasuredRun
from servesim.fidelity.replay import STATS, compare, load_replay, simulated_metrics
from servesim.simcore.commands import Command, given_options
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic


def validate(
    run: MeasuredRun,
    *,
    overrides: dict[str, Any] | None = None,
    latency: str | None = None,
    overheads: tuple[float, float] | str | Path | None = None,
) -> dict[str, Any]:
    """Replay ``run`` and compare. ``latency`` names the latency model; by default the first of
    blackbox (fitted coefficients for the model, GPU and TP), trained-physics and roofline that
    accepts the run's model and GPU. ``overheads``: calibrated (first-token µs, per-step µs), or
    an overheads file, added on top (:func:`~servesim.fidelity.replay.load_replay`)."""
    from servesim.run import simulate

    overrides = dict(overrides or {})
    with tempfile.TemporaryDirectory(prefix="servesim-validate-") as tmp:
        trace = run.write_trace_csv(Path(tmp) / "trace.csv")
        scenario, assumed = load_replay(
            run, trace, overrides=overrides, latency=latency, overheads=overheads
        )
        results = simulate(scenario)
    simulated = simulated_metrics(results)
    simulated["itl_ms"] = _simulated_itl(results.summary)
    measured = run.metrics()
    measured["itl_ms"], itl_note = _measured_itl(run)
    duration_s = max(float(run.arrival_us.max()) / 1e6, 1e-9) if run.n else 0.0
    r = results.requests
    done = r["status"] == 0
    return {
        "run": run.name,
        "source": str(run.source),
        "system": run.system,
        "requests": int(run.n),
        "settings": run.settings(),
        "notes": list(run.notes),
        "assumed": assumed,
        "instances": [
            {
                "role": inst.role,
                "gpu": inst.gpu.name,
                "tp": inst.tp,
                "kv_blocks": inst.engine.kv_blocks,
                "kv_blocks_source": inst.engine.kv_blocks_source,
            }
            for inst in scenario.instance_specs
        ],
        "scenario": results.summary.get("scenario", {}),
        "latency_model": results.summary.get("scenario", {}).get("latency"),
        "simulated_completed": int(done.sum()),
        "throughput": {  # completed requests / (first arrival → last completion), both sides
            "measured_rps": float(run.n / _span_s(run.arrival_us, run.e2e_us))
            if duration_s
            else None,
            "simulated_rps": float(
                done.sum()
                / _span_s(r["arrival_us"][done], r["completion_us"][done] - r["arrival_us"][done])
            )
            if done.any()
            else 0.0,
        },
        "comparison": compare(measured, simulated, METRICS),
        "metric_definitions": dict(METRIC_DEFINITIONS),
        "itl_measured": itl_note,
        "_cdf": {
            "measured": {k: _values(run, k) for k in ("ttft", "tpot", "e2e")},
            "simulated": _simulated_values(results),
        },
    }


METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
METRIC_DEFINITIONS = {
    "ttft_ms": "time to first token, per request",
    "tpot_ms": "TPOT: (E2E - TTFT) / (output tokens - 1) per request, then averaged over requests",
    "itl_ms": "ITL as vLLM's benchmark reports it: every inter-token gap of every request "
    "(token-weighted)",
    "e2e_ms": "end-to-end latency, per request",
}


def _simulated_itl(summary: Any) -> dict[str, float | int | None]:
    """The simulation's ITL statistics (every inter-token gap, from the step log)."""
    out: dict[str, float | int | None] = {"n": summary.get("itl_gaps")}
    out["mean"] = summary.get("itl_mean_ms")
    for p in (50, 90, 99):
        out[f"p{p}"] = summary.get(f"itl_p{p}_ms")
    return out


def _measured_itl(run: MeasuredRun) -> tuple[dict[str, float | int | None], str]:
    """The run's ITL. Its mean over every gap is exact from first- and last-token times
    (Σ(E2E − TTFT) / Σ(output − 1)); percentiles need per-token timestamps, which no supported
    format records."""
    known = (run.ttft_us >= 0) & (run.e2e_us >= 0) & (run.output_tokens > 1)
    gaps = int((run.output_tokens[known] - 1).sum())
    stats: dict[str, float | int | None] = {"n": gaps, "mean": None, "p50": None, "p90": None,
                                            "p99": None}  # fmt: skip
    if gaps:
        span = float((run.e2e_us[known] - run.ttft_us[known]).sum())
        stats["mean"] = span / gaps / 1000.0
        note = (
            "mean only: sum(E2E - TTFT) / sum(output - 1) over requests, exact for the mean of "
            "every gap; percentiles not measured (the run has no per-token timestamps)"
        )
    else:
        note = "not measured: no request with two or more output tokens and known times"
    return stats, note


def _span_s(arrival_us: np.ndarray, e2e_us: np.ndarray) -> float:
    known = e2e_us >= 0
    end = float((arrival_us[known] + e2e_us[known]).max()) if known.any() else 0.0
    return max((end - float(arrival_us.min())) / 1e6, 1e-9)


def _values(run: MeasuredRun, key: str) -> list[float]:
    v = {"ttft": run.ttft_us, "tpot": run.tpot_us, "e2e": run.e2e_us}[key]
    v = np.asarray(v, dtype=np.float64)
    return sorted((v[v >= 0] / 1000.0).tolist())


def _simulated_values(results: Any) -> dict[str, list[float]]:
    r = results.requests
    done = r["status"] == 0
    arrival = r["arrival_us"][done]
    out = r["output_tokens"][done]
    tpot = r["itl_sum_us"][done][out > 1] / (out[out > 1] - 1)
    return {
        "ttft": sorted(((r["first_token_us"][done] - arrival) / 1000.0).tolist()),
        "tpot": sorted((tpot / 1000.0).tolist()),
        "e2e": sorted(((r["completion_us"][done] - arrival) / 1000.0).tolist()),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{report['run']} ({report['system']}, {report['requests']} requests): simulated vs measured",
        f"latency model {_latency_label(report['latency_model'])}",
    ]
    lines.append("each cell: measured / simulated (simulated / measured - 1)")
    lines.append(f"{'metric':10}" + "".join(f"{s:>26}" for s in STATS))
    for metric, label in (
        ("ttft_ms", "TTFT ms"),
        ("tpot_ms", "TPOT ms"),
        ("itl_ms", "ITL ms"),
        ("e2e_ms", "E2E ms"),
    ):
        if metric not in report["comparison"]:
            continue
        cells = []
        for stat in STATS:
            c = report["comparison"][metric][stat]
            if c["measured"] is None and c["simulated"] is not None:
                cells.append(f"{'not measured /':>15}{c['simulated']:>9.1f}  ")
            elif c["measured"] is None or c["simulated"] is None:
                cells.append(f"{'n/a':>26}")
            else:
                cells.append(
                    f"{c['measured']:>9.1f} /{c['simulated']:>9.1f} ({c['error'] * 100:+4.0f}%)"
                )
        lines.append(f"{label:10}" + "".join(cells))
    lines.append(
        "TPOT = (E2E - TTFT)/(output - 1) per request, averaged; ITL = vLLM's: every "
        "inter-token gap, token-weighted"
    )
    if report.get("itl_measured"):
        lines.append(f"measured ITL: {report['itl_measured']}")
    t = report["throughput"]
    lines.append(
        f"throughput measured {t['measured_rps']:.2f} req/s, simulated {t['simulated_rps']:.2f} "
        f"req/s ({report['simulated_completed']} of {report['requests']} completed)"
    )
    for a in report["assumed"]:
        lines.append(f"assumed    {a}")
    return "\n".join(lines)


def _latency_label(latency: Any) -> str:
    """One line: the model and where its coefficients come from (its describe() has it all)."""
    if not isinstance(latency, dict):
        return str(latency)
    name = latency.get("model") or latency.get("name") or "?"
    if name == "overheads" and isinstance(latency.get("base"), dict):
        source = (latency.get("provenance") or {}).get("file") or "scenario"
        return (
            f"overheads (first token {latency.get('first_token_us')} us, step "
            f"{latency.get('step_us')} us; from {source}) on {_latency_label(latency['base'])}"
        )
    prov = latency.get("provenance") or latency.get("source")
    parts = []
    if isinstance(prov, dict):
        for key in ("source", "file", "model", "gpu", "tp", "vllm_version", "repo"):
            if prov.get(key) is not None:
                parts.append(f"{key} {prov[key]}")
    elif prov:
        parts.append(str(prov))
    for key in ("alpha", "beta"):
        if isinstance(latency.get(key), list):
            parts.append(f"{key} [" + ", ".join(f"{v:.4g}" for v in latency[key]) + "]")
    return name + (f" ({'; '.join(parts)})" if parts else " (physics: model config + GPU table)")


def write_report(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """validation.json (and validation.png with matplotlib), written atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {k: v for k, v in report.items() if not k.startswith("_")}
    files = [
        write_atomic(out / "validation.json", json.dumps(payload, indent=2, default=str) + "\n")
    ]
    try:
        import matplotlib
    except ImportError:
        return files
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, label in zip(axes, ("ttft", "tpot", "e2e"), ("TTFT", "TPOT", "E2E")):
        for who, style in (("measured", "k-"), ("simulated", "C0--")):
            values = report["_cdf"][who][key]
            if values:
                y = np.arange(1, len(values) + 1) / len(values)
                ax.plot(values, y, style, label=who)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{label}: {report['run']}")
        ax.legend()
    fig.tight_layout()
    files.append(
        write_atomic(out / "validation.png", lambda fh: fig.savefig(fh, format="png", dpi=100))
    )
    plt.close(fig)
    return files


def _validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("measured", help="measured run: .exp file, run directory, or .csv")
    p.add_argument("--model", help="override the run's model (name or config.json)")
    p.add_argument("--gpu", help="override the run's GPU")
    p.add_argument("--tp", type=int, help="override the tensor parallelism")
    p.add_argument("--max-num-seqs", type=int, help="override the engine's max_num_seqs")
    p.add_argument("--max-num-batched-tokens", type=int, help="override the token budget")
    p.add_argument(
        "--kv-blocks",
        type=int,
        help="KV blocks per instance (both instances of a disaggregated run), replacing the "
        "run's recorded count or servesim's memory model",
    )
    p.add_argument(
        "--kv-blocks-prefill",
        type=int,
        metavar="N",
        help="disaggregated run: KV blocks of the prefill instance (replaces DistServe's "
        "profile_data/max_num_tokens.csv)",
    )
    p.add_argument(
        "--kv-blocks-decode",
        type=int,
        metavar="N",
        help="disaggregated run: KV blocks of the decode instance (replaces DistServe's "
        "profile_data/max_num_tokens.csv)",
    )
    p.add_argument(
        "--placement",
        metavar="cXYdZW",
        help="DistServe run whose file name has no placement code: prefill TP X / PP Y and "
        "decode TP Z / PP W (e.g. c21d11)",
    )
    p.add_argument(
        "--latency-model",
        help="latency model to price steps (default: the first of blackbox, trained-physics, "
        "roofline that has what it needs for the model and GPU; distserve-profile for OPT-13B)",
    )
    p.add_argument(
        "--overheads",
        metavar="FILE",
        help="add the serving overheads of a file written by `servesim calibrate --latency "
        "overheads` on top of the latency model (default: none)",
    )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other scenario field, as in servesim run")  # fmt: skip
    p.add_argument("--out", default="validation", help="directory for validation.json/.png")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


_SCENARIO_OPTIONS = (
    ("model", "model"),
    ("gpu", "gpu"),
    ("tp", "tp"),
    ("max_num_seqs", "engine.max_num_seqs"),
    ("max_num_batched_tokens", "engine.max_num_batched_tokens"),
    ("kv_blocks", "engine.kv_blocks"),
)
"""Options that override one field of the replayed scenario: (option's dest, field)."""


def cmd_validate(args: argparse.Namespace) -> int:
    import yaml

    from servesim.simcore.config import parse_set_option

    run = read_measured(args.measured, placement=getattr(args, "placement", None))
    overrides: dict[str, Any] = {}
    for flag in ("kv_blocks", "kv_blocks_prefill", "kv_blocks_decode"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ScenarioError("--" + flag.replace("_", "-"), value, "must be a positive integer")
    for role in ("prefill", "decode"):
        value = getattr(args, f"kv_blocks_{role}", None)
        if value is not None:
            if not run.disaggregated:
                raise ScenarioError(
                    f"--kv-blocks-{role}",
                    value,
                    f"{run.name} is not disaggregated (one colocated instance); use --kv-blocks",
                )
            overrides[f"cluster.pools.{role}.engine.kv_blocks"] = value
    overrides.update(given_options(args, _SCENARIO_OPTIONS))
    for option in args.set:
        key, value = parse_set_option(option)
        overrides[key] = yaml.safe_load(value) if value != "" else ""
    overheads = None
    if getattr(args, "overheads", None):
        from servesim.latency.blackbox import resolve_coefficients_file

        overheads = resolve_coefficients_file(args.overheads, "--overheads").resolve()
    report = validate(run, overrides=overrides, latency=args.latency_model, overheads=overheads)
    files = write_report(report, args.out)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if not k.startswith("_")}, indent=2))
    else:
        print(format_report(report))
        print("wrote " + ", ".join(str(f) for f in files))
    return 0


add_validate_parser = Command(
    "validate",
    help="replay a measured serving run and compare simulated vs measured latency",
    description=(
        "Replay a measured run (DistServe .exp, an LLMServingSim run directory, or a CSV with "
        "arrival_s, input_tokens, output_tokens, ttft_s, e2e_s[, queued_s]) with its exact "
        "arrivals, token counts and server settings, and report simulated vs measured "
        "mean/p50/p90/p99 TTFT, TPOT and E2E and throughput. Settings the run does not "
        "record are assumed and listed."
    ),
    arguments=_validate_arguments,
    handler=cmd_validate,
)
