"""Fit latency-model coefficients to measurements: ``servesim calibrate``.

Two sources of measurements, one :class:`CalibrationReport`:

* **Measured runs** (:func:`fit_blackbox_to_runs`): each :class:`MeasuredRun` is replayed through
  the simulator (:func:`servesim.fidelity.replay.simulate_run`) with candidate blackbox
  coefficients, and a derivative-free optimiser (scipy's Nelder-Mead, in log-coefficients so every
  coefficient stays > 0) minimises the mean over runs of the mean squared log-ratio
  simulated/measured of the mean and p90 of TTFT, TPOT and E2E. All six coefficients are fitted:
  α0 (µs added once before a request's first token: the per-request server overhead), α1 (µs per
  prompt token of that delay), α2 (µs per output token), β0 (µs per engine step: the per-step
  CPU/scheduling overhead), β1 (µs per prefill token) and β2 (µs per decode request). With
  ``folds=k`` the runs are split k ways (run ``i`` is held out in fold ``i mod k``) and every fold
  reports its training error and its held-out error separately. The same replay loop fits a few
  trained-physics betas (:func:`fit_trained_physics_to_runs`) and serving overheads on top of any
  model (:func:`fit_overheads_to_runs`).
* **Step tables** (:func:`fit_blackbox_to_steps`, :func:`fit_trained_physics_to_steps`): measured
  step times (Splitwise's ``perf_model.csv``, or LLMServingSim per-layer profiles or
  AIConfigurator's kernel database composed into steps) are fitted by least squared log-ratios
  model/measured with non-negative coefficients (Gauss-Newton steps of scipy's NNLS, Huber weights
  per kind of step, each measured point counted once), with k-fold held-out errors over measured points (repeats stay in one fold).

:func:`write_coefficients` writes the fit (coefficients, what they were fitted on, the objective,
train and held-out errors, servesim version, date) as a YAML file that a scenario names with
``latency: {model: blackbox, file: fitted.yaml}``. scipy does the fitting (Nelder-Mead, NNLS) and
is imported only when a fit runs: ``pip install servesim[fit]``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import yaml

from servesim.fidelity.measured import MeasuredRun
from servesim.latency.blackbox import COEFFICIENTS_FILE_FORMAT
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic

__all__ = [
    "BLACKBOX_PARAMS",
    "TRAINED_BETA_NAMES",
    "CalibrationReport",
    "FoldResult",
    "StepTable",
    "add_calibrate_parser",
    "cmd_calibrate",
    "fit_blackbox_to_runs",
    "fit_blackbox_to_steps",
    "fit_overheads_to_runs",
    "fit_trained_physics_to_runs",
    "fit_trained_physics_to_steps",
    "format_report",
    "initial_guess",
    "read_llmservingsim_profile",
    "read_splitwise",
    "read_step_table",
    "write_coefficients",
]

BLACKBOX_PARAMS = ("alpha0", "alpha1", "alpha2", "beta0", "beta1", "beta2")
"""Names of the blackbox coefficients, in ``alpha + beta`` order."""
BLACKBOX_UNITS = {
    "alpha": ["us per request", "us per prompt token", "us per output token"],
    "beta": ["us per step", "us per prefill token", "us per decode request"],
}
TRAINED_BETA_NAMES = ("b1a", "b2a", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11")
"""The 11 trained-physics betas (``servesim/latency/trained.py``): prefill compute, decode compute,
weight loading, TP all-reduce, per layer, per request, per step, per MoE layer, prefill KV write,
decode KV access, MoE dispatch."""
DEFAULT_TRAINED_FREE = ("b1a", "b2a", "b6", "b7", "b10")
"""Trained-physics betas fitted by default; the others keep their bundled values (on one model,
GPU and TP, β3·weights, β5·layers and β7 are all constants, so only one of them is identifiable)."""

OBJECTIVE_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
FIT_STATS = ("mean", "p90")
"""Statistics of each metric the run fit matches."""
MISSING_PENALTY = 25.0
"""Loss of a statistic the run measured but the replay could not produce (no completed request):
a log-ratio of 5."""
STEP_OBJECTIVE = (
    "step time: least squared log(model/measured), coefficients >= 0 (Gauss-Newton NNLS, "
    "Huber-weighted per kind of step, each measured point counted once)"
)
_LOG_MIN, _LOG_MAX = math.log(1e-6), math.log(1e9)
_FLOORS = (1.0, 1e-3, 0.1, 1.0, 1e-3, 0.1)
"""Start values (µs) of free blackbox coefficients whose guess is 0 (log space cannot hold 0)."""
_BASIS_SCALE = 1e6
"""One-hot beta used to read a trained-physics basis term through its integer step time."""

SPLITWISE_COLUMNS = (
    "model",
    "hardware",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
    "tensor_parallel",
)
SPLITWISE_LLM = {"llama2-70b": "llama-3.1-70b-instruct"}
"""Bundled configs with the same layer shapes as a Splitwise model (trained-physics pricing)."""
SPLITWISE_GPU = {"a100-80gb": "A100-80", "h100-80gb": "H100", "h100-80gb-pcap": "H100"}

PathArg = str | os.PathLike[str]


# ====================================================================== reports


@attrs.define(eq=False)
class FoldResult:
    """One k-fold split: coefficients fitted on ``train`` and their errors on both parts.

    Errors map a statistic (``ttft_ms.mean`` for runs, ``prefill_step.median`` for step tables)
    to the median absolute relative error over the runs (or rows) of that part.
    """

    index: int
    train: list[str]
    heldout: list[str]
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    train_error: dict[str, float]
    heldout_error: dict[str, float]
    loss: float | None = None
    evaluations: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fold": self.index,
            "train": list(self.train),
            "heldout": list(self.heldout),
            "alpha": [float(x) for x in self.alpha],
            "beta": [float(x) for x in self.beta],
            "train_error": _rounded(self.train_error),
            "heldout_error": _rounded(self.heldout_error),
        }
        if self.loss is not None:
            out["loss"] = float(self.loss)
        if self.evaluations is not None:
            out["evaluations"] = int(self.evaluations)
        return out


@attrs.define(eq=False)
class CalibrationReport:
    """A fit: the coefficients (final fit on all the data), what they were fitted on, and the
    training and held-out errors (``heldout_error`` is None when it could not be estimated, and
    ``heldout_note`` then says why)."""

    latency_model: str
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    kind: str  # "runs" or "steps"
    fitted_on: dict[str, Any]
    objective: str
    train_error: dict[str, float]
    heldout_error: dict[str, float] | None
    heldout_note: str | None = None
    folds: list[FoldResult] = attrs.field(factory=list)
    free: tuple[str, ...] = ()
    start: dict[str, list[float]] | None = None
    loss: float | None = None
    evaluations: int | None = None
    per_item: dict[str, dict[str, float]] = attrs.field(factory=dict)
    """Runs: signed relative error of each statistic of each run under the final fit."""
    notes: list[str] = attrs.field(factory=list)

    def latency_section(self) -> dict[str, Any]:
        """The scenario ``latency`` mapping with these coefficients inline."""
        return {
            "model": self.latency_model,
            "alpha": [float(x) for x in self.alpha],
            "beta": [float(x) for x in self.beta],
        }

    def to_dict(self) -> dict[str, Any]:
        errors: dict[str, Any] = {
            "train": _rounded(self.train_error),
            "heldout": None if self.heldout_error is None else _rounded(self.heldout_error),
        }
        if self.heldout_note:
            errors["heldout_note"] = self.heldout_note
        if self.folds:
            errors["folds"] = [f.to_dict() for f in self.folds]
        if self.per_item:
            errors["per_run"] = {k: _rounded(v) for k, v in self.per_item.items()}
        fitted_on = dict(self.fitted_on)
        fitted_on["free"] = list(self.free)
        if self.start is not None:
            fitted_on["start"] = self.start
        if self.loss is not None:
            fitted_on["loss"] = float(self.loss)
        if self.evaluations is not None:
            fitted_on["evaluations"] = int(self.evaluations)
        return {
            "model": self.latency_model,
            "alpha": [float(x) for x in self.alpha],
            "beta": [float(x) for x in self.beta],
            "fitted_on": fitted_on,
            "objective": self.objective,
            "errors": errors,
            "notes": list(self.notes),
        }


def _rounded(errors: Mapping[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.6g}") for k, v in errors.items()}


# ====================================================================== scipy


def _optimize() -> Any:
    try:
        from scipy import optimize
    except ImportError:
        raise ScenarioError(
            "calibrate",
            "scipy",
            "fitting latency coefficients needs scipy, which is not installed: "
            "pip install servesim[fit]",
        ) from None
    return optimize


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares with scipy, columns scaled to unit norm for conditioning."""
    optimize = _optimize()
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = optimize.nnls(a / norms, y)
    return coef / norms


def _huber(residual: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """Huber weights (k = 1.345) with the scale 1.4826 × the median absolute residual taken
    within each stratum (kind of step), so a kind that fits worse is not mistaken for outliers."""
    w = np.ones(residual.size)
    for stratum in np.unique(strata):
        pick = strata == stratum
        scale = 1.4826 * float(np.median(np.abs(residual[pick])))
        if scale > 0:
            limit = 1.345 * scale
            w[pick] = np.minimum(1.0, limit / np.maximum(np.abs(residual[pick]), 1e-300))
    return w


def _log_nnls(
    a: np.ndarray,
    offset: np.ndarray,
    y: np.ndarray,
    weight: np.ndarray,
    strata: np.ndarray | None = None,
    iterations: int = 100,
) -> np.ndarray:
    """Non-negative ``c`` minimising Σ weight · log((a·c + offset) / y)², by Gauss-Newton
    (each step an NNLS of the linearised log-ratio, halved while it does not lower the loss),
    with Huber weights per stratum when ``strata`` is given.

    Log-ratios treat over- and under-prediction alike, so a measured point far below its
    neighbours cannot pull the fit as hard as in a relative-error fit (bounded above by 1 below
    and unbounded above)."""
    coef = _nnls(a * (np.sqrt(weight) / y)[:, None], np.sqrt(weight) * (y - offset) / y)

    def predict(c: np.ndarray) -> np.ndarray:
        return np.maximum(a @ c + offset, 1e-9)

    def loss(c: np.ndarray, w: np.ndarray) -> float:
        return float(np.sum(w * np.log(predict(c) / y) ** 2))

    for _ in range(iterations):
        p0 = predict(coef)
        r = np.log(p0 / y)
        w = weight * (_huber(r, strata) if strata is not None else 1.0)
        root = np.sqrt(w)
        target = 1.0 - r - offset / p0
        new = _nnls(a * (root / p0)[:, None], root * target)
        before = loss(coef, w)
        step = 1.0
        candidate = new
        while loss(candidate, w) > before and step > 1e-3:
            step /= 2
            candidate = coef + step * (new - coef)
        if loss(candidate, w) > before:
            break
        done = np.allclose(candidate, coef, rtol=1e-10, atol=1e-12)
        coef = candidate
        if done:
            break
    return coef


# ====================================================================== runs


def _objective_metrics(objective: str | Sequence[str], path: str = "objective") -> tuple[str, ...]:
    names = objective.split(",") if isinstance(objective, str) else list(objective)
    out: list[str] = []
    for raw in names:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name not in OBJECTIVE_METRICS:
            raise ScenarioError(
                path, raw, f"unknown metric; choose from {', '.join(OBJECTIVE_METRICS)}"
            )
        if OBJECTIVE_METRICS[name] not in out:
            out.append(OBJECTIVE_METRICS[name])
    if not out:
        raise ScenarioError(path, objective, "name at least one of ttft, tpot, e2e")
    return tuple(out)


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


def _parse_free(
    free: Iterable[str] | str | None, names: Sequence[str], path: str
) -> tuple[int, ...]:
    if free is None:
        return tuple(range(len(names)))
    items = free.split(",") if isinstance(free, str) else list(free)
    index: list[int] = []
    for raw in items:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name not in names:
            raise ScenarioError(path, raw, f"unknown coefficient; choose from {', '.join(names)}")
        if names.index(name) not in index:
            index.append(names.index(name))
    if not index:
        raise ScenarioError(path, free, f"name at least one of {', '.join(names)}")
    return tuple(sorted(index))


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


def _overhead_options(key: tuple[float, ...]) -> dict[str, Any]:
    """Replay options adding overheads ``key`` = (first-token µs, per-step µs) to each run's own
    latency model."""
    return {"overheads": (key[0], key[1])}


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


def _check_run_fit(folds: Any, max_evals: Any, min_evals: int) -> None:
    """Named errors for a run fit's ``folds`` and ``max_evals``."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 0:
        raise ScenarioError("folds", folds, "expected a whole number >= 0 (0 or 1: no k-fold)")
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < min_evals:
        raise ScenarioError("max_evals", max_evals, f"expected a whole number >= {min_evals}")


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
    """Fit the blackbox α and β by replaying ``runs`` (module docstring).

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
    objective_text = (
        ",".join(k.split("_")[0] for k in metric_keys)
        + f" ({'/'.join(FIT_STATS)}): mean over runs of the mean squared log(simulated/measured)"
    )
    notes: list[str] = []

    def fit_fold(train: list[MeasuredRun]) -> tuple[Sequence[float], float, _RunObjective]:
        best, _, loss, _, objective_ = _fit_runs_once(
            train, metric_keys, start_values, free_index, max_evals, overrides
        )
        return best, loss, objective_

    fold_results, heldout_items, heldout_note = _run_folds(
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
    return CalibrationReport(
        latency_model="blackbox",
        alpha=best[:3],
        beta=best[3:],
        kind="runs",
        fitted_on=fitted_on,
        objective=objective_text,
        train_error=_median_abs(per_run),
        heldout_error=_median_abs(heldout_items) if heldout_items else None,
        heldout_note=heldout_note,
        folds=fold_results,
        free=tuple(BLACKBOX_PARAMS[i] for i in free_index),
        start={"alpha": list(used_start[:3]), "beta": list(used_start[3:])},
        loss=loss,
        evaluations=evals,
        per_item={r.name: e for r, e in zip(runs, per_run)},
        notes=notes,
    )


DEFAULT_TRAINED_RUN_FREE = ("b1a", "b3")
"""Trained-physics betas a run fit moves by default: prefill compute (TTFT) and weight loading
(the bulk of a decode step); the others keep their bundled values. On one model, GPU and TP the
weight-loading, per-layer and per-step terms are all constants per step, so only one of them
(here β3) can be told apart by runs."""


def _trained_options(key: tuple[float, ...]) -> dict[str, Any]:
    """Replay options pricing steps with trained-physics betas ``key`` (bundled alpha)."""
    return {"overrides": {"latency": {"model": "trained-physics", "beta": list(key)}}}


def fit_trained_physics_to_runs(
    runs: Sequence[MeasuredRun],
    *,
    folds: int = 0,
    free: Iterable[str] | str | None = None,
    max_evals: int = 60,
    objective: str | Sequence[str] = "ttft,tpot,e2e",
    overrides: Mapping[str, Any] | None = None,
) -> CalibrationReport:
    """Fit trained-physics β corrections by replaying ``runs`` with the trained-physics model.

    Only the betas named by ``free`` move (default :data:`DEFAULT_TRAINED_RUN_FREE`; six summary
    statistics per run cannot pin all eleven), from their bundled values, by Nelder-Mead on their
    logarithms (each evaluation replays every run) minimising the mean squared log-ratio of the
    mean and p90 of TTFT, TPOT and E2E, as :func:`fit_blackbox_to_runs` does; ``folds`` as there.
    The α stay bundled. Disaggregated runs are refused: their pools price steps with their own
    latency sections, which a trained-physics fit does not reach.
    """
    from servesim.latency.trained import default_coefficients

    runs = list(runs)
    if not runs:
        raise ScenarioError("runs", [], "give at least one measured run")
    for run in runs:
        if run.disaggregated:
            raise ScenarioError(
                f"runs: {run.name}",
                run.source,
                "a disaggregated run's pools price their steps with their own latency models; "
                "fit colocated runs (or fit overheads with --latency overheads)",
            )
    metric_keys = _objective_metrics(objective)
    free_index = _parse_free(
        DEFAULT_TRAINED_RUN_FREE if free is None else free, TRAINED_BETA_NAMES, "free"
    )
    _check_run_fit(folds, max_evals, 1)
    alpha, start, _ = default_coefficients()
    floors = tuple(1e-3 for _ in TRAINED_BETA_NAMES)

    def fit(part: list[MeasuredRun]) -> tuple[Sequence[float], float, _RunObjective]:
        objective_ = _RunObjective(part, metric_keys, overrides, _trained_options)
        best, loss = _nelder_mead(objective_, start, free_index, max_evals, floors)
        return best, loss, objective_

    notes: list[str] = []
    fold_results, heldout_items, heldout_note = _run_folds(
        runs,
        folds,
        fit,
        lambda held: _RunObjective(held, metric_keys, overrides, _trained_options),
        0,
        notes,
    )
    best, loss, final = fit(runs)
    per_run = final.errors(best)
    fixed = [TRAINED_BETA_NAMES[i] for i in range(len(start)) if i not in free_index]
    notes.append(f"held at the bundled fit: {', '.join(fixed)}; alpha bundled")
    return CalibrationReport(
        latency_model="trained-physics",
        alpha=tuple(alpha),
        beta=tuple(best),
        kind="runs",
        fitted_on={
            "kind": "runs",
            "runs": [{"name": r.name, "source": r.source, "requests": r.n} for r in runs],
        },
        objective=",".join(k.split("_")[0] for k in metric_keys)
        + f" ({'/'.join(FIT_STATS)}): mean over runs of the mean squared log(simulated/measured)",
        train_error=_median_abs(per_run),
        heldout_error=_median_abs(heldout_items) if heldout_items else None,
        heldout_note=heldout_note,
        folds=fold_results,
        free=tuple(TRAINED_BETA_NAMES[i] for i in free_index),
        start={"beta": list(start)},
        loss=loss,
        evaluations=final.evaluations,
        per_item={r.name: e for r, e in zip(runs, per_run)},
        notes=notes,
    )


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

    def fit(part: Sequence[MeasuredRun]) -> tuple[tuple[float, float], float, _RunObjective]:
        objective_ = _RunObjective(part, metric_keys, overrides, _overhead_options, robust=True)
        best, loss = _fit_overheads_once(objective_, begin, max_evals, grid)
        return best, loss, objective_

    notes: list[str] = []
    fold_results, heldout_items, heldout_note = _run_folds(
        runs,
        folds,
        fit,
        lambda held: _RunObjective(held, metric_keys, overrides, _overhead_options, robust=True),
        1,
        notes,
    )
    best, loss, final = fit(runs)
    per_run = final.errors(best)
    return CalibrationReport(
        latency_model="overheads",
        alpha=(best[0],),
        beta=(best[1],),
        kind="runs",
        fitted_on={
            "kind": "runs",
            "runs": [
                {"name": r.name, "source": r.source, "requests": r.n, "system": r.system}
                for r in runs
            ],
            "base": "each run's own replay latency model",
        },
        objective=",".join(k.split("_")[0] for k in metric_keys)
        + f" ({'/'.join(FIT_STATS)}): mean over runs of the mean |log(simulated/measured)| "
        "(absolute, so one saturated run cannot pull the fit)",
        train_error=_median_abs(per_run),
        heldout_error=_median_abs(heldout_items) if heldout_items else None,
        heldout_note=heldout_note,
        folds=fold_results,
        free=OVERHEAD_PARAMS,
        start={"first_token_us": [begin[0]], "step_us": [begin[1]]},
        loss=loss,
        evaluations=final.evaluations,
        per_item={r.name: e for r, e in zip(runs, per_run)},
        notes=notes,
    )


# ====================================================================== step tables


@attrs.define(eq=False)
class StepTable:
    """Measured (or composed) engine step times, one row per step.

    ``kind`` is ``prefill``, ``decode`` or ``mixed``; ``prefill_items`` holds one
    ``(context_before, new_tokens, prompt_len)`` per prefilling request (as in
    :class:`~servesim.latency.base.BatchSummary`); ``group`` ties repeats of one measured point
    together (k-fold keeps a group in one fold); ``tp`` is each row's tensor parallelism.
    """

    source: str
    format: str
    model: str
    hardware: str
    kind: np.ndarray
    prefill_tokens: np.ndarray
    decode_requests: np.ndarray
    decode_context: np.ndarray
    prefill_items: list[tuple[tuple[int, int, int], ...]]
    time_us: np.ndarray
    group: np.ndarray
    tp: np.ndarray
    notes: list[str] = attrs.field(factory=list)

    @property
    def n(self) -> int:
        return int(self.time_us.size)

    @property
    def tps(self) -> tuple[int, ...]:
        return tuple(sorted({int(t) for t in self.tp}))

    def describe(self) -> dict[str, Any]:
        kinds = {k: int(np.count_nonzero(self.kind == k)) for k in ("prefill", "decode", "mixed")}
        return {
            "kind": "steps",
            "source": self.source,
            "format": self.format,
            "model": self.model,
            "hardware": self.hardware,
            "tp": list(self.tps),
            "rows": {k: v for k, v in kinds.items() if v},
        }


def _table_from_rows(
    rows: list[dict[str, Any]], *, source: str, fmt: str, model: str, hardware: str
) -> StepTable:
    keys: dict[Any, int] = {}
    groups = [keys.setdefault(r["group"], len(keys)) for r in rows]
    return StepTable(
        source=source,
        format=fmt,
        model=model,
        hardware=hardware,
        kind=np.asarray([r["kind"] for r in rows]),
        prefill_tokens=np.asarray([r["prefill_tokens"] for r in rows], dtype=np.int64),
        decode_requests=np.asarray([r["decode_requests"] for r in rows], dtype=np.int64),
        decode_context=np.asarray([r["decode_context"] for r in rows], dtype=np.int64),
        prefill_items=[r["prefill_items"] for r in rows],
        time_us=np.asarray([r["time_us"] for r in rows], dtype=np.float64),
        group=np.asarray(groups, dtype=np.int64),
        tp=np.asarray([r["tp"] for r in rows], dtype=np.int64),
    )


def read_splitwise(
    path: PathArg,
    *,
    model: str | None = None,
    hardware: str | None = None,
    tp: int | None = None,
) -> StepTable:
    """Splitwise's measured ``perf_model.csv`` as steps, for one model and hardware.

    Each row gives two steps: ``prompt_time`` (ms) is one prefill step of ``batch_size`` prompts
    of ``prompt_size`` tokens; ``token_time`` (ms) is one decode iteration of ``batch_size``
    requests, averaged over ``token_size`` tokens (so each request's context is taken as
    ``prompt_size + token_size / 2``). ``model``/``hardware`` may be left out when the file has
    only one; ``tp`` None keeps every TP of the selection.
    """
    file = Path(path)
    if not file.is_file():
        raise ScenarioError(str(file), None, "no such file")
    with file.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in SPLITWISE_COLUMNS if c not in header]
        if missing:
            raise ScenarioError(
                f"{file}:1",
                ",".join(header),
                f"not a Splitwise perf_model.csv: missing column(s) {', '.join(missing)}",
            )
        records = []
        for line, rec in enumerate(reader, start=2):
            try:
                records.append(
                    {
                        "model": rec["model"].strip(),
                        "hardware": rec["hardware"].strip(),
                        "tp": _whole(rec, "tensor_parallel"),
                        "prompt": _whole(rec, "prompt_size"),
                        "batch": _whole(rec, "batch_size"),
                        "tokens": _whole(rec, "token_size"),
                        "prompt_ms": _positive(rec, "prompt_time"),
                        "token_ms": _positive(rec, "token_time"),
                    }
                )
            except _BadCell as bad:
                raise ScenarioError(
                    f"{file}:{line}", bad.value, f"column {bad.column}: {bad.what}"
                ) from None
    if not records:
        raise ScenarioError(str(file), None, "the file has a header but no rows")
    model = _choose(records, "model", model, file)
    records = [r for r in records if r["model"] == model]
    hardware = _choose(records, "hardware", hardware, file, context=f"for {model}")
    records = [r for r in records if r["hardware"] == hardware]
    if tp is not None:
        available = sorted({r["tp"] for r in records})
        if tp not in available:
            raise ScenarioError(
                "--tp",
                tp,
                f"no rows for {model} on {hardware} with tensor_parallel={tp}; available: "
                f"{', '.join(map(str, available))}",
            )
        records = [r for r in records if r["tp"] == tp]
    rows: list[dict[str, Any]] = []
    for r in records:
        p, b, t, rtp = r["prompt"], r["batch"], r["tokens"], r["tp"]
        rows.append(
            {
                "kind": "prefill",
                "prefill_tokens": b * p,
                "decode_requests": 0,
                "decode_context": 0,
                "prefill_items": ((0, p, p),) * b,
                "time_us": r["prompt_ms"] * 1000.0,
                "group": ("prefill", p, b, rtp),  # the same prefill whatever token_size
                "tp": rtp,
            }
        )
        rows.append(
            {
                "kind": "decode",
                "prefill_tokens": 0,
                "decode_requests": b,
                "decode_context": b * (p + t // 2),
                "prefill_items": (),
                "time_us": r["token_ms"] * 1000.0,
                "group": ("decode", p, b, t, rtp),
                "tp": rtp,
            }
        )
    table = _table_from_rows(
        rows, source=str(file), fmt="splitwise", model=model, hardware=hardware
    )
    table.notes.append(
        "Splitwise token_time is the mean decode iteration over token_size tokens; each request's "
        "decode context is taken as prompt_size + token_size/2"
    )
    return table


class _BadCell(Exception):
    def __init__(self, column: str, value: Any, what: str):
        super().__init__(column)
        self.column = column
        self.value = value
        self.what = what


def _whole(rec: Mapping[str, str], column: str) -> int:
    text = (rec.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise _BadCell(column, text, "expected a whole number >= 1") from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise _BadCell(column, text, "expected a whole number >= 1")
    return int(value)


def _positive(rec: Mapping[str, str], column: str) -> float:
    text = (rec.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise _BadCell(column, text, "expected a time in ms > 0") from None
    if not math.isfinite(value) or value <= 0:
        raise _BadCell(column, text, "expected a finite time in ms > 0")
    return value


def _choose(
    records: list[dict[str, Any]], key: str, wanted: str | None, file: Path, context: str = ""
) -> str:
    available = sorted({r[key] for r in records})
    flag = "--model" if key == "model" else "--hardware"
    if wanted is None:
        if len(available) == 1:
            return available[0]
        raise ScenarioError(
            flag,
            None,
            f"{file} has several {key}s{' ' + context if context else ''}: "
            f"{', '.join(available)}; choose one",
        )
    for name in available:
        if name.lower() == wanted.strip().lower():
            return name
    raise ScenarioError(
        flag,
        wanted,
        f"not in {file}{' ' + context if context else ''}; available: {', '.join(available)}",
    )


_LLAMA_DENSE = ("qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn", "down_proj")


def read_llmservingsim_profile(
    path: PathArg,
    *,
    tp: int | None = None,
    num_layers: int | None = None,
    max_context: int | None = None,
) -> StepTable:
    """Compose step times from an LLMServingSim per-layer profile (``perf/<hw>/<model>/<variant>``).

    A step of ``pc`` new prefill tokens (one request, ``kv_prefill`` tokens already cached) and
    ``nd`` decode requests (``kv_decode`` tokens of context each) takes, as LLMServingSim's trace
    generator composes it for the llama layer sequence::

        embedding(T) + L·(2·layernorm(T) + qkv_proj(T) + rotary_emb(T) + attention(row)
                          + o_proj(T) + gate_up_proj(T) + act_fn(T) + down_proj(T))
        + final_layernorm(T) + lm_head(S) + sampler(S)

    with ``T = pc + nd`` tokens and ``S = nd + [pc > 0]`` sequences, one step per row of
    ``attention.csv``; the dense and per-sequence times are interpolated linearly between profiled
    token counts, and rows beyond the profiled range are left out (no extrapolation). ``L`` is the
    model's layer count (from the bundled config of ``meta.yaml``'s model unless given).
    ``max_context`` keeps only rows whose per-request context (``kv_prefill + prefill_chunk``,
    ``kv_decode``) is at most that many tokens: the profiled grid runs to 16k tokens per decode
    request, far beyond what a KV cache holds for 256 requests.

    Only ``tp=1``: the profiles hold no all-reduce (LLMServingSim adds it from its network
    simulator), so a TP>1 step composed from them would be missing its communication. The
    composed times are kernel times only: host-side scheduling and launch gaps are not in them.
    """
    root = Path(path)
    if root.is_file():
        root = root.parent
    if root.name.startswith("tp") and (root.parent / "meta.yaml").is_file():
        tp = tp if tp is not None else _tp_of(root.name)
        root = root.parent
    meta_file = root / "meta.yaml"
    if not meta_file.is_file():
        raise ScenarioError(
            str(root),
            None,
            "not an LLMServingSim profile: expected meta.yaml and tp<N>/ (dense.csv, "
            "attention.csv, per_sequence.csv) in perf/<hardware>/<model>/<variant>/",
        )
    try:
        meta = yaml.safe_load(meta_file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(str(meta_file), None, f"cannot read meta.yaml ({exc})") from None
    arch = str(meta.get("architecture", ""))
    if arch != "llama":
        raise ScenarioError(
            f"{meta_file}: architecture",
            arch,
            "only the llama layer sequence is known to the composer; another architecture's "
            "layers (q/k norms, MoE) would be summed wrongly",
        )
    tp = 1 if tp is None else tp
    if tp != 1:
        raise ScenarioError(
            "--tp",
            tp,
            "LLMServingSim profiles hold no TP all-reduce (its network simulator adds it), so a "
            "step composed from a tp>1 profile would leave the communication out; use tp 1",
        )
    folder = root / f"tp{tp}"
    model = str(meta.get("model", root.parent.name))
    if num_layers is None:
        from servesim.latency.modelindex import resolve_model

        try:
            spec = resolve_model(model.split("/")[-1].lower(), "model").require_spec(
                "model", "composing LLMServingSim layers"
            )
        except ScenarioError:
            try:
                spec = resolve_model(model.split("/")[-1].lower() + "-instruct", "model").spec
            except ScenarioError:
                raise ScenarioError(
                    "--layers",
                    None,
                    f"no bundled config for {model}; give its number of layers",
                ) from None
        num_layers = int(spec.num_layers)
    dense = _layer_table(folder / "dense.csv", "tokens")
    per_seq = _layer_table(folder / "per_sequence.csv", "sequences")
    needed = {
        "dense.csv": [*_LLAMA_DENSE, "layernorm", "embedding", "final_layernorm"],
        "per_sequence.csv": ["lm_head", "sampler"],
    }
    for name, layers in needed.items():
        table = dense if name == "dense.csv" else per_seq
        absent = [layer for layer in layers if layer not in table]
        if absent:
            raise ScenarioError(
                str(folder / name), None, f"missing layer(s) {', '.join(absent)} (llama sequence)"
            )
    attention = _read_attention(folder / "attention.csv")
    max_tokens = min(float(dense[layer][0][-1]) for layer in needed["dense.csv"])
    max_seqs = min(float(per_seq[layer][0][-1]) for layer in needed["per_sequence.csv"])
    pc, kvp, nd, kvd, t_attn = attention
    tokens = (pc + nd).astype(np.float64)
    seqs = (nd + (pc > 0)).astype(np.float64)
    keep = (tokens >= 1) & (tokens <= max_tokens) & (seqs >= 1) & (seqs <= max_seqs)
    out_of_range = int(np.count_nonzero(~keep))
    if max_context is not None:
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
            raise ScenarioError("--max-context", max_context, "expected a whole number >= 1")
        keep &= (kvd <= max_context) & (kvp + pc <= max_context)

    def d(layer: str) -> np.ndarray:
        keys, values = dense[layer]
        return np.interp(tokens[keep], keys, values)

    def s(layer: str) -> np.ndarray:
        keys, values = per_seq[layer]
        return np.interp(seqs[keep], keys, values)

    per_layer = 2 * d("layernorm") + t_attn[keep]
    for layer in _LLAMA_DENSE:
        per_layer = per_layer + d(layer)
    step = (
        d("embedding") + num_layers * per_layer + d("final_layernorm") + s("lm_head") + s("sampler")
    )
    rows = []
    for i, (p, kp, n, kd, t) in enumerate(
        zip(pc[keep].tolist(), kvp[keep].tolist(), nd[keep].tolist(), kvd[keep].tolist(), step)
    ):
        kind = "mixed" if p and n else ("prefill" if p else "decode")
        rows.append(
            {
                "kind": kind,
                "prefill_tokens": p,
                "decode_requests": n,
                "decode_context": n * kd,
                "prefill_items": ((kp, p, kp + p),) if p else (),
                "time_us": float(t),
                "group": i,
                "tp": tp,
            }
        )
    if not rows:
        raise ScenarioError(str(folder), None, "no attention row within the profiled token range")
    hardware = str(meta.get("hardware", root.parent.parent.name))
    table = _table_from_rows(
        rows, source=str(root), fmt="llmservingsim-profile", model=model, hardware=hardware
    )
    table.notes.append(
        f"steps composed from per-layer kernel times of {num_layers} layers (LLMServingSim's llama "
        "sequence); host scheduling and launch gaps are not in them"
    )
    if out_of_range:
        table.notes.append(
            f"{out_of_range} attention rows beyond the profiled {int(max_tokens)} tokens / "
            f"{int(max_seqs)} sequences left out"
        )
    if max_context is not None:
        table.notes.append(f"only rows with at most {max_context} tokens of context per request")
    return table


def _tp_of(name: str) -> int:
    try:
        return int(name[2:])
    except ValueError:
        raise ScenarioError(name, name, "expected a tp<N> folder") from None


def _layer_table(file: Path, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if not file.is_file():
        raise ScenarioError(str(file), None, "no such file (LLMServingSim profile)")
    out: dict[str, list[tuple[float, float]]] = {}
    with file.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for column in ("layer", key, "time_us"):
            if column not in (reader.fieldnames or []):
                raise ScenarioError(f"{file}:1", reader.fieldnames, f"missing column {column}")
        for line, rec in enumerate(reader, start=2):
            try:
                out.setdefault(rec["layer"], []).append((float(rec[key]), float(rec["time_us"])))
            except (TypeError, ValueError):
                raise ScenarioError(
                    f"{file}:{line}", rec, f"expected numbers in {key} and time_us"
                ) from None
    table = {}
    for layer, pairs in out.items():
        pairs.sort()
        keys = np.asarray([p[0] for p in pairs])
        values = np.asarray([p[1] for p in pairs])
        table[layer] = (keys, values)
    return table


def _read_attention(file: Path) -> tuple[np.ndarray, ...]:
    if not file.is_file():
        raise ScenarioError(str(file), None, "no such file (LLMServingSim profile)")
    columns = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
    try:
        data = np.genfromtxt(file, delimiter=",", names=True, dtype=None, encoding="utf-8")
    except ValueError as exc:
        raise ScenarioError(str(file), None, f"malformed CSV ({exc})") from None
    names = data.dtype.names or ()
    missing = [c for c in columns if c not in names]
    if missing:
        raise ScenarioError(f"{file}:1", list(names), f"missing column(s) {', '.join(missing)}")
    out = tuple(np.atleast_1d(data[c]).astype(np.float64) for c in columns)
    pc, kvp, nd, kvd, t = out
    return pc.astype(np.int64), kvp.astype(np.int64), nd.astype(np.int64), kvd.astype(np.int64), t


def read_step_table(
    path: PathArg,
    *,
    model: str | None = None,
    hardware: str | None = None,
    tp: int | None = None,
    num_layers: int | None = None,
    max_context: int | None = None,
    llm: str | None = None,
) -> StepTable:
    """Read a step table, choosing the reader from what ``path`` is.

    A CSV with Splitwise's columns → :func:`read_splitwise`; an LLMServingSim ``perf/`` variant
    folder (or its ``meta.yaml`` or a ``tp<N>`` folder) → :func:`read_llmservingsim_profile`; an
    AIConfigurator database folder (``systems/data/<gpu>``, or a folder holding one) → steps of
    model ``llm`` composed by :func:`servesim.fidelity.aiconfigurator.read_aiconfigurator`.
    LLMServingSim ``v0`` ``layers.csv`` and AIConfigurator's CSV samples are refused with the
    reason (see ``docs/howto/calibrate.md``).
    """
    file = Path(path)
    if not file.exists():
        raise ScenarioError(str(file), None, "no such file or directory")
    if file.is_dir() and not (file / "meta.yaml").is_file() and any(file.glob("**/gemm")):
        from servesim.fidelity.aiconfigurator import read_aiconfigurator

        return read_aiconfigurator(file, llm=llm, tp=tp, max_context=max_context)
    if file.is_dir() or file.name == "meta.yaml":
        return read_llmservingsim_profile(
            file, tp=tp, num_layers=num_layers, max_context=max_context
        )
    try:
        with file.open(encoding="utf-8") as fh:
            header = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(file), None, f"cannot read the file ({exc})") from None
    columns = [c.strip() for c in header.split(",")]
    if "prompt_time" in columns and "token_time" in columns:
        return read_splitwise(file, model=model, hardware=hardware, tp=tp)
    if columns[:5] == ["layer_name", "input", "kv_cache", "tp_size", "latency(ns)"]:
        raise ScenarioError(
            str(file),
            None,
            "an LLMServingSim v0 layers.csv cannot be turned into step times honestly: its "
            "attention is profiled only with an empty KV cache (kv_cache 0), so decode steps "
            "would carry no context cost; give a perf/<hw>/<model>/<variant> profile instead",
        )
    if {"op_name", "latency"} <= set(columns):
        raise ScenarioError(
            str(file),
            None,
            "one AIConfigurator kernel table cannot price a step (it needs every GEMM of the "
            "model, attention at its batch and context, from one database), and the CSV samples "
            "are the first 2,000 rows of each table; give the database folder "
            "(aiconfigurator_core/systems/data/<gpu>, parquet) with --llm MODEL",
        )
    raise ScenarioError(
        str(file),
        header[:80],
        "unknown step table: expected Splitwise's perf_model.csv or an LLMServingSim "
        "perf/<hw>/<model>/<variant> folder",
    )


# ---------------------------------------------------------------------- step fits


def _fold_groups(group: np.ndarray, k: int) -> list[np.ndarray]:
    """Row masks of the held-out part of each fold: group ``g`` (in order of first appearance)
    is held out in fold ``g mod k``."""
    return [(group % k) == j for j in range(k)]


def _step_errors(
    table: StepTable, predicted: np.ndarray, mask: np.ndarray | None = None
) -> dict[str, float]:
    """Median and p90 |relative error| of each kind of step, over measured points: repeats of a
    point (one group) are averaged before comparing, so each point counts once."""
    rows = np.ones(table.n, dtype=bool) if mask is None else mask
    group = table.group[rows]
    ids, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
    measured = np.bincount(inverse, weights=table.time_us[rows]) / counts
    model = np.bincount(inverse, weights=predicted[rows]) / counts
    kinds = np.empty(ids.size, dtype=table.kind.dtype)
    kinds[inverse] = table.kind[rows]
    rel = np.abs(model / measured - 1.0)
    out: dict[str, float] = {}
    for name in ("prefill", "decode", "mixed"):
        pick = kinds == name
        if pick.any():
            out[f"{name}_step.median"] = float(np.median(rel[pick]))
            out[f"{name}_step.p90"] = float(np.percentile(rel[pick], 90))
    out["all_steps.median"] = float(np.median(rel))
    return out


def _kfold_linear(
    table: StepTable,
    design: np.ndarray,
    offset: np.ndarray,
    folds: int,
    coefficients: Callable[[np.ndarray], tuple[tuple[float, ...], tuple[float, ...]]],
    robust: bool = True,
) -> tuple[np.ndarray, list[FoldResult], dict[str, float] | None, str | None, list[str]]:
    """Fit ``time ≈ design · c + offset`` (c ≥ 0) by least squared log-ratios on all rows and per
    fold: each measured point (group of repeats) weighs as much as any other, and with
    ``robust`` Huber weights keep a few inconsistent points from dragging the fit."""
    y = table.time_us
    _, inverse, counts = np.unique(table.group, return_inverse=True, return_counts=True)
    weight = 1.0 / counts[inverse]

    def solve(mask: np.ndarray) -> np.ndarray:
        strata = table.kind[mask] if robust else None
        return _log_nnls(design[mask], offset[mask], y[mask], weight[mask], strata)

    everything = np.ones(table.n, dtype=bool)
    coef = solve(everything)
    notes: list[str] = []
    folds_out: list[FoldResult] = []
    heldout: dict[str, float] | None = None
    note: str | None = None
    groups = int(table.group.max()) + 1 if table.n else 0
    k = folds
    if k >= 2 and groups < 2:
        note = "held-out error unavailable: the table has a single measured point"
    elif k >= 2:
        if k > groups:
            notes.append(f"{k} folds asked for {groups} measured points: leave-one-out")
            k = groups
        predicted_all = np.empty(table.n)
        for j, held in enumerate(_fold_groups(table.group, k)):
            train = ~held
            c = solve(train)
            predicted = design @ c + offset
            predicted_all[held] = predicted[held]
            alpha, beta = coefficients(c)
            folds_out.append(
                FoldResult(
                    index=j,
                    train=[f"{np.unique(table.group[train]).size} points"],
                    heldout=[f"{np.unique(table.group[held]).size} points"],
                    alpha=alpha,
                    beta=beta,
                    train_error=_step_errors(table, predicted, train),
                    heldout_error=_step_errors(table, predicted, held),
                )
            )
        heldout = _step_errors(table, predicted_all)
    else:
        note = "held-out error not estimated: pass folds >= 2 (k-fold over measured points)"
    return coef, folds_out, heldout, note, notes


def fit_blackbox_to_steps(table: StepTable, *, folds: int = 5) -> CalibrationReport:
    """Fit β = (β0, β1, β2) of ``step = β0 + β1·prefill_tokens + β2·decode_requests`` to a step
    table of one (model, hardware, TP), by least squared log-ratios with β ≥ 0 (module doc).

    α is not observable in step times and is written as 0 (off). ``folds=k`` (≥ 2): k-fold over
    the table's measured points (repeats of a point stay together), reporting the median and p90
    absolute relative error of prefill, decode and mixed steps on training and held-out rows.
    """
    if len(table.tps) != 1:
        raise ScenarioError(
            "--tp",
            None,
            f"blackbox coefficients are per TP but the table holds tp {list(table.tps)}; choose one",
        )
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 0:
        raise ScenarioError("folds", folds, "expected a whole number >= 0")
    design = np.column_stack(
        [
            np.ones(table.n),
            table.prefill_tokens.astype(np.float64),
            table.decode_requests.astype(np.float64),
        ]
    )

    def as_coefficients(c: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return (0.0, 0.0, 0.0), tuple(float(x) for x in c)

    coef, fold_results, heldout, note, notes = _kfold_linear(
        table, design, np.zeros(table.n), folds, as_coefficients
    )
    predicted = design @ coef
    notes = [
        *table.notes,
        *notes,
        "alpha is not observable in step times: written as 0 (off); fit runs to calibrate it",
    ]
    fitted_on = {**table.describe(), "tp": table.tps[0]}
    return CalibrationReport(
        latency_model="blackbox",
        alpha=(0.0, 0.0, 0.0),
        beta=tuple(float(x) for x in coef),
        kind="steps",
        fitted_on=fitted_on,
        objective=STEP_OBJECTIVE,
        train_error=_step_errors(table, predicted),
        heldout_error=heldout,
        heldout_note=note,
        folds=fold_results,
        free=("beta0", "beta1", "beta2"),
        notes=notes,
    )


def _trained_basis(
    table: StepTable, llm: str, gpu: str, n_beta: int, needed: Iterable[int] | None = None
) -> tuple[np.ndarray, list[str]]:
    """Rows × betas: each trained-physics term with its beta set to 1 (µs); only the ``needed``
    columns are evaluated (the others stay 0)."""
    from servesim.latency.base import BatchSummary
    from servesim.latency.hardware import resolve_gpu
    from servesim.latency.modelindex import resolve_model
    from servesim.latency.trained import TrainedPhysicsLatencyModel

    spec = resolve_model(llm, "--llm").require_spec("--llm", "the trained-physics model")
    hardware = resolve_gpu(gpu, "--gpu")
    basis = np.zeros((table.n, n_beta))
    columns = range(n_beta) if needed is None else sorted(set(needed))
    for tp in table.tps:
        rows = np.flatnonzero(table.tp == tp)
        for i in columns:
            beta = [0.0] * n_beta
            beta[i] = _BASIS_SCALE
            model = TrainedPhysicsLatencyModel(
                spec, hardware, tp, alpha=(0.0, 0.0, 0.0), beta=beta, path="--llm"
            )
            for r in rows:
                summary = BatchSummary(
                    int(table.prefill_tokens[r]),
                    table.prefill_items[r],
                    int(table.decode_requests[r]),
                    int(table.decode_context[r]),
                )
                basis[r, i] = model.step_time_us(summary) / _BASIS_SCALE
    return basis, [spec.name, hardware.name]


def fit_trained_physics_to_steps(
    table: StepTable,
    *,
    llm: str | None = None,
    gpu: str | None = None,
    free: Iterable[str] | str | None = None,
    start_beta: Sequence[float] | None = None,
    folds: int = 5,
) -> CalibrationReport:
    """Fit the trained-physics β corrections to a step table (least squared log-ratios with
    β ≥ 0; the roofline terms are evaluated by the model itself, one beta at a time).

    ``llm``/``gpu`` name the servesim model and GPU whose roofline terms price the table's steps
    (defaults for Splitwise: :data:`SPLITWISE_LLM`, :data:`SPLITWISE_GPU`). ``free`` names the
    betas fitted (:data:`TRAINED_BETA_NAMES`; default :data:`DEFAULT_TRAINED_FREE`); the others
    keep ``start_beta`` (default: the bundled fit), and their terms are subtracted first. α is not
    observable in step times and is written as 0. All 11 betas are written.
    """
    from servesim.latency.trained import default_coefficients

    notes = list(table.notes)
    if llm is None:
        llm = SPLITWISE_LLM.get(table.model.lower())
        if llm is None:
            raise ScenarioError(
                "--llm",
                None,
                f"no bundled config known for {table.model}; give --llm (a servesim model name "
                "or a config.json path) whose layer shapes match it",
            )
        notes.append(
            f"{table.model} priced with the {llm} config (same layer shapes: 80 layers, hidden "
            "8192, 64 heads / 8 KV heads, FFN 28672; only the vocabulary differs, which the "
            "trained-physics terms do not use)"
        )
    if gpu is None:
        gpu = SPLITWISE_GPU.get(table.hardware.lower(), table.hardware)
        if table.hardware.lower().endswith("-pcap"):
            notes.append(
                f"{table.hardware} is power-capped; its roofline terms use {gpu}'s nominal peak rates"
            )
    n_beta = len(TRAINED_BETA_NAMES)
    free_index = _parse_free(
        DEFAULT_TRAINED_FREE if free is None else free, TRAINED_BETA_NAMES, "free"
    )
    base = list(default_coefficients()[1] if start_beta is None else start_beta)
    if len(base) != n_beta:
        raise ScenarioError(
            "start_beta", base, f"expected {n_beta} betas (the 11-term trained-physics form)"
        )
    fixed = [i for i in range(n_beta) if i not in free_index and base[i] != 0]
    basis, names = _trained_basis(table, llm, gpu, n_beta, [*free_index, *fixed])
    offset = basis[:, fixed] @ np.asarray([base[i] for i in fixed]) if fixed else np.zeros(table.n)
    design = basis[:, list(free_index)]
    weighted = design / table.time_us[:, None]
    rank = int(
        np.linalg.matrix_rank(weighted / np.maximum(np.linalg.norm(weighted, axis=0), 1e-300))
    )
    if rank < len(free_index):
        notes.append(
            f"the free terms {', '.join(TRAINED_BETA_NAMES[i] for i in free_index)} span only "
            f"{rank} independent directions over this table: their split is not identifiable"
        )
    for i in free_index:
        if not np.any(basis[:, i] > 1e-9):
            notes.append(
                f"{TRAINED_BETA_NAMES[i]}'s term is 0 on every row: its value is arbitrary"
            )

    def as_coefficients(c: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
        beta = list(base)
        for j, i in enumerate(free_index):
            beta[i] = float(c[j])
        return (0.0, 0.0, 0.0), tuple(beta)

    coef, fold_results, heldout, note, kfold_notes = _kfold_linear(
        table, design, offset, folds, as_coefficients
    )
    notes.extend(kfold_notes)
    _, beta = as_coefficients(coef)
    predicted = design @ coef + offset
    notes.append("alpha is not observable in step times: written as 0 (off)")
    held = [i for i in range(n_beta) if i not in free_index]
    if held:
        notes.append(
            "held at "
            + ("the bundled fit" if start_beta is None else "start_beta")
            + f": {', '.join(TRAINED_BETA_NAMES[i] for i in held)}"
        )
    fitted_on = {**table.describe(), "llm": names[0], "gpu": names[1]}
    return CalibrationReport(
        latency_model="trained-physics",
        alpha=(0.0, 0.0, 0.0),
        beta=beta,
        kind="steps",
        fitted_on=fitted_on,
        objective=STEP_OBJECTIVE,
        train_error=_step_errors(table, predicted),
        heldout_error=heldout,
        heldout_note=note,
        folds=fold_results,
        free=tuple(TRAINED_BETA_NAMES[i] for i in free_index),
        notes=notes,
    )


# ====================================================================== output


def write_coefficients(report: CalibrationReport, path: PathArg) -> Path:
    """Write ``report`` as a coefficients YAML (atomically: a temporary file, then a rename).

    A blackbox file is read by ``latency: {model: blackbox, file: PATH}``; a trained-physics
    file carries its ``scenario.latency`` mapping to paste into a scenario.
    """
    import servesim

    out = Path(path)
    body = report.to_dict()
    if report.latency_model == "overheads":
        return _write_overheads(report, body, out)
    data: dict[str, Any] = {
        "format": COEFFICIENTS_FILE_FORMAT,
        "model": body["model"],
        "alpha": body["alpha"],
        "beta": body["beta"],
    }
    if report.latency_model == "blackbox":
        data["units"] = BLACKBOX_UNITS
    else:
        data["units"] = {
            "alpha": ["us queueing", "us post-decode", "us per output token"],
            "beta": list(TRAINED_BETA_NAMES),
        }
        data["scenario"] = {"latency": report.latency_section()}
    data["fitted_on"] = body["fitted_on"]
    data["objective"] = body["objective"]
    data["errors"] = body["errors"]
    data["servesim_version"] = servesim.__version__
    data["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data["notes"] = body["notes"]
    text = (
        "# Latency coefficients fitted by `servesim calibrate`; use with\n"
        + (
            f"#   latency: {{model: blackbox, file: {out.name}}}\n"
            if report.latency_model == "blackbox"
            else "#   the `scenario.latency` mapping below as a scenario's latency section\n"
        )
        + yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=None, width=100)
    )
    return _write_atomically(out, text)


def _write_overheads(report: CalibrationReport, body: dict[str, Any], out: Path) -> Path:
    """An overheads file, read by ``latency: {model: overheads, base: ..., file: PATH}``."""
    import servesim
    from servesim.latency.overheads import OVERHEADS_FILE_FORMAT

    data = {
        "format": OVERHEADS_FILE_FORMAT,
        "model": "overheads",
        "first_token_us": float(report.alpha[0]),
        "step_us": float(report.beta[0]),
        "fitted_on": body["fitted_on"],
        "objective": body["objective"],
        "errors": body["errors"],
        "servesim_version": servesim.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "notes": body["notes"],
    }
    text = (
        "# Serving overheads fitted by `servesim calibrate --latency overheads`; use with\n"
        f"#   latency: {{model: overheads, base: <the latency model they were fitted on>, "
        f"file: {out.name}}}\n"
        + yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=None, width=100)
    )
    return _write_atomically(out, text)


def _write_atomically(out: Path, text: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(out, text)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    return value


def format_report(report: CalibrationReport) -> str:
    """Coefficients and a table of training vs held-out error per statistic."""
    lines = [
        f"{report.latency_model} coefficients fitted on "
        + (
            f"{len(report.fitted_on.get('runs', []))} run(s)"
            if report.kind == "runs"
            else f"{report.fitted_on.get('format')} step table {report.fitted_on.get('source')}"
        ),
        *(
            [
                f"  first-token overhead = {report.alpha[0]:.0f} us per request",
                f"  per-step overhead    = {report.beta[0]:.0f} us per step",
            ]
            if report.latency_model == "overheads"
            else [
                f"  alpha = [{', '.join(f'{x:.6g}' for x in report.alpha)}]",
                f"  beta  = [{', '.join(f'{x:.6g}' for x in report.beta)}]",
            ]
        ),
        f"  objective: {report.objective}",
    ]
    if report.evaluations is not None:
        lines.append(f"  final fit: {report.evaluations} evaluations, loss {report.loss:.4g}")
    lines.append("")
    if report.kind == "runs":
        lines.append(
            "  |simulated/measured - 1| of each statistic, median over runs (train: the final "
            "fit on all runs; held-out: each run predicted by the fold that left it out)"
        )
    else:
        lines.append(
            "  |model/measured - 1| over measured points, median and p90 (train: the final fit "
            "on all points; held-out: each point predicted by the fold that left it out)"
        )
    lines.append(f"  {'statistic':<22}{'train':>10}{'held-out':>10}")
    keys = list(report.train_error)
    for key in report.heldout_error or {}:
        if key not in keys:
            keys.append(key)
    for key in keys:
        train = report.train_error.get(key)
        held = (report.heldout_error or {}).get(key)
        lines.append(
            f"  {key:<22}{_pct(train):>10}{_pct(held) if report.heldout_error else 'n/a':>10}"
        )
    if report.heldout_note:
        lines.append(f"  {report.heldout_note}")
    for fold in report.folds:
        train_med = _overall(fold.train_error)
        held_med = _overall(fold.heldout_error)
        lines.append(
            f"  fold {fold.index}: held out {', '.join(fold.heldout)}: train {_pct(train_med)}, "
            f"held-out {_pct(held_med)} (median over statistics)"
        )
    for note in report.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _overall(errors: Mapping[str, float]) -> float | None:
    return float(np.median(list(errors.values()))) if errors else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


# ====================================================================== CLI


def add_calibrate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` command to the CLI's subparsers; dispatch it to
    :func:`cmd_calibrate`."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit latency-model coefficients to measured runs or step tables",
        description=(
            "Fit the blackbox alpha/beta coefficients by replaying measured runs (Nelder-Mead on "
            "the log-error of mean and p90 TTFT/TPOT/E2E); or, with --latency overheads, a "
            "first-token and a per-step serving overhead on top of each run's own latency model "
            "(grid + Nelder-Mead, |log-error|); or fit blackbox or trained-physics betas to a "
            "step table (least squared log-ratios, betas >= 0). Prints training and held-out "
            "(k-fold) errors and writes a file a scenario names with "
            "latency: {model: blackbox, file: FILE} or "
            "latency: {model: overheads, base: MODEL, file: FILE}."
        ),
    )
    p.add_argument(
        "measured",
        nargs="*",
        metavar="MEASURED",
        help="measured runs (DistServe .exp, LLMServingSim run folder, generic .csv)",
    )
    p.add_argument(
        "--steps",
        metavar="TABLE",
        help="a step table instead: Splitwise perf_model.csv, an LLMServingSim perf profile, "
        "or an AIConfigurator database folder (with --llm)",
    )
    p.add_argument("--model", help="step table: the model to select (Splitwise 'model')")
    p.add_argument("--hardware", help="step table: the hardware to select (Splitwise 'hardware')")
    p.add_argument("--tp", type=int, help="step table: the tensor parallelism to select")
    p.add_argument(
        "--latency",
        choices=("blackbox", "trained-physics", "overheads"),
        default="blackbox",
        help="latency model to fit (trained-physics: its beta corrections, from step tables or "
        "runs; overheads: runs only, a first-token and a per-step overhead on top of each run's "
        "own latency model)",
    )
    p.add_argument(
        "--llm",
        help="trained-physics, or an AIConfigurator database: servesim model whose layer shapes "
        "price the table",
    )
    p.add_argument("--gpu", help="trained-physics: servesim GPU whose peak rates price the table")
    p.add_argument(
        "--layers", type=int, help="LLMServingSim profile: number of layers (default: config)"
    )
    p.add_argument(
        "--max-context",
        type=int,
        metavar="TOKENS",
        help="LLMServingSim profile: keep steps with at most this context per request",
    )
    p.add_argument(
        "--folds",
        type=int,
        default=None,
        metavar="K",
        help="k-fold held-out error (over runs, or over measured points of a step table); "
        "default 0 for runs (each fold refits), 5 for step tables",
    )
    p.add_argument(
        "--max-evals",
        type=int,
        default=None,
        metavar="N",
        help="runs: objective evaluations per fit (each replays every training run); "
        "default 200 (blackbox), 60 (trained-physics); overheads: Nelder-Mead polish after its "
        "78-point grid, default 20",
    )
    p.add_argument(
        "--objective",
        default="ttft,tpot,e2e",
        help="runs: metrics matched (mean and p90 of each), from ttft, tpot, e2e",
    )
    p.add_argument(
        "--free",
        help="coefficients to fit (comma list; blackbox runs: alpha0..beta2, default all; "
        f"trained-physics: {','.join(TRAINED_BETA_NAMES)}, default "
        f"{','.join(DEFAULT_TRAINED_FREE)} for step tables, "
        f"{','.join(DEFAULT_TRAINED_RUN_FREE)} for runs)",
    )
    p.add_argument(
        "--start",
        metavar="VALUES",
        help="runs: start values, A0,A1,A2,B0,B1,B2 for blackbox (default: a guess from the measurements) or FIRST_TOKEN_US,STEP_US for overheads (default 0,0)",
    )
    p.add_argument(
        "--placement",
        metavar="cXYdZW",
        help="runs: placement of DistServe runs whose file names have none (e.g. c21d11), "
        "as in servesim validate",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="runs: a scenario field for every replay, as in servesim validate (e.g. "
        "model=llama-3.1-8b, engine.kv_blocks=4000 for a CSV that does not record them)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="coefficients file to write (default: calibrated.yaml)",
    )
    p.set_defaults(handler=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit, print the error table, write the coefficients file; returns 0."""
    measured = list(getattr(args, "measured", None) or [])
    steps = getattr(args, "steps", None)
    latency = getattr(args, "latency", "blackbox") or "blackbox"
    if bool(measured) == bool(steps):
        raise ScenarioError(
            "MEASURED",
            measured or None,
            "give measured runs or --steps TABLE (one of the two)",
        )
    folds = getattr(args, "folds", None)
    if steps and getattr(args, "set", None):
        raise ScenarioError(
            "--set",
            args.set,
            "--set changes the replays of measured runs; a step fit replays nothing",
        )
    if steps and latency == "overheads":
        raise ScenarioError(
            "--latency",
            latency,
            "serving overheads are what step tables cannot show; fit them from measured runs "
            "(MEASURED ...) instead of --steps",
        )
    if steps:
        table = read_step_table(
            steps,
            model=getattr(args, "model", None),
            hardware=getattr(args, "hardware", None),
            tp=getattr(args, "tp", None),
            num_layers=getattr(args, "layers", None),
            max_context=getattr(args, "max_context", None),
            llm=getattr(args, "llm", None),
        )
        k = 5 if folds is None else folds
        if latency == "trained-physics":
            report = fit_trained_physics_to_steps(
                table,
                llm=getattr(args, "llm", None),
                gpu=getattr(args, "gpu", None),
                free=getattr(args, "free", None),
                folds=k,
            )
        else:
            report = fit_blackbox_to_steps(table, folds=k)
    else:
        from servesim.fidelity.measured import needs_placement, read_measured

        placement = getattr(args, "placement", None)
        runs = [
            read_measured(m, placement=placement if needs_placement(m) else None) for m in measured
        ]
        overrides: dict[str, Any] = {}
        for option in getattr(args, "set", None) or []:
            from servesim.simcore.config import parse_set_option

            key, value = parse_set_option(option)
            overrides[key] = yaml.safe_load(value) if value != "" else ""
        start = getattr(args, "start", None)
        max_evals = getattr(args, "max_evals", None)
        objective = getattr(args, "objective", "ttft,tpot,e2e")
        if latency == "trained-physics":
            if start:
                raise ScenarioError(
                    "--start", start, "a trained-physics run fit starts at the bundled betas"
                )
            report = fit_trained_physics_to_runs(
                runs,
                folds=0 if folds is None else folds,
                free=getattr(args, "free", None),
                max_evals=60 if max_evals is None else max_evals,
                objective=objective,
                overrides=overrides,
            )
        elif latency == "overheads":
            if getattr(args, "free", None):
                raise ScenarioError(
                    "--free", args.free, "overheads fits both of its two values; remove --free"
                )
            begin = (0.0, 0.0)
            if start:
                begin = _parse_overhead_start(start)
            report = fit_overheads_to_runs(
                runs,
                folds=0 if folds is None else folds,
                start=begin,
                max_evals=20 if max_evals is None else max_evals,
                objective=objective,
                overrides=overrides,
            )
        else:
            start_values = None
            if start:
                start_values = _parse_start([s for s in start.split(",") if s.strip()])
            report = fit_blackbox_to_runs(
                runs,
                folds=0 if folds is None else folds,
                start=start_values,
                max_evals=200 if max_evals is None else max_evals,
                objective=objective,
                free=getattr(args, "free", None),
                overrides=overrides,
            )
    print(format_report(report))
    out = write_coefficients(report, getattr(args, "out", None) or "calibrated.yaml")
    if report.latency_model == "blackbox":
        print(f"wrote {out}; use it with  latency: {{model: blackbox, file: {out}}}")
    elif report.latency_model == "overheads":
        print(
            f"wrote {out}; use it with  latency: {{model: overheads, base: <the runs' latency "
            f"model>, file: {out}}}"
        )
    else:
        print(f"wrote {out}; its scenario.latency mapping is the latency section to use")
    return 0
