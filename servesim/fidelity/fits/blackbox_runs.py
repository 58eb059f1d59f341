"""Fit the blackbox α and β by replaying measured runs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from servesim.fidelity.fits.report import BLACKBOX_PARAMS, CalibrationReport
from servesim.fidelity.fits.runs import (
    _check_run_fit,
    _check_runs,
    _nelder_mead,
    _objective_metrics,
    _objective_text,
    _parse_free,
    _parse_start,
    _run_folds,
    _RunObjective,
    _runs_report,
)
from servesim.fidelity.readers.common import MeasuredRun


def _decode_concurrency(run: MeasuredRun) -> tuple[np.ndarray, np.ndarray]:
    """(mask, mean number of requests decoding during each masked request's decode)."""
    t0 = run.arrival_us.astype(np.float64)
    ok = (run.ttft_us >= 0) & (run.e2e_us > run.ttft_us) & (run.tpot_us > 0)
    starts = t0[ok] + run.ttft_us[ok]
    ends = t0[ok] + run.e2e_us[ok]
    if starts.size == 0:
        return ok, np.empty(0)
    times = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(starts.size), -np.ones(ends.size)])
    order = np.argsort(times, kind="stable")
    times, delta = times[order], delta[order]
    level = np.cumsum(delta)
    integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
    area = np.interp(ends, times, integral) - np.interp(starts, times, integral)
    return ok, area / (ends - starts)


def _lower_envelope_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept and slope of ``y ~ a + b·x`` through the lower half of the points (the least
    queued requests), refitted twice; (lower quartile, 0) when ``x`` does not vary."""
    if x.size == 0:
        return 0.0, 0.0
    if x.size < 3 or np.ptp(x) == 0:
        return float(np.percentile(y, 25)), 0.0
    keep = np.ones(x.size, dtype=bool)
    a = b = 0.0
    for _ in range(3):
        design = np.column_stack([np.ones(int(keep.sum())), x[keep]])
        (a, b), *_ = np.linalg.lstsq(design, y[keep], rcond=None)
        residual = y - (a + b * x)
        keep = residual <= np.percentile(residual, 50)
        if keep.sum() < 3:
            break
    return float(a), float(b)


def initial_guess(
    runs: Sequence[MeasuredRun],
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """A start for the run fit, from the measurements alone.

    TTFT against prompt length through the least-queued half of the requests gives an intercept
    (α0 + β0 + α2, one unqueued prefill step) and a slope (α1 + β1, all given to β1); each
    request's TPOT against the mean number of requests decoding alongside it gives β0 (intercept)
    and β2 (slope). α0 takes what the TTFT intercept leaves over β0; α1 and α2 start at 0 (the
    fit moves them from a small floor when they are free).
    """
    prompts, ttfts, tpots, widths = [], [], [], []
    for run in runs:
        known = run.ttft_us >= 0
        prompts.append(run.input_tokens[known].astype(np.float64))
        ttfts.append(run.ttft_us[known])
        mask, concurrency = _decode_concurrency(run)
        tpots.append(run.tpot_us[mask])
        widths.append(concurrency)
    x = np.concatenate(prompts) if prompts else np.empty(0)
    y = np.concatenate(ttfts) if ttfts else np.empty(0)
    intercept, slope = _lower_envelope_fit(x, y)
    tpot = np.concatenate(tpots) if tpots else np.empty(0)
    width = np.concatenate(widths) if widths else np.empty(0)
    if tpot.size >= 3 and np.ptp(width) > 0:
        design = np.column_stack([np.ones(tpot.size), width])
        (c0, c2), *_ = np.linalg.lstsq(design, tpot, rcond=None)
        if c0 <= 0 or c2 < 0:
            c0, c2 = float(np.median(tpot)), 0.0
    elif tpot.size:
        c0, c2 = float(np.median(tpot)), 0.0
    else:
        c0, c2 = max(intercept, 1.0) * 0.1, 0.0
    beta0 = max(float(c0), 1.0)
    beta2 = max(float(c2), 0.0)
    beta1 = max(slope, 0.0)
    alpha0 = max(intercept - beta0, 0.0)
    return (alpha0, 0.0, 0.0), (beta0, beta1, beta2)


def _fit_runs_once(
    runs: Sequence[MeasuredRun],
    metric_keys: Sequence[str],
    start: tuple[float, ...] | None,
    free: Sequence[int],
    max_evals: int,
    overrides: Mapping[str, Any] | None,
) -> tuple[tuple[float, ...], tuple[float, ...], float, int, _RunObjective]:
    if start is None:
        alpha, beta = initial_guess(runs)
        start = (*alpha, *beta)
    objective = _RunObjective(runs, metric_keys, overrides)
    best, loss = _nelder_mead(objective, start, free, max_evals)
    return best, start, loss, objective.evaluations, objective


def fit_blackbox_to_runs(
    runs: Sequence[MeasuredRun],
    *,
    folds: int = 0,
    start: Any = None,
    max_evals: int = 200,
    objective: str | Sequence[str] = "ttft,tpot,e2e",
    free: Iterable[str] | str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CalibrationReport:
    """Fit the blackbox α and β by replaying ``runs`` (see :mod:`servesim.fidelity.fits`).

    ``start``: ``(α0, α1, α2, β0, β1, β2)`` or ``((α...), (β...))``; by default
    :func:`initial_guess` of the (training) runs. ``max_evals``: the optimiser's budget of
    objective evaluations per fit (each replays every training run once). ``objective``: the
    metrics matched (mean and p90 of each; statistics a run does not know are skipped). ``free``:
    the coefficients to fit (names of :data:`BLACKBOX_PARAMS`); the others stay at ``start``.
    ``overrides``: extra scenario overrides for every replay (dotted keys, as in
    :func:`~servesim.fidelity.replay.replay_scenario`).

    ``folds=k`` (k ≥ 2) adds k fits, fold ``j`` holding out the runs ``j, j+k, ...``; with a
    single run there is nothing to hold out and the report says so. The returned coefficients are
    always the final fit on all runs.
    """
    runs = list(runs)
    _check_runs(runs)
    metric_keys = _objective_metrics(objective)
    free_index = _parse_free(free, BLACKBOX_PARAMS, "free")
    start_values = None if start is None else _parse_start(start)
    _check_run_fit(folds, max_evals, 1)
    objective_text = _objective_text(
        metric_keys, "mean over runs of the mean squared log(simulated/measured)"
    )
    notes: list[str] = []

    def fit_fold(train: list[MeasuredRun]) -> tuple[Sequence[float], float, _RunObjective]:
        best, _, loss, _, objective_ = _fit_runs_once(
            train, metric_keys, start_values, free_index, max_evals, overrides
        )
        return best, loss, objective_

    fold_run = _run_folds(
        runs, folds, fit_fold, lambda held: _RunObjective(held, metric_keys, overrides), 3, notes
    )

    best, used_start, loss, evals, final_objective = _fit_runs_once(
        runs, metric_keys, start_values, free_index, max_evals, overrides
    )
    per_run = final_objective.errors(best)
    fixed = [BLACKBOX_PARAMS[i] for i in range(6) if i not in free_index]
    if fixed:
        notes.append(f"held at the start value (not fitted): {', '.join(fixed)}")
    first = runs[0]
    fitted_on = {
        "kind": "runs",
        "runs": [{"name": r.name, "source": r.source, "requests": r.n} for r in runs],
        "llm": first.model,
        "gpu": first.gpu,
        "tp": first.tp,
    }
    return _runs_report(
        "blackbox",
        runs,
        per_run,
        fold_run,
        alpha=best[:3],
        beta=best[3:],
        fitted_on=fitted_on,
        objective=objective_text,
        free=tuple(BLACKBOX_PARAMS[i] for i in free_index),
        start={"alpha": list(used_start[:3]), "beta": list(used_start[3:])},
        loss=loss,
        evaluations=evals,
        notes=notes,
    )
