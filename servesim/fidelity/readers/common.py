"""The shape every measured-run reader fills (:class:`MeasuredRun`), :func:`summarize`, and
the record checks and conversions the readers share."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from servesim.simcore.errors import ScenarioError

PathArg = str | PathLike[str]
UNKNOWN = -1.0
"""Latency value meaning "not measured"."""
CONSISTENCY_TOLERANCE_MS = 1.0
"""How far a reported ``ttft_ms``/``latency_ms``/``tpot_ms`` may stray from its timestamps."""


def _array(dtype: type) -> Callable[[Any], np.ndarray]:
    def convert(value: Any) -> np.ndarray:
        return np.asarray(value, dtype=dtype)

    return convert


@attrs.define(eq=False, kw_only=True)
class MeasuredRun:
    """One measured serving run: per-request arrays plus what is known of the server."""

    name: str
    source: str
    system: str
    arrival_us: np.ndarray = attrs.field(converter=_array(np.int64))
    input_tokens: np.ndarray = attrs.field(converter=_array(np.int64))
    output_tokens: np.ndarray = attrs.field(converter=_array(np.int64))
    ttft_us: np.ndarray = attrs.field(converter=_array(np.float64))
    e2e_us: np.ndarray = attrs.field(converter=_array(np.float64))
    tpot_us: np.ndarray = attrs.field(converter=_array(np.float64))
    queued_us: np.ndarray | None = attrs.field(
        default=None, converter=attrs.converters.optional(_array(np.float64))
    )
    request_ids: tuple[str, ...] = ()
    # ---- server settings (None = unknown)
    model: str | None = None
    model_config: str | None = None
    gpu: str | None = None
    engine_version: str | None = None
    dtype: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    expert_parallel: bool | None = None
    num_instances: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_blocks: int | None = None
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    prefill_tp: int | None = None
    prefill_pp: int | None = None
    decode_tp: int | None = None
    decode_pp: int | None = None
    request_rate: float | None = None
    """Nominal offered rate (req/s) as the run was configured; see :meth:`measured_rate`."""
    clock: str = attrs.field(default="client", validator=attrs.validators.in_(("client", "engine")))
    """Where the run's times were taken. ``client``: from the request's sending to its tokens'
    receipt, so the server's front end (HTTP, tokenising, streaming) is inside TTFT and E2E.
    ``engine``: from the engine's queue to the engine's token outputs (vLLM v1's ``queued_ts`` …
    ``last_token_ts``), so the front end is outside them and a replay must not add it."""
    # ---- provenance
    reported: dict[str, float] = attrs.field(factory=dict)
    """Summary figures the source itself reported (its own means/percentiles), for cross-checks."""
    extra: dict[str, Any] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    inferred: list[str] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        n = len(self.arrival_us)
        arrays = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "ttft_us": self.ttft_us,
            "e2e_us": self.e2e_us,
            "tpot_us": self.tpot_us,
        }
        if self.queued_us is not None:
            arrays["queued_us"] = self.queued_us
        for field, values in arrays.items():
            if values.shape != (n,):
                raise ValueError(
                    f"MeasuredRun {self.name}: {field} has shape {values.shape}, not ({n},)"
                )
        if self.request_ids and len(self.request_ids) != n:
            raise ValueError(
                f"MeasuredRun {self.name}: {len(self.request_ids)} request ids for {n} requests"
            )

    @property
    def n(self) -> int:
        """Number of requests."""
        return len(self.arrival_us)

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode ran on separate instances (DistServe)."""
        return self.prefill_tp is not None or self.decode_tp is not None

    def measured_rate(self) -> float | None:
        """Requests per second over the arrival span, (n − 1) / span; None below 2 requests."""
        if self.n < 2 or self.arrival_us[-1] <= self.arrival_us[0]:
            return None
        return (self.n - 1) / ((int(self.arrival_us[-1]) - int(self.arrival_us[0])) / 1e6)

    def metrics(self) -> dict[str, dict[str, float | int | None]]:
        """:func:`summarize` of TTFT, TPOT, E2E (and queueing when known), in milliseconds."""
        out = {
            "ttft_ms": summarize(_ms(self.ttft_us)),
            "tpot_ms": summarize(_ms(self.tpot_us)),
            "e2e_ms": summarize(_ms(self.e2e_us)),
        }
        if self.queued_us is not None:
            out["queued_ms"] = summarize(_ms(self.queued_us))
        return out

    def settings(self) -> dict[str, Any]:
        """The known server settings (None fields left out), for reports."""
        names = (
            "model", "model_config", "gpu", "engine_version", "dtype", "tp", "pp", "dp",
            "expert_parallel", "num_instances", "max_num_seqs", "max_num_batched_tokens",
            "kv_blocks", "block_size", "kv_capacity_tokens", "prefill_tp", "prefill_pp",
            "decode_tp", "decode_pp", "request_rate",
        )  # fmt: skip
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def write_trace_csv(self, path: PathArg) -> Path:
        """Write the arrivals and lengths as a servesim ``csv`` trace (``arrival_us, input_tokens,
        output_tokens``), to replay this run's workload in a simulation."""
        out = Path(path)
        with out.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["arrival_us", "input_tokens", "output_tokens"])
            writer.writerows(
                zip(
                    self.arrival_us.tolist(),
                    self.input_tokens.tolist(),
                    self.output_tokens.tolist(),
                )
            )
        return out

    def __repr__(self) -> str:
        return (
            f"MeasuredRun(name={self.name!r}, system={self.system!r}, n={self.n}, "
            f"source={self.source!r})"
        )


def _ms(values_us: np.ndarray) -> np.ndarray:
    return np.where(values_us >= 0, values_us / 1000.0, UNKNOWN)


def summarize(values: Iterable[float] | np.ndarray) -> dict[str, float | int | None]:
    """``count``, ``mean``, ``p50``, ``p90``, ``p95``, ``p99`` of the known values.

    Negative values (the ``-1`` unknown marker) and NaN are ignored; percentiles interpolate
    linearly (numpy's default). With no known value every statistic is None.
    """
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    arr = arr.ravel()
    known = arr[np.isfinite(arr) & (arr >= 0)]
    if known.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    p50, p90, p95, p99 = np.percentile(known, [50, 90, 95, 99])
    return {
        "count": int(known.size),
        "mean": float(known.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
    }


class _Bad(Exception):
    """A bad field in a record; turned into a ScenarioError naming file, line and record."""

    def __init__(self, field: str, value: Any, what: str):
        super().__init__(field)
        self.field = field
        self.value = value
        self.what = what


def _require(rec: Mapping[str, Any], fields: Iterable[str]) -> None:
    """Every one of ``fields`` is in the record, else a :class:`_Bad` naming the first missing."""
    fields = tuple(fields)
    missing = [k for k in fields if k not in rec]
    if missing:
        raise _Bad(
            missing[0],
            None,
            f"missing; every record needs {', '.join(fields)} (missing: {', '.join(missing)})",
        )


def _number(rec: Mapping[str, Any], key: str, *, minimum: float = 0.0) -> float:
    if key not in rec:
        raise _Bad(key, None, "missing")
    value = rec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(key, value, f"expected a number >= {minimum:g}")
    value = float(value)
    if not math.isfinite(value):
        raise _Bad(key, value, "expected a finite number (not NaN or infinity)")
    if value < minimum:
        raise _Bad(key, value, f"must be >= {minimum:g}")
    return value


def _count(rec: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    value = _number(rec, key, minimum=minimum)
    if value != int(value):
        raise _Bad(key, rec[key], "expected a whole number of tokens")
    return int(value)


def _ordered(rec: Mapping[str, Any], times: Iterable[tuple[str, float | None]]) -> None:
    """Timestamps must not decrease in the given order (None = absent, skipped)."""
    previous: tuple[str, float] | None = None
    for key, value in times:
        if value is None:
            continue
        if previous is not None and value < previous[1]:
            raise _Bad(
                key,
                rec.get(key, value),
                f"earlier than {previous[0]} ({previous[1]!r}); the times must not decrease",
            )
        previous = (key, value)


def _agrees(
    rec: Mapping[str, Any], key: str, reported_ms: float, derived_ms: float, how: str
) -> None:
    if abs(reported_ms - derived_ms) > CONSISTENCY_TOLERANCE_MS:
        raise _Bad(
            key,
            rec.get(key),
            f"disagrees with {how} = {derived_ms:.3f} ms (more than "
            f"{CONSISTENCY_TOLERANCE_MS:g} ms apart)",
        )


def _record_error(where: str, index: int, err: _Bad) -> ScenarioError:
    return ScenarioError(where, err.value, f"record {index}, field {err.field}: {err.what}")


def _sorted_by_arrival(times: np.ndarray) -> tuple[np.ndarray, int]:
    """Stable arrival order and the number of records that came earlier than their predecessor."""
    order = np.argsort(times, kind="stable")
    out_of_order = int(np.count_nonzero(np.diff(times) < 0)) if times.size > 1 else 0
    return order, out_of_order


def _tpot_us(ttft_us: np.ndarray, e2e_us: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    ok = (output_tokens >= 2) & (ttft_us >= 0) & (e2e_us >= 0)
    tpot = np.full(ttft_us.shape, UNKNOWN)
    tpot[ok] = (e2e_us[ok] - ttft_us[ok]) / (output_tokens[ok] - 1)
    return tpot


def _relative_us(seconds: np.ndarray) -> np.ndarray:
    return (
        np.rint((seconds - seconds[0]) * 1e6).astype(np.int64)
        if seconds.size
        else seconds.astype(np.int64)
    )


RecordCheck = Callable[[int, Mapping[str, Any], Mapping[str, float | None], int], None]
"""``check(index, record, times, output_tokens)``: a reader's own test of one record, after its
token counts and timestamps passed; raises :class:`_Bad` to refuse it."""


def _timed_columns(
    records: Sequence[tuple[int, Mapping[str, Any]]],
    where: PathArg,
    required: Sequence[str],
    tokens: tuple[str, str],
    times: Sequence[tuple[str, str]],
    check: RecordCheck | None = None,
) -> dict[str, np.ndarray]:
    """The ``(line, record)`` pairs' token counts and timestamps (seconds) as columns named as
    :func:`_run_from_timestamps` takes them, so a reader only says which field is which.

    Every record needs all of ``required``; ``tokens`` names its input and output token
    fields; ``times`` pairs each time column (``arrival_s``, ``scheduled_s``, ...) with its
    field, in the order the times must not decrease. A time field outside ``required`` may be
    absent (NaN in its column). A bad record raises a ScenarioError naming ``where:line``, the
    record's index and the field.
    """
    n = len(records)
    inputs = np.empty(n, dtype=np.int64)
    outputs = np.empty(n, dtype=np.int64)
    columns = {column: np.full(n, np.nan) for column, _ in times}
    for i, (line, rec) in enumerate(records):
        try:
            _require(rec, required)
            inputs[i] = _count(rec, tokens[0])
            outputs[i] = _count(rec, tokens[1])
            values = {
                column: _number(rec, key) if key in required or key in rec else None
                for column, key in times
            }
            _ordered(rec, [(key, values[column]) for column, key in times])
            if check is not None:
                check(i, rec, values, int(outputs[i]))
        except _Bad as err:
            raise _record_error(f"{where}:{line}", i, err) from None
        for column, value in values.items():
            if value is not None:
                columns[column][i] = value
    return {"input_tokens": inputs, "output_tokens": outputs, **columns}


def _run_from_timestamps(
    *,
    arrival_s: np.ndarray,
    first_token_s: np.ndarray,
    last_token_s: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    request_ids: Sequence[str],
    scheduled_s: np.ndarray | None = None,
    **fields: Any,
) -> tuple[MeasuredRun, np.ndarray, int]:
    """A run from per-record timestamps in seconds on one clock, in the records' order.

    The records are sorted by arrival (stably); arrival becomes µs after the first, TTFT = first
    token - arrival, E2E = last token - arrival, TPOT is derived from them, and the queueing time
    is scheduled - arrival where ``scheduled_s`` is known (not NaN). ``fields`` are the run's other
    fields (name, source, system, ...). Returns the run, the arrival order (to sort any other
    per-record column) and how many records came out of order.
    """
    order, out_of_order = _sorted_by_arrival(arrival_s)
    arrival = arrival_s[order]
    output = output_tokens[order]
    ttft = (first_token_s[order] - arrival) * 1e6
    e2e = (last_token_s[order] - arrival) * 1e6
    queued = None
    if scheduled_s is not None and not np.isnan(scheduled_s).all():
        scheduled = scheduled_s[order]
        queued = np.where(np.isnan(scheduled), UNKNOWN, (scheduled - arrival) * 1e6)
    run = MeasuredRun(
        arrival_us=_relative_us(arrival),
        input_tokens=input_tokens[order],
        output_tokens=output,
        ttft_us=ttft,
        e2e_us=e2e,
        tpot_us=_tpot_us(ttft, e2e, output),
        queued_us=queued,
        request_ids=tuple(request_ids[int(i)] for i in order),
        **fields,
    )
    return run, order, out_of_order


def _existing(path: PathArg) -> Path:
    file = Path(path)
    if not file.exists():
        raise ScenarioError(str(file), None, "no such file or directory")
    return file


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(file), None, f"cannot read the file ({exc})") from None


def _canonical_gpu(name: str) -> str:
    """servesim's canonical GPU name when known (``RTXPRO6000`` → ``RTX-PRO-6000``)."""
    from servesim.latency.hardware import resolve_gpu

    try:
        return resolve_gpu(name).name
    except ScenarioError:
        return name
