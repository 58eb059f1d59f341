"""The per-row tables of a run: requests.csv, transfers.csv, timeseries.csv, decisions.csv and the
steps.npz payload.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from servesim.analysis.metrics import request_arrays
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_NAMES,
    STEP_COLUMNS,
)
from servesim.simcore.log import get_logger

REQUEST_CSV_COLUMNS = (
    "id",
    "status",
    "finish_reason",
    "slo_class",
    "tenant",
    "client",
    "instance",
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
    "prompt_tokens",
    "prefix_tokens",
    "cached_tokens",
    "output_tokens",
    "preemptions",
    "session_id",
    "round_index",
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


def requests_csv(record: Any) -> str:
    """One row per request (completed or not), ordered by id; times in seconds, latencies in ms."""
    req = request_arrays(record)
    labels = {name: record.requests.labels(name) for name in record.requests.CODED}
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    split = "transfer_start_us" in req  # disaggregated serving adds its own columns
    writer.writerow(REQUEST_CSV_COLUMNS + (PD_CSV_COLUMNS if split else ()))

    def sec(us: int) -> str:
        return "" if us < 0 else f"{us / 1e6:.6f}"

    def ms(us: float | None) -> str:
        return "" if us is None else f"{us / 1000.0:.3f}"

    for i in range(len(req["id"])):
        pd_cells: tuple = ()
        if split:
            start, end = int(req["transfer_start_us"][i]), int(req["transfer_end_us"][i])
            pd_cells = (
                int(req["prefill_instance"][i]),
                sec(int(req["prefill_end_us"][i])),
                sec(start),
                sec(end),
                ms(end - start if end >= 0 else None),
                sec(int(req["decode_enqueue_us"][i])),
                max(int(req["transfer_blocks"][i]), 0),
            )
        arrival = int(req["arrival_us"][i])
        first = int(req["first_token_us"][i])
        completion = int(req["completion_us"][i])
        scheduled = int(req["first_scheduled_us"][i])
        out = int(req["output_tokens"][i])
        completed = req["status"][i] == STATUS_COMPLETED
        writer.writerow(
            (
                int(req["id"][i]),
                STATUS_NAMES[req["status"][i]],
                labels["finish_reason"][req["finish_reason"][i]],
                labels["slo_class"][req["slo_class"][i]],
                labels["tenant"][req["tenant"][i]],
                labels["client"][req["client"][i]],
                int(req["instance"][i]),
                sec(arrival),
                sec(int(req["enqueue_us"][i])),
                sec(scheduled),
                sec(first),
                sec(completion),
                ms(first - arrival if first >= 0 else None),
                ms(
                    req["itl_sum_us"][i] / (out - 1)
                    if completed and out > 1
                    else (0 if completed else None)
                ),
                ms(completion - arrival if completion >= 0 else None),
                ms(scheduled - arrival if scheduled >= 0 else None),
                ms(int(req["gateway_wait_us"][i]) if req["gateway_wait_us"][i] >= 0 else None),
                int(req["prompt_tokens"][i]),
                int(req["prefix_tokens"][i]),
                max(int(req["cached_tokens"][i]), 0),
                out,
                int(req["preemptions"][i]),
                int(req["session_id"][i]),
                int(req["round_index"][i]),
            )
            + pd_cells
        )
    return buf.getvalue()


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
"""Sample times per instance at most: a longer run is sampled at a wider interval (with a
warning), so a run spanning years of simulated time cannot allocate terabytes."""


def timeseries(record: Any, interval_us: int) -> dict[str, np.ndarray]:
    """Per-instance state sampled every ``interval_us``: the step in progress at each sample time.

    At most :data:`MAX_TIMESERIES_SAMPLES` samples per instance: a run longer than that many
    intervals is sampled at ``ceil(end / MAX_TIMESERIES_SAMPLES)`` µs instead, with a warning."""
    end = max(int(record.end_us), 1)
    widest = -(-end // MAX_TIMESERIES_SAMPLES)
    if widest > interval_us:
        get_logger("servesim.analysis").warning(
            f"the time series is sampled every {widest / 1e6:g} s instead of every "
            f"{interval_us / 1e6:g} s: the run spans {end / 1e6:g} s, and a series holds at most "
            f"{MAX_TIMESERIES_SAMPLES:,} samples per instance (set output.timeseries_interval)"
        )
        interval_us = widest
    times = np.arange(0, end + 1, interval_us, dtype=np.int64)
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("time_s", "instance", "waiting", "batch_size", "kv_utilization")
    }
    for log, info in zip(record.step_logs, record.instances):
        n = len(times)
        if len(log):
            starts = log.column("start_us")
            ends = starts + log.column("dt_us")
            idx = np.searchsorted(starts, times, side="right") - 1
            valid = (idx >= 0) & (times < ends[np.maximum(idx, 0)])
            safe = np.maximum(idx, 0)
            waiting = np.where(valid, log.column("waiting")[safe], 0)
            batch = np.where(valid, log.column("batch_size")[safe], 0)
            kv = np.where(valid, log.column("kv_used")[safe], 0) / info["kv_blocks"]
        else:
            waiting = batch = np.zeros(n, np.int64)
            kv = np.zeros(n)
        cols["time_s"].append(times / 1e6)
        cols["instance"].append(np.full(n, info["index"]))
        cols["waiting"].append(waiting)
        cols["batch_size"].append(batch)
        cols["kv_utilization"].append(kv)
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}


def timeseries_csv(record: Any, interval_us: int) -> str:
    ts = timeseries(record, interval_us)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    keys = ("time_s", "instance", "waiting", "batch_size", "kv_utilization")
    writer.writerow(keys)
    for i in range(len(ts["time_s"])):
        writer.writerow(
            (
                f"{ts['time_s'][i]:.6f}",
                int(ts["instance"][i]),
                int(ts["waiting"][i]),
                int(ts["batch_size"][i]),
                f"{ts['kv_utilization'][i]:.6f}",
            )
        )
    return buf.getvalue()


def steps_npz_payload(record: Any) -> dict[str, np.ndarray]:
    payload: dict[str, np.ndarray] = {}
    for log, info in zip(record.step_logs, record.instances):
        for name in STEP_COLUMNS:
            payload[f"i{info['index']}_{name}"] = np.array(log.column(name))
        payload[f"i{info['index']}_irregular_gaps_us"] = (
            np.frombuffer(log.irregular_gaps_us, dtype=np.int64).copy()
            if len(log.irregular_gaps_us)
            else np.zeros(0, np.int64)
        )
        if len(log.blocked_us):  # disaggregated serving: idle with work waiting for KV
            payload[f"i{info['index']}_blocked_us"] = np.array(log.blocked_us, dtype=np.int64)
    return payload


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
