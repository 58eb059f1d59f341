"""The scipy solvers the fits use (imported only when a fit runs): non-negative least squares on log-ratios
(Nelder-Mead is in :mod:`servesim.fidelity.fits.runs`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from servesim.simcore.errors import ScenarioError


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
