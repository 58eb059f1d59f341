"""Autoscaled clusters end to end: a spike is answered within the cooldown and the start-up time,
the fleet stays within its bounds, a schedule is followed, the fleet's audit checks hold (and
catch a tampered log), and bad settings name their field."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import scenario_dict

from servesim.audit.autoscaling import check_fleet
from servesim.components.autoscaler import LOADING, READY, STATES
from servesim.components.record import fleet_states_at
from servesim.run import audit_input, simulate
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError

LOAD_US, WARMUP_US, INTERVAL_US = 2_000_000, 1_000_000, 1_000_000


def fleet_scenario(
    policy: Any = "queue-depth", *, fleet: int = 4, rate: float = 20, spike: bool = True, **settings
) -> dict[str, Any]:
    """A blackbox cluster (about 40 requests/s per instance) whose rate is five times higher
    from 5 s to 10 s; instances load for 2 s and warm up for 1 s; samples every second."""
    data = scenario_dict(
        requests=100_000,
        rate=rate,
        input=64,
        output=32,
        kv_blocks=512,
        max_num_seqs=8,
        beta=(5000, 10, 100),
        instances=fleet,
    )
    data["workload"]["duration"] = "20s"
    if spike:
        data["workload"]["stages"] = [{"spike": {"at": "5s", "duration": "5s", "multiplier": 5}}]
    data["cluster"]["autoscaling"] = {
        "policy": policy,
        "load_time": "2s",
        "warmup": "1s",
        "interval": "1s",
        "scale_up_cooldown": "2s",
        "scale_down_cooldown": "4s",
        **settings,
    }
    return data


def run(data: dict[str, Any]):
    results = simulate(load_scenario(data))
    assert results.violations == [], results.violations
    fleet = results.record.fleet
    assert list(check_fleet(fleet, audit_input(results.record).steps)) == []
    return results, fleet


def ready_counts(fleet: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The number of ready instances after each state change, and the change's time."""
    events = fleet["events"]
    step = np.where(events[:, 2] == READY, 1, np.where(events[:, 2] == READY + 1, -1, 0))
    return events[:, 0], np.cumsum(step)


def test_the_queue_depth_autoscaler_serves_a_spike_within_cooldown_and_start_up():
    results, fleet = run(fleet_scenario(min_instances=1))
    events = fleet["events"]
    starts = events[events[:, 2] == LOADING]
    assert len(starts), "the spike started no instance"
    # the first sample after the spike begins (5 s) sees the queue: it starts an instance then
    first = int(starts[0, 0])
    assert 5_000_000 < first <= 5_000_000 + 2 * INTERVAL_US
    # ... and that instance is ready one load and one warm-up later, and serves requests
    k = int(starts[0, 1])
    ready_at = events[(events[:, 1] == k) & (events[:, 2] == READY)][0, 0]
    assert ready_at == first + LOAD_US + WARMUP_US
    assert np.sum(results.requests["instance"] == k) > 0
    summary = results.summary["autoscaling"]
    assert summary["scale_ups"] >= 1 and summary["peak_ready"] >= 2


def test_requests_only_go_to_instances_that_were_ready_when_routed():
    results, fleet = run(fleet_scenario(min_instances=1))
    routed = fleet["routed"]
    assert len(routed) == results.summary["injected_requests"]
    events = fleet["events"]
    for rid, t, k, _ in routed[:: max(1, len(routed) // 200)].tolist():
        mine = events[(events[:, 1] == k) & (events[:, 0] <= t)]
        assert STATES[mine[-1, 2]] in ("ready", "draining"), (rid, t, k)


def test_the_fleet_stays_within_min_and_max():
    results, fleet = run(fleet_scenario(min_instances=2, max_instances=3, fleet=5))
    samples = fleet["samples"]
    assert samples[:, 2].min() >= 2 and samples[:, 2].max() <= 3
    events = fleet["events"]
    up = np.cumsum(np.where(events[:, 2] == LOADING, 1, 0) - np.where(events[:, 2] == 5, 1, 0))
    assert up.max() + 2 <= 3  # the two initial instances plus those started
    assert fleet["gpu_us"][3:] == [0, 0]  # instances 3 and 4 were never needed
    _, ready = ready_counts(fleet)
    assert ready.min() >= 1


def test_a_schedule_is_followed_one_start_up_later():
    plan = {
        "name": "schedule",
        "steps": [
            {"at": "0s", "instances": 1},
            {"at": "4s", "instances": 3},
            {"at": "12s", "instances": 1},
        ],
    }
    _, fleet = run(
        fleet_scenario(plan, spike=False, scale_up_cooldown="0s", scale_down_cooldown="0s")
    )
    times, ready = ready_counts(fleet)
    # sampled at 4 s: two instances start and are ready 3 s later; at 12 s two drain
    assert ready[times <= 4_000_000][-1] == 1
    assert ready[times <= 7_000_000][-1] == 3
    starts = fleet["events"][fleet["events"][:, 2] == LOADING]
    assert starts[:, 0].tolist() == [4_000_000, 4_000_000]
    drains = fleet["events"][fleet["events"][:, 2] == READY + 1]
    assert drains[:, 0].tolist() == [12_000_000, 12_000_000]


def test_gpu_hours_run_from_loading_to_stop_and_cost_uses_the_given_price():
    results, fleet = run(fleet_scenario(cost_per_gpu_hour=3.0, min_instances=1))
    events = fleet["events"]
    end = results.record.end_us
    for k in range(4):
        mine = events[events[:, 1] == k]
        expected, since = 0, None
        for t, _, state in mine.tolist():
            if state in (LOADING,) or (state == READY and t == 0 and since is None):
                since = t
            elif state == 5:
                expected += t - since
                since = None
        if since is not None:
            expected += end - since
        assert fleet["gpu_us"][k] == expected, k
    summary = results.summary["autoscaling"]
    assert summary["gpu_hours"] == pytest.approx(sum(fleet["gpu_us"]) / 3.6e9)
    assert summary["cost_usd"] == pytest.approx(3.0 * summary["gpu_hours"])


def test_the_fleet_audit_catches_a_request_routed_to_a_cold_instance_and_a_bad_change():
    results, fleet = run(fleet_scenario(min_instances=1))
    steps = audit_input(results.record).steps
    cold = dict(fleet)
    cold["routed"] = fleet["routed"].copy()
    cold["routed"][0, 2] = 3  # instance 3 was cold at the first decision
    found = list(check_fleet(cold, steps))
    assert [v.invariant for v in found] == ["INV-AS-2"]
    skipped = dict(fleet)
    events = fleet["events"]
    skipped["events"] = events[~(events[:, 2] == 2)]  # loading straight to ready
    assert any(v.invariant == "INV-AS-1" for v in check_fleet(skipped, steps))


def test_autoscaling_false_is_the_same_run_as_no_autoscaling():
    base = scenario_dict(requests=200, rate=50, instances=3)
    off = scenario_dict(requests=200, rate=50, instances=3)
    off["cluster"]["autoscaling"] = False
    one, two = simulate(load_scenario(base)), simulate(load_scenario(off))
    assert one.summary == two.summary
    assert "autoscaling" not in one.summary and one.record.fleet is None


@pytest.mark.parametrize(
    "change, field",
    [
        ({"max_instances": 9}, "cluster.autoscaling.max_instances"),
        ({"min_instances": 3, "max_instances": 2}, "cluster.autoscaling.max_instances"),
        ({"initial_instances": 4, "max_instances": 3}, "cluster.autoscaling.initial_instances"),
        ({"policy": "no-such-autoscaler"}, "cluster.autoscaling.policy"),
        ({"policy": {"name": "queue-depth", "target": -1}}, "cluster.autoscaling.policy.target"),
        ({"interval": "0s"}, "cluster.autoscaling.interval"),
        ({"load_bandwidth": 0}, "cluster.autoscaling.load_bandwidth"),
        ({"cooldown": "1s"}, "cluster.autoscaling"),
    ],
)
def test_bad_settings_name_their_field(change, field):
    with pytest.raises(ScenarioError) as err:
        load_scenario(fleet_scenario(**change) if "policy" not in change else _with_policy(change))
    assert field in str(err.value)


def _with_policy(change: dict) -> dict:
    data = fleet_scenario()
    data["cluster"]["autoscaling"].update(change)
    return data


def test_autoscaling_with_pools_is_refused_naming_the_field():
    data = fleet_scenario()
    data["cluster"]["pools"] = {"prefill": {"instances": 1}, "decode": {"instances": 1}}
    del data["cluster"]["instances"]
    data["model"] = "qwen3-14b"
    data["gpu"] = "H100"
    with pytest.raises(ScenarioError, match="cluster.autoscaling"):
        simulate(load_scenario(data))


def test_instance_states_at_sample_times_follow_the_event_log():
    events = np.array(
        [[0, 0, 3], [5, 1, 1], [8, 1, 2], [10, 1, 3], [10, 0, 4], [12, 0, 5]], dtype=np.int64
    )
    times = np.array([0, 4, 5, 9, 10, 11, 12, 20])
    assert fleet_states_at(events, 0, times).tolist() == (
        ["ready"] * 4 + ["draining", "draining", "stopped", "stopped"]
    )
    assert fleet_states_at(events, 1, times).tolist() == (
        ["cold", "cold", "loading", "warming", "ready", "ready", "ready", "ready"]
    )
    assert fleet_states_at(events, 2, times).tolist() == ["cold"] * 8


def test_timeseries_csv_of_an_autoscaled_run_names_each_instance_state():
    from servesim.analysis.tables import timeseries_csv

    results, fleet = run(fleet_scenario(min_instances=1))
    lines = timeseries_csv(results.record, 1_000_000).splitlines()
    assert lines[0].endswith(",state")
    started = int(fleet["events"][fleet["events"][:, 2] == LOADING][0, 1])
    mine = [row.split(",") for row in lines[1:] if row.split(",")[1] == str(started)]
    assert mine[0][-1] == "cold" and "ready" in {row[-1] for row in mine}
