"""Saturation detectors of the gateway queue (spec §4.2) and their parameter validation."""

from __future__ import annotations

import math

import pytest

from servesim.policies.saturation import Concurrency, Never, SaturationDetector, Utilization
from servesim.policies.snapshot import ClusterState, InstanceSnapshot
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext

PATH = "policies.flow_control"


def state(*instances):
    """``instances``: (queue_depth, kv_utilization, in_flight) per instance."""
    return ClusterState(
        0,
        [
            InstanceSnapshot(i, queue_depth=q, kv_utilization=k, in_flight=f)
            for i, (q, k, f) in enumerate(instances)
        ],
    )


def test_never_reports_zero_and_says_so():
    assert Never().saturation(state((100, 1.0, 100))) == 0.0
    assert Never.never_saturates and not Utilization.never_saturates
    assert not Concurrency.never_saturates and not SaturationDetector.never_saturates


def test_utilization_is_the_mean_of_each_instances_worse_ratio():
    # max(10/5, 0.4/0.8) = 2, max(1/5, 0.6/0.8) = 0.75, max(0, 0) = 0 -> mean 2.75/3
    s = state((10, 0.4, 0), (1, 0.6, 0), (0, 0.0, 0))
    assert Utilization().saturation(s) == pytest.approx(2.75 / 3)
    custom = Utilization.from_config(
        {"queue_depth_threshold": 2, "kv_utilization_threshold": 0.5},
        PluginContext(PATH),
    )
    # max(5, 0.8), max(0.5, 1.2), max(0, 0) -> 6.2 / 3
    assert custom.saturation(s) == pytest.approx(6.2 / 3)


def test_concurrency_divides_in_flight_by_total_capacity():
    s = state((0, 0, 30), (0, 0, 50))
    assert Concurrency().saturation(s) == pytest.approx(80 / 200)
    assert (
        Concurrency.from_config({"max_concurrency": 40}, PluginContext(PATH)).saturation(s) == 1.0
    )


@pytest.mark.parametrize("detector", [Utilization(), Concurrency()])
def test_no_routable_instance_is_saturated(detector):
    assert detector.saturation(ClusterState(0, [])) == 1.0


@pytest.mark.parametrize(
    "cls,field,bad",
    [
        (Utilization, "queue_depth_threshold", math.nan),
        (Utilization, "queue_depth_threshold", 0),
        (Utilization, "queue_depth_threshold", -2),
        (Utilization, "kv_utilization_threshold", math.inf),
        (Utilization, "kv_utilization_threshold", 0.0),
        (Utilization, "kv_utilization_threshold", "high"),
        (Concurrency, "max_concurrency", math.nan),
        (Concurrency, "max_concurrency", 0),
        (Concurrency, "max_concurrency", 2.5),
    ],
)
def test_thresholds_must_be_positive_and_finite(cls, field, bad):
    with pytest.raises(ScenarioError) as info:
        cls.from_config({field: bad}, PluginContext(PATH))
    assert info.value.path == f"{PATH}.{field}"


def test_defaults_and_unknown_fields():
    u = Utilization.from_config({}, PluginContext(PATH))
    assert (u.queue_depth_threshold, u.kv_utilization_threshold) == (5.0, 0.8)
    assert Concurrency.from_config({}, PluginContext(PATH)).max_concurrency == 100
    with pytest.raises(ScenarioError) as info:
        Utilization.from_config({"queue_depth": 3}, PluginContext(PATH))
    assert "queue_depth_threshold" in str(info.value)
    with pytest.raises(ScenarioError):
        Never.from_config({"x": 1}, PluginContext(PATH))


def test_the_builtins_are_registered():
    assert {"never", "utilization", "concurrency"} <= set(registry.registry("saturation").names())
