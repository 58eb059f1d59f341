"""The process model (DESIGN §2): each request is one process from arrival to its end, waiting on
its own completion event; the router and the gateway's dispatcher are processes too."""

from __future__ import annotations

from servesim import load_scenario
from servesim.components.cluster import Cluster
from servesim.components.request import FINISHED, finished
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
