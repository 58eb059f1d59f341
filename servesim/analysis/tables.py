"""The per-row tables of a run: requests.csv, transfers.csv, timeseries.csv, decisions.csv and the
steps.npz payload.
"""

from __future__ import annotations

import csv
import io
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from servesim.analysis.metrics import request_arrays
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_NAMES,
    STEP_COLUMNS,
    fleet_states_at,
)
from servesim.simcore.log import get_logger

_COPIED_FIRST = ("id", "status", "finish_reason", "slo_class", "tenant", "client", "instance")
"""The leading columns of requests.csv, named as the run record's columns they come from (the
coded ones written as their labels)."""
_COPIED_LAST = (
    "prompt_tokens",
    "prefix_tokens",
    "cached_tokens",
    "output_tokens",
    "preemptions",
    "session_id",
    "round_index",
)
"""The trailing columns of requests.csv, named as the run record's columns they come from."""

REQUEST_CSV_COLUMNS = (
    *_COPIED_FIRST,
    "arrival_s",
    "enqueue_s",
    "first_scheduled_s",
    "first_token_s",
    "completion_s",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "scheduling_delay_ms",
    "gateway_wait_ms",
    *_COPIED_LAST,
)


PD_CSV_COLUMNS = (
    "prefill_instance",
    "prefill_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "transfer_ms",
    "decode_enqueue_s",
    "transfer_blocks",
)
TRANSFER_CSV_COLUMNS = (
    "request_id",
    "link",
    "prefill_instance",
    "decode_instance",
    "start_s",
    "end_s",
    "duration_ms",
    "uncontended_ms",
    "blocks",
    "bytes",
    "achieved_gb_per_s",
)


_REQUEST_SOURCE_COLUMNS = (
    *_COPIED_FIRST,
    "arrival_us",
    "enqueue_us",
    "first_scheduled_us",
    "first_token_us",
    "completion_us",
    "itl_sum_us",
    "gateway_wait_us",
    *_COPIED_LAST,
)
"""The run record's columns that requests.csv is computed from."""
_PD_SOURCE_COLUMNS = (
    "prefill_instance",
    "prefill_end_us",
    "transfer_start_us",
    "transfer_end_us",
    "decode_enqueue_us",
    "transfer_blocks",
)


CSV_CHUNK_ROWS = 1 << 16
"""Rows formatted at once when a table is written as CSV: their cells are Python objects
(about 40 bytes each), so a slice costs tens of megabytes, not the gigabytes of a whole run."""


def requests_csv(record: Any) -> str:
    """requests.csv as one string (see :func:`write_requests_csv`)."""
    buf = io.StringIO()
    write_requests_csv(buf, record)
    return buf.getvalue()


def write_requests_csv(fh: Any, record: Any) -> None:
    """One row per request (completed or not), ordered by id; times in seconds, latencies in ms.

    Written a slice of the table at a time, so the text of the whole file is never in memory."""
    table = record.requests
    labels = {name: table.labels(name) for name in table.CODED}
    writer = csv.writer(fh, lineterminator="\n")
    from servesim.analysis.lora import with_lora_columns  # LoRA / several models: 2 columns

    writer = with_lora_columns(writer, record)
    pd_table = getattr(record, "pd_table", None)
    split = pd_table is not None  # disaggregated serving adds its own columns
    writer.writerow(REQUEST_CSV_COLUMNS + (PD_CSV_COLUMNS if split else ()))
    pd_columns = (
        {name: request_arrays(record)[name] for name in _PD_SOURCE_COLUMNS} if split else {}
    )
    offset = 0
    for chunk in table.chunks(_REQUEST_SOURCE_COLUMNS, CSV_CHUNK_ROWS):
        n = len(chunk["id"])
        rows = {name: values.tolist() for name, values in chunk.items()}
        for name, values in pd_columns.items():
            rows[name] = values[offset : offset + n].tolist()
        offset += n
        writer.writerows(_request_rows(rows, n, labels, split))


def _sec(us: int) -> str:
    return "" if us < 0 else f"{us / 1e6:.6f}"


def _ms(us: float | None) -> str:
    return "" if us is None else f"{us / 1000.0:.3f}"


def _request_rows(r: dict, n: int, labels: dict, split: bool) -> Any:
    """The CSV cells of ``n`` requests (columns given as lists)."""
    sec, ms = _sec, _ms
    for i in range(n):
        pd_cells: tuple = ()
        if split:
            start, end = r["transfer_start_us"][i], r["transfer_end_us"][i]
            pd_cells = (
                r["prefill_instance"][i],
                sec(r["prefill_end_us"][i]),
                sec(start),
                sec(end),
                ms(end - start if end >= 0 else None),
                sec(r["decode_enqueue_us"][i]),
                max(r["transfer_blocks"][i], 0),
            )
        arrival = r["arrival_us"][i]
        first = r["first_token_us"][i]
        completion = r["completion_us"][i]
        scheduled = r["first_scheduled_us"][i]
        out = r["output_tokens"][i]
        status = r["status"][i]
        completed = status == STATUS_COMPLETED
        wait = r["gateway_wait_us"][i]
        yield (
            r["id"][i],
            STATUS_NAMES[status],
            labels["finish_reason"][r["finish_reason"][i]],
            labels["slo_class"][r["slo_class"][i]],
            labels["tenant"][r["tenant"][i]],
            labels["client"][r["client"][i]],
            r["instance"][i],
            sec(arrival),
            sec(r["enqueue_us"][i]),
            sec(scheduled),
            sec(first),
            sec(completion),
            ms(first - arrival if first >= 0 else None),
            ms(
                r["itl_sum_us"][i] / (out - 1)
                if completed and out > 1
                else (0 if completed else None)
            ),
            ms(completion - arrival if completion >= 0 else None),
            ms(scheduled - arrival if scheduled >= 0 else None),
            ms(wait if wait >= 0 else None),
            r["prompt_tokens"][i],
            r["prefix_tokens"][i],
            max(r["cached_tokens"][i], 0),
            out,
            r["preemptions"][i],
            r["session_id"][i],
            r["round_index"][i],
        ) + pd_cells


def transfers_csv(record: Any) -> str:
    """One row per completed KV transfer (disaggregated serving); times in s, sizes in bytes."""
    t = record.transfers.as_arrays()
    names = [link["name"] for link in record.links]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TRANSFER_CSV_COLUMNS)
    order = np.lexsort((t["id"], t["start_us"]))
    for i in order:
        start, end = int(t["start_us"][i]), int(t["end_us"][i])
        nbytes = float(t["bytes"][i])
        writer.writerow(
            (
                int(t["id"][i]),
                names[int(t["link"][i])],
                int(t["prefill_instance"][i]),
                int(t["decode_instance"][i]),
                f"{start / 1e6:.6f}",
                f"{end / 1e6:.6f}",
                f"{(end - start) / 1000.0:.3f}",
                f"{int(t['uncontended_us'][i]) / 1000.0:.3f}",
                int(t["blocks"][i]),
                f"{nbytes:.0f}",
                f"{nbytes / max(end - start, 1) / 1e3:.6g}",
            )
        )
    return buf.getvalue()


MAX_TIMESERIES_SAMPLES = 1_000_000
"""Rows of the time series at most, over all instances together: a run longer than that many
intervals (times its instances) is sampled at a wider interval, with a warning, so a run spanning
years of simulated time, or thousands of instances, cannot write or allocate gigabytes."""

_SERIES_COLUMNS = ("time_s", "instance", "waiting", "batch_size", "kv_utilization")


def timeseries_interval_us(record: Any, interval_us: int) -> int:
    """The interval the time series is sampled at: ``interval_us``, or wider when the run would
    otherwise give more than :data:`MAX_TIMESERIES_SAMPLES` rows (with a warning)."""
    end = max(int(record.end_us), 1)
    instances = max(len(record.step_logs), 1)
    widest = -(-end * instances // MAX_TIMESERIES_SAMPLES)
    if widest > interval_us:
        get_logger("servesim.analysis").warning(
            f"the time series is sampled every {widest / 1e6:g} s instead of every "
            f"{interval_us / 1e6:g} s: the run spans {end / 1e6:g} s on {instances} instance(s), "
            f"and a series holds at most {MAX_TIMESERIES_SAMPLES:,} rows "
            "(set output.timeseries_interval)"
        )
        return widest
    return interval_us


def _series_columns(record: Any) -> tuple[str, ...]:
    """The time series' columns: an autoscaled run's add each instance's state."""
    return _SERIES_COLUMNS + (("state",) if getattr(record, "fleet", None) is not None else ())


def _instance_series(
    log: Any, info: dict, times: np.ndarray, fleet: dict | None = None
) -> dict[str, np.ndarray]:
    """One instance's samples at ``times``: the step in progress at each (zeros when idle).

    Walks the step log a slice at a time: a sample inside a slice's span ``[first start, last
    end)`` is answered by that slice, and a sample in no slice's span falls between steps."""
    n = len(times)
    waiting, batch, kv = (np.zeros(n, np.int64) for _ in range(3))
    names = ("start_us", "dt_us", "waiting", "batch_size", "kv_used")
    for chunk in log.chunks(names):
        starts = chunk["start_us"]
        ends = starts + chunk["dt_us"]
        lo = np.searchsorted(times, starts[0], side="left")
        hi = np.searchsorted(times, ends[-1], side="left")
        t = times[lo:hi]
        idx = np.searchsorted(starts, t, side="right") - 1
        valid = t < ends[idx]
        waiting[lo:hi] = np.where(valid, chunk["waiting"][idx], 0)
        batch[lo:hi] = np.where(valid, chunk["batch_size"][idx], 0)
        kv[lo:hi] = np.where(valid, chunk["kv_used"][idx], 0)
    series = {
        "time_s": times / 1e6,
        "instance": np.full(n, info["index"]),
        "waiting": waiting,
        "batch_size": batch,
        "kv_utilization": kv / info["kv_blocks"],
    }
    if fleet is not None:  # autoscaling: when the instance was up (scale events)
        series["state"] = fleet_states_at(fleet["events"], info["index"], times)
    return series


def _sample_times(record: Any, interval_us: int) -> np.ndarray:
    end = max(int(record.end_us), 1)
    return np.arange(0, end + 1, timeseries_interval_us(record, interval_us), dtype=np.int64)


def timeseries(record: Any, interval_us: int) -> dict[str, np.ndarray]:
    """Per-instance state sampled every ``interval_us``: the step in progress at each sample time.

    At most about :data:`MAX_TIMESERIES_SAMPLES` rows in all (see :func:`timeseries_interval_us`)."""
    times = _sample_times(record, interval_us)
    fleet = getattr(record, "fleet", None)
    parts = [
        _instance_series(log, info, times, fleet)
        for log, info in zip(record.step_logs, record.instances)
    ]
    return {
        k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0)
        for k in _series_columns(record)
    }


def timeseries_csv(record: Any, interval_us: int) -> str:
    """timeseries.csv as one string (see :func:`write_timeseries_csv`)."""
    buf = io.StringIO()
    write_timeseries_csv(buf, record, interval_us)
    return buf.getvalue()


def write_timeseries_csv(fh: Any, record: Any, interval_us: int) -> None:
    """The time series as CSV, written one instance at a time."""
    writer = csv.writer(fh, lineterminator="\n")
    writer.writerow(_series_columns(record))
    times = _sample_times(record, interval_us)
    fleet = getattr(record, "fleet", None)
    for log, info in zip(record.step_logs, record.instances):
        ts = _instance_series(log, info, times, fleet)
        for start in range(0, len(times), CSV_CHUNK_ROWS):
            columns = [ts[k][start : start + CSV_CHUNK_ROWS].tolist() for k in _SERIES_COLUMNS]
            rows = ((f"{t:.6f}", i, w, b, f"{kv:.6f}") for t, i, w, b, kv in zip(*columns))
            if fleet is not None:
                states = ts["state"][start : start + CSV_CHUNK_ROWS]
                rows = (row + (state,) for row, state in zip(rows, states))
            writer.writerows(rows)


def write_steps_npz(fh: Any, record: Any) -> None:
    """steps.npz (compressed), one array at a time: what :func:`numpy.savez_compressed` writes
    for :func:`steps_npz_payload`, without holding every column of every instance at once."""
    with zipfile.ZipFile(
        fh, mode="w", compression=zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True
    ) as zf:
        for name, array in _steps_npz_items(record):
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def steps_npz_payload(record: Any) -> dict[str, np.ndarray]:
    """Every array of steps.npz by name (all in memory: for small runs and tests)."""
    return dict(_steps_npz_items(record))


def _steps_npz_items(record: Any) -> Iterator[tuple[str, np.ndarray]]:
    for log, info in zip(record.step_logs, record.instances):
        for name in STEP_COLUMNS:
            yield f"i{info['index']}_{name}", np.array(log.column(name))
        yield (
            f"i{info['index']}_irregular_gaps_us",
            (
                np.frombuffer(log.irregular_gaps_us, dtype=np.int64).copy()
                if len(log.irregular_gaps_us)
                else np.zeros(0, np.int64)
            ),
        )
        if len(log.blocked_us):  # disaggregated serving: idle with work waiting for KV
            yield f"i{info['index']}_blocked_us", np.array(log.blocked_us, dtype=np.int64)


def decisions_csv(record: Any) -> str:
    """One row per routing decision: chosen instance, its score, the best score, the regret
    (best − chosen), the top-k candidates ``instance:score`` and the oldest snapshot's age.
    With disaggregation the candidates are the decode pool's, and two columns say whether the
    request was split and where its prefill ran."""
    split = getattr(record, "pd", None) is not None
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        (
            "time_s",
            "request_id",
            "chosen",
            "chosen_score",
            "best",
            "best_score",
            "regret",
            "top_k",
            "snapshot_age_ms",
        )
        + (("pd_decision", "prefill_instance") if split else ())
    )
    for decision in record.decisions or ():
        now, rid, chosen, scores, top, age = decision[:6]
        chosen_score = scores.get(chosen, float("nan"))
        best_score, best = top[0] if top else (float("nan"), -1)
        writer.writerow(
            (
                f"{now / 1e6:.6f}",
                rid,
                chosen,
                f"{chosen_score:.6g}",
                best,
                f"{best_score:.6g}",
                f"{max(0.0, best_score - chosen_score):.6g}",
                ";".join(f"{i}:{v:.6g}" for v, i in top),
                f"{age / 1000:.3f}",
            )
            + tuple(decision[6:])
        )
    return buf.getvalue()
