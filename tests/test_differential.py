"""Fast-forward is exact: ``exact_steps: false`` gives the same run as ``exact_steps: true``.

DESIGN §4.1: coalescing steady-decode steps into one sleep must not change any per-request
timeline or any step-log row. Every test here runs a scenario both ways, with
``MIN_WINDOW_STEPS`` lowered to 2 (the ``small_windows`` fixture) so that windows are taken as
often as possible, and compares request tables, step logs, irregular inter-token gaps, the
per-instance counters and the summary, which may differ only in the number of windows taken.
Random scenarios use the blackbox step time and, now and then, a context-dependent model
(roofline, trained-physics), whose steady-decode steps change length from step to step.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import run_scenario, scenario_dict, with_changes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import pd_scenarios, scenarios

import servesim.components.instance as instance_module

# The summary and instance facts that legitimately depend on the path taken.
PATH_ONLY_INSTANCE_FACTS = ("windows",)


def both_ways(data):
    exact = run_scenario(with_changes(data, exact_steps=True))
    fast = run_scenario(with_changes(data, exact_steps=False))
    return exact, fast


def assert_same_run(exact, fast) -> None:
    ra, rb = exact.requests, fast.requests
    assert ra.keys() == rb.keys()
    for name in ra:
        np.testing.assert_array_equal(ra[name], rb[name], err_msg=f"request column {name}")
    for i, (la, lb) in enumerate(zip(exact.record.step_logs, fast.record.step_logs, strict=True)):
        sa, sb = la.as_arrays(), lb.as_arrays()
        for name in sa:
            np.testing.assert_array_equal(
                sa[name], sb[name], err_msg=f"instance {i} step column {name}"
            )
        assert list(la.irregular_gaps_us) == list(lb.irregular_gaps_us)
    for ia, ib in zip(exact.record.instances, fast.record.instances, strict=True):
        strip = lambda info: {k: v for k, v in info.items() if k not in PATH_ONLY_INSTANCE_FACTS}  # noqa: E731
        assert strip(ia) == strip(ib)
    assert exact.record.end_us == fast.record.end_us
    assert exact.record.kv_problems == fast.record.kv_problems
    summary_a, summary_b = copy.deepcopy(exact.summary), copy.deepcopy(fast.summary)
    for summary in (summary_a, summary_b):
        summary.pop("fast_forward_windows")
        summary["scenario"].pop("exact_steps")
    assert summary_a == summary_b


@pytest.fixture(scope="module")
def windows_of_two_steps():
    """``small_windows`` for a whole module (hypothesis tests cannot use function fixtures)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(instance_module, "MIN_WINDOW_STEPS", 2)
        yield


DIFFERENTIAL = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# Step-time models whose decode steps grow with the context (the window's step durations come
# from their vectorised ``decode_steps_us``), besides the context-blind blackbox.
LATENCY_MODELS = st.sampled_from([None, None, {"model": "roofline"}, {"model": "trained-physics"}])


@DIFFERENTIAL
@given(data=scenarios(max_requests=30), latency=LATENCY_MODELS)
def test_fast_forward_gives_identical_runs_on_random_scenarios(windows_of_two_steps, data, latency):
    if latency is not None:
        data = with_changes(data, latency=latency)
    exact, fast = both_ways(data)
    assert exact.violations == [] and fast.violations == []
    assert exact.summary["fast_forward_windows"] == 0
    assert_same_run(exact, fast)


@DIFFERENTIAL
@given(scenarios(max_requests=30, horizon=True))
def test_fast_forward_gives_identical_runs_when_cut_at_a_horizon(windows_of_two_steps, data):
    exact, fast = both_ways(data)
    assert_same_run(exact, fast)


# ---------------------------------------------------------------------- named corners

CORNERS = {
    "preemption": dict(
        requests=40,
        rate=2000,
        input={"type": "uniform", "min": 4, "max": 40},
        output={"type": "uniform", "min": 10, "max": 60},
        kv_blocks=32,
        max_model_len=100,
    ),
    "swap preemption": dict(
        requests=40,
        rate=2000,
        input={"type": "uniform", "min": 4, "max": 40},
        output={"type": "uniform", "min": 10, "max": 60},
        kv_blocks=32,
        max_model_len=100,
        preemption_mode="swap",
    ),
    "swap space fills": dict(
        requests=40,
        rate=2000,
        input={"type": "uniform", "min": 4, "max": 40},
        output={"type": "uniform", "min": 10, "max": 60},
        kv_blocks=32,
        max_model_len=100,
        preemption_mode="swap",
        swap_space="8MiB",  # 12 blocks of 640 KiB: some victims are recomputed
    ),
    "prefix groups": dict(
        requests=40,
        rate=300,
        input={"type": "uniform", "min": 1, "max": 20},
        output={"type": "uniform", "min": 5, "max": 50},
        prefix={"tokens": 30, "groups": 3},
        kv_blocks=48,
        max_model_len=120,
    ),
    "chunked prefill": dict(
        requests=30,
        rate=500,
        input={"type": "uniform", "min": 10, "max": 200},
        output={"type": "uniform", "min": 5, "max": 40},
        max_num_batched_tokens=24,
        kv_blocks=256,
    ),
    "long prefill threshold": dict(
        requests=30,
        rate=500,
        input={"type": "uniform", "min": 10, "max": 200},
        output={"type": "uniform", "min": 5, "max": 40},
        long_prefill_token_threshold=16,
        kv_blocks=256,
    ),
    "sequence slots block the queue": dict(
        requests=30,
        rate=2000,
        input=8,
        output={"type": "uniform", "min": 5, "max": 80},
        max_num_seqs=3,
        kv_blocks=256,
    ),
    "queueing delay lands inside windows": dict(
        requests=40,
        rate=150,
        input={"type": "uniform", "min": 1, "max": 64},
        output={"type": "uniform", "min": 20, "max": 80},
        alpha=(333, 7.5, 90),
        kv_blocks=256,
    ),
    "server-filled budgets": dict(
        requests=20,
        rate=300,
        input={"type": "uniform", "min": 1, "max": 30},
        output={"type": "uniform", "min": 1, "max": 120},
        max_output_tokens=0,
        kv_blocks=24,
        max_model_len=64,
    ),
}


@pytest.mark.parametrize("corner", sorted(CORNERS))
def test_fast_forward_gives_identical_runs_in_each_corner(corner, small_windows):
    data = scenario_dict(**CORNERS[corner], kv_every_step=True)
    exact, fast = both_ways(data)
    assert exact.violations == [] and fast.violations == []
    assert fast.summary["fast_forward_windows"] > 0
    assert_same_run(exact, fast)


@pytest.mark.parametrize("corner", ["preemption", "swap preemption", "prefix groups"])
def test_fast_forward_at_the_default_window_threshold_is_identical_too(corner):
    data = scenario_dict(**CORNERS[corner])
    assert_same_run(*both_ways(data))


def test_a_window_in_flight_at_the_horizon_is_settled_at_the_horizon(small_windows):
    """Two requests decode 500 tokens each; the horizon falls in the middle of a long window.
    Steps that ended before the horizon happened in the step-by-step run and must be in the
    fast-forwarded run's step log too (and the run's duration with them)."""
    data = scenario_dict(
        requests=2,
        rate=100,
        input=10,
        output=500,
        kv_blocks=400,
        max_model_len=1024,
        beta=(1000, 0, 10),
        horizon="300ms",
        audit=False,
    )
    exact, fast = both_ways(data)
    steps_exact = len(exact.record.step_logs[0])
    assert steps_exact > 250
    assert len(fast.record.step_logs[0]) == steps_exact
    assert fast.record.end_us == exact.record.end_us


def test_a_request_arriving_in_a_window_cut_by_the_horizon_is_still_waiting_at_the_horizon():
    """Request 0 decodes in 1.5 ms steps from 3.2 ms (boundaries 4.7, 6.2, 7.7 ms ...); request 1
    arrives at 6.4 ms, inside the step [6.2, 7.7); the horizon is 7 ms. Step by step, the step in
    flight at the horizon was formed at 6.2 ms, before request 1 existed: it is still queued, and
    the step that ended at 6.2 ms saw one request in the instance. Settling a fast-forward window
    at the horizon must give the same, with the default window threshold too."""
    data = scenario_dict(
        requests=2,
        rate=312.5,
        arrival="constant",
        input=8,
        output=500,
        beta=(1500, 0, 0),
        kv_blocks=400,
        horizon="7000us",
    )
    exact, fast = both_ways(data)
    assert fast.summary["fast_forward_windows"] > 0
    assert exact.violations == []
    assert fast.violations == []  # INV-5 if request 1 is scheduled before it was enqueued
    np.testing.assert_array_equal(exact.requests["arrival_us"], [3200, 6400])
    np.testing.assert_array_equal(exact.requests["first_scheduled_us"], [3200, -1])
    assert_same_run(exact, fast)


def test_fast_forward_is_identical_on_an_overloaded_disaggregated_run_that_swaps(small_windows):
    """Prefill and decode pools under overload: the decode instance swaps, transfers wait for
    room (back-pressure holds prompts on the prefill instance), windows are cut by transfers."""
    data = scenario_dict(
        requests=60,
        rate=3000,
        input={"type": "uniform", "min": 4, "max": 40},
        output={"type": "uniform", "min": 10, "max": 80},
        kv_blocks=48,
        max_model_len=100,
        kv_every_step=True,
    )
    data.pop("cluster", None)
    data["cluster"] = {
        "pools": {
            "prefill": {"instances": 1},
            "decode": {
                "instances": 1,
                "engine": {"kv_blocks": 40, "preemption_mode": "swap", "swap_space": "16MiB"},
            },
        },
        "kv_transfer": {"bandwidth": "1GB/s", "decode_full": "backpressure"},
    }
    data["policies"] = {"disaggregation": "always"}
    exact, fast = both_ways(data)
    assert exact.violations == [] and fast.violations == []
    assert fast.summary["swap_outs"] > 0 and fast.summary["fast_forward_windows"] > 0
    assert_same_run(exact, fast)


@DIFFERENTIAL
@given(data=pd_scenarios(mixed_only=True))
def test_fast_forward_gives_identical_runs_on_random_pd_clusters_with_mixed_pools(
    windows_of_two_steps, data
):
    """Disaggregated clusters with mixed instances: a mixed instance's step end reserves KV on
    (and starts transfers to) other instances in the middle of their fast-forward windows."""
    exact, fast = both_ways(data)
    assert exact.violations == [] and fast.violations == []
    assert_same_run(exact, fast)


# Found by the property test above (hypothesis): the mixed instance (1) admitted its waiting head
# at step 262 with exact steps (15 prompt tokens, ~100 blocks from its prefix cache and CPU tier)
# while a fast-forward window ran past that step; 7 of 33 completions then differed by up to
# 72 µs. Decode growth evicts cached blocks to the CPU tier, where the head can find its prefix,
# so with a CPU tier a head with shareable blocks is not one only a completion can release and
# no window opens over it.
MIXED_POOL_CPU_TIER_CASE = {
    "seed": 0,
    "latency": {"model": "blackbox", "alpha": [0, 0, 0], "beta": [50, 0, 0]},
    "engine": {
        "kv_blocks": 263,
        "block_size": 1,
        "max_model_len": 263,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "long_prefill_token_threshold": 0,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "kv_cpu_blocks": 131,
        "kv_cpu_latency": 0,
    },
    "workload": {
        "rate": 1000.0,
        "requests": 33,
        "input": 1,
        "output": {"type": "uniform", "min": 1, "max": 36},
        "arrival": "poisson",
        "prefix": {"tokens": 121, "groups": 2},
        "max_output_tokens": "oracle",
    },
    "audit": {"enabled": True, "kv_every_step": True},
    "policies": {"disaggregation": "always", "routing": "round-robin"},
    "cluster": {
        "pools": {"prefill": {"instances": 1}, "mixed": {"instances": 1}},
        "cache_signal_delay": 0,
        "kv_transfer": {"bandwidth": "1MB/s", "base_latency": 0, "sharing": "processor-sharing"},
    },
}


def test_fast_forward_on_a_mixed_instance_with_a_cpu_tier_and_prefix_caching():
    exact, fast = both_ways(MIXED_POOL_CPU_TIER_CASE)
    assert exact.violations == [] and fast.violations == []
    assert_same_run(exact, fast)


def test_the_pinned_mixed_pool_case_agrees_without_the_cpu_tier():
    data = copy.deepcopy(MIXED_POOL_CPU_TIER_CASE)
    data["engine"]["kv_cpu_blocks"] = 0
    exact, fast = both_ways(data)
    assert_same_run(exact, fast)


def pd_with_mixed_pool(pools: dict, **changes) -> dict:
    changes = {
        "requests": 40,
        "rate": 1000,
        "beta": (50, 0, 0),
        "input": {"type": "uniform", "min": 1, "max": 24},
        "output": {"type": "uniform", "min": 1, "max": 40},
        **changes,
    }
    data = scenario_dict(
        block_size=1,
        kv_blocks=212,
        max_model_len=212,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        kv_every_step=True,
        seed=0,
        **changes,
    )
    data.pop("cluster", None)
    data["cluster"] = {
        "pools": pools,
        "kv_transfer": {"bandwidth": "1MB/s", "decode_full": "wait"},
    }
    data["policies"] = {"disaggregation": "always", "routing": "round-robin"}
    return data


ALIGNED = dict(arrival="constant", beta=(100, 0, 0))  # every step boundary on a 100 µs grid


@pytest.mark.parametrize(
    "pools, changes",
    [
        ({"prefill": {"instances": 1}, "mixed": {"instances": 1}}, {}),
        ({"decode": {"instances": 1}, "mixed": {"instances": 2}}, ALIGNED),
    ],
    ids=["prefill+mixed", "decode+mixed, aligned boundaries"],
)
def test_a_kv_reservation_inside_a_window_lands_where_it_does_step_by_step(
    small_windows, pools, changes
):
    """Regression: a KV reservation for an incoming transfer, made at a step end of another
    instance (a mixed one, of higher or lower index) while this instance is inside a
    fast-forward window, used to take its blocks before the window's steps took theirs: the
    window's steps logged kv_used including the later reservation, and completions and
    preemptions could differ from exact steps. The window is now settled at the reservation's
    instant first; a boundary of this instance at that very instant counts as passed when a
    later-priority (higher-index) instance's step has run, as step by step."""
    exact, fast = both_ways(pd_with_mixed_pool(pools, **changes))
    assert exact.violations == [] and fast.violations == []
    assert fast.summary["fast_forward_windows"] > 0
    assert exact.summary["pd"]["transfers_started"] > 0
    assert_same_run(exact, fast)


def test_a_transferred_request_queued_inside_a_window_is_hidden_from_an_earlier_boundary(
    small_windows,
):
    """Regression: a transferred request reaches the mixed decode instance's queue inside a
    window (2022 µs, in the step ending at 2113 µs); a reservation at 2081 µs settles the window,
    forming the step that began at 2003 µs. Step by step, that formation did not see the request
    (its KV was still in flight, held by its reservation): settling must hide it by arrival
    order (its enqueue time is its prefill's), and still count its reserved blocks."""
    data = pd_with_mixed_pool(
        {"prefill": {"instances": 1}, "mixed": {"instances": 1}},
        requests=8,
        input=1,
        output=6,
        beta=(50, 0, 60),
        horizon="4000us",
    )
    data["engine"].update(kv_blocks=12, max_model_len=12, long_prefill_token_threshold=0)
    data["cluster"]["kv_transfer"].update(bandwidth="100GB/s", base_latency="1ms")
    data["policies"]["routing"] = "least-loaded"
    exact, fast = both_ways(data)
    assert exact.violations == [] and fast.violations == []
    assert fast.summary["fast_forward_windows"] > 0
    assert_same_run(exact, fast)
