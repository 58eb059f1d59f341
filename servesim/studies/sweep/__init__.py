"""Run one scenario over a grid or a random sample of field values: ``servesim sweep SWEEP.yaml``.

A sweep file names a base scenario, fixed overrides (``set``), the swept fields (``grid``: every
combination; or ``random``: a seeded sample), the seeds of each point (``replicas``), the summary
metrics to tabulate and an optional plot::

    scenario: cluster-weighted.yaml           # relative to the sweep file; omitted: the default
    set: {workload.requests: 500}
    grid: {workload.rate: [10, 20, 40], policies.routing: [round-robin, least-loaded]}
    replicas: 3                               # seeds: the scenario's seed, seed + 1, seed + 2
    metrics: [ttft_p99_ms, e2e_p50_ms, responses_per_sec]
    plot: {x: workload.rate, y: ttft_p99_ms, group: policies.routing}

:func:`load_sweep` validates the file and every point's scenario before anything runs (a bad value
is a :class:`~servesim.simcore.errors.ScenarioError` naming the sweep field and the point).
:func:`run_sweep` runs the points that have no result yet on a process pool (default), serially,
or as Ray tasks. Every backend calls the same pure function, :func:`run_point`, so a point's
metrics depend only on the base scenario, its overrides and its seed, never on the backend.

The results directory holds ``points.csv`` (one row per point, rewritten atomically as points
finish), ``points.parquet`` (with pyarrow), ``points/<id>.json`` (each finished point's full
summary: the resume marker), ``sweep.yaml`` (the resolved sweep) and ``plot.png`` (with
matplotlib). A point id is a short hash of the base scenario's content, the point's overrides and
its seed, so an unchanged point keeps its id, and its result, across edits of the sweep.

Modules: ``spec`` (the sweep file), ``points`` (point ids), ``metrics``, ``backends``
(:func:`run_point` and where it runs), ``resume`` (the results directory), ``table`` (console table
and plot), ``runner`` (:func:`run_sweep`), ``cli`` (``servesim sweep``).
"""

from servesim.studies.sweep.backends import BACKENDS, run_point
from servesim.studies.sweep.cli import add_sweep_parser, cmd_sweep, dry_run
from servesim.studies.sweep.metrics import check_metric, metric_value
from servesim.studies.sweep.runner import SweepRun, run_sweep
from servesim.studies.sweep.spec import DEFAULT_METRICS, PlotSpec, Point, Sweep, load_sweep
from servesim.studies.sweep.table import format_table, plot_sweep

__all__ = [
    "BACKENDS",
    "DEFAULT_METRICS",
    "PlotSpec",
    "Point",
    "Sweep",
    "SweepRun",
    "add_sweep_parser",
    "check_metric",
    "cmd_sweep",
    "dry_run",
    "format_table",
    "load_sweep",
    "metric_value",
    "plot_sweep",
    "run_point",
    "run_sweep",
]
