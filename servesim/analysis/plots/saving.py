"""Every applicable figure of a run at once: :func:`build_figures` (for the report) and
:func:`save_figures` / :func:`save_all` (PNG files, written atomically).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesim.analysis.plots.data import FigureNotApplicable, ResultsData
from servesim.analysis.plots.figure import DPI
from servesim.analysis.plots.instances import (
    gateway_queue,
    instance_timeseries,
    step_gantt,
    transfer_timeline,
)
from servesim.analysis.plots.latency import latency_cdfs, latency_over_time
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic

FIGURES = (
    "latency_cdfs",
    "latency_over_time",
    "instance_timeseries",
    "gateway_queue",
    "transfer_timeline",
    "step_gantt",
)


class SavedFigures(list):
    """The PNG files written (a list of Paths); ``skipped`` maps figure name -> why not drawn."""

    def __init__(self, paths: list[Path], skipped: dict[str, str]):
        super().__init__(paths)
        self.skipped = skipped


def build_figures(
    data: ResultsData,
    *,
    instance: int = 0,
    window: tuple[float | None, float | None] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every figure that applies to the run, by name, and why the others were skipped."""
    start, end = window if window is not None else (None, None)
    data.check_instance(instance)
    builders = {
        "latency_cdfs": lambda: latency_cdfs(data),
        "latency_over_time": lambda: latency_over_time(data),
        "instance_timeseries": lambda: instance_timeseries(data),
        "gateway_queue": lambda: gateway_queue(data),
        "transfer_timeline": lambda: transfer_timeline(data),
        "step_gantt": lambda: step_gantt(data, instance, start, end),
    }
    figures: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in FIGURES:
        try:
            figures[name] = builders[name]()
        except FigureNotApplicable as exc:
            skipped[name] = exc.fix
    return figures, skipped


def _write_png(fig: Any, path: Path) -> Path:
    """Save a figure as PNG atomically (a temporary sibling replaces ``path`` in one rename)."""
    return write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=DPI))


def save_figures(
    data: ResultsData,
    out_dir: str | Path,
    *,
    instance: int = 0,
    window: tuple[float | None, float | None] | None = None,
) -> SavedFigures:
    """Write every applicable figure of loaded data as ``<figure>.png`` into ``out_dir``."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(
            "--out", str(out), f"cannot create the directory ({exc.strerror or exc})"
        ) from None
    figures, skipped = build_figures(data, instance=instance, window=window)
    paths = []
    try:
        for name, fig in figures.items():
            paths.append(_write_png(fig, out / f"{name}.png"))
    except OSError as exc:
        raise ScenarioError(
            "--out", str(out), f"cannot write the figures there ({exc.strerror or exc})"
        ) from None
    return SavedFigures(paths, skipped)


def save_all(
    results_dir: str | Path,
    out_dir: str | Path,
    *,
    instance: int = 0,
    window: tuple[float | None, float | None] | None = None,
) -> SavedFigures:
    """Load a results directory and write its figures as PNG files into ``out_dir``.

    Returns the paths written (a list); its ``skipped`` attribute maps each figure that does
    not apply to the run (no flow control, not disaggregated, no step log) to the reason.
    ``window`` is the Gantt's ``(start_s, end_s)`` (either may be None).
    """
    return save_figures(ResultsData.load(results_dir), out_dir, instance=instance, window=window)
