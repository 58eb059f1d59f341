"""Figures of a run: ``servesim plot``, :func:`save_all` and the ``Results.plot`` shortcuts.

Every figure is drawn from a results directory (what ``servesim run`` or ``Results.write``
writes), loaded once by :class:`ResultsData` into numpy arrays. One function per figure takes the
loaded data and returns a :class:`matplotlib.figure.Figure`:

* :func:`latency_cdfs` — TTFT, ITL and E2E distributions, one line per SLO class;
* :func:`latency_cdf_overlay` — one latency's distribution for several runs on one axis (``ax=``);
* :func:`latency_over_time` — TTFT, TPOT and E2E of each request against its arrival time;
* :func:`instance_timeseries` — per-instance queue depth, batch size and KV utilisation;
* :func:`gateway_queue` — the gateway queue depth and the refused requests (flow control only);
* :func:`transfer_timeline` — KV transfers on each link (disaggregated serving only);
* :func:`step_gantt` — the engine steps of one instance in a time window.

Modules: ``data`` (loading), ``figure`` (matplotlib plumbing), ``latency`` and ``instances`` (the
figures), ``saving`` (all figures at once), ``cli`` (``servesim plot``).
"""

from servesim.analysis.plots.cli import add_plot_parser, cmd_plot
from servesim.analysis.plots.data import (
    FigureNotApplicable,
    ItlSample,
    ResultsData,
    as_results_data,
    load_results,
)
from servesim.analysis.plots.figure import figure_caption
from servesim.analysis.plots.instances import (
    gateway_queue,
    instance_timeseries,
    parse_window,
    step_gantt,
    transfer_timeline,
)
from servesim.analysis.plots.latency import latency_cdf_overlay, latency_cdfs, latency_over_time
from servesim.analysis.plots.saving import (
    FIGURES,
    SavedFigures,
    build_figures,
    save_all,
    save_figures,
)

__all__ = [
    "FIGURES",
    "FigureNotApplicable",
    "ItlSample",
    "ResultsData",
    "SavedFigures",
    "add_plot_parser",
    "as_results_data",
    "build_figures",
    "cmd_plot",
    "figure_caption",
    "gateway_queue",
    "instance_timeseries",
    "latency_cdf_overlay",
    "latency_cdfs",
    "latency_over_time",
    "load_results",
    "parse_window",
    "save_all",
    "save_figures",
    "step_gantt",
    "transfer_timeline",
]
