"""The process model (DESIGN §2): each request is one process from arrival to its end, waiting on
its own completion event; the router and the gateway's dispatcher are processes too."""

from __future__ import annotations

import simpy

from servesim import load_scenario
from servesim.components.cluster import Cluster
from servesim.components.request import FINISHED, finished
from servesim.components.router import RouterProcess
from tests.conftest import scenario_dict


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
