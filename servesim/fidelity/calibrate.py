"""``servesim calibrate``: its argument parser and command."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from servesim.fidelity.fits.blackbox_runs import fit_blackbox_to_runs
from servesim.fidelity.fits.overheads import _parse_overhead_start, fit_overheads_to_runs
from servesim.fidelity.fits.report import TRAINED_BETA_NAMES, format_report, write_coefficients
from servesim.fidelity.fits.runs import _parse_start
from servesim.fidelity.fits.steps import (
    DEFAULT_TRAINED_FREE,
    fit_blackbox_to_steps,
    fit_trained_physics_to_steps,
)
from servesim.fidelity.fits.trained_runs import (
    DEFAULT_TRAINED_RUN_FREE,
    fit_trained_physics_to_runs,
)
from servesim.fidelity.readers import read_measured
from servesim.fidelity.readers.distserve import needs_placement
from servesim.fidelity.steptables import read_step_table
from servesim.simcore.errors import ScenarioError


def add_calibrate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` command to the CLI's subparsers; dispatch it to
    :func:`cmd_calibrate`."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit latency-model coefficients to measured runs or step tables",
        description=(
            "Fit the blackbox alpha/beta coefficients by replaying measured runs (Nelder-Mead on "
            "the log-error of mean and p90 TTFT/TPOT/E2E); or, with --latency overheads, a "
            "first-token and a per-step serving overhead on top of each run's own latency model "
            "(grid + Nelder-Mead, |log-error|); or fit blackbox or trained-physics betas to a "
            "step table (least squared log-ratios, betas >= 0). Prints training and held-out "
            "(k-fold) errors and writes a file a scenario names with "
            "latency: {model: blackbox, file: FILE} or "
            "latency: {model: overheads, base: MODEL, file: FILE}."
        ),
    )
    p.add_argument(
        "measured",
        nargs="*",
        metavar="MEASURED",
        help="measured runs (DistServe .exp, LLMServingSim run folder, generic .csv)",
    )
    p.add_argument(
        "--steps",
        metavar="TABLE",
        help="a step table instead: Splitwise perf_model.csv, an LLMServingSim perf profile, "
        "or an AIConfigurator database folder (with --llm)",
    )
    p.add_argument("--model", help="step table: the model to select (Splitwise 'model')")
    p.add_argument("--hardware", help="step table: the hardware to select (Splitwise 'hardware')")
    p.add_argument("--tp", type=int, help="step table: the tensor parallelism to select")
    p.add_argument(
        "--latency",
        choices=("blackbox", "trained-physics", "overheads"),
        default="blackbox",
        help="latency model to fit (trained-physics: its beta corrections, from step tables or "
        "runs; overheads: runs only, a first-token and a per-step overhead on top of each run's "
        "own latency model)",
    )
    p.add_argument(
        "--llm",
        help="trained-physics, or an AIConfigurator database: servesim model whose layer shapes "
        "price the table",
    )
    p.add_argument("--gpu", help="trained-physics: servesim GPU whose peak rates price the table")
    p.add_argument(
        "--layers", type=int, help="LLMServingSim profile: number of layers (default: config)"
    )
    p.add_argument(
        "--max-context",
        type=int,
        metavar="TOKENS",
        help="LLMServingSim profile: keep steps with at most this context per request",
    )
    p.add_argument(
        "--folds",
        type=int,
        default=None,
        metavar="K",
        help="k-fold held-out error (over runs, or over measured points of a step table); "
        "default 0 for runs (each fold refits), 5 for step tables",
    )
    p.add_argument(
        "--max-evals",
        type=int,
        default=None,
        metavar="N",
        help="runs: objective evaluations per fit (each replays every training run); "
        "default 200 (blackbox), 60 (trained-physics); overheads: Nelder-Mead polish after its "
        "78-point grid, default 20",
    )
    p.add_argument(
        "--objective",
        default="ttft,tpot,e2e",
        help="runs: metrics matched (mean and p90 of each), from ttft, tpot, e2e",
    )
    p.add_argument(
        "--free",
        help="coefficients to fit (comma list; blackbox runs: alpha0..beta2, default all; "
        f"trained-physics: {','.join(TRAINED_BETA_NAMES)}, default "
        f"{','.join(DEFAULT_TRAINED_FREE)} for step tables, "
        f"{','.join(DEFAULT_TRAINED_RUN_FREE)} for runs)",
    )
    p.add_argument(
        "--start",
        metavar="VALUES",
        help="runs: start values, A0,A1,A2,B0,B1,B2 for blackbox (default: a guess from the measurements) or FIRST_TOKEN_US,STEP_US for overheads (default 0,0)",
    )
    p.add_argument(
        "--placement",
        metavar="cXYdZW",
        help="runs: placement of DistServe runs whose file names have none (e.g. c21d11), "
        "as in servesim validate",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="runs: a scenario field for every replay, as in servesim validate (e.g. "
        "model=llama-3.1-8b, engine.kv_blocks=4000 for a CSV that does not record them)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="coefficients file to write (default: calibrated.yaml)",
    )
    p.set_defaults(handler=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit, print the error table, write the coefficients file; returns 0."""
    measured = list(getattr(args, "measured", None) or [])
    steps = getattr(args, "steps", None)
    latency = getattr(args, "latency", "blackbox") or "blackbox"
    if bool(measured) == bool(steps):
        raise ScenarioError(
            "MEASURED",
            measured or None,
            "give measured runs or --steps TABLE (one of the two)",
        )
    folds = getattr(args, "folds", None)
    if steps and getattr(args, "set", None):
        raise ScenarioError(
            "--set",
            args.set,
            "--set changes the replays of measured runs; a step fit replays nothing",
        )
    if steps and latency == "overheads":
        raise ScenarioError(
            "--latency",
            latency,
            "serving overheads are what step tables cannot show; fit them from measured runs "
            "(MEASURED ...) instead of --steps",
        )
    if steps:
        table = read_step_table(
            steps,
            model=getattr(args, "model", None),
            hardware=getattr(args, "hardware", None),
            tp=getattr(args, "tp", None),
            num_layers=getattr(args, "layers", None),
            max_context=getattr(args, "max_context", None),
            llm=getattr(args, "llm", None),
        )
        k = 5 if folds is None else folds
        if latency == "trained-physics":
            report = fit_trained_physics_to_steps(
                table,
                llm=getattr(args, "llm", None),
                gpu=getattr(args, "gpu", None),
                free=getattr(args, "free", None),
                folds=k,
            )
        else:
            report = fit_blackbox_to_steps(table, folds=k)
    else:
        placement = getattr(args, "placement", None)
        runs = [
            read_measured(m, placement=placement if needs_placement(m) else None) for m in measured
        ]
        overrides: dict[str, Any] = {}
        for option in getattr(args, "set", None) or []:
            from servesim.simcore.config import parse_set_option

            key, value = parse_set_option(option)
            overrides[key] = yaml.safe_load(value) if value != "" else ""
        start = getattr(args, "start", None)
        # --folds and --max-evals only when given: each fit keeps its own defaults
        options: dict[str, Any] = {
            "objective": getattr(args, "objective", "ttft,tpot,e2e"),
            "overrides": overrides,
        }
        for name in ("folds", "max_evals"):
            if getattr(args, name, None) is not None:
                options[name] = getattr(args, name)
        if latency == "trained-physics":
            if start:
                raise ScenarioError(
                    "--start", start, "a trained-physics run fit starts at the bundled betas"
                )
            report = fit_trained_physics_to_runs(runs, free=getattr(args, "free", None), **options)
        elif latency == "overheads":
            if getattr(args, "free", None):
                raise ScenarioError(
                    "--free", args.free, "overheads fits both of its two values; remove --free"
                )
            begin = (0.0, 0.0)
            if start:
                begin = _parse_overhead_start(start)
            report = fit_overheads_to_runs(runs, start=begin, **options)
        else:
            start_values = None
            if start:
                start_values = _parse_start([s for s in start.split(",") if s.strip()])
            report = fit_blackbox_to_runs(
                runs, start=start_values, free=getattr(args, "free", None), **options
            )
    print(format_report(report))
    out = write_coefficients(report, getattr(args, "out", None) or "calibrated.yaml")
    if report.latency_model == "blackbox":
        print(f"wrote {out}; use it with  latency: {{model: blackbox, file: {out}}}")
    elif report.latency_model == "overheads":
        print(
            f"wrote {out}; use it with  latency: {{model: overheads, base: <the runs' latency "
            f"model>, file: {out}}}"
        )
    else:
        print(f"wrote {out}; its scenario.latency mapping is the latency section to use")
    return 0
