"""``servesim plot``: draw a saved run's figures as PNG files."""

from __future__ import annotations

import argparse
from pathlib import Path

from servesim.analysis.plots.data import ResultsData
from servesim.analysis.plots.figure import INSTALL_HINT
from servesim.analysis.plots.instances import parse_window
from servesim.analysis.plots.saving import save_figures
from servesim.simcore.commands import Command
from servesim.simcore.errors import ScenarioError


def add_saved_run_arguments(p: argparse.ArgumentParser, *, out: str, out_help: str) -> None:
    """The arguments of a command that reads a saved run (``plot``, ``report``): the results
    directory, and ``--out`` (metavar ``out``), where to write what is drawn from it."""
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="directory written by servesim run")
    p.add_argument("--out", metavar=out, default=None, help=out_help)


def _plot_arguments(p: argparse.ArgumentParser) -> None:
    add_saved_run_arguments(
        p, out="DIR", out_help="directory for the PNG files (default: RESULTS_DIR/plots)"
    )
    p.add_argument(
        "--instance",
        type=int,
        default=0,
        metavar="N",
        help="instance drawn in the step Gantt (default 0)",
    )
    p.add_argument(
        "--window",
        metavar="START:END",
        default=None,
        help="time window of the step Gantt in simulated seconds, e.g. 10:10.5; either side may "
        "be empty (default: 200 steps around the middle of the instance's run)",
    )


def cmd_plot(args: argparse.Namespace) -> int:
    """Write the PNG files, print their paths and the figures skipped (and why)."""
    window = parse_window(args.window)
    out = Path(args.out) if args.out else Path(args.results_dir) / "plots"
    data = ResultsData.load(args.results_dir)
    try:
        saved = save_figures(data, out, instance=args.instance, window=window)
    except ScenarioError as exc:
        if exc.path in ("instance", "window"):
            raise ScenarioError("--" + exc.path, exc.value, exc.fix) from None
        raise
    for path in saved:
        print(path)
    for name, why in saved.skipped.items():
        print(f"skipped {name}: {why}")
    return 0


add_plot_parser = Command(
    "plot",
    help="draw a saved run's figures as PNG files (needs servesim[plot])",
    description=(
        "Draw the figures of a results directory written by `servesim run`: latency CDFs "
        "per SLO class, latency over time, per-instance queue depth, batch size and KV "
        "utilisation, the gateway queue (flow control), the KV transfer timeline "
        "(disaggregated serving) and a step-level Gantt of one instance. Figures that do "
        "not apply to the run are skipped, with the reason. Needs matplotlib: "
        f"{INSTALL_HINT}."
    ),
    arguments=_plot_arguments,
    handler=cmd_plot,
)
"""Add the ``plot`` command to the CLI's subparsers; dispatch it to :func:`cmd_plot`."""
