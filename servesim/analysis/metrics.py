"""Per-request arrays and latency statistics of a run record: percentiles, ITL gaps, the
vLLM benchmark metrics.

Latency statistics are in milliseconds: mean and p50/p90/p95/p99, with percentiles by linear
interpolation between closest ranks (``rank = p/100·(n−1)``), over completed requests. ITL
statistics are over every inter-token gap (not per-request means), computed from the per-instance
step log: a step of duration ``dt`` contributes ``dt + α2`` once per token whose previous token
ended as the step began; gaps spanning several steps are recorded individually.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from servesim.components.record import STEP_COLUMNS
from servesim.policies.metrics import percentile

PERCENTILES = (50, 90, 95, 99)


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


def sorted_ms(values_us: np.ndarray, owned: bool = False) -> np.ndarray:
    """The values in ms, ascending: a float64 copy sorted and scaled in place (one copy held).
    ``owned``: the caller hands a float64 array over, to be sorted and scaled without a copy."""
    values = np.asarray(values_us, dtype=np.float64) if owned else np.array(values_us, np.float64)
    values.sort()
    values /= 1000.0
    return values


def stats_of_sorted_ms(values: np.ndarray, prefix: str) -> dict[str, float]:
    """Mean and :data:`PERCENTILES` of ascending values in ms (``{prefix}_mean_ms``, ...)."""
    out = {f"{prefix}_mean_ms": float(values.mean()) if len(values) else 0.0}
    for p in PERCENTILES:
        out[f"{prefix}_p{p}_ms"] = percentile(values, p)
    return out


def latency_stats_ms(values_us: np.ndarray, prefix: str) -> dict[str, float]:
    return stats_of_sorted_ms(sorted_ms(values_us), prefix)


def itl_gaps(record: Any) -> tuple[np.ndarray, np.ndarray]:
    """(distinct gap values µs, ascending; how often each occurs) over every inter-token gap of
    the run, α2 included.

    The multiset is built a slice of the step log at a time and kept as distinct values with
    counts, so a run of millions of steps costs the number of distinct step durations, not the
    number of steps; its percentiles and integer sums are those of the full list of gaps."""
    values: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for log, info in zip(record.step_logs, record.instances):
        alpha2 = info.get("alpha2_us", record.alpha2_us)
        for chunk in log.chunks(("dt_us", "regular_tokens", "burst_tokens")):
            gaps, counts = chunk["dt_us"] + alpha2, chunk["regular_tokens"]
            burst = int(chunk["burst_tokens"].sum())
            if burst:  # tokens delivered in the same step as the previous one (speculation)
                gaps = np.append(gaps, alpha2)
                counts = np.append(counts, burst)
            gaps, counts = _distinct(gaps, counts)
            values.append(gaps)
            weights.append(counts)
        if len(log.irregular_gaps_us):
            irregular = np.frombuffer(log.irregular_gaps_us, dtype=np.int64) + alpha2
            values.append(irregular)
            weights.append(np.ones(len(irregular), dtype=np.int64))
    if not values:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _distinct(np.concatenate(values), np.concatenate(weights))


def _distinct(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The multiset ``values`` (each ``weights`` times) as ascending distinct values and counts
    (values that occur 0 times dropped)."""
    keep = weights > 0
    unique, inverse = np.unique(values[keep], return_inverse=True)
    # float64 sums of integer counts are exact below 2**53 tokens
    counts = np.bincount(inverse.reshape(-1), weights=weights[keep], minlength=len(unique))
    return unique.astype(np.int64), counts.astype(np.int64)


class _NamedColumns(Mapping):
    """A mapping of columns read when asked for, whose names (``_keys``) are known up front:
    membership, iteration and length go by name only, since Mapping's defaults would read the
    columns (from disk, for a spilled run)."""

    _keys: tuple[str, ...]

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class RequestColumns(_NamedColumns):
    """Every per-request column of a run by name, in id order, read when asked for.

    A run whose table stayed in memory keeps each column once read (they are small); a run whose
    rows were spilled to disk reads the column from its file at each access and keeps nothing,
    so a reader holds only the columns it is using. Disaggregated runs add the split requests'
    timeline (:data:`~servesim.components.record.PD_COLUMNS`; -1 for requests served on one
    instance).
    """

    def __init__(self, record: Any) -> None:
        self._table = record.requests
        self._pd = getattr(record, "pd_table", None)
        self._keys = tuple(self._table.COLUMNS) + (
            tuple(self._pd.COLUMNS[1:]) if self._pd is not None else ()
        )
        self._cache: dict[str, np.ndarray] | None = None if self._table.spilled else {}
        self._pd_order: np.ndarray | None = None  # PD rows in id order, once a PD column is read
        self._pd_ids: np.ndarray | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._keys:
            raise KeyError(name)
        if self._cache is not None and name in self._cache:
            return self._cache[name]
        if name in self._table.COLUMNS:
            column = self._table.column(name)
        else:
            column = self._pd_column(name)
        if self._cache is not None:
            self._cache[name] = column
        return column

    def _pd_column(self, name: str) -> np.ndarray:
        return self._pd_rows(name, self["id"])

    def _pd_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """The PD column ``name`` for the requests ``ids`` (-1 for those served on one instance)."""
        if self._pd_order is None:
            pd_ids = self._pd.column("id")
            self._pd_order = np.argsort(pd_ids, kind="stable")
            self._pd_ids = pd_ids[self._pd_order]
        sorted_ids = self._pd_ids
        column = np.full(len(ids), -1, np.int64)
        if not len(sorted_ids):
            return column
        rows = np.searchsorted(sorted_ids, ids)
        found = (rows < len(sorted_ids)) & (
            sorted_ids[np.minimum(rows, len(sorted_ids) - 1)] == ids
        )
        column[found] = self._pd.column(name)[self._pd_order[rows[found]]]
        return column

    def chunks(self, names: tuple[str, ...], size: int) -> Iterator[dict[str, np.ndarray]]:
        """The named columns in id order, in slices of at most ``size`` rows: what a reader of a
        spilled run walks to hold one slice, not whole columns."""
        if self._cache is not None:  # in memory: slices of the (cached) columns cost nothing
            columns = {name: self[name] for name in names}
            for start in range(0, len(self._table), size):
                yield {name: column[start : start + size] for name, column in columns.items()}
            return
        for name in names:
            if name not in self._keys:
                raise KeyError(name)
        own = tuple(n for n in names if n in self._table.COLUMNS)
        pd = tuple(n for n in names if n not in self._table.COLUMNS)
        if pd and "id" not in own:
            own += ("id",)
        for chunk in self._table.chunks(own, size):
            for name in pd:
                chunk[name] = self._pd_rows(name, chunk["id"])
            yield chunk


class StepColumns(_NamedColumns):
    """One instance's step log by column (and its ``blocked_us`` instants), read when asked for:
    what the auditor reads, without copying every column of a long run at once."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self._keys = tuple(STEP_COLUMNS) + ("blocked_us",)

    def __getitem__(self, name: str) -> np.ndarray:
        if name == "blocked_us":
            return np.array(self._log.blocked_us, dtype=np.int64)
        if name not in self._keys:
            raise KeyError(name)
        return self._log.column(name)

    @property
    def rows(self) -> int:
        """How many steps the log holds (without reading a column)."""
        return len(self._log)

    def chunks(self, names: tuple[str, ...], size: int) -> Iterator[dict[str, np.ndarray]]:
        """The named columns in step order, in slices of at most ``size`` steps."""
        return self._log.chunks(names, size)


def request_arrays(record: Any) -> RequestColumns:
    """Every per-request column as a numpy array (ids ascending), read lazily."""
    return RequestColumns(record)


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
    The summary builds the same figures a column at a time from the pieces below.
    """
    out = vllm_throughputs(input_tokens, output_tokens, completed, duration_s)
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2e)):
        out.update(vllm_stats(name, sorted_ms(values)))
    out.update(vllm_itl_stats(gaps, gap_weights))
    return out


def vllm_throughputs(
    input_tokens: int, output_tokens: int, completed: int, duration_s: float
) -> dict[str, float]:
    """Requests, output tokens and all tokens of the completed requests per second."""
    return {
        "request_throughput": completed / duration_s if completed else 0.0,
        "output_throughput": output_tokens / duration_s if completed else 0.0,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s if completed else 0.0,
    }


def vllm_stats(name: str, ms: np.ndarray) -> dict[str, float]:
    """``mean/median/std/p99`` of ascending values in ms, under vLLM's names."""
    return {
        f"mean_{name}_ms": float(ms.mean()) if len(ms) else 0.0,
        f"median_{name}_ms": percentile(ms, 50),
        f"std_{name}_ms": float(ms.std()) if len(ms) else 0.0,
        f"p99_{name}_ms": percentile(ms, 99),
    }


def vllm_itl_stats(gaps: np.ndarray, gap_weights: np.ndarray) -> dict[str, float]:
    """``mean/median/std/p99`` of every inter-token gap (µs values occurring ``gap_weights``
    times), in ms."""
    total = int(gap_weights.sum())
    ms = np.asarray(gaps, dtype=np.float64) / 1000.0
    mean = float((ms * gap_weights).sum() / total) if total else 0.0
    return {
        "mean_itl_ms": mean,
        "median_itl_ms": weighted_percentile(ms, gap_weights, 50) if total else 0.0,
        "std_itl_ms": float(np.sqrt(((ms - mean) ** 2 * gap_weights).sum() / total))
        if total
        else 0.0,
        "p99_itl_ms": weighted_percentile(ms, gap_weights, 99) if total else 0.0,
    }
