"""Admission control end to end (spec §4.1): who gets into the cluster, decided once per request
at arrival (+ admission latency), before routing.

* ``token-bucket`` admits exactly what a reference bucket admits: a burst empties it, the refill
  lets requests in again, and with no refill nothing more ever gets in;
* ``reject-all`` rejects every request, and the books still balance;
* ``tier-shed`` rejects the sheddable tiers only while some instance has load, never ``critical``
  or ``standard``;
* ``gaie-legacy`` never rejects a non-sheddable request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_scenario, scenario_dict

from servesim.components.record import STATUS_COMPLETED, STATUS_REJECTED
from servesim.simcore.log import configure as configure_logging

SHEDDABLE = {"batch", "sheddable", "background"}
ALL_CLASSES = {"critical": 1, "standard": 1, "batch": 1, "sheddable": 1, "background": 1}


@pytest.fixture(autouse=True, scope="module")
def _logs_to_the_current_stderr():
    """The CLI binds servesim's log stream to ``sys.stderr`` as it is when it runs, so an earlier
    test that ran the CLI under ``capsys`` leaves the logs bound to a closed stream (a warning
    would then raise). Bind them to this module's stderr."""
    configure_logging("warning")


def admission_scenario(
    admission: Any,
    *,
    instances: int = 2,
    mix: Any = None,
    cluster: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    data = scenario_dict(instances=instances, **kw)
    data["cluster"] = {"instances": instances, **(cluster or {})}
    data["policies"] = {"routing": "least-loaded", "admission": admission}
    if mix is not None:
        data["workload"]["slo_class"] = mix
    return data


def classes_of(results) -> np.ndarray:
    labels = results.record.requests.labels("slo_class")
    return np.array([labels[c] for c in results.requests["slo_class"]], dtype=object)


def assert_balanced(results) -> None:
    s = results.summary
    assert results.violations == [], results.violations
    assert s["conservation"]["balanced"]
    served = s["completed_requests"] + s["dropped_unservable"]
    assert served + s["rejected_requests"] == s["injected_requests"]
    assert s["anomalies"]["admission_rejections"] == s["rejected_requests"]


def reference_bucket(
    times_us: np.ndarray, costs: np.ndarray, capacity: float, refill_per_s: float
) -> list[bool]:
    """The token bucket of spec §4.1, decision by decision."""
    tokens, last, out = capacity, 0, []
    for now, cost in zip(times_us.tolist(), costs.tolist()):
        elapsed = now - last
        if elapsed > 0:
            tokens = min(capacity, tokens + elapsed * refill_per_s / 1e6)
            last = now
        if tokens >= cost:
            tokens -= cost
            out.append(True)
        else:
            out.append(False)
    return out


# ---------------------------------------------------------------------- token bucket


@pytest.mark.parametrize(
    ("capacity", "refill", "admission_latency"),
    [(200, 2000, 0), (200, 2000, "3ms"), (120, 700, 0), (1000, 10_000, "1ms")],
)
def test_token_bucket_admits_exactly_what_the_reference_bucket_admits(
    capacity, refill, admission_latency
):
    data = admission_scenario(
        {"name": "token-bucket", "capacity": capacity, "refill_per_s": refill},
        requests=60,
        rate=300,
        input={"type": "uniform", "min": 10, "max": 90},
        output=4,
        kv_blocks=128,
        cluster={"admission_latency": admission_latency},
    )
    results = run_scenario(data)
    assert_balanced(results)
    req = results.requests
    latency = {0: 0, "3ms": 3000, "1ms": 1000}[admission_latency]
    expected = reference_bucket(req["arrival_us"] + latency, req["prompt_tokens"], capacity, refill)
    admitted = (req["status"] != STATUS_REJECTED).tolist()
    assert admitted == expected
    assert not all(admitted) and any(admitted)


def test_token_bucket_empties_under_a_burst_and_recovers_with_refill():
    """50-token prompts every 10 ms against a 200-token bucket refilled at 2500 tokens/s (25 per
    gap): each request nets -25 tokens, so the bucket lasts seven requests; from then on the
    refill lets every other request in."""
    data = admission_scenario(
        {"name": "token-bucket", "capacity": 200, "refill_per_s": 2500},
        requests=24,
        rate=100,
        arrival="constant",
        input=50,
        output=2,
        kv_blocks=128,
    )
    results = run_scenario(data)
    assert_balanced(results)
    admitted = (results.requests["status"] == STATUS_COMPLETED).astype(int).tolist()
    assert admitted == [1] * 7 + [0, 1] * 8 + [0]


def test_token_bucket_without_refill_admits_capacity_over_cost_then_nothing():
    data = admission_scenario(
        {"name": "token-bucket", "capacity": 200, "refill_per_s": 0},
        requests=30,
        rate=50,
        input=40,
        output=2,
        kv_blocks=64,
    )
    results = run_scenario(data)
    assert_balanced(results)
    status = results.requests["status"]
    assert (status[:5] == STATUS_COMPLETED).all()
    assert (status[5:] == STATUS_REJECTED).all()


def test_a_prompt_larger_than_the_bucket_is_never_admitted():
    data = admission_scenario(
        {"name": "token-bucket", "capacity": 30, "refill_per_s": 1e6},
        requests=10,
        rate=10,
        input=31,
        output=2,
    )
    results = run_scenario(data)
    assert_balanced(results)
    assert results.summary["rejected_requests"] == 10


# ---------------------------------------------------------------------- reject-all


@pytest.mark.parametrize("flow_control", [None, {"detector": "utilization", "max_queue": 3}])
def test_reject_all_rejects_every_request_and_the_books_balance(flow_control):
    data = admission_scenario("reject-all", requests=25, rate=500, mix=ALL_CLASSES)
    if flow_control is not None:
        data["policies"]["flow_control"] = flow_control
    results = run_scenario(data)
    assert_balanced(results)
    s = results.summary
    assert s["rejected_requests"] == s["injected_requests"] == 25
    assert s["completed_requests"] == 0
    assert s["steps"] == 0  # nothing ever reached an instance
    req = results.requests
    assert (req["instance"] == -1).all()
    assert (req["enqueue_us"] == -1).all()
    assert (req["gateway_wait_us"] == -1).all()  # rejected before the gateway
    assert s["anomalies"]["gateway_peak_depth"] == 0
    reasons = results.record.requests.labels("finish_reason")
    assert {reasons[c] for c in req["finish_reason"]} == {"admission"}
    assert s["fairness"]["jain_classes_completion_rate"] in (0.0, 1.0)  # all-zero rates: no NaN


def test_reject_all_with_a_horizon_and_admission_latency_leaves_late_requests_in_transit():
    data = admission_scenario(
        "reject-all",
        requests=20,
        rate=1000,
        arrival="constant",
        horizon="10ms",
        cluster={"admission_latency": "5ms"},
    )
    results = run_scenario(data)
    s = results.summary
    assert results.violations == []
    assert s["conservation"]["balanced"]
    # arrivals at 1..9 ms (10 ms is past the horizon); those before 5 ms were decided by 10 ms
    assert s["injected_requests"] == 9
    assert s["rejected_requests"] == 5
    assert s["in_transit"] == 4


# ---------------------------------------------------------------------- tier-shed


def in_flight_at_arrivals(results) -> np.ndarray:
    """For each request, how many admitted requests were in flight at its arrival (α = 0:
    in flight from arrival to the end of the finishing step, ties counted as finished)."""
    req = results.requests
    arrival = req["arrival_us"]
    admitted = req["status"] == STATUS_COMPLETED
    finish = np.where(admitted, req["completion_us"], -1)
    out = np.zeros(len(arrival), dtype=np.int64)
    for k in range(len(arrival)):
        before = admitted & (req["id"] < req["id"][k])
        out[k] = int((before & (finish > arrival[k])).sum())
    return out


def test_tier_shed_admits_everyone_while_the_cluster_is_idle():
    data = admission_scenario(
        {"name": "tier-shed", "threshold": 0},
        requests=30,
        rate=20,
        arrival="constant",
        input=16,
        output=4,
        mix=ALL_CLASSES,
        cluster={"snapshot_interval": 0},
    )
    results = run_scenario(data)
    assert_balanced(results)
    assert results.summary["rejected_requests"] == 0
    assert (in_flight_at_arrivals(results) == 0).all()  # each request found the cluster idle


def test_tier_shed_rejects_only_sheddable_tiers_and_only_under_load():
    data = admission_scenario(
        {"name": "tier-shed", "threshold": 0},
        requests=80,
        rate=400,
        input=16,
        output=30,
        kv_blocks=128,
        mix=ALL_CLASSES,
        cluster={"snapshot_interval": 0},
    )
    results = run_scenario(data)
    assert_balanced(results)
    req = results.requests
    cls = classes_of(results)
    rejected = req["status"] == STATUS_REJECTED
    assert rejected.any()
    assert set(cls[rejected]) <= SHEDDABLE
    assert not rejected[np.isin(cls, ["critical", "standard"])].any()
    # threshold 0: a sheddable request is rejected exactly when something is in flight
    busy = in_flight_at_arrivals(results) > 0
    sheddable = np.isin(cls, sorted(SHEDDABLE))
    np.testing.assert_array_equal(rejected[sheddable], busy[sheddable])
    assert (~busy[sheddable]).any()  # and some sheddable requests did find the cluster idle


def test_tier_shed_min_priority_moves_the_cut():
    """min_priority 4 sheds standard too; critical (4) still always passes."""
    data = admission_scenario(
        {"name": "tier-shed", "threshold": 0, "min_priority": 4},
        requests=60,
        rate=400,
        input=16,
        output=30,
        kv_blocks=128,
        mix={"critical": 1, "standard": 1},
        cluster={"snapshot_interval": 0},
    )
    results = run_scenario(data)
    assert_balanced(results)
    cls = classes_of(results)
    rejected = results.requests["status"] == STATUS_REJECTED
    assert rejected[cls == "standard"].any()
    assert not rejected[cls == "critical"].any()


def test_tier_shed_with_a_high_threshold_behaves_like_always_admit():
    base = admission_scenario(
        "always-admit", requests=40, rate=400, output=10, mix=ALL_CLASSES, kv_blocks=128
    )
    shed = admission_scenario(
        {"name": "tier-shed", "threshold": 1000},
        requests=40,
        rate=400,
        output=10,
        mix=ALL_CLASSES,
        kv_blocks=128,
    )
    a, b = run_scenario(base), run_scenario(shed)
    assert_balanced(b)
    assert b.summary["rejected_requests"] == 0
    for column in ("instance", "enqueue_us", "completion_us"):
        np.testing.assert_array_equal(a.requests[column], b.requests[column])


# ---------------------------------------------------------------------- gaie-legacy


def test_gaie_legacy_never_rejects_non_sheddable_requests():
    data = admission_scenario(
        {"name": "gaie-legacy", "queue_depth_threshold": 1, "kv_utilization_threshold": 0.05},
        requests=80,
        rate=1000,
        input=24,
        output=30,
        kv_blocks=128,
        max_num_seqs=2,
        mix=ALL_CLASSES,
        cluster={"snapshot_interval": 0},
    )
    results = run_scenario(data)
    assert_balanced(results)
    cls = classes_of(results)
    rejected = results.requests["status"] == STATUS_REJECTED
    assert rejected.any()
    assert set(cls[rejected]) <= SHEDDABLE


# ---------------------------------------------------------------------- goodput accounting


def test_rejected_requests_count_as_slo_misses_in_goodput():
    """Goodput's denominator is every injected request of a class, so admission rejections lower
    SLO attainment; the per-class counts agree with the request table."""
    data = admission_scenario(
        {"name": "tier-shed", "threshold": 0},
        requests=80,
        rate=60,
        input=16,
        output=20,
        kv_blocks=128,
        mix={"critical": 1, "batch": 1},
        cluster={"snapshot_interval": 0},
    )
    data["slo"] = {"critical": {"e2e": "10s"}, "batch": {"e2e": "10s"}}  # every completion is good
    results = run_scenario(data)
    assert_balanced(results)
    s = results.summary
    cls = classes_of(results)
    done = results.requests["status"] == STATUS_COMPLETED
    for name in ("critical", "batch"):
        g = s["goodput"][name]
        assert g["count"] == int((cls == name).sum())
        assert g["completed"] == g["good"] == int((done & (cls == name)).sum())
        assert g["slo_attainment"] == pytest.approx(g["good"] / g["count"])
    assert s["goodput"]["critical"]["slo_attainment"] == 1.0
    assert 0.0 < s["goodput"]["batch"]["slo_attainment"] < 1.0  # its rejections are misses
    assert s["slo_attainment"] == pytest.approx(done.sum() / 80)
    assert s["per_class"]["batch"]["count"] == s["goodput"]["batch"]["completed"]
    assert 0.0 < s["fairness"]["jain_classes_completion_rate"] < 1.0
