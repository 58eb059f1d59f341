"""Routing-signal freshness (INV-7) recomputed from when each snapshot was taken, and traced
decisions tied to their requests' rows."""

from __future__ import annotations

import numpy as np
import pytest

import servesim
from servesim.audit import AuditInput, audit
from servesim.run import audit_input
from tests.test_audit import SCENARIO, copy_input, only

INTERVAL_US = 20_000
TRACED = {
    **SCENARIO,
    "cluster": {"instances": 2, "snapshot_interval": "20ms"},
    "policies": {"routing": "least-loaded"},
    "output": {"trace": "decisions"},
}


@pytest.fixture(scope="module")
def clean() -> AuditInput:
    results = servesim.simulate(servesim.load_scenario(TRACED), check=False)
    return audit_input(results.record)


@pytest.fixture
def data(clean) -> AuditInput:
    return copy_input(clean)


def stale_decision(data: AuditInput) -> int:
    """A decision that read a snapshot taken some time before it."""
    d = data.decisions
    rows = np.flatnonzero(d["time_us"] - d["taken_us"] > 1000)
    assert len(rows) > 3
    return int(rows[len(rows) // 2])


def test_the_clean_traced_run_passes_and_its_ages_are_recomputable(clean):
    assert audit(clean) == []
    d = clean.decisions
    assert len(d["time_us"]) == clean.arrived
    np.testing.assert_array_equal(d["age_us"], d["time_us"] - d["taken_us"])
    assert d["age_us"].max() > 0 and d["age_us"].max() <= INTERVAL_US


def test_a_snapshot_whose_age_is_self_reported_fresh_is_caught(data):
    k = stale_decision(data)
    d = data.decisions
    d["age_us"][k] = 0
    v = only(audit(data), "INV-7")[0]
    assert v.request == int(d["request"][k]) and v.time_us == int(d["time_us"][k])
    assert "reports a snapshot 0 µs old" in str(v)


def test_a_snapshot_taken_after_its_decision_is_caught(data):
    k = stale_decision(data)
    d = data.decisions
    d["taken_us"][k] = d["time_us"][k] + 1
    found = [str(v) for v in only(audit(data), "INV-7")]
    taken = int(d["time_us"][k]) + 1
    assert any(f"read a snapshot taken at {taken} µs, after it" in t for t in found), found


def test_a_stale_snapshot_reported_fresh_is_caught_by_its_own_age(data):
    k = stale_decision(data)
    d = data.decisions
    d["taken_us"][k] = d["time_us"][k] - INTERVAL_US - 1
    d["age_us"][k] = 0
    found = [str(v) for v in only(audit(data), "INV-7")]
    assert any(f"{INTERVAL_US + 1} µs old (interval {INTERVAL_US} µs)" in t for t in found), found


def test_a_decision_for_another_instance_than_the_request_ran_on_is_caught(data):
    k = stale_decision(data)
    d = data.decisions
    d["chosen"][k] = 1 - d["chosen"][k]
    v = only(audit(data), "INV-7")[0]
    assert v.request == int(d["request"][k]) and "routed to instance" in str(v)


def test_a_decision_before_its_request_arrived_is_caught(data):
    k = stale_decision(data)
    d = data.decisions
    rid = int(d["request"][k])
    d["time_us"][k] = data.requests["arrival_us"][rid] - 1
    d["taken_us"][k] = d["time_us"][k]
    d["age_us"][k] = 0
    v = only(audit(data), "INV-7")[0]
    assert v.request == rid and "outside [arrival" in str(v)
