"""The process model (DESIGN §2): each request is one process from arrival to its end, waiting on
its own completion event; the router and the gateway's dispatcher are processes too."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from servesim import load_scenario
from servesim.components.cluster import Cluster
from servesim.components.gateway import Gateway
from servesim.components.request import FINISHED, finished
from servesim.components.router import RouterProcess
from tests.conftest import requests_of, run_scenario, scenario_dict


def test_a_request_process_sees_its_own_completion():
    cluster = Cluster(load_scenario(scenario_dict(requests=12, instances=2)))
    # the engines trigger the request's own event; nothing calls back into the cluster
    assert all(instance.engine.on_finish is finished for instance in cluster.instances)
    seen = []
    record_end = cluster._on_finish

    def spy(req):
        seen.append((req.id, req.done.processed, req.done.value, req.state, req.finish_us))
        assert cluster.env.now == req.finish_us  # in the instant it finished
        record_end(req)

    cluster._on_finish = spy
    record = cluster.run()
    assert sorted(rid for rid, *_ in seen) == list(range(12))
    assert all(
        processed and value is True and state == FINISHED for _, processed, value, state, _ in seen
    )
    assert len(record.requests) == 12


def _feed(router_kwargs, arrivals):
    """Requests 0..n-1 reach a RouterProcess at ``arrivals``; returns (decision time, id) pairs and
    the (routed time, id) pairs their own processes see."""
    env = simpy.Environment()
    decided, routed = [], []

    def decide(req):
        decided.append((env.now, req))
        return f"instance-for-{req}"

    router = RouterProcess(env, decide, **router_kwargs)

    def request(rid, at):
        yield env.timeout(at)
        instance = yield router.route(rid)
        assert instance == f"instance-for-{rid}"
        routed.append((env.now, rid))

    for rid, at in enumerate(arrivals):
        env.process(request(rid, at))
    env.run()
    return decided, routed


def test_the_router_serves_in_arrival_order_under_routing_latency():
    arrivals = [0, 0, 5, 5, 5, 12]
    decided, routed = _feed({"latency_us": 100}, arrivals)
    # every request decided its latency after it arrived (no limit on decisions in progress),
    # same-instant arrivals in the order they arrived
    assert decided == [(at + 100, rid) for rid, at in enumerate(arrivals)]
    assert routed == decided


def test_a_router_with_limited_concurrency_queues_requests_in_arrival_order():
    arrivals = [0, 0, 5, 5, 5, 12]
    decided, _ = _feed({"latency_us": 100, "concurrency": 2}, arrivals)
    # two decision slots: requests wait in the Store for a free one, first come first served
    assert decided == [(100, 0), (100, 1), (200, 2), (200, 3), (300, 4), (300, 5)]


def test_without_routing_latency_a_request_is_routed_in_its_arrival_instant():
    decided, routed = _feed({}, [0, 3, 3])
    assert decided == routed == [(0, 0), (3, 1), (3, 2)]


class _Gate:
    """A detector saturated until ``opens_at`` (µs): the cluster state it reads never pokes."""

    never_saturates = False

    def __init__(self, env, opens_at: int):
        self.env = env
        self.opens_at = opens_at

    def saturation(self, state) -> float:
        return 0.0 if self.env.now >= self.opens_at else 1.0


class _Probe:
    def __init__(self, rid: int):
        self.id = rid
        self.priority = 3


@pytest.mark.parametrize("tick, released_at", [(250, 1250), (400, 1200), (1000, 2000)])
def test_the_detectors_period_decides_when_capacity_opening_silently_is_seen(tick, released_at):
    """Documented (flow-control how-to): while requests wait, the detector samples every ``tick``
    after the last attempt; capacity that opens with no arrival or completion is seen at the next
    sample, and the dispatcher releases then."""
    env = simpy.Environment()
    released = []
    gateway = Gateway(env, _Gate(env, 1100), lambda: None, None, tick_us=tick)
    event = gateway.enqueue(_Probe(0))
    event.callbacks.append(lambda e: released.append((env.now, e.value)))
    env.run(until=5000)
    assert released == [(released_at, True)]
    assert gateway.saturation == 0.0  # the published reading


def test_a_longer_detector_period_delays_releases_on_stale_snapshots():
    def median_wait(tick):
        data = scenario_dict(
            requests=150,
            rate=3000,
            kv_blocks=128,
            max_num_seqs=16,
            instances=2,
            alpha=(300, 0.1, 50),
        )
        data["cluster"] = {"instances": 2, "snapshot_interval": "5ms"}
        data["policies"] = {
            "flow_control": {
                "detector": {"name": "utilization", "queue_depth_threshold": 2},
                "tick": tick,
                "order": "fifo",
            }
        }
        return np.median(requests_of(run_scenario(data))["gateway_wait_us"])

    assert median_wait("1ms") < median_wait("3ms")
