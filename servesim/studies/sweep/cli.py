"""``servesim sweep``: run a sweep file from the command line (or show what it would run)."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servesim.simcore.commands import Command
from servesim.simcore.errors import ScenarioError
from servesim.studies.sweep.backends import BACKENDS, RAY_HINT
from servesim.studies.sweep.runner import run_sweep
from servesim.studies.sweep.spec import Sweep, load_sweep
from servesim.studies.sweep.table import _shape


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file (docs/howto/sweep.md)")
    p.add_argument("--out", metavar="DIR", help="results directory (default: results/<sweep name>)")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="process",
        help="process: a local process pool (default); serial: one point at a time in this "
        f"process; ray: Ray tasks ({RAY_HINT})",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="points run at once (default: one per CPU; with ray: the cluster's CPUs)",
    )
    p.add_argument(
        "--force", action="store_true", help="discard the points' earlier results and rerun them"
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to connect to, e.g. ray://head:10001 or auto (default: start a local "
        "one); only with --backend ray",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the sweep and list its points and which would run; run nothing",
    )


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run ``servesim sweep``: 0 all points finished, 1 some failed, 130 interrupted."""
    if args.ray_address is not None and args.backend != "ray":
        raise ScenarioError("--ray-address", args.ray_address, "only used with --backend ray")
    if args.workers is not None and args.workers < 1:
        raise ScenarioError("--workers", args.workers, "must be at least 1")
    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("results") / sweep.name
    if args.dry_run:
        print(dry_run(sweep, out, force=args.force))
        return 0
    with _terminate_as_interrupt():
        run = run_sweep(
            sweep,
            out,
            backend=args.backend,
            workers=args.workers,
            force=args.force,
            ray_address=args.ray_address,
            log_level=getattr(args, "log_level", "warning"),
        )
    if run.interrupted:
        return 130
    return 1 if run.failed else 0


add_sweep_parser = Command(
    "sweep",
    help="run a scenario over a grid or random sample of field values, with seed replicas",
    description=(
        "Run a scenario over a grid (every combination) or a random sample of field values, "
        "each point with `replicas` seeds, on a process pool (default), serially or on Ray. "
        "Every point is validated before any runs. Results go to the --out directory: "
        "points.csv (one row per point), points.parquet (with pyarrow), points/<id>.json "
        "(each point's full summary), sweep.yaml and plot.png (with matplotlib). Points "
        "that already have a result there are not run again (--force reruns them). Exit 0 "
        "when every point finished, 1 when some failed, 2 for an invalid sweep, 130 on "
        "Ctrl-C."
    ),
    arguments=_sweep_arguments,
    handler=cmd_sweep,
)
"""Add the ``sweep`` command to the CLI's subparsers; dispatch it to :func:`cmd_sweep`."""


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterable[None]:
    """While a sweep runs from the command line, SIGTERM (``kill``) stops it like Ctrl-C: the
    finished points are kept and the worker processes are stopped, not left running."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def dry_run(sweep: Sweep, out: str | Path, *, force: bool = False) -> str:
    """What ``--dry-run`` prints: every point, and whether it has a result in ``out``."""
    done = {
        p.id for p in sweep.points if not force and (Path(out) / "points" / f"{p.id}.json").exists()
    }
    lines = [
        f"sweep {sweep.name}: {_shape(sweep)}, all valid; {len(done)} finished in {out}, "
        f"{len(sweep.points) - len(done)} to run"
    ]
    for p in sweep.points:
        lines.append(f"  {p.id} {p.describe()}{'  (finished)' if p.id in done else ''}")
    return "\n".join(lines)
