"""Fit serving overheads (first-token and per-step µs) on top of each run's own latency model."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from servesim.fidelity.fits.report import CalibrationReport
from servesim.fidelity.fits.runs import (
    _check_run_fit,
    _fit_with_folds,
    _objective_metrics,
    _objective_text,
    _RunObjective,
    _runs_report,
)
from servesim.fidelity.fits.solvers import _optimize
from servesim.fidelity.readers.common import MeasuredRun
from servesim.simcore.errors import ScenarioError


def _parse_overhead_start(text: str) -> tuple[float, float]:
    """``--start FIRST_TOKEN_US,STEP_US`` for an overheads fit."""
    parts = [p for p in text.split(",") if p.strip()]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ScenarioError(
            "--start", text, "overheads: give FIRST_TOKEN_US,STEP_US, two numbers >= 0"
        )
    return (values[0], values[1])


def _overhead_options(key: tuple[float, ...]) -> dict[str, Any]:
    """Replay options adding overheads ``key`` = (first-token µs, per-step µs) to each run's own
    latency model."""
    return {"overheads": (key[0], key[1])}


OVERHEAD_PARAMS = ("first_token_us", "step_us")
"""The serving overheads fitted by :func:`fit_overheads_to_runs` (µs per request before its first
token, µs per engine step)."""
OVERHEAD_GRID = (
    (0.0, 1000.0, 2500.0, 5000.0, 10000.0, 20000.0),
    tuple(250.0 * i for i in range(13)),
)
"""The coarse grid (first-token µs, per-step µs) an overheads fit starts with: replayed step
dynamics make the loss piecewise (a little more step time can tip a run into preemptions), so a
local optimiser alone stops in the nearest dip."""


def _fit_overheads_once(
    objective: _RunObjective,
    start: tuple[float, float],
    max_evals: int,
    grid: tuple[Sequence[float], Sequence[float]] = OVERHEAD_GRID,
) -> tuple[tuple[float, float], float]:
    """The best of ``start``, the :data:`OVERHEAD_GRID` and a Nelder-Mead polish (``max_evals``
    evaluations) around the best grid point; overheads in µs, clamped at 0."""
    optimize = _optimize()
    losses: dict[tuple[float, float], float] = {}

    def loss(x: Sequence[float]) -> float:
        key = (max(0.0, round(float(x[0]))), max(0.0, round(float(x[1]))))
        if key not in losses:
            losses[key] = objective.loss(key)
        return losses[key]

    loss(start)
    for first in grid[0]:
        for step in grid[1]:
            loss((first, step))
    x0 = np.asarray(min(losses, key=losses.__getitem__), dtype=np.float64)
    simplex = np.vstack([x0, x0 + [500.0, 0.0], x0 + [0.0, 100.0]])
    optimize.minimize(
        loss,
        x0,
        method="Nelder-Mead",
        options={"maxfev": max_evals, "initial_simplex": simplex, "xatol": 10.0, "fatol": 1e-7},
    )
    best = min(losses, key=lambda k: (losses[k], k))
    return best, losses[best]


def fit_overheads_to_runs(
    runs: Sequence[MeasuredRun],
    *,
    folds: int = 0,
    start: Sequence[float] = (0.0, 0.0),
    max_evals: int = 20,
    objective: str | Sequence[str] = "ttft,tpot,e2e",
    overrides: Mapping[str, Any] | None = None,
    grid: tuple[Sequence[float], Sequence[float]] = OVERHEAD_GRID,
) -> CalibrationReport:
    """Fit a per-request first-token overhead and a per-step overhead (µs) on top of each run's
    own latency model (:class:`~servesim.latency.overheads.OverheadsLatencyModel`), by replaying
    ``runs`` (DistServe's fitted step times for its runs; otherwise the first of blackbox,
    trained-physics and roofline that accepts the run's model and GPU).

    Unlike blackbox coefficients, the overheads are the serving software's, so runs of different
    models, TP or disaggregation may be fitted together. The fit evaluates ``start`` (first-token
    µs, step µs) and the ``grid`` (first-token values × step values, default
    :data:`OVERHEAD_GRID`), then polishes the best point with ``max_evals``
    Nelder-Mead evaluations; each evaluation replays every run. ``folds``: k-fold over runs as in
    :func:`fit_blackbox_to_runs`. The returned overheads are the fit on all runs; ``alpha`` holds
    the first-token overhead and ``beta`` the per-step one.
    """
    runs = list(runs)
    if not runs:
        raise ScenarioError("runs", [], "give at least one measured run")
    metric_keys = _objective_metrics(objective)
    _check_run_fit(folds, max_evals, 0)
    start_values = tuple(float(x) for x in start)
    if len(start_values) != 2 or not all(math.isfinite(x) and x >= 0 for x in start_values):
        raise ScenarioError("start", start, "expected (first-token µs, step µs), two numbers >= 0")
    begin = (start_values[0], start_values[1])

    def objective_for(part: list[MeasuredRun]) -> _RunObjective:
        return _RunObjective(part, metric_keys, overrides, _overhead_options, robust=True)

    def optimise(objective_: _RunObjective) -> tuple[tuple[float, float], float]:
        return _fit_overheads_once(objective_, begin, max_evals, grid)

    notes: list[str] = []
    best, loss, final, fold_run = _fit_with_folds(runs, folds, objective_for, optimise, 1, notes)
    per_run = final.errors(best)
    return _runs_report(
        "overheads",
        runs,
        per_run,
        fold_run,
        alpha=(best[0],),
        beta=(best[1],),
        fitted_on={
            "kind": "runs",
            "runs": [
                {"name": r.name, "source": r.source, "requests": r.n, "system": r.system}
                for r in runs
            ],
            "base": "each run's own replay latency model",
        },
        objective=_objective_text(
            metric_keys,
            "mean over runs of the mean |log(simulated/measured)| "
            "(absolute, so one saturated run cannot pull the fit)",
        ),
        free=OVERHEAD_PARAMS,
        start={"first_token_us": [begin[0]], "step_us": [begin[1]]},
        loss=loss,
        evaluations=final.evaluations,
        notes=notes,
    )
