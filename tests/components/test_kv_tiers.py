"""Tiered KV offload (engine.kv_tiers): write-through LRU tiers below the GPU, a prefix found in
any tier reloaded at that tier's price, per-tier counters, the books the auditor checks."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.components.engine import Engine, EngineLimits
from servesim.components.kvcache import KVCache
from servesim.components.kvtiers import KVTier, reload_from, tier_totals
from servesim.components.request import Request
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from tests.components.test_cpu_tier import BETA, run_alone
from tests.conftest import requests_of, run_scenario, scenario_dict, step_logs
from tests.strategies import scenarios
from tests.test_differential import assert_same_run, both_ways

CPU = ("cpu", 2, 100, 10.0, 1000)  # (name, blocks, latency µs, µs per block, block bytes)
DISK = ("disk", 100, 500, 50.0, 1000)


def two_tier_engine() -> Engine:
    limits = EngineLimits(
        max_num_seqs=4,
        max_num_batched_tokens=256,
        block_size=4,
        total_blocks=20,
        kv_tiers=(CPU, DISK),
    )
    return Engine(limits, BlackboxLatencyModel(alpha=(0, 0, 0), beta=BETA))


def test_a_prefix_split_over_two_tiers_is_reloaded_from_both_and_counted_per_tier():
    # As in test_cpu_tier: A registers prefix blocks h0..h7; written through, the CPU tier (2
    # blocks) keeps h6, h7 and the disk all eight. C's private prompt evicts h5..h7 from the GPU.
    # B: GPU hits h0..h4; h5 comes from the disk, h6 and h7 from the CPU, loaded in parallel:
    # max(100 + 2 x 10, 500 + 1 x 50) = 550 µs, added to B's first step.
    engine = two_tier_engine()
    t, _ = run_alone(
        engine, Request(0, 0, 40, 2, prefix_group=0, prefix_tokens=32, block_size=4), 0
    )
    t, _ = run_alone(engine, Request(1, t, 60, 1, block_size=4), t)
    b = Request(2, t, 40, 2, prefix_group=0, prefix_tokens=32, block_size=4)
    _, dts = run_alone(engine, b, t)
    assert b.cached_tokens == 32
    assert dts[0] == int(BETA[0] + BETA[1] * (40 - 32)) + 550
    cpu, disk = engine.kv.tiers
    assert (cpu.hits, cpu.reloads, cpu.reload_us) == (1, 2, 120.0)
    assert (disk.hits, disk.reloads, disk.reload_us) == (1, 1, 550.0)
    assert engine.reload_us_total == 550
    # h5, read from the disk, was written back to the CPU tier (its LRU dropped h7)
    h5 = b.block_hash(5, 4, engine.content_ids)
    assert h5 in cpu and len(cpu) == 2
    assert (cpu.stores, cpu.evictions) == (9, 7)
    assert engine.kv.check(engine.kv_owners()) == []


def test_reload_time_is_the_slowest_tiers_latency_plus_blocks_over_bandwidth():
    # three tiers priced as 25, 5 and 1 GB/s for 1 MB blocks: 40, 200 and 1000 µs per block
    cpu = KVTier(10, "cpu", 10, 1e6 / 25e9 * 1e6)
    disk = KVTier(10, "disk", 100, 1e6 / 5e9 * 1e6)
    remote = KVTier(10, "remote", 2000, 1e6 / 1e9 * 1e6)
    for h in range(6):
        remote.store(h)
    for h in range(4):
        disk.store(h)
    for h in range(3):
        cpu.store(h)
    tiers = [cpu, disk, remote]
    # 3 blocks from the CPU, 1 from the disk, 2 from the remote store
    assert reload_from(tiers, list(range(6))) == pytest.approx(
        max(10 + 3 * 40, 100 + 200, 2000 + 2 * 1000)
    )
    assert [t.reloads for t in tiers] == [3, 1, 2]
    # the CPU alone: latency + n x block bytes / bandwidth
    assert reload_from(tiers, [0, 1]) == pytest.approx(10 + 2 * 40)
    assert [t.hits for t in tiers] == [2, 1, 1]


def test_a_block_evicted_from_a_fast_tier_is_still_found_in_a_slower_one_and_written_back():
    kv = KVCache(10, 4, tiers=[KVTier(2, "cpu", 1, 1.0), KVTier(4, "disk", 10, 5.0)])
    cpu, disk = kv.tiers
    kv.pop_blocks(5)
    blocks = [kv.register(h) for h in range(5)]
    kv.release(0, blocks)
    kv.pop_blocks(10)  # the GPU evicts all five
    kv.release(10, [])
    # each tier kept its most recent blocks: the CPU 3, 4; the disk 1 .. 4; block 0 is gone
    assert [h for h in range(5) if h in cpu] == [3, 4]
    assert [h for h in range(5) if h in disk] == [1, 2, 3, 4]
    assert not kv.offloaded(0) and kv.offloaded(1)
    assert (cpu.evictions, disk.evictions) == (3, 1)
    reloaded, reload_us = kv.reload([1, 2])
    assert reload_us == 10 + 2 * 5.0  # both from the disk
    assert [h for h in range(5) if h in cpu] == [1, 2]  # written back, the CPU's LRU dropped 3, 4
    assert (cpu.reloads, disk.reloads) == (0, 2)
    assert kv.check([(0, reloaded)]) == []


# 12 shared prefixes of 4 blocks on a GPU cache of 80 blocks: prefixes are evicted and come back
PREFIX_HEAVY = dict(
    requests=200,
    rate=50,
    input={"type": "uniform", "min": 70, "max": 120},
    output={"type": "uniform", "min": 2, "max": 20},
    prefix={"tokens": 64, "groups": 12},
    kv_blocks=80,
    kv_every_step=True,
)


def test_one_tier_of_kv_tiers_is_the_cpu_tier_of_kv_cpu_blocks():
    base = PREFIX_HEAVY
    cpu = run_scenario(
        scenario_dict(**base, kv_cpu_blocks=60, kv_cpu_bandwidth="8GB/s", kv_cpu_latency="30us")
    )
    tiers = run_scenario(
        scenario_dict(
            **base,
            kv_tiers=[{"name": "cpu", "capacity": 60, "bandwidth": "8GB/s", "latency": "30us"}],
        )
    )
    assert cpu.violations == [] and tiers.violations == []
    assert cpu.summary["kv_cpu_reloaded_blocks"] > 0
    for name, column in requests_of(cpu).items():
        assert list(column) == list(requests_of(tiers)[name]), name
    for a, b in zip(step_logs(cpu), step_logs(tiers), strict=True):
        for name in a:
            assert list(a[name]) == list(b[name]), name
    for key in ("kv_cpu_reloaded_blocks", "kv_cpu_reload_ms", "kv_tier_hits", "cache_hit_rate"):
        assert cpu.summary[key] == tiers.summary[key], key


def test_a_disk_tier_below_a_small_cpu_tier_raises_the_hit_rate_and_reports_per_tier():
    base = PREFIX_HEAVY
    cpu_only = [{"name": "cpu", "capacity": 20, "bandwidth": "25GB/s"}]
    with_disk = cpu_only + [
        {"name": "disk", "capacity": "1GB", "bandwidth": "2GB/s", "latency": "100us"}
    ]
    small = run_scenario(scenario_dict(**base, kv_tiers=cpu_only))
    deep = run_scenario(scenario_dict(**base, kv_tiers=with_disk))
    assert small.violations == [] and deep.violations == []
    assert deep.summary["cache_hit_rate"] > small.summary["cache_hit_rate"]
    hits = deep.summary["kv_tier_hits"]
    assert list(hits) == ["cpu", "disk"] and hits["disk"]["hits"] > 0
    block_bytes = deep.scenario.engine.kv_block_bytes
    assert hits["disk"]["reloaded_bytes"] == hits["disk"]["reloaded_blocks"] * block_bytes
    assert hits["disk"]["capacity_blocks"] == int(1e9 // block_bytes)
    assert "kv_tier_hits" not in run_scenario(scenario_dict(**base)).summary


def test_the_tiers_are_priced_from_the_models_block_bytes():
    scenario = load_scenario(
        scenario_dict(
            kv_tiers=[
                {"name": "cpu", "capacity": "1GiB", "bandwidth": "32GB/s", "latency": "5us"},
                {"name": "remote", "capacity": 500, "bandwidth": "100Gbps", "latency": "1ms"},
            ]
        )
    )
    e = scenario.engine
    block = e.kv_block_bytes
    assert e.kv_tier_limits == (
        ("cpu", (1 << 30) // block, 5, pytest.approx(block / 32e9 * 1e6), block),
        ("remote", 500, 1000, pytest.approx(block / 12.5e9 * 1e6), block),
    )


@pytest.mark.parametrize(
    "tiers, path",
    [
        ("fast", "engine.kv_tiers"),
        ([{"name": "cpu", "capacity": 10}], "engine.kv_tiers[0].bandwidth"),
        ([{"capacity": 10, "bandwidth": "1GB/s"}], "engine.kv_tiers[0].name"),
        ([{"name": "cpu", "capacity": 0, "bandwidth": "1GB/s"}], "engine.kv_tiers[0].capacity"),
        ([{"name": "cpu", "capacity": "1KB", "bandwidth": "1GB/s"}], "engine.kv_tiers[0].capacity"),
        ([{"name": "cpu", "capacity": 10, "bandwidth": 0}], "engine.kv_tiers[0].bandwidth"),
        (
            [{"name": "cpu", "capacity": 10, "bandwidth": "1GB/s", "speed": 1}],
            "engine.kv_tiers[0].speed",
        ),
        (
            [{"name": "cpu", "capacity": 10, "bandwidth": "1GB/s", "latency": "soon"}],
            "engine.kv_tiers[0].latency",
        ),
        (
            [
                {"name": "a", "capacity": 1, "bandwidth": 1},
                {"name": "a", "capacity": 1, "bandwidth": 1},
            ],
            "engine.kv_tiers[1].name",
        ),
    ],
)
def test_bad_tiers_are_refused_naming_the_field(tiers, path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario_dict(kv_tiers=tiers))
    assert err.value.path == path


def test_kv_tiers_and_kv_cpu_blocks_together_are_refused():
    with pytest.raises(ScenarioError, match="first entry of engine.kv_tiers"):
        load_scenario(
            scenario_dict(
                kv_cpu_blocks=10, kv_tiers=[{"name": "disk", "capacity": 10, "bandwidth": 1}]
            )
        )


def test_per_tier_totals_add_up_over_instances_by_name():
    one = {
        "name": "cpu",
        "hits": 1,
        "reloaded_blocks": 2,
        "reloaded_bytes": 20,
        "reload_us": 1500.0,
        "stored_blocks": 5,
        "evicted_blocks": 1,
        "capacity_blocks": 4,
    }
    two = {**one, "name": "disk", "hits": 3}
    totals = tier_totals([{"kv_tiers": [one, two]}, {"kv_tiers": [one]}, {}])
    assert list(totals) == ["cpu", "disk"]
    assert totals["cpu"]["hits"] == 2 and totals["cpu"]["reload_ms"] == 3.0
    assert totals["disk"]["hits"] == 3 and totals["disk"]["capacity_blocks"] == 4
    assert tier_totals([{}, {"kv_tiers": []}]) == {}


# ---------------------------------------------------------------- conservation, through the auditor


@st.composite
def tiered_scenarios(draw) -> dict:
    """A random scenario (tests.strategies) with one to three random tiers instead of its CPU tier."""
    data = copy.deepcopy(draw(scenarios(max_requests=40, kv_every_step=True)))
    engine = data["engine"]
    if "prefix" not in data["workload"] and engine["max_model_len"] >= 8:
        # shared prefixes, more groups than the GPU keeps, so that the tiers are used
        data["workload"]["prefix"] = {
            "tokens": draw(st.integers(4, engine["max_model_len"] // 2)),
            "groups": draw(st.integers(2, 8)),
        }
    engine.pop("kv_cpu_blocks", None)
    engine.pop("kv_cpu_latency", None)
    engine["kv_tiers"] = [
        {
            "name": f"tier{i}",
            "capacity": draw(st.integers(1, 3 * engine["kv_blocks"])),
            "bandwidth": draw(st.sampled_from(["25GB/s", "5GB/s", "100MB/s"])),
            "latency": draw(st.sampled_from([0, "20us", "1ms"])),
        }
        for i in range(draw(st.integers(1, 3)))
    ]
    return data


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_scenarios())
def test_random_tiered_runs_balance_every_tiers_books_and_agree_with_exact_steps(data):
    exact, fast = both_ways(data)
    assert exact.violations == [] and fast.violations == [], exact.violations + fast.violations
    assert_same_run(exact, fast)
    for name, tier in fast.summary.get("kv_tier_hits", {}).items():
        assert tier["stored_blocks"] - tier["evicted_blocks"] <= tier["capacity_blocks"], name
        assert tier["hits"] <= tier["reloaded_blocks"], name


def test_the_auditor_reports_a_tier_whose_books_do_not_balance(monkeypatch):
    # a store that forgets to count itself breaks "stored - evicted = held" in the KV recount
    def store_uncounted(self, block_hash):
        self._lru[block_hash] = None

    monkeypatch.setattr(KVTier, "store", store_uncounted)
    results = run_scenario(
        scenario_dict(
            requests=20,
            prefix={"tokens": 32, "groups": 2},
            kv_tiers=[{"name": "cpu", "capacity": 100, "bandwidth": "25GB/s"}],
        )
    )
    assert any(
        v.invariant == "INV-4" and "KV tier cpu conservation broken" in v.message
        for v in results.violations
    )
