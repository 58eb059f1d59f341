"""Routing end to end (spec §4.3): what a routing policy does to a whole run, not one decision.

* prefix-aware routing (``prefix-affinity``, ``precise-prefix-cache``) keeps each prefix group on
  few instances, so a cache too small to hold every group everywhere hits far more often than
  under round-robin;
* ``least-loaded`` spreads requests over the instances, ``always-busiest`` piles them on one;
* ``admission_latency`` and ``routing_latency`` delay a request's enqueue by exactly their sum
  (plus the latency model's α queueing time);
* the router's ``observe`` hook is told every decision, with the instance ``route`` returned.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_scenario, scenario_dict

from servesim.policies.routing import RoundRobin
from servesim.simcore import registry
from servesim.simcore.log import configure as configure_logging

# ---------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True, scope="module")
def _logs_to_the_current_stderr():
    """The CLI binds servesim's log stream to ``sys.stderr`` as it is when it runs, so an earlier
    test that ran the CLI under ``capsys`` leaves the logs bound to a closed stream (a warning
    would then raise). Bind them to this module's stderr."""
    configure_logging("warning")


def cluster_scenario(
    routing: Any = "round-robin",
    *,
    instances: int = 4,
    cluster: dict[str, Any] | None = None,
    policies: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    data = scenario_dict(instances=instances, **kw)
    data["cluster"] = {"instances": instances, **(cluster or {})}
    data["policies"] = {"routing": routing, **(policies or {})}
    return data


def per_instance(results, n: int) -> np.ndarray:
    return np.bincount(results.requests["instance"], minlength=n)


def shared_prefix_workload(routing: Any, seed: int) -> dict[str, Any]:
    """8 prefix groups of 16 blocks each on 4 instances of 48 blocks: one instance can hold two
    groups' prefixes (plus the requests' own blocks) but not all eight."""
    return cluster_scenario(
        routing,
        requests=160,
        rate=400,
        input=16,
        output=8,
        kv_blocks=48,
        block_size=4,
        prefix={"tokens": 64, "groups": 8},
        max_num_seqs=8,
        seed=seed,
    )


# ---------------------------------------------------------------------- prefix-aware routing


@pytest.mark.parametrize("seed", [1, 2])
def test_prefix_aware_routing_raises_the_cache_hit_rate_over_round_robin(seed):
    rr = run_scenario(shared_prefix_workload("round-robin", seed))
    affinity = run_scenario(
        shared_prefix_workload({"name": "weighted", "scorers": {"prefix-affinity": 1}}, seed)
    )
    precise = run_scenario(
        shared_prefix_workload(
            {"name": "weighted", "scorers": {"precise-prefix-cache": 2, "queue-depth": 1}}, seed
        )
    )
    default_weighted = run_scenario(shared_prefix_workload("weighted", seed))
    for results in (rr, affinity, precise, default_weighted):
        assert results.violations == []
        assert results.summary["completed_requests"] == 160

    # round-robin visits every instance in turn
    assert per_instance(rr, 4).tolist() == [40, 40, 40, 40]
    base = rr.summary["cache_hit_rate"]
    assert base < 0.3  # each instance sees all eight groups and keeps evicting them
    assert affinity.summary["cache_hit_rate"] > base + 0.2
    assert precise.summary["cache_hit_rate"] > base + 0.1
    assert default_weighted.summary["cache_hit_rate"] > base + 0.1
    # fewer prefix blocks have to be thrown away and recomputed
    assert affinity.summary["kv_evicted_blocks"] < rr.summary["kv_evicted_blocks"]
    assert precise.summary["kv_evicted_blocks"] < rr.summary["kv_evicted_blocks"]
    # the per-request view agrees with the block counters
    for results in (affinity, precise):
        assert (
            results.summary["prefix_cached_token_fraction"]
            > rr.summary["prefix_cached_token_fraction"]
        )


def test_prefix_affinity_sends_every_request_of_a_group_after_the_first_to_one_instance():
    """With a single prefix group, the LRU index makes the first choice sticky (nothing evicts the
    router's memory of it), so the whole run lands on one instance."""
    data = cluster_scenario(
        {"name": "weighted", "scorers": {"prefix-affinity": 1}},
        requests=30,
        rate=200,
        input=8,
        output=4,
        kv_blocks=64,
        block_size=4,
        prefix={"tokens": 32, "groups": 1},
    )
    results = run_scenario(data)
    assert results.violations == []
    counts = per_instance(results, 4)
    assert sorted(counts.tolist()) == [0, 0, 0, 30]


# ---------------------------------------------------------------------- load balancing


def test_least_loaded_spreads_a_burst_that_always_busiest_piles_on_one_instance():
    def run(routing: str):
        data = cluster_scenario(
            routing,
            requests=40,
            rate=2000,
            input=16,
            output=30,
            kv_blocks=128,
            max_num_seqs=64,
            cluster={"snapshot_interval": 0},
        )
        results = run_scenario(data)
        assert results.violations == []
        assert results.summary["completed_requests"] == 40
        return per_instance(results, 4)

    least = run("least-loaded")
    busiest = run("always-busiest")
    assert busiest.tolist() == [40, 0, 0, 0]  # first max on ties, then its own load keeps it first
    assert least.max() - least.min() <= 2
    assert least.max() - least.min() < busiest.max() - busiest.min()


def test_least_loaded_keeps_peak_concurrency_per_instance_lower_than_always_busiest():
    """Peak requests waiting or running on any one instance (from the step log)."""

    def peak(routing: str) -> int:
        data = cluster_scenario(
            routing,
            requests=40,
            rate=2000,
            input=16,
            output=30,
            kv_blocks=128,
            max_num_seqs=4,
            cluster={"snapshot_interval": 0},
        )
        results = run_scenario(data)
        assert results.violations == []
        return max(
            int((log.column("batch_size") + log.column("waiting")).max(initial=0))
            for log in results.record.step_logs
        )

    assert peak("least-loaded") * 2 < peak("always-busiest")


# ---------------------------------------------------------------------- control-plane latencies


@pytest.mark.parametrize(
    ("admission", "routing", "expected"),
    [(0, 0, 0), ("2ms", 0, 2000), (0, "3ms", 3000), ("2ms", "3ms", 5000), ("1us", "1us", 2)],
)
def test_admission_and_routing_latency_delay_enqueue_by_exactly_their_sum(
    admission, routing, expected
):
    data = cluster_scenario(
        "round-robin",
        instances=2,
        requests=1,
        rate=10,
        input=16,
        output=4,
        alpha=(0, 0, 0),
        cluster={"admission_latency": admission, "routing_latency": routing},
    )
    results = run_scenario(data)
    assert results.violations == []
    req = results.requests
    assert req["status"].tolist() == [0]
    assert int(req["enqueue_us"][0] - req["arrival_us"][0]) == expected
    # the instance was idle: the request starts a step the instant it is enqueued
    assert int(req["first_scheduled_us"][0]) == int(req["enqueue_us"][0])


def test_control_plane_latencies_add_to_the_alpha_queueing_delay_for_every_request():
    data = cluster_scenario(
        "least-loaded",
        instances=3,
        requests=30,
        rate=500,
        input={"type": "uniform", "min": 4, "max": 60},
        output=6,
        alpha=(150, 2.5, 0),
        cluster={"admission_latency": "700us", "routing_latency": "1300us"},
    )
    results = run_scenario(data)
    assert results.violations == []
    req = results.requests
    queueing = np.trunc(150 + 2.5 * req["prompt_tokens"]).astype(np.int64)
    np.testing.assert_array_equal(req["enqueue_us"] - req["arrival_us"], 2000 + queueing)


@pytest.mark.parametrize("concurrency", [0, 1, 2])
def test_the_router_decides_in_arrival_order_under_routing_latency_and_concurrency(concurrency):
    """cluster.routing_concurrency decision slots, each busy routing_latency per request: a
    request is decided at max(its arrival, the slot's next free instant) + latency, slots taken
    first come first served (0 = no limit: every request decided its latency after arrival)."""
    latency = 1000
    data = cluster_scenario(
        "round-robin",
        instances=2,
        requests=40,
        rate=3000,  # arrivals ~330 µs apart: faster than one slot decides
        input=16,
        output=4,
        alpha=(0, 0, 0),
        cluster={"routing_latency": "1ms", "routing_concurrency": concurrency},
    )
    results = run_scenario(data)
    assert results.violations == []
    req = results.requests
    order = np.argsort(req["arrival_us"], kind="stable")
    arrivals = req["arrival_us"][order].tolist()
    expected = []
    free = [0] * concurrency
    for at in arrivals:
        if concurrency:
            slot = min(range(concurrency), key=lambda k: free[k])
            free[slot] = max(at, free[slot]) + latency
            expected.append(free[slot])
        else:
            expected.append(at + latency)
    assert req["enqueue_us"][order].tolist() == expected
    # round-robin numbers its decisions: instances alternate in arrival order
    assert req["instance"][order].tolist() == [k % 2 for k in range(len(arrivals))]


def test_zero_latencies_leave_a_single_instance_run_unchanged():
    """A cluster of one behind the router is the bare instance: the same per-request times."""
    base = scenario_dict(requests=25, rate=300, input=24, output=10, kv_blocks=64)
    routed = dict(base)
    routed["cluster"] = {"instances": 1, "admission_latency": 0, "routing_latency": 0}
    routed["policies"] = {"routing": "least-loaded"}
    a, b = run_scenario(base), run_scenario(routed)
    for column in ("enqueue_us", "first_token_us", "completion_us", "instance"):
        np.testing.assert_array_equal(a.requests[column], b.requests[column])


# ---------------------------------------------------------------------- the observe hook


class RecordingRouter(RoundRobin):
    """Round-robin that records every route() and observe() call."""

    name = "test-recording-rr"
    created: list[RecordingRouter] = []

    def __init__(self) -> None:
        super().__init__()
        self.routed: list[tuple[int, int]] = []
        self.observed: list[tuple[int, int]] = []
        self.bound_to = 0
        RecordingRouter.created.append(self)

    def bind(self, num_instances, rng=None) -> None:
        super().bind(num_instances, rng)
        self.bound_to = num_instances

    def route(self, request, snapshots) -> int:
        index = super().route(request, snapshots)
        self.routed.append((request.id, index))
        return index

    def observe(self, request, chosen_index: int) -> None:
        self.observed.append((request.id, chosen_index))


@pytest.fixture
def recording_router():
    RecordingRouter.created.clear()
    registry.register("routing", RecordingRouter.name, RecordingRouter, replace=True)
    yield RecordingRouter
    registry.REGISTRIES["routing"]._items.pop(RecordingRouter.name, None)
    RecordingRouter.created.clear()


def test_the_router_observes_every_decision_with_the_instance_it_chose(recording_router):
    data = cluster_scenario(
        recording_router.name, instances=3, requests=25, rate=400, input=16, output=4
    )
    results = run_scenario(data)
    assert results.violations == []
    router = recording_router.created[-1]  # the scenario loader builds (and drops) one too
    assert router.bound_to == 3
    assert len(router.routed) == 25
    assert router.observed == router.routed
    req = results.requests
    assert dict(router.routed) == dict(zip(req["id"].tolist(), req["instance"].tolist()))


def test_a_rejected_request_is_neither_routed_nor_observed(recording_router):
    data = cluster_scenario(
        recording_router.name,
        instances=2,
        requests=30,
        rate=2000,
        input=40,
        output=4,
        policies={"admission": {"name": "token-bucket", "capacity": 200, "refill_per_s": 1000}},
    )
    results = run_scenario(data)
    assert results.violations == []
    router = recording_router.created[-1]
    rejected = results.summary["rejected_requests"]
    assert rejected > 0
    assert len(router.observed) == 30 - rejected
    assert router.observed == router.routed
    req = results.requests
    admitted_ids = set(req["id"][req["status"] != 5].tolist())
    assert {rid for rid, _ in router.observed} == admitted_ids
