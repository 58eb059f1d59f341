"""``servesim plan``: search a plan file from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs

from servesim.simcore.commands import Command
from servesim.simcore.errors import ScenarioError
from servesim.studies.plan.objectives import OBJECTIVES
from servesim.studies.plan.output import _finite, format_plan, write_plan
from servesim.studies.plan.results import CandidateResult
from servesim.studies.plan.runner import PLAN_BACKENDS, run_plan
from servesim.studies.plan.spec import load_plan
from servesim.studies.sweep.backends import RAY_HINT


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.yaml", help="plan file (see docs/howto/plan-capacity.md)")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="where to write plan.json and plan.csv "
        "(default: results/plan-<plan name>)"
    )  # fmt: skip
    p.add_argument(
        "--objective",
        default=None,
        metavar="OBJECTIVE",
        help=f"rank by {', '.join(OBJECTIVES)}, or any numeric summary.json field (e.g. "
        "ttft_p50_ms; max:FIELD or min:FIELD sets the direction) (default: the plan's, else "
        "cost)",
    )
    p.add_argument(
        "--fitness",
        default=None,
        metavar="METRIC:W,...",
        help="rank by a weighted fitness over the candidates' metrics, e.g. "
        "cost_per_hour:2,ttft_p99_ms:1 (implies --objective fitness)",
    )
    p.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="GPU=USD",
        help="price of one GPU-hour in USD, e.g. --cost H100=2.49 (repeatable; wins over "
        "--costs, the plan's costs and the hardware table)",
    )
    p.add_argument(
        "--power",
        action="append",
        default=[],
        metavar="GPU=W",
        help="watts one GPU draws, e.g. --power H100=700 (repeatable; wins over the plan's "
        "power), for --objective energy_per_million_tokens",
    )
    p.add_argument(
        "--costs",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML file of GPU: USD per GPU-hour (repeatable; later files win)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        metavar="N",
        help="requests simulated per candidate and instance count (default: the plan's, else "
        "the scenario's)",
    )
    p.add_argument(
        "--prune-margin",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="reject a candidate unsimulated when its projected max rate (servesim project, at "
        "the most instances) is below (1 - FRACTION) x the target rate (default 0.2)",
    )
    p.add_argument(
        "--no-prune", action="store_true", help="simulate every candidate (no projection pruning)"
    )
    p.add_argument(
        "--min-confidence",
        choices=("physics", "fitted", "transported", "measured"),
        default=None,
        help="reject candidates whose step times rank below this confidence rung",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="USD",
        help="reject fleets that cost more than USD per hour (default: the plan's budget)",
    )
    p.add_argument(
        "--backend",
        choices=PLAN_BACKENDS,
        default="serial",
        help="serial: one candidate after the other in this process (default); process: a "
        f"local process pool; ray: Ray tasks ({RAY_HINT})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="candidates searched at once with --backend process or ray (default: one per CPU)",
    )
    p.add_argument("--json", action="store_true", help="print plan.json instead of the report")


def cmd_plan(args: argparse.Namespace) -> int:
    """Run the plan, print the report, write plan.json and plan.csv; exit 0 when some candidate
    is feasible, 1 when none is."""
    if args.requests is not None and args.requests < 1:
        raise ScenarioError("--requests", args.requests, "must be a positive integer")
    if args.workers is not None and args.workers < 1:
        raise ScenarioError("--workers", args.workers, "must be at least 1")
    if args.budget is not None and not args.budget > 0:
        raise ScenarioError("--budget", args.budget, "must be a positive number of USD per hour")
    plan = load_plan(
        args.plan,
        objective=args.objective,
        requests=args.requests,
        fitness=args.fitness,
        costs=args.cost,
        cost_files=args.costs,
        power=args.power,
    )
    from servesim.projection.prune import check_margin

    margin = None if args.no_prune else check_margin(args.prune_margin)
    plan = attrs.evolve(plan, prune_margin=margin, min_confidence=args.min_confidence)
    if args.budget is not None:
        plan = attrs.evolve(plan, budget=args.budget)
    show = not getattr(args, "json", False) and sys.stderr.isatty()

    def progress(result: CandidateResult, done: int, total: int) -> None:
        verdict = (
            f"{result.instances} instance(s), ${result.cost_per_hour:.2f}/hour"
            if result.feasible
            else f"rejected ({result.rejected_by})"
        )
        print(f"[{done}/{total}] {result.label}: {verdict}", file=sys.stderr, flush=True)

    result = run_plan(plan, progress if show else None, backend=args.backend, workers=args.workers)
    out = args.out or str(Path("results") / f"plan-{plan.name}")
    files = write_plan(result, out)
    if getattr(args, "json", False):
        print(json.dumps(_finite(result.to_dict()), indent=2))
    else:
        print(format_plan(result))
        print(f"wrote {', '.join(str(f) for f in files)}")
    return 0 if result.ranked else 1


add_plan_parser = Command(
    "plan",
    help="find the best fleet (GPU, tp/pp/ep, instances, engine limits, routing, PD split) "
    "within SLOs",
    description=(
        "Search GPU types, tensor, pipeline and expert parallelism, max_num_seqs, "
        "max_num_batched_tokens, routing policies and prefill:decode splits for the "
        "smallest instance count that serves the base scenario's workload within the SLO "
        "attainment, rejecting what does not fit in memory; rank the feasible fleets by the "
        "objective, show the Pareto front over cost per hour and goodput and why each rejected "
        "candidate was rejected, and write plan.json and plan.csv. GPU prices are indicative "
        "(hardware.yaml cost_per_hour); override them with --cost or --costs."
    ),
    arguments=_plan_arguments,
    handler=cmd_plan,
)
"""Add the ``plan`` command to the CLI's subparsers; dispatch it to :func:`cmd_plan`."""
