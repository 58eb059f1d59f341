"""Metrics from a run record: the summary (spec §7.2 names), per-request table, time series.

Latency statistics are in milliseconds: mean and p50/p90/p95/p99, with percentiles by linear
interpolation between closest ranks (``rank = p/100·(n−1)``), over completed requests. ITL
statistics are over every inter-token gap (not per-request means), computed from the per-instance
step log: a step of duration ``dt`` contributes ``dt + α2`` once per token whose previous token
ended as the step began; gaps spanning several steps are recorded individually.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_GATEWAY,
    STATUS_NAMES,
    STATUS_NOT_ARRIVED,
    STATUS_QUEUED,
    STATUS_REJECTED,
    STATUS_RUNNING,
    STATUS_SHED,
    STATUS_TRANSFERRING,
    STEP_COLUMNS,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import current_umask
from servesim.simcore.log import get_logger

PERCENTILES = (50, 90, 95, 99)
SUMMARY_VERSION = 1


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


def summarize(record: Any, scenario: Any = None, audit: dict | None = None) -> dict[str, Any]:
    """The aggregate metrics of a run, as written to ``summary.json`` (stable field names)."""
    req = request_arrays(record)
    status = req["status"]
    done = status == STATUS_COMPLETED
    duration_us = max(int(record.end_us), 1)
    duration_s = duration_us / 1e6
    arrival = req["arrival_us"]
    ttft = (req["first_token_us"] - arrival)[done]
    e2e = (req["completion_us"] - arrival)[done]
    sched = (req["first_scheduled_us"] - arrival)[done]
    out_tokens = req["output_tokens"][done]
    tpot = np.where(out_tokens > 1, req["itl_sum_us"][done] / np.maximum(out_tokens - 1, 1), 0.0)
    reasons = record.requests.labels("finish_reason")
    length_code = reasons.index("length") if "length" in reasons else -1

    summary: dict[str, Any] = {
        "summary_version": SUMMARY_VERSION,
        "instance_id": "cluster",
        "injected_requests": int(record.arrived),
        "completed_requests": int(done.sum()),
        "still_queued": int((status == STATUS_QUEUED).sum()),
        "still_running": int((status == STATUS_RUNNING).sum()),
        "in_transit": int((status == STATUS_NOT_ARRIVED).sum()),
        "dropped_unservable": int((status == STATUS_DROPPED).sum()),
        "rejected_requests": int((status == STATUS_REJECTED).sum()),
        "shed_requests": int((status == STATUS_SHED).sum()),
        "expired_requests": int((status == STATUS_EXPIRED).sum()),
        "gateway_queued": int((status == STATUS_GATEWAY).sum()),
        "length_capped_requests": int(((req["finish_reason"] == length_code) & done).sum()),
        "timed_out_requests": 0,
        "total_input_tokens": int(sum(i["total_input_tokens"] for i in record.instances)),
        "total_output_tokens": int(out_tokens.sum()),
        "sim_duration_s": duration_s,
        "responses_per_sec": float(done.sum()) / duration_s if done.any() else 0.0,
        "tokens_per_sec": float(out_tokens.sum()) / duration_s if done.any() else 0.0,
        "input_tokens_per_sec": float(req["prompt_tokens"][done].sum()) / duration_s
        if done.any()
        else 0.0,
    }
    summary.update(latency_stats_ms(ttft, "ttft"))
    gaps, weights = itl_gaps(record)
    total_gaps = int(weights.sum())
    summary["itl_mean_ms"] = (
        float((gaps * weights).sum() / total_gaps / 1000.0) if total_gaps else 0.0
    )
    for p in PERCENTILES:
        summary[f"itl_p{p}_ms"] = (
            weighted_percentile(gaps, weights, p) / 1000.0 if total_gaps else 0.0
        )
    summary["itl_gaps"] = total_gaps
    summary.update(latency_stats_ms(tpot * 1.0, "tpot"))
    summary.update(latency_stats_ms(e2e, "e2e"))
    summary.update(latency_stats_ms(sched, "scheduling_delay"))
    summary.update(
        vllm_benchmark_metrics(
            ttft=ttft,
            tpot=tpot[out_tokens > 1],
            e2e=e2e,
            gaps=gaps,
            gap_weights=weights,
            input_tokens=int(req["prompt_tokens"][done].sum()),
            output_tokens=int(out_tokens.sum()),
            completed=int(done.sum()),
            duration_s=duration_s,
        )
    )

    hits = sum(i["kv_hit_blocks"] for i in record.instances)
    misses = sum(i["kv_miss_blocks"] for i in record.instances)
    cached_tokens = req["cached_tokens"][done]
    prompt_tokens = req["prompt_tokens"][done]
    kv_util_mean, kv_util_peak = _kv_utilisation(record)
    summary.update(
        {
            "preemption_count": int(sum(i["preemptions"] for i in record.instances)),
            "preempted_requests": int((req["preemptions"] > 0).sum()),
            "cache_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "prefix_cached_token_fraction": float(cached_tokens.sum() / prompt_tokens.sum())
            if prompt_tokens.sum()
            else 0.0,
            "kv_evicted_blocks": int(sum(i["kv_evictions"] for i in record.instances)),
            "kv_cpu_reloaded_blocks": int(
                sum(i["kv_cpu_reloaded_blocks"] for i in record.instances)
            ),
            "kv_cpu_stored_blocks": int(sum(i["kv_cpu_stores"] for i in record.instances)),
            "kv_cpu_evicted_blocks": int(sum(i["kv_cpu_evictions"] for i in record.instances)),
            "kv_cpu_reload_ms": sum(i["kv_cpu_reload_us"] for i in record.instances) / 1000.0,
            # engine.preemption_mode: swap (all 0 with recompute)
            "swap_outs": int(sum(i.get("swap_outs", 0) for i in record.instances)),
            "swap_ins": int(sum(i.get("swap_ins", 0) for i in record.instances)),
            "swap_bytes": int(sum(i.get("swap_bytes", 0) for i in record.instances)),
            "swap_ms": sum(i.get("swap_us", 0) for i in record.instances) / 1000.0,
            "swap_fallback_recomputes": int(
                sum(i.get("swap_fallbacks", 0) for i in record.instances)
            ),
            "kv_utilization_mean": kv_util_mean,
            "kv_utilization_peak": kv_util_peak,
            "spec_accepted_tokens_per_step": _spec_rate(record),
            "steps": int(sum(i["steps"] for i in record.instances)),
            "fast_forward_windows": int(sum(i["windows"] for i in record.instances)),
            "instance_busy_fraction": [i["busy_us"] / duration_us for i in record.instances],
            "load_imbalance": _imbalance(req, record),
            "per_instance": [
                {
                    "index": i["index"],
                    "gpu": i.get("gpu"),
                    "requests": int((req["instance"] == i["index"]).sum()),
                    "completed": int((done & (req["instance"] == i["index"])).sum()),
                    "steps": i["steps"],
                    "busy_fraction": i["busy_us"] / duration_us,
                    "preemptions": i["preemptions"],
                    "kv_blocks": i["kv_blocks"],
                }
                for i in record.instances
            ],
        }
    )
    summary["anomalies"] = {
        "dropped_unservable": summary["dropped_unservable"],
        "length_capped_requests": summary["length_capped_requests"],
        "preemptions": summary["preemption_count"],
        "unfinished_at_horizon": summary["still_queued"]
        + summary["still_running"]
        + summary["in_transit"]
        + summary["gateway_queued"],
        "admission_rejections": int(getattr(record, "admission_rejections", 0)),
        "gateway_rejected": int(getattr(record, "gateway", {}).get("rejected", 0)),
        "gateway_shed": summary["shed_requests"],
        "gateway_expired": summary["expired_requests"],
        "gateway_peak_depth": int(getattr(record, "gateway", {}).get("peak_depth", 0)),
    }
    summary["conservation"] = {
        "injected": int(record.arrived),
        "completed": summary["completed_requests"],
        "queued": summary["still_queued"],
        "running": summary["still_running"],
        "in_transit": summary["in_transit"],
        "dropped": summary["dropped_unservable"],
        "rejected": summary["rejected_requests"],
        "shed": summary["shed_requests"],
        "expired": summary["expired_requests"],
        "gateway_queued": summary["gateway_queued"],
        "balanced": int(record.arrived) == len(status),
    }
    summary.update(_class_metrics(record, req, done, duration_s, scenario))
    if getattr(record, "sessions", None) is not None:
        summary["sessions"] = _session_metrics(record, req, done)
    decisions = getattr(record, "decisions", None)
    if decisions is not None:
        regrets = [
            max(0.0, top[0][0] - scores[chosen]) if top and chosen in scores else 0.0
            for chosen, scores, top in ((d[2], d[3], d[4]) for d in decisions)
        ]
        summary["decisions"] = {
            "count": len(decisions),
            "mean_regret": float(np.mean(regrets)) if regrets else 0.0,
            "max_regret": float(np.max(regrets)) if regrets else 0.0,
            "max_snapshot_age_ms": max((d[5] for d in decisions), default=0) / 1000.0,
        }
    if getattr(record, "pd", None) is not None:
        summary["pd"] = _pd_metrics(record, req, done, duration_us)
        between = summary["pd"]["transferring"] + summary["pd"]["awaiting_decode_kv"]
        summary["conservation"]["transferring"] = between
        summary["anomalies"]["unfinished_at_horizon"] += between
        summary["anomalies"]["dropped_at_decode_kv"] = summary["pd"]["dropped_at_decode_kv"]
    if scenario is not None:
        summary["scenario"] = _scenario_facts(scenario, record)
    summary["interrupted"] = bool(getattr(record, "interrupted", False))
    summary["audit"] = audit if audit is not None else {"checked": False}
    return summary


def _class_metrics(
    record: Any, req: dict, done: np.ndarray, duration_s: float, scenario: Any
) -> dict:
    """Per-SLO-class latency, goodput against the scenario's targets, and fairness (spec §7.4)."""
    from servesim.policies.metrics import goodput, jain_index, per_class_latency

    table = record.requests
    arrival = req["arrival_us"]
    ttft = np.where(done, (req["first_token_us"] - arrival) / 1000.0, np.nan)
    e2e = np.where(done, (req["completion_us"] - arrival) / 1000.0, np.nan)
    out_tokens = req["output_tokens"]
    itl = np.where(
        done & (out_tokens > 1), req["itl_sum_us"] / np.maximum(out_tokens - 1, 1) / 1000.0, np.nan
    )
    classes = table.labels("slo_class")
    out: dict[str, Any] = {
        "per_class": per_class_latency(ttft, itl, e2e, done, req["slo_class"], classes),
    }
    slo = getattr(scenario, "slo", None) if scenario is not None else None
    if slo:
        injected = {
            name: int((req["slo_class"] == code).sum()) for code, name in enumerate(classes)
        }
        targets = {
            cls: {
                "ttft_ms": t.ttft_us / 1000.0 if t.ttft_us else None,
                "itl_ms": t.itl_us / 1000.0 if t.itl_us else None,
                "e2e_ms": t.e2e_us / 1000.0 if t.e2e_us else None,
            }
            for cls, t in slo.items()
        }
        g = goodput(ttft, itl, e2e, done, req["slo_class"], targets, injected, duration_s, classes)
        out["goodput_rps"] = g["goodput_rps"]
        out["slo_attainment"] = g["slo_attainment"]
        out["goodput"] = g["per_class"]
    tenants = table.labels("tenant")
    tokens = [int(out_tokens[done & (req["tenant"] == code)].sum()) for code in range(len(tenants))]
    out["fairness"] = {
        "jain_tenants_output_tokens": jain_index(tokens) if tokens else 0.0,
        "tenant_output_tokens": dict(zip([t or "default" for t in tenants], tokens)),
        "jain_classes_completion_rate": jain_index(
            [
                float((done & (req["slo_class"] == code)).sum())
                / max(int((req["slo_class"] == code).sum()), 1)
                for code in range(len(classes))
            ]
        )
        if classes
        else 0.0,
    }
    return out


def _session_metrics(record: Any, req: dict, done: np.ndarray) -> dict[str, Any]:
    """Sessions: how they ended, cold (round 0) vs warm (later rounds) TTFT, and duration."""
    states = list(record.sessions.values())
    ttft = (req["first_token_us"] - req["arrival_us"]) / 1000.0
    cold = np.sort(ttft[done & (req["round_index"] == 0)])
    warm = np.sort(ttft[done & (req["round_index"] > 0)])
    durations = []
    sid = req["session_id"]
    for session, state in record.sessions.items():
        if state != "completed":
            continue
        members = sid == session
        start = req["arrival_us"][members & (req["round_index"] == 0)]
        durations.append(
            (req["completion_us"][members].max() - start[0]) / 1e6 if len(start) else 0.0
        )
    durations_arr = np.sort(np.array(durations))
    return {
        "count": len(states),
        "completed": states.count("completed"),
        "cancelled": states.count("cancelled"),
        "interrupted": states.count("interrupted"),
        "exhausted": states.count("exhausted"),
        "rounds": record.session_rounds,
        "ttft_cold_mean_ms": float(cold.mean()) if len(cold) else 0.0,
        "ttft_cold_p99_ms": percentile(cold, 99),
        "ttft_warm_mean_ms": float(warm.mean()) if len(warm) else 0.0,
        "ttft_warm_p99_ms": percentile(warm, 99),
        "duration_mean_s": float(durations_arr.mean()) if len(durations_arr) else 0.0,
        "duration_p50_s": percentile(durations_arr, 50),
    }


def _pd_metrics(record: Any, req: dict, done: np.ndarray, duration_us: int) -> dict[str, Any]:
    """Disaggregated serving: how many requests were split, their transfers, and the pools."""
    counts = record.pd
    duration_s = duration_us / 1e6
    t = record.transfers.as_arrays()
    durations = (t["end_us"] - t["start_us"]).astype(np.int64)
    queueing = durations - t["uncontended_us"]  # time lost to sharing the link
    split_done = done & (req["transfer_end_us"] >= 0)
    roles = record.roles
    pools: dict[str, Any] = {}
    for role in ("prefill", "decode", "mixed", "none"):
        members = [i for i in record.instances if roles[i["index"]] == role]
        if not members:
            continue
        index = np.array([i["index"] for i in members])
        if role == "prefill":
            served = int(counts["prefill_completed"])  # prefill sub-requests finished
        else:
            served = int((done & np.isin(req["instance"], index)).sum())
        pools[role] = {
            "instances": [int(i) for i in index],
            "completed": served,
            "throughput_rps": served / duration_s,
            "busy_fraction": float(np.mean([i["busy_us"] / duration_us for i in members])),
            "output_tokens_per_sec": sum(i["total_output_tokens"] for i in members) / duration_s,
        }
    prefill_rate = pools.get("prefill", {}).get("throughput_rps", 0.0)
    decode_rate = pools.get("decode", {}).get("throughput_rps", 0.0)
    if prefill_rate and decode_rate:
        imbalance: float | str = max(prefill_rate, decode_rate) / min(prefill_rate, decode_rate)
    elif prefill_rate or decode_rate:
        imbalance = "inf (one pool idle)"
    else:
        imbalance = 1.0
    parent_ttft = (req["first_token_us"] - req["arrival_us"])[split_done]
    out: dict[str, Any] = {
        "decider": record.pd_decider,
        "split_requests": int(counts["split"]),
        "local_requests": int(counts["local"]),
        "disaggregated_completed": int(split_done.sum()),
        "completed_at_prefill": int(counts["completed_at_prefill"]),
        "dropped_at_prefill": int(counts["dropped_at_prefill"]),
        "dropped_at_decode_kv": int(counts["dropped_at_decode_kv"]),
        "transferring": int(
            ((req["status"] == STATUS_TRANSFERRING) & (req["transfer_start_us"] >= 0)).sum()
        ),
        "awaiting_decode_kv": int(
            ((req["status"] == STATUS_TRANSFERRING) & (req["transfer_start_us"] < 0)).sum()
        ),
        "transfers_started": int(counts["transfers_started"]),
        "transfers_completed": int(counts["transfers_completed"]),
        "kv_blocks_moved": int(req["transfer_blocks"][req["transfer_end_us"] >= 0].sum()),
        "kv_bytes_moved": float(t["bytes"].sum()),
        "peak_concurrent_transfers": max((link["peak"] for link in record.links), default=0),
        "links": [
            {
                "name": link["name"],
                "transfers": link["completed"],
                "peak_concurrent": link["peak"],
                "bytes_moved": float(link["bytes_moved"]),
                "busy_fraction": _link_busy(t, link["index"], duration_us),
            }
            for link in record.links
        ],
        "load_imbalance_ratio": imbalance,
        "pools": pools,
        # kv_transfer.blocking: time decode instances spent stalled receiving KV (0 otherwise)
        "decode_transfer_stall_ms": sum(i.get("kv_transfer_stall_us", 0) for i in record.instances)
        / 1000.0,
    }
    out.update(latency_stats_ms(durations, "transfer"))
    out.update(latency_stats_ms(queueing, "transfer_queueing"))
    out.update(latency_stats_ms(parent_ttft, "split_ttft"))
    return out


def _link_busy(t: dict[str, np.ndarray], link: int, duration_us: int) -> float:
    """Fraction of the run during which the link carried at least one transfer."""
    mine = t["link"] == link
    if not mine.any():
        return 0.0
    joins = t["join_us"][mine].astype(np.float64)
    finishes = t["finish_us"][mine]
    order = np.argsort(joins, kind="stable")
    busy, cur_start, cur_end = 0.0, -1.0, -1.0
    for a, b in zip(joins[order], finishes[order]):
        if a > cur_end:
            busy += max(cur_end - cur_start, 0.0)
            cur_start, cur_end = a, b
        elif b > cur_end:
            cur_end = b
    busy += max(cur_end - cur_start, 0.0)
    return busy / duration_us


def _imbalance(req: dict, record: Any) -> float:
    """Max over mean of the requests each instance received (1 = perfectly even)."""
    counts = [int((req["instance"] == i["index"]).sum()) for i in record.instances]
    mean = sum(counts) / len(counts) if counts else 0.0
    return max(counts) / mean if mean else 0.0


def _spec_rate(record: Any) -> float:
    """Mean tokens accepted per speculative verification (0 when speculation is off)."""
    verifications = sum(i["spec_verifications"] for i in record.instances)
    return (
        sum(i["spec_accepted_tokens"] for i in record.instances) / verifications
        if verifications
        else 0.0
    )


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _kv_utilisation(record: Any) -> tuple[float, float]:
    """Time-weighted mean and peak KV utilisation, averaged over instances."""
    means, peak = [], 0.0
    duration = max(int(record.end_us), 1)
    for log, info in zip(record.step_logs, record.instances):
        total = info["kv_blocks"]
        if not len(log):
            means.append(0.0)
            continue
        used = log.column("kv_used")
        dt = log.column("dt_us")
        means.append(float((used * dt).sum()) / duration / total)
        peak = max(peak, float(used.max()) / total)
    return (float(np.mean(means)) if means else 0.0), peak


def _scenario_facts(scenario: Any, record: Any) -> dict[str, Any]:
    e = scenario.engine
    return {
        "name": scenario.name,
        "seed": scenario.seed,
        "model": scenario.model.name,
        "gpu": scenario.gpu.name,
        "tp": scenario.tp,
        "instances": scenario.instances,
        "latency": record.instances[0]["latency"] if record.instances else {},
        "engine": {
            "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "block_size": e.block_size,
            "kv_blocks": e.kv_blocks,
            "kv_blocks_source": e.kv_blocks_source,
            "max_model_len": e.max_model_len,
            "max_model_len_source": e.max_model_len_source,
            "long_prefill_token_threshold": e.long_prefill_token_threshold,
            "enable_chunked_prefill": e.enable_chunked_prefill,
            "enable_prefix_caching": e.enable_prefix_caching,
            "prefill_first": e.prefill_first,
            "watermark_blocks": e.watermark_blocks,
            "kv_cpu_blocks": e.kv_cpu_blocks,
            "kv_cpu_bandwidth_bytes_s": e.kv_cpu_bandwidth_bytes_s,
            "kv_cpu_latency_us": e.kv_cpu_latency_us,
            "kv_block_bytes": e.kv_block_bytes,
            "speculative": {
                "draft_tokens": e.spec_draft_tokens,
                "acceptance_rate": e.spec_acceptance,
                "draft_cost": e.spec_draft_cost,
            }
            if e.spec_draft_tokens
            else None,
        },
        "policies": {
            "admission": scenario.admission.name,
            "routing": scenario.routing.name,
            "routing_params": _plain(scenario.routing.params),
            "scheduler": scenario.scheduler.name,
            "preemption": scenario.preemption.name,
            "flow_control": None
            if scenario.flow_control is None
            else {
                "detector": scenario.flow_control.detector.name,
                "order": scenario.flow_control.order,
                "max_queue": scenario.flow_control.max_queue,
                "shedding": scenario.flow_control.shedding,
            },
        },
        "cluster": {
            "admission_latency_us": scenario.cluster.admission_latency_us,
            "routing_latency_us": scenario.cluster.routing_latency_us,
            "snapshot_interval_us": scenario.cluster.snapshot_interval_us,
            "cache_signal_delay_us": scenario.cluster.cache_signal_delay_us,
        },
        "workload": scenario.workload.describe(),
        "horizon_us": scenario.horizon_us,
        "exact_steps": scenario.exact_steps,
    }


# ---------------------------------------------------------------------- tables
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
        get_logger("servesim.results").warning(
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


def dumps_summary(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_results(out_dir: str | Path, summary: dict[str, Any], record: Any, scenario: Any) -> Path:
    """Write summary.json, requests.csv, timeseries.csv, steps.npz and scenario.yaml atomically.

    Files go to a temporary sibling directory that replaces ``out_dir`` in one rename, so a reader
    never sees a half-written result and an interrupted run leaves the previous result intact.
    """
    out = Path(out_dir).resolve()
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "summary.json").exists())
    ):
        raise ScenarioError(
            "output.dir",
            str(out_dir),
            "exists and is not a servesim results directory, so it will not be replaced; choose another --out",
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for note in recover_results_dir(out):
            get_logger("servesim.results").warning(note)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    except OSError as exc:
        raise ScenarioError(
            "output.dir",
            str(out_dir),
            f"cannot create the results directory ({exc.strerror or exc}); choose another --out",
        ) from None
    try:
        (tmp / "requests.csv").write_text(requests_csv(record), encoding="utf-8")
        (tmp / "timeseries.csv").write_text(
            timeseries_csv(record, scenario.output.timeseries_interval_us), encoding="utf-8"
        )
        if scenario.output.steps:
            with open(tmp / "steps.npz", "wb") as fh:
                np.savez_compressed(fh, **steps_npz_payload(record))
        (tmp / "scenario.yaml").write_text(scenario.to_yaml(), encoding="utf-8")
        if getattr(record, "exported", None) is not None:
            from servesim.workloads.traces import write_trace

            write_trace(
                record.exported, tmp / "workload.csv.gz", metadata={"scenario": scenario.name}
            )
        if getattr(record, "decisions", None) is not None:
            (tmp / "decisions.csv").write_text(decisions_csv(record), encoding="utf-8")
        if getattr(record, "transfers", None) is not None:
            (tmp / "transfers.csv").write_text(transfers_csv(record), encoding="utf-8")
        # summary.json last: a directory holding it holds everything.
        (tmp / "summary.json").write_text(dumps_summary(summary), encoding="utf-8")
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; results are ordinary files
        if out.exists():
            # Two renames: a crash between them leaves the previous result in `old`, and the
            # next write (recover_results_dir) puts it back.
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
            os.replace(out, old / "previous")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ScenarioError(
            "output.dir",
            str(out_dir),
            f"cannot write results there ({exc.strerror or exc}); choose another --out",
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def recover_results_dir(out: Path) -> list[str]:
    """Undo what a run killed while writing ``out`` left behind; what was done, in words.

    A write builds the new result in ``.<name>.partial-<pid>-*`` beside ``out`` and swaps it in
    with two renames through ``.<name>.old-<pid>-*/previous``. A killed writer (its pid no longer
    running) leaves a partial directory, removed here, or, killed between the renames, the
    previous result in its ``old`` directory, put back at ``out`` when nothing is there.
    """
    done: list[str] = []
    if not out.parent.is_dir():
        return done
    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.old-*")):
        if _writer_alive(leftover, "old"):
            continue
        previous = leftover / "previous"
        if previous.is_dir() and not out.exists():
            os.replace(previous, out)
            done.append(f"restored the previous result at {out} (a run was killed while replacing it)")
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.partial-*")):
        if not _writer_alive(leftover, "partial"):
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"removed {leftover} (the unfinished result of a killed run)")
    return done


def _writer_alive(leftover: Path, kind: str) -> bool:
    """Whether the process that made ``leftover`` (``.<name>.<kind>-<pid>-*``) still runs."""
    tail = leftover.name.rsplit(f".{kind}-", 1)[-1]
    try:
        pid = int(tail.split("-", 1)[0])
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # ours, from a write this process abandoned
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
