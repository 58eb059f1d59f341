"""``Results.plot``: the figures and the HTML report of one run, for notebooks.

It sits above both :mod:`servesim.analysis.plots` and :mod:`servesim.analysis.report` (the report
draws the figures; the figures never import the report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesim.analysis.plots.data import ResultsData
from servesim.analysis.plots.data import as_results_data as _as_data
from servesim.analysis.plots.instances import (
    gateway_queue,
    instance_timeseries,
    step_gantt,
    transfer_timeline,
)
from servesim.analysis.plots.latency import latency_cdfs, latency_over_time
from servesim.analysis.plots.saving import SavedFigures, save_figures
from servesim.analysis.report import render_report


class PlotAccessor:
    """Figures of one run, for notebooks: ``results.plot.latency_cdfs()`` and friends.

    ``source`` is a results directory, a :class:`servesim.run.Results` (written once to a
    temporary directory and loaded from there) or a :class:`ResultsData`. Data is loaded on
    first use and kept.
    """

    def __init__(self, source: Any):
        self._source = source
        self._data: ResultsData | None = None

    @property
    def data(self) -> ResultsData:
        if self._data is None:
            self._data = _as_data(self._source)
        return self._data

    def latency_cdfs(self, *, ax: Any = None) -> Any:
        """TTFT, ITL and E2E CDFs per SLO class (``ax``: 3 axes of your own figure)."""
        return latency_cdfs(self.data, ax=ax)

    def latency_over_time(self, *, ax: Any = None) -> Any:
        """TTFT, TPOT and E2E against arrival time (``ax``: 3 axes)."""
        return latency_over_time(self.data, ax=ax)

    def instances(self, *, ax: Any = None) -> Any:
        """Per-instance queue depth, batch size and KV utilisation over time (``ax``: 3 axes)."""
        return instance_timeseries(self.data, ax=ax)

    def gateway(self, *, ax: Any = None) -> Any:
        """Gateway queue depth and refusals (flow-control runs; ``ax``: 2 axes)."""
        return gateway_queue(self.data, ax=ax)

    def transfers(self, *, ax: Any = None) -> Any:
        """KV transfer timeline (disaggregated runs; ``ax``: 3 axes)."""
        return transfer_timeline(self.data, ax=ax)

    def gantt(
        self,
        instance: int = 0,
        start_s: float | None = None,
        end_s: float | None = None,
        *,
        ax: Any = None,
    ) -> Any:
        """Step-level Gantt of one instance in a window (seconds; ``ax``: 2 axes)."""
        return step_gantt(self.data, instance, start_s, end_s, ax=ax)

    def save_all(
        self,
        out_dir: str | Path,
        *,
        instance: int = 0,
        window: tuple[float | None, float | None] | None = None,
    ) -> SavedFigures:
        """Write every applicable figure as PNG into ``out_dir`` (see :func:`save_all`)."""
        return save_figures(self.data, out_dir, instance=instance, window=window)

    def report(self, out_file: str | Path) -> Path:
        """Write the self-contained HTML report (see :func:`servesim.analysis.report.write_report`)."""
        return render_report(self.data, out_file)

    def __repr__(self) -> str:
        return (
            "PlotAccessor: .latency_cdfs() .latency_over_time() .instances() .gateway() "
            ".transfers() .gantt(instance, start_s, end_s) .save_all(dir) .report(file)"
        )
