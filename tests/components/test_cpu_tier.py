"""The CPU KV tier: blocks mirrored to CPU memory when hashed, reloaded instead of recomputed."""

from __future__ import annotations

import pytest

from servesim.components.engine import Engine, EngineLimits
from servesim.components.kvcache import CPUTier
from servesim.components.request import FINISHED, Request
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from tests.conftest import run_scenario, scenario_dict

BETA = (1000.0, 1.0, 10.0)


def run_alone(engine: Engine, req: Request, now: int) -> tuple[int, list[int]]:
    """Enqueue ``req`` and step the engine until it finishes; return the end time and step times."""
    engine.add_request(req, now)
    dts = []
    while req.state != FINISHED:
        dt = engine.form_batch(now)
        dts.append(dt)
        now += dt
        engine.end_step(now)
    return now, dts


def engine_with(cpu_blocks: int) -> Engine:
    limits = EngineLimits(
        max_num_seqs=4,
        max_num_batched_tokens=256,
        block_size=4,
        total_blocks=20,
        kv_cpu_blocks=cpu_blocks,
        cpu_reload_base_us=100.0,
        cpu_reload_us_per_block=10.0,
    )
    return Engine(limits, BlackboxLatencyModel(alpha=(0, 0, 0), beta=BETA))


@pytest.mark.parametrize("cpu_blocks, cached, reload_us", [(0, 20, 0), (100, 32, 130)])
def test_a_prefix_evicted_from_the_gpu_is_reloaded_from_the_cpu_not_recomputed(
    cpu_blocks, cached, reload_us
):
    # A: 32-token prefix (8 blocks of 4) + 8 private tokens. Its prefix blocks go back to the free
    # list tail last-block-first, so the free list reads: 9 never-used, A's 3 private, h7 .. h0.
    # C: 60 private tokens pops 15 blocks, evicting h7, h6, h5 from the GPU; h0..h4 survive.
    # B: same prefix. GPU hits h0..h4 (20 tokens); with the CPU tier h5..h7 are copied back
    # (12 more tokens) for base 100 µs + 3 x 10 µs, added to B's first step.
    engine = engine_with(cpu_blocks)
    t, _ = run_alone(
        engine, Request(0, 0, 40, 2, prefix_group=0, prefix_tokens=32, block_size=4), 0
    )
    t, _ = run_alone(engine, Request(1, t, 60, 1, block_size=4), t)
    b = Request(2, t, 40, 2, prefix_group=0, prefix_tokens=32, block_size=4)
    _, dts = run_alone(engine, b, t)
    assert b.cached_tokens == cached
    prefill = 40 - cached
    assert dts[0] == int(BETA[0] + BETA[1] * prefill) + reload_us
    if cpu_blocks:
        assert engine.kv.cpu.reloads == 3
        assert engine.reload_us_total == 130
    assert engine.kv.check(engine.kv_owners()) == []
    assert engine.kv.used_blocks == 0


def test_the_cpu_tier_is_an_lru_of_bounded_size():
    tier = CPUTier(2)
    tier.store(1)
    tier.store(2)
    tier.touch(1)  # 2 is now the least recently used
    tier.store(3)
    assert 1 in tier and 3 in tier and 2 not in tier
    assert (tier.stores, tier.evictions, len(tier)) == (3, 1, 2)


def test_a_cpu_tier_raises_the_hit_rate_of_a_prefix_heavy_workload_and_passes_the_audit():
    base = scenario_dict(
        requests=300,
        rate=50,
        input={"type": "uniform", "min": 70, "max": 120},
        output={"type": "uniform", "min": 2, "max": 20},
        prefix={"tokens": 64, "groups": 6},
        kv_blocks=80,
        kv_every_step=True,
    )
    without = run_scenario(base)
    with_tier = run_scenario(scenario_dict(**{**_kwargs(base), "kv_cpu_blocks": 2000}))
    assert without.violations == [] and with_tier.violations == []
    assert with_tier.summary["kv_cpu_reloaded_blocks"] > 0
    assert with_tier.summary["kv_cpu_reload_ms"] > 0
    assert with_tier.summary["cache_hit_rate"] > without.summary["cache_hit_rate"]
    assert without.summary["kv_cpu_reloaded_blocks"] == 0


def _kwargs(data):
    return dict(
        requests=data["workload"]["requests"],
        rate=data["workload"]["rate"],
        input=data["workload"]["input"],
        output=data["workload"]["output"],
        prefix=data["workload"]["prefix"],
        kv_blocks=data["engine"]["kv_blocks"],
        kv_every_step=True,
    )


def test_cpu_tier_fields_are_validated():
    with pytest.raises(ScenarioError, match="engine.kv_cpu_blocks"):
        load_scenario(scenario_dict(kv_cpu_blocks=-1))
    with pytest.raises(ScenarioError, match="engine.kv_cpu_bandwidth"):
        load_scenario(scenario_dict(kv_cpu_blocks=10, kv_cpu_bandwidth="fast"))
    scenario = load_scenario(
        scenario_dict(kv_cpu_blocks="1GiB", kv_cpu_bandwidth="32GB/s", kv_cpu_latency="5us")
    )
    e = scenario.engine
    assert e.kv_cpu_blocks == (1 << 30) // e.kv_block_bytes
    assert e.kv_cpu_latency_us == 5
    assert e.cpu_reload_us_per_block == pytest.approx(e.kv_block_bytes / 32e9 * 1e6)
