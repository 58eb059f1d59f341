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
from strategies import scenarios

from servesim.components.record import STATUS_TRANSFERRING
from servesim.run import simulate
from servesim.scenario import load_scenario

RANDOM = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def pd_scenarios(draw) -> dict[str, Any]:
    data = draw(scenarios(max_requests=40, horizon=draw(st.booleans()), kv_every_step=True))
    data.pop("cluster", None)
    data["engine"].pop("speculative", None)  # speculation and PD are not combined here
    data["engine"].pop("prefill_first", None)  # nor is vLLM v0's scheduler
    mixed = draw(st.integers(0, 2))
    prefill = draw(st.integers(0 if mixed else 1, 2))
    decode = draw(st.integers(0 if mixed else 1, 2))
    pools: dict[str, Any] = {}
    for role, count in (("prefill", prefill), ("decode", decode), ("mixed", mixed)):
        if count:
            pools[role] = {"instances": count}
    if "decode" in pools and draw(st.booleans()):
        # a smaller decode cache (at least one maximum-length prompt): KV-full drops at start
        engine = data["engine"]
        blocks = -(-engine["max_model_len"] // engine["block_size"])
        pools["decode"]["engine"] = {"kv_blocks": max(blocks, engine["kv_blocks"] // 2)}
    deciders = ["always", "always", "never", "prefix-threshold", "direct-to-decode"]
    decider: Any = draw(st.sampled_from(deciders))
    if decider in ("prefix-threshold", "direct-to-decode"):
        decider = {"decider": decider, "threshold": draw(st.integers(0, 64))}
    data["policies"] = {
        "disaggregation": decider,
        "routing": draw(st.sampled_from(["round-robin", "random", "least-loaded"])),
    }
    data["cluster"] = {
        "pools": pools,
        "cache_signal_delay": draw(st.sampled_from([0, "1ms"])),
        "kv_transfer": {
            "bandwidth": draw(st.sampled_from(["1MB/s", "20MB/s", "1GB/s", "100GB/s"])),
            "base_latency": draw(st.sampled_from([0, "10us", "1ms"])),
            "topology": draw(st.sampled_from(["shared", "pair", "prefill-nic", "decode-nic"])),
            "sharing": draw(
                st.sampled_from(["processor-sharing", "processor-sharing", "at-start"])
            ),
            "decode_full": draw(st.sampled_from(["wait", "wait", "drop"])),
            "blocking": draw(st.booleans()),
        },
    }
    return data


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
    if data["cluster"]["kv_transfer"]["decode_full"] == "wait":  # nobody refused for lack of room
        assert "decode_kv_full" not in results.record.requests.labels("finish_reason")
