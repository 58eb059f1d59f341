"""Per-request arrays and latency statistics of a run record: percentiles, ITL gaps, the
vLLM benchmark metrics.

Latency statistics are in milliseconds: mean and p50/p90/p95/p99, with percentiles by linear
interpolation between closest ranks (``rank = p/100·(n−1)``), over completed requests. ITL
statistics are over every inter-token gap (not per-request means), computed from the per-instance
step log: a step of duration ``dt`` contributes ``dt + α2`` once per token whose previous token
ended as the step began; gaps spanning several steps are recorded individually.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def percentile(sorted_values: np.ndarray, p: float) -> float:
    """Linear interpolation between closest ranks over an ascending array (0 when empty)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = p / 100.0 * (n - 1)
    lo = int(np.floor(rank))
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """The percentile of the multiset in which ``values[i]`` occurs ``weights[i]`` times.

    Equal to :func:`percentile` over the expanded array, without expanding it.
    """
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    total = int(weights.sum())
    if total == 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    cumulative = np.cumsum(weights)  # cumulative[i] - 1 = last rank holding values[i]
    rank = p / 100.0 * (total - 1)
    lo = int(np.floor(rank))
    hi = min(lo + 1, total - 1)
    v_lo = values[np.searchsorted(cumulative, lo, side="right")]
    v_hi = values[np.searchsorted(cumulative, hi, side="right")]
    return float(v_lo + (v_hi - v_lo) * (rank - lo))


def latency_stats_ms(values_us: np.ndarray, prefix: str) -> dict[str, float]:
    values = np.sort(values_us.astype(np.float64)) / 1000.0
    out = {f"{prefix}_mean_ms": float(values.mean()) if len(values) else 0.0}
    for p in PERCENTILES:
        out[f"{prefix}_p{p}_ms"] = percentile(values, p)
    return out


def itl_gaps(record: Any) -> tuple[np.ndarray, np.ndarray]:
    """(gap values µs, multiplicities) over every inter-token gap of the run, α2 included."""
    values, weights = [], []
    for log, info in zip(record.step_logs, record.instances):
        alpha2 = info.get("alpha2_us", record.alpha2_us)
        if len(log):
            values.append(log.column("dt_us") + alpha2)
            weights.append(log.column("regular_tokens"))
            burst = log.column("burst_tokens")
            if burst.any():  # tokens delivered in the same step as the previous one (speculation)
                values.append(np.full(len(burst), alpha2, dtype=np.int64))
                weights.append(burst)
        irregular = (
            np.frombuffer(log.irregular_gaps_us, dtype=np.int64)
            if len(log.irregular_gaps_us)
            else None
        )
        if irregular is not None:
            values.append(irregular + alpha2)
            weights.append(np.ones(len(irregular), dtype=np.int64))
    if not values:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(values), np.concatenate(weights)


def request_arrays(record: Any) -> dict[str, np.ndarray]:
    """Every per-request column as a numpy array (ids in arrival order)."""
    table = record.requests
    arrays = {name: np.array(table.column(name)) for name in table.COLUMNS}
    order = np.argsort(arrays["id"], kind="stable")
    out = {name: values[order] for name, values in arrays.items()}
    pd_table = getattr(record, "pd_table", None)
    if pd_table is not None:
        # split requests' disaggregation timeline; -1 for requests served on one instance
        ids = out["id"]
        rows = np.searchsorted(ids, pd_table.column("id")) if len(ids) else np.zeros(0, np.int64)
        found = (rows < len(ids)) & (
            ids[np.minimum(rows, max(len(ids) - 1, 0))] == pd_table.column("id")
        )
        for name in pd_table.COLUMNS[1:]:
            column = np.full(len(ids), -1, np.int64)
            column[rows[found]] = pd_table.column(name)[found]
            out[name] = column
    return out


def vllm_benchmark_metrics(
    *,
    ttft: np.ndarray,
    tpot: np.ndarray,
    e2e: np.ndarray,
    gaps: np.ndarray,
    gap_weights: np.ndarray,
    input_tokens: int,
    output_tokens: int,
    completed: int,
    duration_s: float,
) -> dict[str, float]:
    """The summary under vLLM ``benchmark_serving``'s names, defined as it defines them.

    ``request_throughput``, ``output_throughput`` and ``total_token_throughput`` (input + output
    tokens of the completed requests) per second of the run; ``mean/median/std/p99`` of TTFT,
    of TPOT (per request, ``(E2E − TTFT)/(output − 1)``, over requests with more than one
    output token), of ITL (every inter-token gap of every request, so long requests weigh more)
    and of E2E latency (``e2el``), in ms. Inputs are µs; ``gaps`` occur ``gap_weights`` times.
    """
    out: dict[str, float] = {
        "request_throughput": completed / duration_s if completed else 0.0,
        "output_throughput": output_tokens / duration_s if completed else 0.0,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s if completed else 0.0,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2e)):
        ms = np.sort(np.asarray(values, dtype=np.float64)) / 1000.0
        out[f"mean_{name}_ms"] = float(ms.mean()) if len(ms) else 0.0
        out[f"median_{name}_ms"] = percentile(ms, 50)
        out[f"std_{name}_ms"] = float(ms.std()) if len(ms) else 0.0
        out[f"p99_{name}_ms"] = percentile(ms, 99)
    total = int(gap_weights.sum())
    ms = np.asarray(gaps, dtype=np.float64) / 1000.0
    mean = float((ms * gap_weights).sum() / total) if total else 0.0
    out["mean_itl_ms"] = mean
    out["median_itl_ms"] = weighted_percentile(ms, gap_weights, 50) if total else 0.0
    out["std_itl_ms"] = (
        float(np.sqrt(((ms - mean) ** 2 * gap_weights).sum() / total)) if total else 0.0
    )
    out["p99_itl_ms"] = weighted_percentile(ms, gap_weights, 99) if total else 0.0
    return out
