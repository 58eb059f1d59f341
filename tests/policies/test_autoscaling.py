"""The built-in autoscalers' decisions on hand-made fleet signals, their parameter errors, and the
contract check on each."""

from __future__ import annotations

import pytest

from servesim.plugins import check_autoscaler
from servesim.policies.autoscaling import (
    FleetSignals,
    KVUtilizationTarget,
    QueueDepthTarget,
    Schedule,
    SLOAttainmentTarget,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext, get

CTX = PluginContext("cluster.autoscaling.policy")


def build(name: str, **params):
    return get("autoscaler", name).from_config(params, CTX)


def test_queue_depth_asks_for_enough_instances_to_bring_the_wait_to_its_target():
    # 2 ready + 1 starting, 24 waiting: 12 per ready instance, 3x the target of 4 -> 3 x 3 = 9
    signals = FleetSignals(0, ready=2, starting=1, queue_depth=24)
    assert QueueDepthTarget(target=4).desired(signals) == 9


def test_queue_depth_keeps_the_fleet_within_its_tolerance_and_shrinks_on_an_empty_queue():
    near = FleetSignals(0, ready=4, queue_depth=17)  # 4.25 per instance: within 10 % of 4
    assert QueueDepthTarget(target=4, tolerance=0.1).desired(near) == 4
    assert QueueDepthTarget(target=4, tolerance=0.0).desired(near) == 5
    assert QueueDepthTarget().desired(FleetSignals(0, ready=4, queue_depth=0)) == 0


def test_kv_utilization_scales_with_the_mean_utilisation_over_its_target():
    assert (
        KVUtilizationTarget(target=0.7).desired(FleetSignals(0, ready=4, kv_utilization=0.35)) == 2
    )
    assert (
        KVUtilizationTarget(target=0.5).desired(FleetSignals(0, ready=3, kv_utilization=0.9)) == 6
    )
    assert (
        KVUtilizationTarget(target=0.7).desired(FleetSignals(0, ready=3, kv_utilization=0.72)) == 3
    )


def test_slo_attainment_adds_one_below_target_and_removes_one_when_comfortably_above():
    policy = SLOAttainmentTarget(ttft_us=500_000, target=0.9, scale_down_above=0.99)
    assert policy.desired(FleetSignals(0, ready=3, finished=100, attained=80)) == 4
    assert policy.desired(FleetSignals(0, ready=3, finished=100, attained=95)) == 3
    assert policy.desired(FleetSignals(0, ready=3, finished=100, attained=100)) == 2
    # something still waits: no scale-down even at full attainment
    assert policy.desired(FleetSignals(0, ready=3, finished=100, attained=100, queue_depth=2)) == 3
    # nothing ended: nothing to judge
    assert policy.desired(FleetSignals(0, ready=3, starting=1, finished=0)) == 4
    assert policy.needs_ttft and policy.ttft_target_us == 500_000


def test_schedule_follows_its_steps_and_repeats_with_its_period():
    plan = build(
        "schedule",
        steps=[{"at": "0s", "instances": 2}, {"at": "1min", "instances": 5}],
        every="2min",
    )
    at = [0, 59_999_999, 60_000_000, 119_999_999, 120_000_000, 185_000_000]
    assert [plan.desired(FleetSignals(t, ready=1)) for t in at] == [2, 2, 5, 5, 2, 5]
    once = build("schedule", steps=[{"at": 0, "instances": 1}, {"at": "10s", "instances": 3}])
    assert once.desired(FleetSignals(10**12, ready=1)) == 3


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("queue-depth", {"target": 0}, "target"),
        ("queue-depth", {"depth": 4}, "depth"),
        ("kv-utilization", {"target": 1.5}, "target"),
        ("slo-attainment", {"target": 0.95, "scale_down_above": 0.9}, "scale_down_above"),
        ("slo-attainment", {"ttft": "0s"}, "ttft"),
        ("schedule", {}, "steps"),
        ("schedule", {"steps": [{"at": "5s", "instances": 2}]}, "steps[0].at"),
        (
            "schedule",
            {"steps": [{"at": 0, "instances": 2}, {"at": 0, "instances": 3}]},
            "steps[1].at",
        ),
        ("schedule", {"steps": [{"at": 0, "instances": 0}]}, "steps[0].instances"),
        (
            "schedule",
            {"steps": [{"at": 0, "instances": 1}, {"at": "2h", "instances": 2}], "every": "1h"},
            "every",
        ),
    ],
)
def test_bad_parameters_name_their_field(name, params, field):
    with pytest.raises(ScenarioError) as err:
        build(name, **params)
    assert f"cluster.autoscaling.policy.{field}" in str(err.value)


@pytest.mark.parametrize(
    "factory",
    [
        QueueDepthTarget,
        KVUtilizationTarget,
        SLOAttainmentTarget,
        lambda: Schedule([(0, 2), (60_000_000, 4)], every_us=120_000_000),
    ],
    ids=["queue-depth", "kv-utilization", "slo-attainment", "schedule"],
)
def test_every_built_in_passes_the_contract_check(factory):
    check_autoscaler(factory)


def test_the_contract_check_catches_a_negative_or_fractional_answer():
    class Negative(QueueDepthTarget):
        def desired(self, signals):
            return -1

    class Fractional(QueueDepthTarget):
        def desired(self, signals):
            return signals.queue_depth / 3

    for bad in (Negative, Fractional):
        with pytest.raises(AssertionError, match="desired\\(\\) returns an int >= 0"):
            check_autoscaler(bad)
