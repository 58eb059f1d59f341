"""Prefill/decode disaggregation end to end: pools, deciders, the decode-first flow, KV transfers,
parent-level metrics, and the auditor's PD invariants (spec §5, §8.2)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from conftest import requests_of, run_scenario, scenario_dict

from servesim.analysis.tables import requests_csv, transfers_csv
from servesim.components.record import STATUS_COMPLETED, STATUS_TRANSFERRING
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError

BETA = (1000, 1, 10)  # step = 1000 + prefill tokens + 10·decode tokens (µs)


def pd_scenario(
    *,
    prefill: int = 1,
    decode: int = 1,
    mixed: int = 0,
    decider: Any = "always",
    bandwidth: Any = "1GB/s",
    base_latency: Any = 0,
    topology: str = "shared",
    sharing: str = "processor-sharing",
    pools: dict[str, dict] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """``scenario_dict`` (blackbox, explicit KV) with pools instead of plain instances."""
    data = scenario_dict(beta=BETA, **kw)
    data.pop("cluster", None)
    spec = {"prefill": {"instances": prefill}, "decode": {"instances": decode}}
    if mixed:
        spec["mixed"] = {"instances": mixed}
    for role, extra in (pools or {}).items():
        spec.setdefault(role, {"instances": 0}).update(extra)
    data["cluster"] = {
        "pools": spec,
        "kv_transfer": {
            "bandwidth": bandwidth,
            "base_latency": base_latency,
            "topology": topology,
            "sharing": sharing,
        },
    }
    data["policies"] = {"disaggregation": decider}
    return data


def block_bytes(data: dict[str, Any]) -> int:
    return load_scenario(data).instance_specs[0].engine.kv_block_bytes


# ---------------------------------------------------------------------- the flow


def test_a_lone_split_request_follows_the_closed_form():
    """One request: prefill step, transfer of every prompt block, then one decode step per
    further token on the decode instance; TTFT comes from the prefill instance."""
    data = pd_scenario(requests=1, input=40, output=5, block_size=4, base_latency="30us")
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    assert r["status"][0] == STATUS_COMPLETED
    prefill_end = r["arrival_us"][0] + 1000 + 40  # one step of 40 prompt tokens
    assert r["prefill_instance"][0] == 0 and r["instance"][0] == 1
    assert r["first_token_us"][0] == prefill_end  # α = 0
    assert r["prefill_end_us"][0] == prefill_end == r["transfer_start_us"][0]
    blocks = 10  # 40 tokens / 4 per block, none cached on the decode instance
    assert r["transfer_blocks"][0] == blocks
    nbytes = blocks * block_bytes(data)
    duration = 30 + math.ceil(nbytes / 1000.0)  # 1 GB/s = 1000 bytes/µs
    assert r["transfer_end_us"][0] == prefill_end + duration == r["decode_enqueue_us"][0]
    # 4 more tokens, one decode step each (the first as it is admitted): 1000 + 10·1 µs
    assert r["completion_us"][0] == r["decode_enqueue_us"][0] + 4 * (1000 + 10)
    assert r["output_tokens"][0] == 5
    steps = res.record.step_logs
    assert len(steps[0]) == 1 and len(steps[1]) == 4
    t = res.record.transfers.as_arrays()
    assert len(t["id"]) == 1 and t["end_us"][0] - t["start_us"][0] == duration


def test_a_blocking_transfer_lengthens_the_decode_step_that_admits_it():
    """kv_transfer.blocking (DistServe): the decode instance stalls for as long as it takes to
    receive the KV, so the step admitting the request is longer by the transfer's duration."""
    data = pd_scenario(requests=1, input=40, output=5, block_size=4, base_latency="30us")
    plain = requests_of(run_scenario(data, raise_on_violation=True))
    data["cluster"]["kv_transfer"]["blocking"] = True
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    duration = int(r["transfer_end_us"][0] - r["transfer_start_us"][0])
    assert duration == plain["transfer_end_us"][0] - plain["transfer_start_us"][0] > 30
    # the first decode step (which admits it) takes 1010 µs + the copy; the other three 1010
    assert r["completion_us"][0] == plain["completion_us"][0] + duration
    decode_steps = res.record.step_logs[1].as_arrays()["dt_us"]
    assert decode_steps.tolist() == [1010 + duration, 1010, 1010, 1010]
    assert res.summary["pd"]["decode_transfer_stall_ms"] == duration / 1000.0


def test_blocking_transfers_stall_the_requests_already_decoding():
    data = pd_scenario(requests=2, input=40, output=30, block_size=4, rate=200)  # 5 ms apart
    data["workload"]["arrival"] = "constant"
    plain = requests_of(run_scenario(data, raise_on_violation=True))
    data["cluster"]["kv_transfer"]["blocking"] = True
    blocking = requests_of(run_scenario(data, raise_on_violation=True))
    # the first request decodes (30 steps of ~1 ms) while the second's KV arrives at ~5 ms: its
    # inter-token gaps now hold its own copy (in its first decode step) and the second's
    own, second = blocking["transfer_end_us"] - blocking["transfer_start_us"]
    assert blocking["transfer_end_us"][1] < blocking["completion_us"][0]
    # (give or take β2 = 10 µs per step the two share, which the shifted timeline changes)
    increase = blocking["itl_sum_us"][0] - plain["itl_sum_us"][0]
    assert own + second - 30 * 10 <= increase <= own + second + 30 * 10
    assert (blocking["completion_us"] >= plain["completion_us"]).all()


def test_one_output_token_completes_at_prefill_without_a_decode_step():
    data = pd_scenario(requests=5, input=24, output=1, rate=10)
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    assert (r["status"] == STATUS_COMPLETED).all()
    assert (r["output_tokens"] == 1).all()
    assert (r["transfer_start_us"] == -1).all()  # nothing to move
    assert len(res.record.step_logs[1]) == 0  # the decode instance never stepped
    assert res.summary["pd"]["completed_at_prefill"] == 5


def test_decode_first_non_split_requests_go_to_the_decode_pool():
    data = pd_scenario(prefill=1, decode=2, decider="never", requests=30, instances=1)
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    assert set(r["instance"].tolist()) == {1, 2}
    assert len(res.record.step_logs[0]) == 0  # the prefill pool got nothing
    assert res.summary["pd"]["split_requests"] == 0


def test_prefix_threshold_keeps_warm_prefixes_local_and_splits_cold_long_prompts():
    """The first request of a system prompt is cold (split); once the decode instance holds the
    prefix (its transferred KV is cached there), requests adding a short tail stay local."""
    data = pd_scenario(
        requests=12,
        rate=2,  # far apart: each one finishes before the next arrives
        arrival="constant",
        input=4,
        output=4,
        prefix={"tokens": 64, "groups": 1},
        block_size=4,
        kv_blocks=256,
        decider={"decider": "prefix-threshold", "threshold": 16},
    )
    data["cluster"]["cache_signal_delay"] = 0
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    split = r["prefill_instance"] >= 0
    assert split[0]  # cold: 68 tokens uncached > 16
    assert not split[1:].any()  # warm: 68 - 64 = 4 ≤ 16
    cold = pd_scenario(
        requests=6,
        rate=2,
        arrival="constant",
        input=64,
        output=4,
        block_size=4,
        kv_blocks=256,
        decider={"decider": "prefix-threshold", "threshold": 16},
    )
    assert (requests_of(run_scenario(cold))["prefill_instance"] >= 0).all()


def test_direct_to_decode_splits_only_long_prompts():
    data = pd_scenario(
        requests=40,
        input={"type": "uniform", "min": 8, "max": 200},
        decider={"decider": "direct-to-decode", "threshold": 100},
        kv_blocks=512,
    )
    r = requests_of(run_scenario(data, raise_on_violation=True))
    split = r["prefill_instance"] >= 0
    assert (split == (r["prompt_tokens"] >= 100)).all()
    assert split.any() and (~split).any()


def test_contention_slows_transfers_and_at_start_differs():
    """Many long prompts at once on a slow shared fabric: transfers queue behind each other;
    no transfer is faster than its uncontended time; both sharing rules audit clean."""
    base = dict(
        prefill=2,
        decode=2,
        requests=30,
        rate=2000,
        input=120,
        output=4,
        kv_blocks=1024,
        max_num_batched_tokens=2048,
        max_num_seqs=32,
        bandwidth="50MB/s",
    )
    ps = run_scenario(pd_scenario(**base), raise_on_violation=True)
    at_start = run_scenario(pd_scenario(sharing="at-start", **base), raise_on_violation=True)
    for res in (ps, at_start):
        t = res.record.transfers.as_arrays()
        assert ((t["end_us"] - t["start_us"]) >= t["uncontended_us"]).all()
        assert res.summary["pd"]["peak_concurrent_transfers"] > 1
        assert res.summary["pd"]["transfer_queueing_p90_ms"] > 0
    a = ps.record.transfers.as_arrays()
    b = at_start.record.transfers.as_arrays()
    assert not np.array_equal(a["end_us"], b["end_us"])


def test_topologies_give_one_link_per_pair_or_nic():
    counts = {}
    for topology in ("shared", "pair", "prefill-nic", "decode-nic"):
        data = pd_scenario(prefill=2, decode=3, requests=40, topology=topology, kv_blocks=512)
        res = run_scenario(data, raise_on_violation=True)
        counts[topology] = len(res.record.links)
    assert counts == {"shared": 1, "pair": 6, "prefill-nic": 2, "decode-nic": 3}


def test_decode_kv_full_drops_at_transfer_start():
    """A decode instance too small for two prompts at once refuses the second (BLIS's drop at
    transfer start); the books still balance."""
    data = pd_scenario(
        requests=6,
        rate=5000,
        input=40,
        output=20,
        kv_blocks=256,
        pools={"decode": {"engine": {"kv_blocks": 16, "max_model_len": 64}}},
    )
    data["cluster"]["kv_transfer"]["decode_full"] = "drop"
    res = run_scenario(data, raise_on_violation=True)
    pd = res.summary["pd"]
    assert pd["dropped_at_decode_kv"] > 0
    r = requests_of(res)
    dropped = r["finish_reason"] == res.record.requests.code("finish_reason", "decode_kv_full")
    assert dropped.sum() == pd["dropped_at_decode_kv"]
    assert (r["first_token_us"][dropped] == -1).all()


def test_decode_kv_full_waits_by_default_and_everyone_completes():
    """The same tight decode instance: by default a transfer waits (FIFO) for a request there to
    finish instead of being refused; every request completes, later."""
    data = pd_scenario(
        requests=6,
        rate=5000,
        input=40,
        output=20,
        kv_blocks=256,
        pools={"decode": {"engine": {"kv_blocks": 16, "max_model_len": 64}}},
    )
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    assert res.summary["completed_requests"] == 6
    assert res.summary["pd"]["dropped_at_decode_kv"] == 0
    waited = r["transfer_start_us"] - r["prefill_end_us"]
    assert (waited > 0).sum() >= 4  # one prompt fits at a time: the others waited for room
    order = np.argsort(r["prefill_end_us"], kind="stable")
    assert (np.diff(r["transfer_start_us"][order]) >= 0).all()  # FIFO


def test_horizon_leaves_requests_in_transfer_and_audits_clean():
    data = pd_scenario(
        requests=20,
        rate=20000,
        input=200,
        output=20,
        kv_blocks=2048,
        max_num_batched_tokens=4096,
        bandwidth="10MB/s",
        horizon="30ms",
    )
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    assert (r["status"] == STATUS_TRANSFERRING).any()
    pd = res.summary["pd"]
    assert pd["transfers_started"] == pd["transfers_completed"] + pd["transferring"]


def test_outputs_have_pd_columns_transfers_and_decisions():
    data = pd_scenario(prefill=1, decode=2, requests=20, kv_blocks=512)
    data["output"] = {"trace": "decisions"}
    res = run_scenario(data, raise_on_violation=True)
    header = requests_csv(res.record).splitlines()[0].split(",")
    assert header[-7:] == [
        "prefill_instance",
        "prefill_end_s",
        "transfer_start_s",
        "transfer_end_s",
        "transfer_ms",
        "decode_enqueue_s",
        "transfer_blocks",
    ]
    rows = transfers_csv(res.record).splitlines()
    assert len(rows) == 1 + res.summary["pd"]["transfers_completed"] == 21
    decisions = res.record.decisions
    assert all(d[6] == "split" and d[7] == 0 for d in decisions)
    assert {d[2] for d in decisions} <= {1, 2}


def test_mixed_pool_serves_both_phases():
    data = pd_scenario(prefill=0, decode=0, mixed=3, requests=40, kv_blocks=512)
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    split = r["prefill_instance"] >= 0
    assert (r["prefill_instance"][split] != r["instance"][split]).all()
    assert res.summary["completed_requests"] == 40


def test_per_pool_overrides_size_each_pool():
    data = pd_scenario(
        prefill=1,
        decode=2,
        requests=4,
        pools={
            "prefill": {"engine": {"kv_blocks": 100, "max_num_seqs": 2}},
            "decode": {"engine": {"kv_blocks": 300}},
        },
    )
    s = load_scenario(data)
    assert [x.role for x in s.instance_specs] == ["prefill", "decode", "decode"]
    assert [x.engine.kv_blocks for x in s.instance_specs] == [100, 300, 300]
    assert s.instance_specs[0].engine.max_num_seqs == 2
    assert s.pd.decider.name == "always"


def test_pool_routing_overrides():
    data = pd_scenario(
        prefill=2,
        decode=2,
        requests=40,
        kv_blocks=512,
        pools={"prefill": {"routing": "round-robin"}, "decode": {"routing": "always-busiest"}},
    )
    r = requests_of(run_scenario(data, raise_on_violation=True))
    assert sorted(set(r["prefill_instance"].tolist())) == [0, 1]


def test_same_seed_same_run():
    data = pd_scenario(prefill=2, decode=2, requests=60, decider="always", kv_blocks=256)
    a, b = run_scenario(data), run_scenario(copy.deepcopy(data))
    assert requests_csv(a.record) == requests_csv(b.record)
    assert transfers_csv(a.record) == transfers_csv(b.record)


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "change, field, words",
    [
        (
            lambda d: d["cluster"]["kv_transfer"].update(bandwidth="-5GB/s"),
            "bandwidth",
            "non-negative",
        ),
        (lambda d: d["cluster"]["kv_transfer"].update(bandwidth=0), "bandwidth", "positive"),
        (
            lambda d: d["cluster"]["kv_transfer"].update(base_latency=float("nan")),
            "base_latency",
            "NaN",
        ),
        (lambda d: d["cluster"]["kv_transfer"].update(topology="mesh"), "topology", "shared"),
        (lambda d: d["cluster"]["kv_transfer"].update(sharing="fair"), "sharing", "at-start"),
        (lambda d: d["cluster"]["kv_transfer"].update(blocking="often"), "blocking", "often"),
        (lambda d: d["cluster"].update(instances=1), "cluster.pools", "raise cluster.instances"),
        (lambda d: d["cluster"].update(instances=5), "cluster.instances", "allow_unassigned"),
        (
            lambda d: d["cluster"]["pools"].update(decode={"instances": 0}),
            "cluster.pools",
            "prefill and one decode",
        ),
        (
            lambda d: d["cluster"]["pools"].update(encode={"instances": 1}),
            "cluster.pools",
            "encode",
        ),
        (lambda d: d["policies"].update(disaggregation="sometimes"), "disaggregation", "sometimes"),
        (
            lambda d: d["policies"].update(
                disaggregation={"decider": "prefix-threshold", "threshold": -1}
            ),
            "threshold",
            "-1",
        ),
        (
            lambda d: d["cluster"].update(groups=[{"count": 2}]),
            "cluster.groups",
            "either groups or pools",
        ),
    ],
)
def test_topology_and_parameter_errors_name_the_field(change, field, words):
    data = pd_scenario()
    change(data)
    with pytest.raises(ScenarioError) as err:
        load_scenario(data)
    assert field in str(err.value) and words in str(err.value)


def test_disaggregation_without_pools_is_an_error():
    data = scenario_dict(instances=2)
    data["policies"] = {"disaggregation": "always"}
    with pytest.raises(ScenarioError, match="cluster.pools"):
        load_scenario(data)
    data = scenario_dict()
    data["cluster"] = {"kv_transfer": {"bandwidth": "10GB/s"}}
    with pytest.raises(ScenarioError, match="kv_transfer"):
        load_scenario(data)


def test_unassigned_instances_allowed_get_no_traffic():
    data = pd_scenario(requests=20)
    data["cluster"].update(instances=3, allow_unassigned=True)
    res = run_scenario(data, raise_on_violation=True)
    assert res.record.roles == ("prefill", "decode", "none")
    assert len(res.record.step_logs[2]) == 0


# ---------------------------------------------------------------------- the auditor


def pd_audit_input(res):
    from servesim.run import audit_input

    return audit_input(res.record)


def violations_after(res, tamper) -> list[str]:
    from servesim.audit import audit

    data = pd_audit_input(res)
    tamper(data)
    return [str(v) for v in audit(data)]


@pytest.fixture(scope="module")
def clean_run():
    data = pd_scenario(prefill=1, decode=2, requests=30, kv_blocks=512, bandwidth="20MB/s")
    res = run_scenario(data, raise_on_violation=True)
    assert res.summary["pd"]["peak_concurrent_transfers"] > 1
    return res


def test_the_clean_run_audits_clean(clean_run):
    assert violations_after(clean_run, lambda d: None) == []


def first_split(d) -> int:
    return int(np.flatnonzero(d.requests["transfer_end_us"] >= 0)[0])


def shift(column: str, delta: int):
    def tamper(d):
        d.requests[column][first_split(d)] += delta

    return tamper


@pytest.mark.parametrize(
    "tamper, invariant",
    [
        (shift("decode_enqueue_us", -5), "INV-PD-1"),  # decoded before its KV arrived
        (shift("transfer_start_us", 10**9), "INV-PD-4"),  # its transfer started after it ended
        (shift("prefill_end_us", 10**9), "INV-PD-4"),
    ],
)
def test_the_auditor_catches_a_broken_pd_timeline(clean_run, tamper, invariant):
    found = violations_after(clean_run, tamper)
    assert any(v.startswith(invariant) for v in found), found


def test_the_auditor_catches_a_request_decoded_on_the_prefill_pool(clean_run):
    def tamper(d):
        d.requests["instance"][first_split(d)] = 0  # instance 0 is the prefill instance

    found = violations_after(clean_run, tamper)
    assert any(v.startswith("INV-PD-2") and "decoded on a prefill instance" in v for v in found)


def test_the_auditor_catches_a_prefill_run_on_the_decode_pool(clean_run):
    def tamper(d):
        d.requests["prefill_instance"][first_split(d)] = 1  # instances 1 and 2 decode

    found = violations_after(clean_run, tamper)
    assert any(v.startswith("INV-PD-2") and "prefill ran on a decode instance" in v for v in found)


def test_the_auditor_catches_changed_pools_and_lost_transfers(clean_run):
    def pools(d):
        d.pd["roles_at_end"] = ("decode", "decode", "decode")

    def lost(d):
        d.pd["transfers_completed"] -= 1

    assert any(v.startswith("INV-PD-5") for v in violations_after(clean_run, pools))
    assert any(v.startswith("INV-PD-3") for v in violations_after(clean_run, lost))


def test_the_auditor_catches_a_transfer_that_carried_the_wrong_bytes(clean_run):
    """Every transfer must carry its request's blocks × the prefill instance's block bytes."""
    record = clean_run.record
    original = list(record.block_bytes)
    record.block_bytes[0] += 1  # the prefill instance's blocks are one byte larger than moved
    try:
        found = violations_after(clean_run, lambda d: None)
    finally:
        record.block_bytes[:] = original
    assert any("carried" in v and "bytes" in v for v in found), found


def test_saved_pd_run_audits_clean_and_catches_an_edit(clean_run, tmp_path):
    from servesim.analysis.saved import audit_saved_run

    out = clean_run.write(tmp_path / "run")
    violations, _ = audit_saved_run(out)
    assert violations == []
    csv_file = out / "requests.csv"
    lines = csv_file.read_text().splitlines()
    header = lines[0].split(",")
    k = next(
        i for i, line in enumerate(lines[1:], 1) if line.split(",")[header.index("transfer_end_s")]
    )
    cells = lines[k].split(",")
    cells[header.index("decode_enqueue_s")] = "0.000001"  # before its transfer ended
    lines[k] = ",".join(cells)
    csv_file.write_text("\n".join(lines) + "\n")
    violations, _ = audit_saved_run(out)
    assert any(v.invariant == "INV-PD-1" for v in violations)


def test_interference_on_a_mixed_pool_slows_its_mixed_steps():
    base = pd_scenario(prefill=0, decode=0, mixed=2, requests=40, kv_blocks=512, decider="never")
    slow = copy.deepcopy(base)
    slow["cluster"]["pools"]["mixed"]["latency"] = {
        "model": "interference",
        "base": {"model": "blackbox", "alpha": [0, 0, 0], "beta": list(BETA)},
        "prefill_factor": 2.0,
        "decode_factor": 2.0,
    }
    fast_s = run_scenario(base, raise_on_violation=True).summary
    slow_s = run_scenario(slow, raise_on_violation=True).summary
    assert slow_s["e2e_mean_ms"] > fast_s["e2e_mean_ms"]
    assert slow_s["completed_requests"] == fast_s["completed_requests"] == 40


# ---------------------------------------------------------------------- back-pressure


def backpressure_scenario(decode_full: str) -> dict[str, Any]:
    """Six 40-token prompts at once (10 blocks of 4 tokens each). The prefill instance holds two
    prompts' KV, the decode instance one request at a time."""
    data = pd_scenario(
        requests=6,
        rate=5000,
        input=40,
        output=20,
        kv_blocks=256,
        pools={
            "prefill": {"engine": {"kv_blocks": 22, "max_model_len": 64}},
            "decode": {"engine": {"kv_blocks": 16, "max_model_len": 64}},
        },
        kv_every_step=True,
    )
    data["cluster"]["kv_transfer"]["decode_full"] = decode_full
    return data


def test_backpressure_keeps_a_prompts_kv_on_the_prefill_instance_until_its_transfer_ends():
    res = run_scenario(backpressure_scenario("backpressure"), raise_on_violation=True)
    r = requests_of(res)
    assert res.summary["completed_requests"] == 6
    assert res.summary["pd"]["dropped_at_decode_kv"] == 0
    order = np.argsort(r["arrival_us"], kind="stable")
    start, transferred = r["first_scheduled_us"][order], r["transfer_end_us"][order]
    # the prefill instance holds two prompts: the third starts only once the first has left
    for k in range(2, 6):
        assert start[k] >= transferred[k - 2]
    # and its KV use never falls below what the finished, not yet transferred prompts hold
    prefill_steps = res.record.step_logs[0].as_arrays()
    assert prefill_steps["kv_used"].max() <= 22
    assert len(res.record.step_logs[0].blocked_us) > 0  # it idled with a queue it had no room for


def test_backpressure_moves_the_backlog_from_the_transfer_queue_to_the_prefill_queue():
    wait = requests_of(run_scenario(backpressure_scenario("wait"), raise_on_violation=True))
    held = requests_of(run_scenario(backpressure_scenario("backpressure"), raise_on_violation=True))
    queued_for_kv = lambda r: (r["transfer_start_us"] - r["prefill_end_us"]).sum()  # noqa: E731
    ttft = lambda r: (r["first_token_us"] - r["arrival_us"]).mean()  # noqa: E731
    assert queued_for_kv(held) < queued_for_kv(wait)
    assert ttft(held) > ttft(wait)
    # the decode instance sees the same work either way: completions are not later
    assert held["completion_us"].max() <= wait["completion_us"].max() + 1


def test_backpressure_applies_to_prefill_pools_only():
    data = backpressure_scenario("backpressure")
    data["cluster"]["pools"]["mixed"] = {"instances": 1}
    res = run_scenario(data, raise_on_violation=True)
    assert res.summary["completed_requests"] == 6


def test_decode_full_names_the_backpressure_mode_in_its_error():
    data = backpressure_scenario("hold")
    with pytest.raises(ScenarioError) as err:
        load_scenario(data)
    assert err.value.path == "cluster.kv_transfer.decode_full"
    assert "backpressure" in str(err.value)


def test_decode_queue_limit_caps_the_prompts_accepted_but_not_yet_running():
    """DistServe's rule: a decode instance takes a transfer only while the prompts it accepted
    and does not run yet hold under a fraction of its blocks."""
    from servesim.components.engine import Engine, EngineLimits
    from servesim.components.request import Request
    from servesim.latency.blackbox import BlackboxLatencyModel

    engine = Engine(
        EngineLimits(block_size=4, total_blocks=256), BlackboxLatencyModel((0, 0, 0), BETA)
    )
    engine.remote_queue_limit = 0.05 * 256  # 12.8 blocks
    reqs = [Request(i, 0, 40, 5, block_size=4) for i in range(3)]  # 10 blocks each
    assert engine.reserve_remote(reqs[0], 0, 256) == 10
    assert engine.reserve_remote(reqs[1], 0, 246) == 10  # 10 < 12.8: still accepted
    assert engine.reserve_remote(reqs[2], 0, 236) == -1  # 20 held: full
    assert engine.remote_queue_blocks == 20
    for r in reqs[:2]:
        engine.add_remote(r, 10)
    engine.form_batch(10)  # both admitted: they run now
    assert engine.remote_queue_blocks == 0
    reqs[2].finish_reason = ""
    assert engine.reserve_remote(reqs[2], 10, engine.kv.free_count) == 10


def test_a_decode_queue_limit_run_completes_everyone_and_audits_clean():
    data = pd_scenario(
        requests=30, rate=5000, input=40, output=20, kv_blocks=256, kv_every_step=True
    )
    data["cluster"]["kv_transfer"]["decode_queue_limit"] = 0.05
    data["cluster"]["kv_transfer"]["decode_full"] = "backpressure"
    res = run_scenario(data, raise_on_violation=True)
    assert res.summary["completed_requests"] == 30
    r = requests_of(res)
    assert ((r["transfer_start_us"] - r["prefill_end_us"]) > 0).any()  # some waited for the cap


def test_a_waiting_transfer_starts_after_the_step_that_ran_a_received_request():
    """With a queue limit, room appears when a received request starts running, not only when
    one finishes: the decode instance re-checks waiting transfers after such a step."""
    data = pd_scenario(requests=12, rate=20000, input=40, output=200, kv_blocks=512)
    data["cluster"]["kv_transfer"]["decode_queue_limit"] = 0.02  # 10.24 blocks: one prompt
    res = run_scenario(data, raise_on_violation=True)
    r = requests_of(res)
    waited = r["transfer_start_us"] > r["prefill_end_us"]
    assert waited.sum() >= 5
    finishes = set(r["completion_us"].tolist())
    decode_ends = set(
        (lambda s: (s["start_us"] + s["dt_us"]).tolist())(res.record.step_logs[1].as_arrays())
    )
    started = r["transfer_start_us"][waited].tolist()
    assert all(t in decode_ends for t in started)  # at the end of a decode step
    assert any(t not in finishes for t in started)  # and not only when a request finished
