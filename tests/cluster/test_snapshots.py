"""Signal freshness (INV-7, spec §4.4): what the router sees of the instances, and when.

* queue depth, batch size, KV utilisation and preemptions are re-read lazily once the snapshot is
  ``snapshot_interval`` old (0 = every decision); they read zero until the first refresh, at the
  first decision with ``now >= snapshot_interval``; between refreshes they do not move;
* ``in_flight`` is the router's own count, exact at every decision;
* the prefix-cache view lags by ``cache_signal_delay``: blocks cached less than the delay ago are
  hidden, blocks evicted less than the delay ago are still visible.

Consequences checked end to end: load-aware routing on stale signals herds a burst onto one
instance, on live signals spreads it; least-loaded still spreads a burst with stale signals
because its in-flight counts are live.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
from conftest import run_scenario, scenario_dict

from servesim.components.kvcache import KVCache
from servesim.policies.routing import RoutingPolicy
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
    routing: Any, *, instances: int = 4, cluster: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    data = scenario_dict(instances=instances, **kw)
    data["cluster"] = {"instances": instances, **(cluster or {})}
    data["policies"] = {"routing": routing}
    return data


class SnapshotRecorder(RoutingPolicy):
    """Round-robin that copies every snapshot it is shown (the provider reuses the objects) and,
    for each instance, how many of the request's prompt blocks its cache view reports."""

    name = "test-snapshot-recorder"
    reads_prefix_cache = True
    created: list[SnapshotRecorder] = []

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []
        self._next = 0
        type(self).created.append(self)

    def route(self, request, snapshots) -> int:
        ids = request.prompt_block_ids()
        self.decisions.append(
            {
                "id": request.id,
                "now": request.arrival_us,  # no admission or routing latency in these tests
                "blocks": len(ids),
                "snaps": [
                    {
                        "index": s.index,
                        "queue_depth": s.queue_depth,
                        "batch_size": s.batch_size,
                        "kv_utilization": s.kv_utilization,
                        "free_kv_blocks": s.free_kv_blocks,
                        "total_kv_blocks": s.total_kv_blocks,
                        "preemptions": s.preemptions,
                        "in_flight": s.in_flight,
                        "cached": s.cached_prefix_blocks(ids),
                    }
                    for s in snapshots
                ],
            }
        )
        choice = self._next % len(snapshots)
        self._next += 1
        return snapshots[choice].index


class FirstInstanceRecorder(SnapshotRecorder):
    """Sends everything to instance 0 (so one cache receives every prefix), recording as above."""

    name = "test-snapshot-recorder-first"
    created: list[SnapshotRecorder] = []

    def route(self, request, snapshots) -> int:
        super().route(request, snapshots)
        return snapshots[0].index


@pytest.fixture
def recorders():
    for cls in (SnapshotRecorder, FirstInstanceRecorder):
        cls.created.clear()
        registry.register("routing", cls.name, cls, replace=True)
    yield SnapshotRecorder, FirstInstanceRecorder
    for cls in (SnapshotRecorder, FirstInstanceRecorder):
        registry.REGISTRIES["routing"]._items.pop(cls.name, None)
        cls.created.clear()


LOAD_FIELDS = ("queue_depth", "batch_size", "kv_utilization", "free_kv_blocks", "preemptions")


def load_view(decision: dict[str, Any]) -> list[tuple]:
    return [tuple(s[f] for f in LOAD_FIELDS) for s in decision["snaps"]]


def busy_burst(routing: Any, interval: Any, **kw: Any) -> dict[str, Any]:
    """Constant arrivals every 1 ms of long-running requests: load piles up for the whole run."""
    params = dict(
        requests=60,
        rate=1000,
        arrival="constant",
        input=24,
        output=120,
        kv_blocks=256,
        block_size=4,
        max_num_seqs=3,
        cluster={"snapshot_interval": interval},
    )
    params.update(kw)
    return cluster_scenario(routing, **params)


# ---------------------------------------------------------------------- refresh timing


def test_snapshots_read_zero_until_the_first_interval_then_refresh_once_per_interval(recorders):
    recorder, _ = recorders
    results = run_scenario(busy_burst(recorder.name, "20ms"))
    assert results.violations == []
    decisions = recorder.created[-1].decisions
    assert len(decisions) == 60
    total = 256
    zero = [(0, 0, 0.0, total, 0)] * 4

    before = [d for d in decisions if d["now"] < 20_000]
    assert len(before) >= 15
    for d in before:
        assert load_view(d) == zero, d

    # from the first decision at or after each refresh point, the view is frozen for 20 ms
    refreshes = []
    last = None
    for d in decisions:
        if d["now"] < 20_000:
            continue
        if last is None or d["now"] - last >= 20_000:
            refreshes.append(d)
            last = d["now"]
    assert len(refreshes) == 3  # arrivals run from 20 ms to 60 ms
    for first, nxt in zip(refreshes, refreshes[1:] + [None]):
        stop = nxt["now"] if nxt is not None else float("inf")
        same = [d for d in decisions if first["now"] <= d["now"] < stop]
        assert all(load_view(d) == load_view(first) for d in same)
    # and after the first refresh the router finally sees the load
    assert load_view(refreshes[0]) != zero
    assert any(s["batch_size"] > 0 and s["queue_depth"] > 0 for s in refreshes[0]["snaps"])


def test_with_interval_zero_every_decision_reads_the_live_state(recorders):
    recorder, _ = recorders
    results = run_scenario(busy_burst(recorder.name, 0))
    assert results.violations == []
    decisions = recorder.created[-1].decisions
    early = [d for d in decisions if d["now"] < 20_000]
    # the load shows up long before 20 ms, and keeps changing from decision to decision
    assert any(load_view(d) != [(0, 0, 0.0, 256, 0)] * 4 for d in early)
    views = [load_view(d) for d in decisions]
    assert sum(a != b for a, b in zip(views, views[1:])) > len(views) // 2


def test_in_flight_is_exact_at_every_decision_even_with_stale_snapshots(recorders):
    """The count of requests routed to an instance and not finished, from the request table."""
    recorder, _ = recorders
    results = run_scenario(busy_burst(recorder.name, "1000s", output=20))
    assert results.violations == []
    req = results.requests
    instance = req["instance"]
    finish = req["completion_us"]  # α = 0 and no post-decode overhead: the finishing step's end
    for d in recorder.created[-1].decisions:
        now = d["now"]
        for s in d["snaps"]:
            routed_before = (instance == s["index"]) & (req["id"] < d["id"])
            finished = routed_before & (finish < now)
            maybe = routed_before & (finish == now)  # same instant: either order is legitimate
            low = int(routed_before.sum() - finished.sum() - maybe.sum())
            assert low <= s["in_flight"] <= low + int(maybe.sum()), (d, s)
        assert all(s[f] == 0 for s in d["snaps"] for f in ("queue_depth", "batch_size"))


# ---------------------------------------------------------------------- consequences for routing


@pytest.mark.parametrize(
    ("scorer", "max_num_seqs"),
    [("queue-depth", 2), ("kv-utilization", 64)],  # queues need few slots; KV needs admissions
)
def test_stale_load_signals_herd_a_burst_onto_one_instance(scorer, max_num_seqs):
    """Requests routed between two refreshes all see the same (stale) loads and pick the same
    instance; with live signals each decision sees the previous one's effect."""
    routing = {"name": "weighted", "scorers": {scorer: 1}}

    def window_counts(interval: Any) -> np.ndarray:
        data = busy_burst(
            routing,
            interval,
            rate=500,
            output=150,
            input={"type": "uniform", "min": 8, "max": 64},
            kv_blocks=512,
            max_num_seqs=max_num_seqs,
        )
        results = run_scenario(data)
        assert results.violations == []
        req = results.requests
        # requests arriving in the second snapshot window [40 ms, 80 ms)
        window = (req["arrival_us"] >= 40_000) & (req["arrival_us"] < 80_000)
        return np.bincount(req["instance"][window], minlength=4)

    stale = window_counts("40ms")
    live = window_counts(0)
    assert stale.sum() == live.sum() == 20
    assert stale.max() == 20  # every request of the window on one instance
    assert live.max() <= 8  # spread over the instances
    assert (live > 0).sum() >= 3


def test_least_loaded_spreads_a_burst_with_stale_snapshots_because_in_flight_is_live():
    data = busy_burst("least-loaded", "1000s", rate=5000, output=200, max_num_seqs=64)
    results = run_scenario(data)
    assert results.violations == []
    req = results.requests
    # nothing finishes during the burst, so the in-flight counts alone balance it exactly
    assert req["first_token_us"].min() > 0
    assert int(req["arrival_us"].max()) < int(req["completion_us"].min())
    counts = np.bincount(req["instance"], minlength=4)
    assert counts.tolist() == [15, 15, 15, 15]
    # arrival order: any 4 consecutive requests went to 4 different instances
    instance = req["instance"]
    for k in range(0, 60, 4):
        assert sorted(instance[k : k + 4].tolist()) == [0, 1, 2, 3]


# ---------------------------------------------------------------------- delayed cache signal


def prefix_run(recorder_name: str, delay: Any) -> dict[str, Any]:
    """One prefix group of 8 blocks, a request every 5 ms, all sent to instance 0."""
    return cluster_scenario(
        recorder_name,
        instances=2,
        requests=20,
        rate=200,
        arrival="constant",
        input=8,
        output=2,
        kv_blocks=64,
        block_size=4,
        prefix={"tokens": 32, "groups": 1},
        cluster={"cache_signal_delay": delay, "snapshot_interval": 0},
    )


@pytest.mark.parametrize("delay_us", [0, 1000, 12_000, 50_000])
def test_the_cache_view_hides_blocks_cached_less_than_the_delay_ago(recorders, delay_us):
    _, first = recorders
    delay = f"{delay_us}us" if delay_us else 0
    results = run_scenario(prefix_run(first.name, delay))
    assert results.violations == []
    req = results.requests
    born = int(req["first_scheduled_us"][0])  # the prefix is cached from request 0's prefill on
    decisions = first.created[-1].decisions
    assert [d["blocks"] for d in decisions] == [8] * 20
    for d in decisions:
        visible = d["id"] > 0 and d["now"] - delay_us >= born
        assert d["snaps"][0]["cached"] == (8 if visible else 0), (delay_us, d["now"], born)
        assert d["snaps"][1]["cached"] == 0  # instance 1 never holds anything
    hidden = [d for d in decisions[1:] if d["snaps"][0]["cached"] == 0]
    assert len(hidden) == len([d for d in decisions[1:] if d["now"] - delay_us < born])
    if delay_us >= 12_000:
        assert hidden  # the delay really hid something
    # the engine itself sees the blocks at once: every later request hits them
    assert (req["cached_tokens"][1:] == 32).all()


def test_a_second_request_one_ms_later_sees_no_hit_with_a_50ms_delay(recorders):
    _, first = recorders
    data = prefix_run(first.name, "50ms")
    data["workload"]["rate"] = 1000  # 1 ms apart
    data["workload"]["requests"] = 2
    results = run_scenario(data)
    assert results.violations == []
    second = first.created[-1].decisions[1]
    assert second["snaps"][0]["cached"] == 0
    assert results.requests["cached_tokens"][1] == 32  # the hit is real, only the signal lags

    first.created.clear()
    live = run_scenario(prefix_run(first.name, 0) | {"workload": data["workload"]})
    assert live.violations == []
    assert first.created[-1].decisions[1]["snaps"][0]["cached"] == 8


def test_a_prefix_router_follows_the_cache_only_as_fast_as_the_signal():
    """precise-prefix-cache on one prefix group. With a live view every request after the first
    joins the first one's instance; with a 20 ms delay the requests of the first 20 ms see cold
    caches everywhere and scatter, and a later request only goes to an instance whose copy of
    the prefix is at least 20 ms old."""

    def run(delay: Any):
        data = cluster_scenario(
            {"name": "weighted", "scorers": {"precise-prefix-cache": 1}},
            requests=40,
            rate=200,
            arrival="constant",
            input=8,
            output=2,
            kv_blocks=64,
            block_size=4,
            prefix={"tokens": 32, "groups": 1},
            cluster={"cache_signal_delay": delay},
        )
        results = run_scenario(data)
        assert results.violations == []
        return results.requests

    live = run(0)
    assert len(set(live["instance"].tolist())) == 1
    assert (live["cached_tokens"][1:] == 32).all()

    delayed = run("20ms")
    instance, arrival = delayed["instance"], delayed["arrival_us"]
    assert len(set(instance[arrival < arrival[0] + 20_000].tolist())) >= 2
    # an instance holds the prefix from the prefill of the first request it served
    warm_since = {
        int(i): int(delayed["first_scheduled_us"][instance == i].min()) for i in set(instance)
    }
    for k in range(len(arrival)):
        if any(arrival[k] - 20_000 >= t for t in warm_since.values()):
            assert warm_since[int(instance[k])] <= arrival[k] - 20_000, k


# ---------------------------------------------------------------------- the KV cache's past view


def cache_with_logged_evictions(blocks: int = 4) -> KVCache:
    kv = KVCache(total_blocks=blocks, block_size=4)
    kv.eviction_log = OrderedDict()
    return kv


def test_cached_prefix_as_of_hides_blocks_born_later_and_shows_blocks_evicted_later():
    kv = cache_with_logged_evictions(4)
    ids = [101, 102, 103, 104]
    kv.now = 1_000
    kv.pop_blocks(4)
    held = [kv.register(h) for h in ids]
    assert kv.cached_prefix(ids) == 4  # live view
    kv.release(0, held)  # free but still cached
    assert kv.cached_prefix(ids) == 4
    kv.now = 5_000
    kv.pop_blocks(4)  # reused for something else: the prefix is evicted at 5 ms
    assert kv.evictions == 4
    assert kv.cached_prefix(ids) == 0
    # queries with a non-decreasing as_of, as a delayed router makes them
    assert kv.cached_prefix(ids, as_of=999) == 0  # not cached yet
    assert kv.cached_prefix(ids, as_of=1_000) == 4
    assert kv.cached_prefix(ids, as_of=4_999) == 4  # evicted, but the signal has not caught up
    assert kv.cached_prefix(ids, as_of=5_000) == 0
    assert kv.cached_prefix(ids, as_of=9_000) == 0


def test_cached_prefix_as_of_counts_only_the_leading_run():
    kv = cache_with_logged_evictions(4)
    kv.now = 100
    kv.pop_blocks(2)
    a = kv.register(1)
    kv.now = 300
    b = kv.register(2)
    assert kv.cached_prefix([1, 2, 3], as_of=200) == 1  # block 2 is newer than the view
    assert kv.cached_prefix([2, 1], as_of=200) == 0  # the first block is what matters
    assert kv.cached_prefix([1, 2, 3], as_of=300) == 2
    kv.release(0, [a, b])


def test_an_evicted_then_recached_block_is_seen_through_both_lives():
    kv = cache_with_logged_evictions(1)
    kv.now = 100
    kv.pop_blocks(1)
    kv.release(0, [kv.register(7)])
    kv.now = 200
    kv.pop_blocks(1)  # evicts 7
    kv.release(1, [])
    kv.now = 300
    kv.pop_blocks(1)
    kv.release(0, [kv.register(7)])  # cached again at 300
    assert kv.cached_prefix([7], as_of=150) == 1  # first life
    assert kv.cached_prefix([7], as_of=250) == 0  # between lives
    assert kv.cached_prefix([7], as_of=300) == 1  # second life


# ---------------------------------------------------------------------- fast-forward windows


@pytest.mark.parametrize(
    "routing",
    [
        "least-loaded",
        {"name": "weighted", "scorers": {"kv-utilization": 1}},
        {"name": "weighted", "scorers": {"queue-depth": 1, "running-requests": 1, "vllm-dp": 1}},
    ],
)
@pytest.mark.parametrize("interval", [0, "3ms"])
def test_snapshots_read_inside_a_fast_forward_window_match_a_step_by_step_run(
    routing, interval, small_windows
):
    """Load signals read while an instance is inside a fast-forwarded decode window (KV use from
    the window's precomputed allocations) equal what a step-by-step run shows: every routing
    decision, and so every request's timeline, is the same."""
    data = cluster_scenario(
        routing,
        instances=3,
        requests=40,
        rate=300,
        input={"type": "uniform", "min": 4, "max": 40},
        output={"type": "uniform", "min": 5, "max": 80},
        kv_blocks=40,
        block_size=4,
        max_num_seqs=8,
        seed=4,
        cluster={"snapshot_interval": interval},
    )
    data["policies"]["flow_control"] = {
        "detector": {
            "name": "utilization",
            "queue_depth_threshold": 2,
            "kv_utilization_threshold": 0.6,
        }
    }
    runs = []
    for exact in (True, False):
        data["exact_steps"] = exact
        results = run_scenario(data)
        assert results.violations == []
        runs.append(results)
    exact_run, windowed = runs
    assert windowed.summary["fast_forward_windows"] > 0
    for column in ("instance", "enqueue_us", "gateway_wait_us", "first_token_us", "completion_us"):
        np.testing.assert_array_equal(exact_run.requests[column], windowed.requests[column])
