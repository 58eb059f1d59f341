"""Random disaggregated clusters through the whole simulator: the auditor (INV-1…11, INV-PD-1…5,
transfer conservation, byte conservation and fair share) finds nothing, and the PD books balance.

Each example is a random engine scenario from ``strategies.scenarios`` (KV pressure, prefixes,
chunked prefill, CPU tier, sometimes a horizon) laid out as prefill, decode and mixed pools of
random sizes, with a random decider, per-pool KV capacities (small decode caches make drops at
transfer start), a random link topology, sharing rule, bandwidth (slow ones make every transfer
contend) and base latency. Every run audits the KV blocks after every step.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import pd_scenarios

from servesim.components.record import STATUS_TRANSFERRING
from servesim.run import simulate
from servesim.scenario import load_scenario

RANDOM = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@RANDOM
@given(pd_scenarios())
def test_random_pd_clusters_pass_the_audit(data):
    results = simulate(load_scenario(data), raise_on_violation=False)
    assert results.violations == [], "\n".join(map(str, results.violations))
    pd = results.summary["pd"]
    r = results.requests
    assert pd["split_requests"] + pd["local_requests"] <= results.record.arrived
    assert pd["transfers_started"] == pd["transfers_completed"] + pd["transferring"]
    between = int((r["status"] == STATUS_TRANSFERRING).sum())
    assert pd["transferring"] + pd["awaiting_decode_kv"] == between
    if data.get("horizon") is None:
        assert between == 0
    if data["cluster"]["kv_transfer"]["decode_full"] != "drop":  # nobody refused for lack of room
        assert "decode_kv_full" not in results.record.requests.labels("finish_reason")


@st.composite
def overloaded_pd_scenarios(draw) -> dict[str, Any]:
    """Prefill and decode pools under overload with back-pressure: arrivals far faster than the
    decode pool drains, decode caches holding a few requests, prefill caches a few prompts; the
    decode pool preempts by swapping (as DistServe's decode engine), sometimes into a swap space
    too small for everyone."""
    block_size = draw(st.sampled_from([4, 8, 16]))
    max_model_len = draw(st.integers(8, 20)) * block_size
    blocks = -(-max_model_len // block_size)
    prompt_high = draw(st.integers(1, max_model_len // 2))
    output_high = draw(st.integers(2, max_model_len // 2))
    decode_blocks = blocks * draw(st.sampled_from([1, 2, 3]))
    prefill_blocks = blocks * draw(st.sampled_from([1, 2, 4]))
    data: dict[str, Any] = {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "latency": {"model": "blackbox", "alpha": [0, 0, 0], "beta": [1000, 1, 10]},
        "engine": {
            "kv_blocks": prefill_blocks,
            "block_size": block_size,
            "max_model_len": max_model_len,
            "max_num_seqs": draw(st.integers(4, 32)),
            "max_num_batched_tokens": draw(st.integers(max(16, max_model_len), 4 * max_model_len)),
            "enable_chunked_prefill": draw(st.booleans()),
        },
        "workload": {
            "rate": draw(st.sampled_from([2000.0, 10000.0])),
            "requests": draw(st.integers(10, 50)),
            "input": {"type": "uniform", "min": 1, "max": prompt_high},
            "output": {"type": "uniform", "min": 2, "max": output_high},
        },
        "audit": {"enabled": True, "kv_every_step": True},
        "policies": {
            "disaggregation": "always",
            "routing": draw(st.sampled_from(["round-robin", "least-loaded"])),
        },
        "cluster": {
            "pools": {
                "prefill": {"instances": draw(st.integers(1, 2))},
                "decode": {
                    "instances": draw(st.integers(1, 2)),
                    "engine": {
                        "kv_blocks": decode_blocks,
                        "preemption_mode": "swap",
                        "swap_space": draw(st.sampled_from(["2MiB", "16MiB", 4])),
                    },
                },
            },
            "kv_transfer": {
                "bandwidth": draw(st.sampled_from(["20MB/s", "1GB/s"])),
                "base_latency": 0,
                "decode_full": "backpressure",
                "decode_queue_limit": draw(st.sampled_from([0, 0.05])),
                "blocking": draw(st.booleans()),
            },
        },
        "exact_steps": draw(st.booleans()),
    }
    return data


@RANDOM
@given(overloaded_pd_scenarios())
def test_overloaded_pd_clusters_under_backpressure_drop_nothing_and_never_storm(data):
    results = simulate(load_scenario(data), raise_on_violation=False)
    assert results.violations == [], "\n".join(map(str, results.violations))
    s = results.summary
    n = results.record.arrived
    # no drops for lack of decode KV, and a drained run completes everyone
    assert s["pd"]["dropped_at_decode_kv"] == 0
    assert s["completed_requests"] == n
    decode = [i for i, role in enumerate(results.record.roles) if role == "decode"]
    prefill = [i for i, role in enumerate(results.record.roles) if role == "prefill"]
    info = results.record.instances
    for i in decode:
        # a decode instance preempts decoders by swap, or by recompute when its swap space is
        # full; a request recomputed there prefills there again and, preempted mid-prefill, is
        # recomputed (a prefilling victim is never swapped), which only a fallback can lead to
        d = info[i]
        assert d["preemptions"] == d["swap_outs"] + d["swap_fallbacks"] + d["prefill_recomputes"]
        assert d["prefill_recomputes"] == 0 or d["swap_fallbacks"] > 0
        assert info[i]["swap_ins"] == info[i]["swap_outs"]
    chunked = data["engine"]["enable_chunked_prefill"]
    for i in prefill:
        # back-pressure stops admissions on the prefill side instead of preempting: a whole
        # prompt is admitted only when its blocks are free, so prefills never preempt; with
        # chunked prefill a prompt's next chunk may find its blocks taken (vLLM v1 allocates
        # chunk by chunk): never more often than prompts served (no storm)
        served = int((results.requests["prefill_instance"] == i).sum())
        assert info[i]["preemptions"] <= (served if chunked else 0)
    # preemptions are bounded by the work: at most one per decode step taken
    assert s["preemption_count"] <= sum(info[i]["steps"] for i in decode)
