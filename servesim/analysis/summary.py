"""The aggregate metrics of a run as written to ``summary.json`` (spec §7.2 names): latency,
throughput, goodput, per-SLO-class, sessions, disaggregation, KV and the scenario's facts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servesim.analysis.metrics import latency_stats_ms, percentile, request_arrays
from servesim.analysis.streamed import (
    arrivals_and_departures,
    class_metrics,
    latency,
    request_totals,
)
from servesim.analysis.verdict import classify_run, fitness
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_GATEWAY,
    STATUS_NOT_ARRIVED,
    STATUS_QUEUED,
    STATUS_REJECTED,
    STATUS_RUNNING,
    STATUS_SHED,
    STATUS_TRANSFERRING,
)
from servesim.simcore.config import plain_data
from servesim.simcore.errors import ScenarioError

SUMMARY_VERSION = 1


def summarize(record: Any, scenario: Any = None, audit: dict | None = None) -> dict[str, Any]:
    """The aggregate metrics of a run, as written to ``summary.json`` (stable field names)."""
    req = request_arrays(record)
    reasons = record.requests.labels("finish_reason")
    length_code = reasons.index("length") if "length" in reasons else -1
    # counts and sums in one pass over slices of the table (a spilled run's is on disk)
    totals = request_totals(req, len(record.instances), length_code)
    by_status = totals["by_status"]
    duration_us = max(int(record.end_us), 1)
    duration_s = duration_us / 1e6
    completed = int(by_status[STATUS_COMPLETED])
    output_tokens = totals["output"]
    input_tokens = totals["prompt"]

    summary: dict[str, Any] = {
        "summary_version": SUMMARY_VERSION,
        "instance_id": "cluster",
        "injected_requests": int(record.arrived),
        "completed_requests": completed,
        "still_queued": int(by_status[STATUS_QUEUED]),
        "still_running": int(by_status[STATUS_RUNNING]),
        "in_transit": int(by_status[STATUS_NOT_ARRIVED]),
        "dropped_unservable": int(by_status[STATUS_DROPPED]),
        "rejected_requests": int(by_status[STATUS_REJECTED]),
        "shed_requests": int(by_status[STATUS_SHED]),
        "expired_requests": int(by_status[STATUS_EXPIRED]),
        "gateway_queued": int(by_status[STATUS_GATEWAY]),
        "length_capped_requests": totals["length_capped"],
        "timed_out_requests": 0,
        "total_input_tokens": int(sum(i["total_input_tokens"] for i in record.instances)),
        "total_output_tokens": output_tokens,
        "sim_duration_s": duration_s,
        "responses_per_sec": float(completed) / duration_s if completed else 0.0,
        "tokens_per_sec": float(output_tokens) / duration_s if completed else 0.0,
        "input_tokens_per_sec": float(input_tokens) / duration_s if completed else 0.0,
    }
    summary.update(latency(record, req, totals, duration_s))

    hits = sum(i["kv_hit_blocks"] for i in record.instances)
    misses = sum(i["kv_miss_blocks"] for i in record.instances)
    kv_util_mean, kv_util_peak = _kv_utilisation(record)
    received, served = totals["received"], totals["served"]
    summary.update(
        {
            "preemption_count": int(sum(i["preemptions"] for i in record.instances)),
            "preempted_requests": totals["preempted"],
            "cache_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "prefix_cached_token_fraction": totals["cached"] / input_tokens
            if input_tokens
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
            "load_imbalance": _imbalance(received),
            "per_instance": [
                {
                    "index": i["index"],
                    "gpu": i.get("gpu"),
                    "requests": int(received[i["index"]]),
                    "completed": int(served[i["index"]]),
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
    arrivals, departures, refused = arrivals_and_departures(req)
    verdict = classify_run(
        arrivals,
        departures,
        refused=refused,
        unfinished_at_horizon=summary["anomalies"]["unfinished_at_horizon"],
    )
    del arrivals, departures
    summary.update(verdict.as_summary())
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
        "balanced": int(record.arrived) == int(by_status.sum()),
    }
    summary.update(class_metrics(record, req, duration_s, scenario))
    # offload tiers below the GPU (engine.kv_tiers or kv_cpu_blocks): counters per tier
    from servesim.components.kvtiers import tier_totals

    tier_hits = tier_totals(record.instances)
    if tier_hits:
        summary["kv_tier_hits"] = tier_hits
    # the session and disaggregation figures read whole columns (runs that have them)
    done = _completed_mask(record, req)
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
    if getattr(record, "fleet", None) is not None:  # autoscaling: GPU-hours, cost, scale events
        from servesim.components.autoscaler import fleet_summary

        summary["autoscaling"] = fleet_summary(record.fleet)
    if getattr(record, "encode", None) is not None:  # multimodal: the encode stage
        from servesim.analysis.encode import encode_metrics

        summary["encode"] = encode_metrics(record.encode, record.arrived)
    if getattr(record, "lora", None) is not None:  # LoRA / several models: per model, adapter
        from servesim.analysis.lora import lora_metrics

        summary.update(lora_metrics(record, req, duration_s))
    if scenario is not None:
        summary["scenario"] = _scenario_facts(scenario, record)
    from servesim.projection.confidence import run_confidence

    summary["confidence"] = run_confidence([i["latency"] for i in record.instances])
    if scenario is not None and getattr(scenario, "fitness", ()):
        # a misnamed metric must not throw away a finished run: say so in the summary instead
        try:
            summary["fitness"] = fitness(summary, scenario.fitness)
        except ScenarioError as exc:
            summary["fitness"], summary["fitness_error"] = None, str(exc)
    summary["interrupted"] = bool(getattr(record, "interrupted", False))
    summary["audit"] = audit if audit is not None else {"checked": False}
    return summary


def _completed_mask(record: Any, req: Any) -> np.ndarray | None:
    """Which requests completed, for the figures that only some runs have (None without)."""
    if getattr(record, "sessions", None) is None and getattr(record, "pd", None) is None:
        return None
    return req["status"] == STATUS_COMPLETED


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
        "rounds": _most_rounds(record.session_rounds),
        "ttft_cold_mean_ms": float(cold.mean()) if len(cold) else 0.0,
        "ttft_cold_p99_ms": percentile(cold, 99),
        "ttft_warm_mean_ms": float(warm.mean()) if len(warm) else 0.0,
        "ttft_warm_p99_ms": percentile(warm, 99),
        "duration_mean_s": float(durations_arr.mean()) if len(durations_arr) else 0.0,
        "duration_p50_s": percentile(durations_arr, 50),
    }


def _most_rounds(rounds: int | dict[int, int]) -> int:
    """Rounds per session: generated sessions all have the same number, recorded ones (a trace
    replayed closed loop) their own: the most of any."""
    return rounds if isinstance(rounds, int) else max(rounds.values(), default=0)


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


def _imbalance(received: np.ndarray) -> float:
    """Max over mean of the requests each instance received (1 = perfectly even)."""
    counts = [int(c) for c in received]
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
            # engine.profile: sglang only (other runs' summaries stay as they were)
            **(
                {
                    "profile": e.profile,
                    "schedule_policy": e.schedule_policy,
                    "schedule_conservativeness": e.schedule_conservativeness,
                    "max_prefill_tokens": e.max_prefill_tokens,
                }
                if e.profile == "sglang"
                else {}
            ),
            # engine.lora only: the adapters and their resolved sizes (servesim.scenario.lora)
            **({"lora": _lora_facts(e.lora)} if e.lora is not None else {}),
        },
        "policies": {
            "admission": scenario.admission.name,
            "routing": scenario.routing.name,
            "routing_params": plain_data(scenario.routing.params),
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


def _lora_facts(lora: Any) -> dict[str, Any]:
    """``engine.lora`` as the summary states it (the top-level engine's)."""
    return {
        "max_loras": lora.max_loras,
        "max_cpu_loras": lora.max_cpu_loras,
        "max_lora_rank": lora.max_lora_rank,
        "target_modules": list(lora.target_modules),
        "adapter_bytes": dict(lora.adapter_bytes),
    }
