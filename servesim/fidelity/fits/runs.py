"""What the fits that replay measured runs share: the objective over runs, argument parsing and
the k-fold loop."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from servesim.fidelity.fits.report import BLACKBOX_PARAMS, CalibrationReport, FoldResult
from servesim.fidelity.fits.solvers import _optimize
from servesim.fidelity.readers.common import MeasuredRun
from servesim.simcore.errors import ScenarioError

OBJECTIVE_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
FIT_STATS = ("mean", "p90")
"""Statistics of each metric the run fit matches."""
MISSING_PENALTY = 25.0
"""Loss of a statistic the run measured but the replay could not produce (no completed request):
a log-ratio of 5."""
_LOG_MIN, _LOG_MAX = math.log(1e-6), math.log(1e9)
_FLOORS = (1.0, 1e-3, 0.1, 1.0, 1e-3, 0.1)
"""Start values (µs) of free blackbox coefficients whose guess is 0 (log space cannot hold 0)."""


def _listed(
    given: str | Iterable[Any], known: Mapping[str, Any], path: str, what: str
) -> list[Any]:
    """What ``known`` maps the names in ``given`` to (a comma-separated string or a list; case and
    blanks ignored), each value once, in order of first mention; an unknown name or none at all is
    an error listing the known names."""
    items = given.split(",") if isinstance(given, str) else list(given)
    out: list[Any] = []
    for raw in items:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name not in known:
            raise ScenarioError(path, raw, f"unknown {what}; choose from {', '.join(known)}")
        if known[name] not in out:
            out.append(known[name])
    if not out:
        raise ScenarioError(path, given, f"name at least one of {', '.join(known)}")
    return out


def _objective_metrics(objective: str | Sequence[str], path: str = "objective") -> tuple[str, ...]:
    return tuple(_listed(objective, OBJECTIVE_METRICS, path, "metric"))


def _stat_values(metrics: Mapping[str, Mapping], metric_keys: Sequence[str]) -> dict[str, float]:
    """``{"ttft_ms.mean": value, ...}`` for the known, positive statistics."""
    out: dict[str, float] = {}
    for metric in metric_keys:
        for stat in FIT_STATS:
            value = metrics.get(metric, {}).get(stat)
            if value is not None and math.isfinite(value) and value > 0:
                out[f"{metric}.{stat}"] = float(value)
    return out


def _check_runs(runs: Sequence[MeasuredRun]) -> None:
    if not runs:
        raise ScenarioError("runs", [], "give at least one measured run")
    for run in runs:
        if not isinstance(run, MeasuredRun):
            raise ScenarioError("runs", run, "expected MeasuredRun objects (servesim.fidelity)")
        if run.disaggregated:
            raise ScenarioError(
                f"runs: {run.name}",
                run.source,
                "a disaggregated run has prefill and decode instances of different TP, which one "
                "set of blackbox coefficients (per model, GPU and TP) cannot describe; fit "
                "colocated runs",
            )
    combos = {(r.model, r.gpu, r.tp) for r in runs}
    if len(combos) > 1:
        listing = "; ".join(f"{r.name}: model={r.model} gpu={r.gpu} tp={r.tp}" for r in runs[:6])
        raise ScenarioError(
            "runs",
            [r.name for r in runs],
            "blackbox coefficients are per (model, GPU, TP) but the runs differ: "
            f"{listing}; calibrate each combination separately",
        )


def _parse_start(start: Any) -> tuple[float, ...]:
    """``(a0, a1, a2, b0, b1, b2)`` or ``((a0, a1, a2), (b0, b1, b2))``."""
    if isinstance(start, Mapping) and {"alpha", "beta"} <= set(start):
        start = (start["alpha"], start["beta"])
    values: list[Any] = []
    if isinstance(start, Sequence) and len(start) == 2:
        for part in start:
            if not isinstance(part, Sequence) or len(part) != 3:
                raise ScenarioError(
                    "start", start, "expected (alpha0..2, beta0..2) or ((3 alphas), (3 betas))"
                )
            values.extend(part)
    elif isinstance(start, Sequence) and len(start) == 6:
        values = list(start)
    else:
        raise ScenarioError(
            "start", start, "expected (alpha0..2, beta0..2) or ((3 alphas), (3 betas))"
        )
    out = []
    for name, value in zip(BLACKBOX_PARAMS, values):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ScenarioError(f"start.{name}", value, "expected a number >= 0") from None
        if not (math.isfinite(number) and number >= 0):
            raise ScenarioError(f"start.{name}", value, "expected a finite number >= 0")
        out.append(number)
    return tuple(out)


def _parse_free(
    free: Iterable[str] | str | None, names: Sequence[str], path: str
) -> tuple[int, ...]:
    if free is None:
        return tuple(range(len(names)))
    return tuple(sorted(_listed(free, {n: i for i, n in enumerate(names)}, path, "coefficient")))


class _RunObjective:
    """Replays runs with candidate coefficients; memoises the per-run statistics."""

    def __init__(
        self,
        runs: Sequence[MeasuredRun],
        metric_keys: Sequence[str],
        overrides: Mapping[str, Any] | None,
        replay_options: Callable[[tuple[float, ...]], dict[str, Any]] | None = None,
        robust: bool = False,
    ):
        self.replay_options = replay_options or _blackbox_options
        self.robust = robust  # |log ratio| (a median-like fit) instead of its square
        self.runs = list(runs)
        self.metric_keys = tuple(metric_keys)
        self.overrides = dict(overrides or {})
        self.measured = [_stat_values(r.metrics(), self.metric_keys) for r in self.runs]
        for run, stats in zip(self.runs, self.measured):
            if not stats:
                raise ScenarioError(
                    f"runs: {run.name}",
                    run.source,
                    f"the run measured none of {', '.join(self.metric_keys)}; nothing to fit",
                )
        self.cache: dict[tuple[float, ...], list[dict[str, float]]] = {}
        self.evaluations = 0

    def simulate(self, coefficients: Sequence[float]) -> list[dict[str, float]]:
        key = tuple(float(f"{c:.9g}") for c in coefficients)
        if key not in self.cache:
            from servesim.fidelity.replay import simulate_run, simulated_metrics
            from servesim.simcore.log import errors_only

            options = self.replay_options(key)
            overrides = {**self.overrides, **options.pop("overrides", {})}
            out = []
            # the first replay says what it assumed; the next hundred would only repeat it
            with errors_only() if self.evaluations else contextlib.nullcontext():
                for run in self.runs:
                    results, _ = simulate_run(run, overrides=overrides, **options)
                    out.append(_stat_values(simulated_metrics(results), self.metric_keys))
            self.cache[key] = out
            self.evaluations += 1
        return self.cache[key]

    def loss(self, coefficients: Sequence[float]) -> float:
        total = 0.0
        for measured, simulated in zip(self.measured, self.simulate(coefficients)):
            if self.robust:
                terms = [
                    abs(math.log(simulated[k] / m)) if k in simulated else MISSING_PENALTY
                    for k, m in measured.items()
                ]
            else:
                terms = [
                    math.log(simulated[k] / m) ** 2 if k in simulated else MISSING_PENALTY
                    for k, m in measured.items()
                ]
            total += sum(terms) / len(terms)
        return total / len(self.runs)

    def errors(self, coefficients: Sequence[float]) -> list[dict[str, float]]:
        """Signed relative error (simulated / measured − 1) of each statistic of each run."""
        out = []
        for measured, simulated in zip(self.measured, self.simulate(coefficients)):
            out.append({k: simulated[k] / m - 1.0 for k, m in measured.items() if k in simulated})
        return out


def _blackbox_options(key: tuple[float, ...]) -> dict[str, Any]:
    """Replay options pricing steps with blackbox coefficients ``key`` = (α0..α2, β0..β2)."""
    latency = {"model": "blackbox", "alpha": list(key[:3]), "beta": list(key[3:])}
    return {"overrides": {"latency": latency}}


def _median_abs(per_item: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys: list[str] = []
    for item in per_item:
        keys.extend(k for k in item if k not in keys)
    out = {}
    for key in keys:
        values = [abs(item[key]) for item in per_item if key in item]
        if values:
            out[key] = float(np.median(values))
    return out


def _nelder_mead(
    objective: _RunObjective,
    start: Sequence[float],
    free: Sequence[int],
    max_evals: int,
    floors: Sequence[float] = _FLOORS,
) -> tuple[tuple[float, ...], float]:
    optimize = _optimize()
    base = [float(v) for v in start]
    x0 = []
    steps = []
    for i in free:
        floored = base[i] <= 0
        value = floors[i] if floored else base[i]
        x0.append(min(max(math.log(value), _LOG_MIN), _LOG_MAX))
        steps.append(1.0 if floored else 0.15)
    budget = max(int(max_evals), len(free) + 2)
    spent_before = objective.evaluations

    def coefficients(x: np.ndarray) -> list[float]:
        full = list(base)
        for j, i in enumerate(free):
            full[i] = math.exp(min(max(float(x[j]), _LOG_MIN), _LOG_MAX))
        return full

    def loss(x: np.ndarray) -> float:
        return objective.loss(coefficients(x))

    x_best = np.asarray(x0)
    f_best = loss(x_best)
    step = np.asarray(steps)
    # Nelder-Mead until the budget is spent; a collapsed simplex restarts around the best point
    # with a smaller one (a restart that gains nothing ends the search).
    while True:
        left = budget - (objective.evaluations - spent_before)
        if left < len(free) + 2:
            break
        simplex = np.vstack(
            [x_best] + [x_best + np.eye(len(free))[j] * step[j] for j in range(len(free))]
        )
        result = optimize.minimize(
            loss,
            x_best,
            method="Nelder-Mead",
            options={"maxfev": left, "initial_simplex": simplex, "xatol": 1e-4, "fatol": 1e-12},
        )
        improved = float(result.fun) < f_best * (1 - 1e-6)
        if float(result.fun) <= f_best:
            x_best, f_best = np.asarray(result.x), float(result.fun)
        if not improved:
            break
        step = np.full(len(free), 0.05)
    best = coefficients(x_best)
    return tuple(best), float(objective.loss(best))


def _check_run_fit(folds: Any, max_evals: Any, min_evals: int) -> None:
    """Named errors for a run fit's ``folds`` and ``max_evals``."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 0:
        raise ScenarioError("folds", folds, "expected a whole number >= 0 (0 or 1: no k-fold)")
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < min_evals:
        raise ScenarioError("max_evals", max_evals, f"expected a whole number >= {min_evals}")


def _served(run: MeasuredRun) -> str:
    """What a run's latency model prices: its model on its GPU."""
    return f"{run.model or 'unknown model'} on {run.gpu or 'unknown GPU'}"


def not_transported(held: Sequence[MeasuredRun], train: Sequence[MeasuredRun]) -> str:
    """Why a fit on ``train`` should not be carried to the ``held`` runs ('' when it may).

    Overheads or corrections fitted on top of a latency model absorb what that model gets wrong
    for the runs they are fitted on as well as the server's own time, and that error is the
    model's on its GPU. Carried to a run of another model or GPU they add the first run's error
    to the second's (a fast MoE prefill on one made a slow dense decode slower still on the
    other). So a fit predicts a run only when its training runs include the same model on the
    same GPU."""
    have = {_served(r) for r in train}
    missing = sorted({_served(r) for r in held} - have)
    if not missing:
        return ""
    return f"no training run of {', '.join(missing)} (fitted on {', '.join(sorted(have))} only)"


def _run_folds(
    runs: Sequence[MeasuredRun],
    folds: int,
    fit: Callable[[list[MeasuredRun]], tuple[Sequence[float], float, _RunObjective]],
    held_objective: Callable[[list[MeasuredRun]], _RunObjective],
    n_alpha: int,
    notes: list[str],
) -> tuple[list[FoldResult], list[dict[str, float]], str | None]:
    """k-fold over runs (run ``i`` held out in fold ``i mod k``): each fold's fit on the other
    runs and its errors on both parts; (folds, every held-out run's errors, why there are none).
    ``fit(train)`` returns (coefficients, loss, the training objective); the first ``n_alpha``
    coefficients are reported as alpha, the rest as beta."""
    results: list[FoldResult] = []
    items: list[dict[str, float]] = []
    k = folds
    if k >= 2 and len(runs) < 2:
        return (
            results,
            items,
            (
                "held-out error unavailable: k-fold is over runs and there is only one run "
                "(measure another run to estimate it)"
            ),
        )
    if k < 2:
        if len(runs) == 1:
            return (
                results,
                items,
                (
                    "held-out error unavailable: only one run (k-fold is over runs); the training "
                    "error alone does not say how well the fit predicts another run"
                ),
            )
        return results, items, "held-out error not estimated: pass folds >= 2 (k-fold over runs)"
    if k > len(runs):
        notes.append(f"{k} folds asked for {len(runs)} runs: leave-one-out ({len(runs)} folds)")
        k = len(runs)
    for j in range(k):
        held = [runs[i] for i in range(j, len(runs), k)]
        train = [r for i, r in enumerate(runs) if i % k != j]
        best, loss, train_objective = fit(train)
        held_errors = held_objective(held).errors(best)
        foreign = not_transported(held, train)
        if foreign:
            notes.append(
                f"fold {j}: {foreign}: its held-out error is that of carrying a fit across "
                "models or GPUs, which calibrating on runs of the model and GPU you will "
                "predict avoids"
            )
        items.extend(held_errors)
        results.append(
            FoldResult(
                index=j,
                train=[r.name for r in train],
                heldout=[r.name for r in held],
                alpha=tuple(best[:n_alpha]),
                beta=tuple(best[n_alpha:]),
                train_error=_median_abs(train_objective.errors(best)),
                heldout_error=_median_abs(held_errors),
                loss=loss,
                evaluations=train_objective.evaluations,
            )
        )
    return results, items, None


def _fit_with_folds(
    runs: list[MeasuredRun],
    folds: int,
    objective_for: Callable[[list[MeasuredRun]], _RunObjective],
    optimise: Callable[[_RunObjective], tuple[Sequence[float], float]],
    n_alpha: int,
    notes: list[str],
) -> tuple[
    Sequence[float],
    float,
    _RunObjective,
    tuple[list[FoldResult], list[dict[str, float]], str | None],
]:
    """The k-fold fits of :func:`_run_folds`, then the fit on all runs: (coefficients, loss, the
    final objective, what :func:`_run_folds` returned). ``objective_for(part)`` is a part's
    objective (training and held-out alike), ``optimise(objective)`` its (coefficients, loss)."""

    def fit(part: list[MeasuredRun]) -> tuple[Sequence[float], float, _RunObjective]:
        objective = objective_for(part)
        best, loss = optimise(objective)
        return best, loss, objective

    fold_run = _run_folds(runs, folds, fit, objective_for, n_alpha, notes)
    best, loss, final = fit(runs)
    return best, loss, final, fold_run


def _objective_text(metric_keys: Sequence[str], measure: str) -> str:
    """How a run fit's objective reads in its report: the metrics, the statistics, ``measure``."""
    return ",".join(k.split("_")[0] for k in metric_keys) + f" ({'/'.join(FIT_STATS)}): {measure}"


def _runs_report(
    latency_model: str,
    runs: Sequence[MeasuredRun],
    per_run: Sequence[dict[str, float]],
    folds: tuple[list[FoldResult], list[dict[str, float]], str | None],
    **fields: Any,
) -> CalibrationReport:
    """The report of a fit to measured runs, whichever model: the train error is the median
    over runs of the final fit's errors (``per_run``, one per run, also reported per run), the
    held-out error that of :func:`_run_folds`'s held-out runs (``folds`` is what it returned)."""
    fold_results, heldout_items, heldout_note = folds
    return CalibrationReport(
        latency_model=latency_model,
        kind="runs",
        train_error=_median_abs(per_run),
        heldout_error=_median_abs(heldout_items) if heldout_items else None,
        heldout_note=heldout_note,
        folds=fold_results,
        per_item={r.name: e for r, e in zip(runs, per_run)},
        **fields,
    )
