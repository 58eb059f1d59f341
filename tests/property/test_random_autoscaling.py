"""Random autoscaled clusters through the whole simulator and the auditor: whatever the autoscaler,
its settings, the router and the gateway, no request is routed to an instance that is not ready,
no instance runs while it is down, every instance's life follows cold → loading → warming →
ready → draining → stopped, and the run's own audit finds nothing."""

from __future__ import annotations

from conftest import scenario_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.audit.autoscaling import check_fleet
from servesim.components.autoscaler import STATES
from servesim.run import audit_input, simulate
from servesim.scenario import load_scenario

POLICIES = st.one_of(
    st.builds(lambda t: {"name": "queue-depth", "target": t}, st.sampled_from([0.5, 2, 8])),
    st.builds(lambda t: {"name": "kv-utilization", "target": t}, st.sampled_from([0.1, 0.5, 0.9])),
    st.builds(
        lambda ttft: {"name": "slo-attainment", "ttft": ttft, "target": 0.9},
        st.sampled_from(["20ms", "200ms", "2s"]),
    ),
    st.builds(
        lambda a, b: {
            "name": "schedule",
            "steps": [{"at": 0, "instances": a}, {"at": "1500ms", "instances": b}],
            "every": "3s",
        },
        st.integers(1, 4),
        st.integers(1, 4),
    ),
)


@st.composite
def autoscaled(draw):
    fleet = draw(st.integers(2, 4))
    low = draw(st.integers(1, fleet))
    data = scenario_dict(
        requests=draw(st.integers(20, 150)),
        rate=draw(st.sampled_from([20.0, 80.0, 300.0])),
        input=draw(st.sampled_from([16, 64, 200])),
        output=draw(st.sampled_from([4, 32])),
        kv_blocks=draw(st.sampled_from([64, 512])),
        beta=(2000, 5, 200),
        instances=fleet,
        seed=draw(st.integers(0, 1000)),
        kv_every_step=True,
        kv_cpu_blocks=draw(st.sampled_from([0, 32])),  # a stopped instance empties its tier
    )
    data["cluster"]["autoscaling"] = {
        "policy": draw(POLICIES),
        "min_instances": low,
        "max_instances": draw(st.integers(low, fleet)),
        "interval": draw(st.sampled_from(["50ms", "300ms"])),
        "load_time": draw(st.sampled_from(["1us", "100ms", "700ms"])),
        "warmup": draw(st.sampled_from(["0s", "200ms"])),
        "scale_up_cooldown": draw(st.sampled_from(["0s", "500ms"])),
        "scale_down_cooldown": draw(st.sampled_from(["0s", "500ms"])),
    }
    data["cluster"]["routing_latency"] = draw(st.sampled_from([0, "2ms"]))
    data["cluster"]["snapshot_interval"] = draw(st.sampled_from([0, "10ms"]))
    data["policies"] = {
        "routing": draw(st.sampled_from(["round-robin", "least-loaded", "random", "weighted"]))
    }
    if draw(st.booleans()):
        data["policies"]["flow_control"] = {"detector": "utilization"}
    if draw(st.booleans()):
        data["horizon"] = "1500ms"
    return data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(autoscaled())
def test_random_autoscaled_clusters_route_only_to_ready_instances(data):
    results = simulate(load_scenario(data))
    assert results.violations == [], results.violations
    fleet = results.record.fleet
    assert list(check_fleet(fleet, audit_input(results.record).steps)) == []
    # every routed request went to an instance that is still accounted for at the end
    assert len(fleet["routed"]) <= results.summary["injected_requests"]
    assert all(state in STATES for state in fleet["state_at_end"])
    ready_or_up = [s for s in fleet["state_at_end"] if s in ("ready", "draining")]
    assert ready_or_up, "an autoscaled cluster always keeps one instance to route to"
