"""Control-plane metrics (spec §7.4): SLO goodput, per-class latency, Jain fairness.

Pure functions over per-request numpy arrays (one entry per injected or completed request, as
the caller chooses; ``completed_mask`` says which completed). Latencies are in milliseconds. A
request's class is ``class_codes[i]``: either the class name itself, or an integer code with
``class_names[code]`` its name. An empty class name counts as ``default``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_CLASS",
    "TARGET_DIMENSIONS",
    "percentile",
    "jain_index",
    "goodput",
    "per_class_latency",
]

DEFAULT_CLASS = "default"
TARGET_DIMENSIONS = ("ttft_ms", "itl_ms", "e2e_ms")


def percentile(sorted_values: np.ndarray, p: float) -> float:
    """Linear interpolation between closest ranks over an ascending array (0 when empty); the
    same rule as ``servesim.analysis.metrics.percentile``."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = p / 100.0 * (n - 1)
    lo = int(np.floor(rank))
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def jain_index(values: Any) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``: 1 when all equal, 1/n when one takes all.
    All zero → 1; no values → 0."""
    x = np.asarray(values, dtype=float).ravel()
    n = x.size
    if n == 0:
        return 0.0
    squares = float(np.dot(x, x))
    if squares == 0.0:
        return 1.0
    total = float(x.sum())
    return total * total / (n * squares)


def _class_name(name: Any) -> str:
    name = str(name) if name is not None else ""
    return name or DEFAULT_CLASS


def _labels(class_codes: Any, class_names: Sequence[str] | None) -> np.ndarray:
    codes = np.asarray(class_codes)
    if class_names is not None:
        names = np.array([_class_name(n) for n in class_names] or [DEFAULT_CLASS], dtype=object)
        return names[codes.astype(np.int64)] if codes.size else np.array([], dtype=object)
    return np.array([_class_name(c) for c in codes.tolist()], dtype=object)


def _mean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else 0.0


def _p(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return percentile(np.sort(values), q)


def goodput(
    ttft_ms: Any,
    itl_ms: Any,
    e2e_ms: Any,
    completed_mask: Any,
    class_codes: Any,
    targets: Mapping[str, Mapping[str, float | None]],
    injected_per_class: Mapping[str, int],
    duration_s: float,
    class_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """SLO attainment and goodput over the classes that have targets (spec §7.4).

    ``targets`` maps a class to its limits ``{ttft_ms, itl_ms, e2e_ms}`` (absent or None = not
    checked). A completed request is *good* iff it meets every configured limit (TTFT, its mean
    ITL — NaN, i.e. no inter-token gap, meets any limit — and E2E). The denominator is the number
    of requests *injected* per class (``injected_per_class``), so rejected, dropped and timed-out
    requests count as misses. Returns ``slo_attainment = Σgood/Σinjected``, ``goodput_rps =
    Σgood/duration_s``, the totals, and per class ``slo_attainment``, ``count`` (injected),
    ``completed``, ``good``, ``goodput_rps``, ``slo_attainment_by_dim`` (fraction of the class's
    completed requests meeting each configured limit), ``ttft_p99_ms``, ``tpot_mean_ms`` (each
    request's mean inter-token gap, averaged: what an ``itl`` target is judged on) and
    ``e2e_p99_ms`` (over its completed requests). Classes are listed in sorted order.
    """
    ttft = np.asarray(ttft_ms, dtype=float)
    itl = np.asarray(itl_ms, dtype=float)
    e2e = np.asarray(e2e_ms, dtype=float)
    done = np.asarray(completed_mask, dtype=bool)
    labels = _labels(class_codes, class_names)
    if not (ttft.shape == itl.shape == e2e.shape == done.shape == labels.shape):
        raise ValueError(
            "goodput: ttft_ms, itl_ms, e2e_ms, completed_mask and class_codes must have one entry "
            f"per request (shapes {ttft.shape}, {itl.shape}, {e2e.shape}, {done.shape}, {labels.shape})"
        )
    injected: dict[str, int] = {}
    for name, count in injected_per_class.items():
        key = _class_name(name)
        injected[key] = injected.get(key, 0) + int(count)
    limits: dict[str, dict[str, float]] = {}
    for name, dims in targets.items():
        unknown = sorted(set(dims) - set(TARGET_DIMENSIONS))
        if unknown:
            raise ValueError(
                f"goodput: class {name!r} has unknown target(s) {unknown}; "
                f"use {', '.join(TARGET_DIMENSIONS)}"
            )
        configured = {d: float(v) for d, v in dims.items() if v is not None}
        if configured:
            limits[_class_name(name)] = configured
    values = {"ttft_ms": ttft, "itl_ms": itl, "e2e_ms": e2e}
    rate = 1.0 / duration_s if duration_s > 0 else 0.0
    per_class: dict[str, dict[str, Any]] = {}
    total_good = total_injected = 0
    for name in sorted(limits):
        mask = done & (labels == name)
        completed = int(mask.sum())
        good = mask.copy()
        by_dim = {}
        for dim, limit in limits[name].items():
            column = values[dim]
            meets = column <= limit
            if dim == "itl_ms":
                meets |= np.isnan(column)
            meets &= mask
            by_dim[dim] = float(meets.sum()) / completed if completed else 0.0
            good &= meets
        n_good = int(good.sum())
        n_injected = injected.get(name, 0)
        total_good += n_good
        total_injected += n_injected
        per_class[name] = {
            "slo_attainment": n_good / n_injected if n_injected else 0.0,
            "count": n_injected,
            "completed": completed,
            "good": n_good,
            "goodput_rps": n_good * rate,
            "slo_attainment_by_dim": by_dim,
            "ttft_p99_ms": _p(ttft[mask], 99),
            "tpot_mean_ms": _mean(itl[mask]),  # per request, as the itl target judges it
            "e2e_p99_ms": _p(e2e[mask], 99),
        }
    return {
        "slo_attainment": total_good / total_injected if total_injected else 0.0,
        "goodput_rps": total_good * rate,
        "good": total_good,
        "injected": total_injected,
        "per_class": per_class,
    }


def per_class_latency(
    ttft_ms: Any,
    itl_ms: Any,
    e2e_ms: Any,
    completed_mask: Any,
    class_codes: Any,
    class_names: Sequence[str] | None = None,
    gaps: Any = None,
) -> dict[str, dict[str, float]]:
    """Per SLO class (sorted; classes with no completed request omitted): ``count`` of completed
    requests; the ``mean``, ``p50`` and ``p99`` of TTFT and E2E (``ttft_mean_ms`` etc.); of
    TPOT, each request's mean inter-token gap ``itl_ms`` (``tpot_mean_ms``, ...; NaN entries,
    requests without a gap, are skipped); and ``itl_mean_ms``, the mean over every inter-token
    gap of the class's requests (each request weighs its ``gaps``, its output tokens − 1 — the
    summary's top-level ``itl_mean_ms`` defined per class; without ``gaps``, every request
    weighs the same). ITL percentiles over every gap need the gaps themselves, which the run
    does not record per class, so there are none per class."""
    ttft = np.asarray(ttft_ms, dtype=float)
    itl = np.asarray(itl_ms, dtype=float)
    e2e = np.asarray(e2e_ms, dtype=float)
    done = np.asarray(completed_mask, dtype=bool)
    weights = np.ones(len(itl)) if gaps is None else np.asarray(gaps, dtype=float)
    labels = _labels(class_codes, class_names)
    out: dict[str, dict[str, float]] = {}
    for name in sorted(set(labels[done].tolist())):
        mask = done & (labels == name)
        row: dict[str, float] = {"count": int(mask.sum())}
        for prefix, column in (("ttft", ttft), ("tpot", itl), ("e2e", e2e)):
            selected = column[mask]
            row[f"{prefix}_mean_ms"] = _mean(selected)
            row[f"{prefix}_p50_ms"] = _p(selected, 50)
            row[f"{prefix}_p99_ms"] = _p(selected, 99)
        has_gap = mask & np.isfinite(itl) & (weights > 0)
        total = float(weights[has_gap].sum())
        row["itl_mean_ms"] = (
            float((itl[has_gap] * weights[has_gap]).sum() / total) if total else 0.0
        )
        out[name] = row
    return out
