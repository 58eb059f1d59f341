"""Random small clusters through the whole simulator: the auditor finds nothing and the control
plane's books balance, whatever the policies.

Each example is a random engine scenario from ``strategies.scenarios`` (KV pressure, prefixes,
chunked prefill, CPU tier, speculation, sometimes a horizon) on 2–4 instances, with a random
control plane on top: routing (including ``weighted`` with a random subset of scorers and
weights), admission, optional gateway flow control (detector, order, capacity, shedding, TTL,
tick), scheduler and preemption policies, cluster latencies and signal freshness, SLO class and
tenant mixes and SLO targets. Every run audits the KV blocks after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import scenarios

from servesim.analysis.writing import dumps_summary
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_GATEWAY,
    STATUS_NOT_ARRIVED,
    STATUS_REJECTED,
    STATUS_SHED,
)
from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES
from servesim.run import simulate
from servesim.scenario import load_scenario
from servesim.simcore.log import configure as configure_logging

RANDOM = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCORERS = (
    "queue-depth",
    "kv-utilization",
    "load-balance",
    "active-requests",
    "running-requests",
    "load-aware",
    "vllm-dp",
    "precise-prefix-cache",
    "prefix-affinity",
    "no-hit-lru",
)
CLASSES = ("critical", "standard", "batch", "sheddable", "background")
BUCKETS = (
    "completed_requests",
    "still_queued",
    "still_running",
    "in_transit",
    "dropped_unservable",
    "rejected_requests",
    "shed_requests",
    "expired_requests",
    "gateway_queued",
)
DURATIONS_US = (0, 0, 1, 250, 1000, 5000)


@pytest.fixture(autouse=True, scope="module")
def _logs_to_the_current_stderr():
    """The CLI binds servesim's log stream to ``sys.stderr`` as it is when it runs, so an earlier
    test that ran the CLI under ``capsys`` leaves the logs bound to a closed stream (a warning
    would then raise). Bind them to this module's stderr."""
    configure_logging("warning")


def duration(us: int) -> Any:
    return 0 if us == 0 else f"{us}us"


@st.composite
def routings(draw) -> Any:
    kind = draw(
        st.sampled_from(
            ["round-robin", "random", "least-loaded", "always-busiest", "weighted", "weighted"]
        )
    )
    if kind != "weighted":
        return kind
    if draw(st.integers(0, 5)) == 0:
        return {"name": "weighted"}  # the default profile
    names = draw(st.lists(st.sampled_from(SCORERS), min_size=1, max_size=5, unique=True))
    scorers: dict[str, Any] = {}
    for name in names:
        weight = draw(st.sampled_from([0.1, 0.5, 1, 1, 2, 7.5]))
        if name == "prefix-affinity" and draw(st.booleans()):
            scorers[name] = {"weight": weight, "capacity": draw(st.sampled_from([1, 4, 10_000]))}
        elif draw(st.integers(0, 3)) == 0:
            scorers[name] = {"weight": weight}
        else:
            scorers[name] = weight
    return {"name": "weighted", "scorers": scorers}


@st.composite
def admissions(draw) -> Any:
    if draw(st.integers(0, 19)) == 19:
        return "reject-all"
    kind = draw(
        st.sampled_from(
            ["always-admit", "token-bucket", "tier-shed", "always-admit", "gaie-legacy"]
        )
    )
    if kind == "token-bucket":
        return {
            "name": kind,
            "capacity": draw(st.sampled_from([50, 300, 2000, 10_000])),
            "refill_per_s": draw(st.sampled_from([0, 500, 5000, 100_000])),
        }
    if kind == "tier-shed":
        return {
            "name": kind,
            "threshold": draw(st.sampled_from([0, 1, 3, 10])),
            "min_priority": draw(st.sampled_from([-1, 0, 3, 4])),
        }
    if kind == "gaie-legacy":
        return {
            "name": kind,
            "queue_depth_threshold": draw(st.sampled_from([0.5, 2, 5])),
            "kv_utilization_threshold": draw(st.sampled_from([0.1, 0.5, 0.8])),
        }
    return kind


@st.composite
def flow_controls(draw) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    detector = draw(st.sampled_from(["concurrency", "utilization", "never"]))
    if detector == "utilization":
        detector = {
            "name": "utilization",
            "queue_depth_threshold": draw(st.sampled_from([0.5, 1, 5])),
            "kv_utilization_threshold": draw(st.sampled_from([0.2, 0.5, 0.8])),
        }
    elif detector == "concurrency":
        detector = {"name": "concurrency", "max_concurrency": draw(st.integers(1, 6))}
    fc: dict[str, Any] = {
        "detector": detector,
        "order": draw(st.sampled_from(["priority", "slo-deadline", "fifo"])),
        "max_queue": draw(st.sampled_from([3, 0, 1, 6, 0])),
        "per_band_capacity": draw(st.sampled_from([0, 3, 0, 1, 0])),
        "shedding": draw(st.sampled_from([True, False])),
        "ttl": duration(draw(st.sampled_from([0, 3000, 500, 20_000, 0]))),
    }
    tick = draw(st.sampled_from([None, 100, 1000, 7000]))  # tick 0 can strand requests (a bug)
    if tick is not None:
        fc["tick"] = f"{tick}us"
    return fc


@st.composite
def class_mixes(draw) -> Any:
    if draw(st.integers(0, 3)) == 3:
        return draw(st.sampled_from(CLASSES))
    names = draw(st.lists(st.sampled_from(CLASSES), min_size=2, max_size=5, unique=True))
    return {name: draw(st.sampled_from([0.5, 1, 3])) for name in names}


@st.composite
def cluster_scenarios(draw) -> dict[str, Any]:
    data = draw(scenarios(max_requests=40, kv_every_step=True))
    # Enough traffic for the control plane to matter: admission limits, gateway queues, shedding.
    # (hypothesis favours the first value of a sampled_from: the loaded cases come first)
    requests = draw(st.sampled_from([40, 30, 20, 10]))
    rate = draw(st.sampled_from([5000.0, 20_000.0, 1000.0, 100.0]))
    data["workload"].update(requests=requests, rate=rate)
    if draw(st.integers(0, 2)) == 0:  # cut the run while requests still arrive, or long after
        span_us = requests / rate * 1e6
        fraction = draw(st.sampled_from([2.0, 10.0, 1.0, 0.5, 0.25]))
        data["horizon"] = f"{max(1, int(fraction * span_us)) + draw(st.integers(0, 999))}us"
    instances = draw(st.integers(2, 4))
    data["cluster"] = {
        "instances": instances,
        "admission_latency": duration(draw(st.sampled_from(DURATIONS_US))),
        "routing_latency": duration(draw(st.sampled_from(DURATIONS_US))),
        "snapshot_interval": duration(draw(st.sampled_from([0, 1000, 50_000]))),
        "cache_signal_delay": duration(draw(st.sampled_from([0, 2000, 50_000]))),
    }
    policies: dict[str, Any] = {
        "routing": draw(routings()),
        "admission": draw(admissions()),
        "scheduler": draw(st.sampled_from(["fcfs", "priority-fcfs", "sjf", "reverse-priority"])),
        "preemption": draw(st.sampled_from(["fcfs", "priority"])),
    }
    fc = draw(flow_controls())
    if fc is not None:
        policies["flow_control"] = fc
    data["policies"] = policies
    data["workload"]["slo_class"] = draw(class_mixes())
    if draw(st.booleans()):
        data["workload"]["tenant"] = {"acme": 2, "globex": 1, "initech": 1}
    if draw(st.booleans()):
        data["slo"] = {
            "critical": {"ttft": "5ms", "e2e": "1s"},
            "standard": {"ttft": "50ms"},
            "batch": {"e2e": "10s"},
        }
    return data


def alpha_queueing(data: dict[str, Any], prompt: np.ndarray) -> np.ndarray:
    a0, a1, _ = data["latency"]["alpha"]
    return np.trunc(a0 + a1 * prompt).astype(np.int64)


def check_cluster_run(data: dict[str, Any], results) -> None:
    assert results.violations == [], [str(v) for v in results.violations]
    s = results.summary
    req = results.requests
    status = req["status"]
    n = s["injected_requests"]

    # INV-1, cluster form: one bucket per request, the buckets add up, the counters agree
    assert s["conservation"]["balanced"]
    assert len(req["id"]) == n and len(np.unique(req["id"])) == n
    assert sum(s[b] for b in BUCKETS) == n
    a = s["anomalies"]
    assert a["gateway_shed"] == s["shed_requests"]
    assert a["gateway_expired"] == s["expired_requests"]
    assert a["gateway_rejected"] + a["admission_rejections"] == s["rejected_requests"]
    gateway = results.record.gateway
    fc = results.scenario.flow_control
    if fc is None:
        assert gateway == {}
        assert (req["gateway_wait_us"] == -1).all()
        assert s["shed_requests"] == s["expired_requests"] == s["gateway_queued"] == 0
    else:
        assert gateway["enqueued"] == (
            gateway["dispatched"] + gateway["shed"] + gateway["expired"] + s["gateway_queued"]
        )
        assert gateway["shed"] == s["shed_requests"]
        assert gateway["expired"] == s["expired_requests"]
        assert gateway["rejected"] == a["gateway_rejected"]
        if fc.max_queue:
            assert a["gateway_peak_depth"] <= fc.max_queue
        if not fc.shedding:
            assert s["shed_requests"] == 0
        if not fc.ttl_us:
            assert s["expired_requests"] == 0
    if results.scenario.horizon_us is None:
        assert s["gateway_queued"] == s["in_transit"] == 0

    # who may be shed: only sheddable classes, for a more important newcomer
    labels = results.record.requests.labels("slo_class")
    priority = np.array([DEFAULT_SLO_PRIORITIES.get(labels[c], 3) for c in req["slo_class"]])
    assert (priority[status == STATUS_SHED] < 0).all()

    # requests that never reached an instance were never enqueued, scheduled or served
    never = np.isin(status, (STATUS_REJECTED, STATUS_SHED, STATUS_EXPIRED, STATUS_GATEWAY))
    never |= status == STATUS_NOT_ARRIVED
    for column in ("enqueue_us", "first_scheduled_us", "first_token_us", "completion_us"):
        assert (req[column][never] == -1).all(), column
    assert (req["output_tokens"][never] == 0).all()

    # the control-plane path takes exactly admission + gateway wait + routing + α
    c = results.scenario.cluster
    enqueued = req["enqueue_us"] >= 0
    expected = (
        c.admission_latency_us
        + np.maximum(req["gateway_wait_us"], 0)
        + c.routing_latency_us
        + alpha_queueing(data, req["prompt_tokens"])
    )
    np.testing.assert_array_equal(
        (req["enqueue_us"] - req["arrival_us"])[enqueued], expected[enqueued]
    )
    # a request dispatched by the gateway waited less than its TTL
    if fc is not None and fc.ttl_us:
        dispatched = req["gateway_wait_us"] >= 0
        assert (req["gateway_wait_us"][dispatched] < fc.ttl_us).all()
    if fc is not None:
        assert (req["gateway_wait_us"][enqueued] >= 0).all()

    # instance indices are valid and every instance-side request has one
    served = status == STATUS_COMPLETED
    assert ((req["instance"][served] >= 0) & (req["instance"][served] < c.instances)).all()

    assert dumps_summary(s)  # JSON-clean: no NaN, no numpy scalars


@RANDOM
@given(cluster_scenarios())
def test_random_clusters_pass_the_audit_and_balance_their_books(data):
    results = simulate(load_scenario(data), raise_on_violation=False)
    check_cluster_run(data, results)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_scenarios())
def test_a_random_cluster_run_is_deterministic(data):
    first = simulate(load_scenario(data), raise_on_violation=False)
    second = simulate(load_scenario(data), raise_on_violation=False)
    assert dumps_summary(first.summary) == dumps_summary(second.summary)
    for column in ("instance", "status", "enqueue_us", "completion_us", "gateway_wait_us"):
        np.testing.assert_array_equal(first.requests[column], second.requests[column])


def in_flight_after_each_dispatch(results) -> list[int]:
    """Requests routed and not yet finished, right after each gateway dispatch (routing latency 0:
    a request is routed at its dispatch). A request finishes at its last step's end (completed),
    at its enqueue (dropped by the enqueue guards) or never (unfinished at the horizon). Finishes
    at a dispatch instant count first, so equal-time ties never produce a false alarm."""
    req = results.requests
    record = results.record
    status = req["status"]
    dispatched = req["gateway_wait_us"] >= 0
    start = (
        req["arrival_us"]
        + results.scenario.cluster.admission_latency_us
        + np.maximum(req["gateway_wait_us"], 0)
    )
    last_step_end = req["completion_us"] - req["output_tokens"] * record.alpha2_us
    finish = np.where(
        status == STATUS_COMPLETED,
        last_step_end - record.post_decode_us,
        np.where(status == STATUS_DROPPED, req["enqueue_us"], np.iinfo(np.int64).max),
    )
    events = sorted(
        [(int(t), 1) for t in start[dispatched]] + [(int(t), -1) for t in finish[dispatched]]
    )
    counts, current = [], 0
    for _, delta in events:
        current += delta
        if delta > 0:
            counts.append(current)
    return counts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_scenarios(), st.integers(1, 4))
def test_random_clusters_never_exceed_the_concurrency_limit_at_dispatch(data, max_concurrency):
    """With the concurrency detector (and no routing latency, during which a dispatched request
    is not yet counted in flight), Σ in_flight ≤ N · max_concurrency after every dispatch."""
    fc = data["policies"].setdefault("flow_control", {"order": "priority"})
    fc["detector"] = {"name": "concurrency", "max_concurrency": max_concurrency}
    data["cluster"]["routing_latency"] = 0
    results = simulate(load_scenario(data), raise_on_violation=False)
    check_cluster_run(data, results)
    limit = data["cluster"]["instances"] * max_concurrency
    counts = in_flight_after_each_dispatch(results)
    assert max(counts, default=0) <= limit, (limit, counts)
