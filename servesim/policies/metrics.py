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
    "class_names_by_code",
    "class_stats",
    "gap_weighted_mean",
    "slo_limits",
    "SloTally",
]

DEFAULT_CLASS = "default"
TARGET_DIMENSIONS = ("ttft_ms", "itl_ms", "e2e_ms")


def percentile(sorted_values: np.ndarray, p: float) -> float:
    """Linear interpolation between closest ranks over an ascending array (0 when empty): the
    rule of every percentile servesim reports (``servesim.analysis.metrics`` uses this one)."""
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


def class_names_by_code(class_names: Sequence[str]) -> np.ndarray:
    """The class name of each integer code (empty names as ``default``), to index by codes."""
    return np.array([_class_name(n) for n in class_names] or [DEFAULT_CLASS], dtype=object)


def _labels(class_codes: Any, class_names: Sequence[str] | None) -> np.ndarray:
    codes = np.asarray(class_codes)
    if class_names is not None:
        names = class_names_by_code(class_names)
        return names[codes.astype(np.int64)] if codes.size else np.array([], dtype=object)
    return np.array([_class_name(c) for c in codes.tolist()], dtype=object)


def class_stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    """``{prefix}_mean_ms``, ``_p50_ms`` and ``_p99_ms`` of one class's values (NaN entries, requests
    without that figure, skipped; 0 when none is left). The mean is over the values in the order
    given; the percentiles sort a copy of them in place, so one column is held twice at most."""
    nan = np.isnan(values)
    kept = values[~nan] if nan.any() else np.array(values, dtype=float)
    out = {f"{prefix}_mean_ms": float(kept.mean()) if kept.size else 0.0}
    kept.sort()
    out[f"{prefix}_p50_ms"] = percentile(kept, 50)
    out[f"{prefix}_p99_ms"] = percentile(kept, 99)
    return out


def gap_weighted_mean(itl_ms: np.ndarray, gaps: np.ndarray) -> float:
    """The mean over every inter-token gap of a class's requests: each request's mean gap
    ``itl_ms`` weighs its number of gaps (requests without a gap, NaN or 0 gaps, skipped)."""
    has_gap = np.isfinite(itl_ms) & (gaps > 0)
    total = float(gaps[has_gap].sum())
    return float((itl_ms[has_gap] * gaps[has_gap]).sum() / total) if total else 0.0


def slo_limits(targets: Mapping[str, Mapping[str, float | None]]) -> dict[str, dict[str, float]]:
    """The configured limits per class (classes without any left out), checked for unknown
    dimensions."""
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
    return limits


class SloTally:
    """Per class with targets: completed requests, good ones, and those meeting each limit.

    Counts add up, so a long run is tallied a slice of requests at a time (:meth:`add`) and
    gives the same figures as one pass over every request."""

    def __init__(self, targets: Mapping[str, Mapping[str, float | None]]) -> None:
        self.limits = slo_limits(targets)
        self.completed = dict.fromkeys(self.limits, 0)
        self.good = dict.fromkeys(self.limits, 0)
        self.meets = {name: dict.fromkeys(dims, 0) for name, dims in self.limits.items()}

    def add(self, ttft_ms: Any, itl_ms: Any, e2e_ms: Any, labels: np.ndarray) -> None:
        """Count completed requests (their class names ``labels``); ``itl_ms`` NaN (no gap) meets
        any ITL limit."""
        values = {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "e2e_ms": e2e_ms}
        for name, dims in self.limits.items():
            mask = labels == name
            good = mask.copy()
            for dim, limit in dims.items():
                column = values[dim]
                meets = column <= limit
                if dim == "itl_ms":
                    meets |= np.isnan(column)
                meets &= mask
                self.meets[name][dim] += int(meets.sum())
                good &= meets
            self.completed[name] += int(mask.sum())
            self.good[name] += int(good.sum())

    def result(
        self,
        injected_per_class: Mapping[str, int],
        duration_s: float,
        latency: Mapping[str, Mapping[str, float]],
    ) -> dict[str, Any]:
        """What :func:`goodput` returns; ``latency``: per class, the ``ttft_p99_ms``,
        ``tpot_mean_ms`` and ``e2e_p99_ms`` of its completed requests (absent: none)."""
        injected: dict[str, int] = {}
        for name, count in injected_per_class.items():
            key = _class_name(name)
            injected[key] = injected.get(key, 0) + int(count)
        rate = 1.0 / duration_s if duration_s > 0 else 0.0
        per_class: dict[str, dict[str, Any]] = {}
        total_good = total_injected = 0
        for name in sorted(self.limits):
            completed, n_good = self.completed[name], self.good[name]
            n_injected = injected.get(name, 0)
            total_good += n_good
            total_injected += n_injected
            stats = latency.get(name, {})
            per_class[name] = {
                "slo_attainment": n_good / n_injected if n_injected else 0.0,
                "count": n_injected,
                "completed": completed,
                "good": n_good,
                "goodput_rps": n_good * rate,
                "slo_attainment_by_dim": {
                    dim: float(count) / completed if completed else 0.0
                    for dim, count in self.meets[name].items()
                },
                "ttft_p99_ms": stats.get("ttft_p99_ms", 0.0),
                "tpot_mean_ms": stats.get("tpot_mean_ms", 0.0),  # per request, as itl targets
                "e2e_p99_ms": stats.get("e2e_p99_ms", 0.0),
            }
        return {
            "slo_attainment": total_good / total_injected if total_injected else 0.0,
            "goodput_rps": total_good * rate,
            "good": total_good,
            "injected": total_injected,
            "per_class": per_class,
        }


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
    tally = SloTally(targets)
    tally.add(ttft[done], itl[done], e2e[done], labels[done])
    latency = {}
    for name in tally.limits:
        mask = done & (labels == name)
        latency[name] = {
            "ttft_p99_ms": class_stats("ttft", ttft[mask])["ttft_p99_ms"],
            "tpot_mean_ms": class_stats("tpot", itl[mask])["tpot_mean_ms"],
            "e2e_p99_ms": class_stats("e2e", e2e[mask])["e2e_p99_ms"],
        }
    return tally.result(injected_per_class, duration_s, latency)


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
            row.update(class_stats(prefix, column[mask]))
        row["itl_mean_ms"] = gap_weighted_mean(itl[mask], weights[mask])
        out[name] = row
    return out
