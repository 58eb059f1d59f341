"""The auditor catches seeded faults (DESIGN §8): each fault is reported under the right invariant,
naming the request, instance and time, and an untouched run is clean."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import servesim
from servesim.audit import COMPLETED, AuditInput, Violation, audit, audit_or_raise
from servesim.components.engine import Engine, EngineLimits
from servesim.components.request import Request
from servesim.latency.base import BatchSummary, LatencyModel
from servesim.run import audit_input
from servesim.simcore.errors import AuditError

SCENARIO = {
    "seed": 11,
    "cluster": {"instances": 2},
    "engine": {"kv_blocks": 400, "max_model_len": 4096},
    "workload": {"preset": "chatbot", "rate": 40, "requests": 150},
}


@pytest.fixture(scope="module")
def clean() -> AuditInput:
    results = servesim.simulate(servesim.load_scenario(SCENARIO), check=False)
    return audit_input(results.record)


@pytest.fixture
def data(clean) -> AuditInput:
    """A deep copy of the clean run's audit input, free to corrupt."""
    return copy_input(clean)


def copy_input(clean: AuditInput) -> AuditInput:
    """A deep copy of an audit input (its arrays copied), free to corrupt."""
    return attrs.evolve(
        clean,
        requests={k: v.copy() for k, v in clean.requests.items()},
        steps=[{k: v.copy() for k, v in s.items()} for s in clean.steps],
        capacity=list(clean.capacity),
        notes=list(clean.notes),
        decisions=None
        if clean.decisions is None
        else {k: v.copy() for k, v in clean.decisions.items()},
    )


def only(violations: list[Violation], invariant: str) -> list[Violation]:
    found = [v for v in violations if v.invariant == invariant]
    assert found, f"{invariant} not reported; got {[str(v) for v in violations]}"
    return found


def row_of(data: AuditInput, request_id: int) -> int:
    return int(np.flatnonzero(data.requests["id"] == request_id)[0])


def completed_on(data: AuditInput, instance: int) -> int:
    """Row index of some completed request served by ``instance`` (not the first)."""
    r = data.requests
    rows = np.flatnonzero((r["status"] == COMPLETED) & (r["instance"] == instance))
    assert len(rows) > 3
    return int(rows[len(rows) // 2])


def test_the_clean_run_has_no_violations(clean):
    assert audit(clean) == []
    assert clean.arrived == 150 and len(clean.steps) == 2
    assert all(len(s["start_us"]) for s in clean.steps), "both instances ran steps"
    audit_or_raise(clean)  # does not raise


def test_the_fixture_copy_does_not_share_arrays(clean, data):
    data.requests["arrival_us"][0] = 123456789
    data.steps[0]["kv_used"][0] = -7
    assert clean.requests["arrival_us"][0] != 123456789
    assert clean.steps[0]["kv_used"][0] != -7


# ------------------------------------------------------------------ INV-1 conservation


def test_a_dropped_request_row_breaks_conservation(data):
    data.requests = {k: np.delete(v, 40) for k, v in data.requests.items()}
    found = only(audit(data), "INV-1")
    assert "150 requests arrived but 149" in str(found[0])


def test_a_dropped_request_row_names_the_missing_request(data):
    # DESIGN §8: a violation names the request. Ids are 0..arrived-1, so the missing one is known.
    missing = int(data.requests["id"][40])
    data.requests = {k: np.delete(v, 40) for k, v in data.requests.items()}
    found = only(audit(data), "INV-1")
    assert any(v.request == missing or f"request {missing}" in str(v) for v in found), [
        str(v) for v in found
    ]


def test_a_duplicated_request_row_is_reported_with_its_id(data):
    dup = 17
    data.requests = {k: np.insert(v, 60, v[dup]) for k, v in data.requests.items()}
    found = only(audit(data), "INV-1")
    named = [v for v in found if v.request == int(data.requests["id"][dup])]
    assert named and f"request {data.requests['id'][dup]}" in str(named[0])
    assert "2 times" in str(named[0])


# ------------------------------------------------------------------ INV-2 lifecycle


def test_a_completed_request_without_a_first_token_breaks_the_lifecycle(data):
    i = completed_on(data, 1)
    rid = int(data.requests["id"][i])
    data.requests["first_token_us"][i] = -1
    found = only(audit(data), "INV-2")
    v = found[0]
    assert v.request == rid and v.server == 1
    assert "first token" in str(v) and f"request {rid}" in str(v) and "instance 1" in str(v)


def test_a_queued_request_with_a_completion_time_breaks_the_lifecycle(data):
    i = completed_on(data, 0)
    data.requests["status"][i] = 1  # queued
    v = only(audit(data), "INV-2")[0]
    assert v.request == int(data.requests["id"][i])


# ------------------------------------------------------------------ INV-5 causality


def test_a_first_token_before_first_scheduling_breaks_causality(data):
    i = completed_on(data, 1)
    rid = int(data.requests["id"][i])
    scheduled = int(data.requests["first_scheduled_us"][i])
    data.requests["first_token_us"][i] = scheduled - 1
    v = only(audit(data), "INV-5")[0]
    assert (v.request, v.server, v.time_us) == (rid, 1, scheduled - 1)
    text = str(v)
    assert f"request {rid}" in text and "instance 1" in text and f"t={scheduled - 1}" in text
    assert "first_token_us" in text and "first_scheduled_us" in text


def test_a_completion_before_arrival_breaks_causality(data):
    i = completed_on(data, 0)
    data.requests["completion_us"][i] = 0
    data.requests["arrival_us"][i] = max(int(data.requests["arrival_us"][i]), 1)
    found = only(audit(data), "INV-5")
    assert any(v.request == int(data.requests["id"][i]) for v in found)


# ------------------------------------------------------------------ INV-3 clock


def test_overlapping_steps_break_clock_monotonicity(data):
    steps = data.steps[1]
    start, dt = steps["start_us"], steps["dt_us"]
    k = int(np.flatnonzero(dt[:-1] > 10)[5]) + 1  # step k-1 lasts > 10 µs
    start[k] = start[k - 1] + dt[k - 1] - 5
    v = only(audit(data), "INV-3")[0]
    assert v.server == 1 and v.time_us == int(start[k])
    assert "instance 1" in str(v) and f"t={start[k]}" in str(v)


def test_a_zero_length_step_breaks_clock_monotonicity(data):
    data.steps[0]["dt_us"][3] = 0
    v = only(audit(data), "INV-3")[0]
    assert v.server == 0 and v.time_us == int(data.steps[0]["start_us"][3])


# ------------------------------------------------------------------ INV-4 KV blocks


def test_kv_use_above_capacity_breaks_block_conservation(data):
    k = 12
    data.steps[0]["kv_used"][k] = data.capacity[0] + 1
    v = only(audit(data), "INV-4")[0]
    assert v.server == 0 and v.time_us == int(data.steps[0]["start_us"][k])
    assert f"{data.capacity[0] + 1} of {data.capacity[0]}" in str(v)
    assert "instance 0" in str(v) and "t=" in str(v)


def test_negative_kv_use_breaks_block_conservation(data):
    data.steps[1]["kv_used"][4] = -1
    assert only(audit(data), "INV-4")[0].server == 1


def test_an_engine_recount_note_is_reported_as_inv4(data):
    data.notes = ["instance 0: KV conservation broken: used 3 + free 396 != total 400"]
    v = only(audit(data), "INV-4")[0]
    assert "instance 0" in str(v)


# ------------------------------------------------------------------ INV-8 work conservation


def test_an_idle_gap_with_waiting_work_breaks_work_conservation(data):
    steps = data.steps[0]
    start, dt, pending = steps["start_us"], steps["dt_us"], steps["pending_after"]
    ends = start + dt
    candidates = np.flatnonzero((pending[:-1] > 0) & (start[1:] == ends[:-1]))
    k = int(candidates[len(candidates) // 2])
    start[k + 1 :] += 1000  # the instance sits idle for 1 ms with work pending
    found = only(audit(data), "INV-8")
    gap = [v for v in found if v.server == 0 and v.time_us == int(ends[k])]
    assert gap, [str(v) for v in found]
    assert "1000 µs later" in str(gap[0]) and "instance 0" in str(gap[0])


def test_work_left_after_the_last_step_of_a_drained_run_breaks_work_conservation(data):
    data.steps[1]["pending_after"][-1] = 2
    v = only(audit(data), "INV-8")[0]
    assert v.server == 1


# ------------------------------------------------------------------ reporting


def test_audit_or_raise_reports_every_violation(data):
    data.steps[0]["kv_used"][0] = 10**9
    data.requests["first_token_us"][completed_on(data, 0)] = -1
    with pytest.raises(AuditError) as info:
        audit_or_raise(data)
    invariants = {v.invariant for v in info.value.violations}
    assert {"INV-2", "INV-4"} <= invariants
    assert "INV-4" in str(info.value) and "INV-2" in str(info.value)


def test_simulate_raises_on_a_violation_found_by_the_auditor(monkeypatch):
    """End to end: a fault in the run record fails ``simulate`` with an AuditError."""
    import servesim.run as run_module

    original = run_module.audit_input

    def corrupted(record):
        data = original(record)
        data.steps[0]["kv_used"][0] = data.capacity[0] + 5
        return data

    monkeypatch.setattr(run_module, "audit_input", corrupted)
    scenario = servesim.load_scenario(
        {**SCENARIO, "workload": {**SCENARIO["workload"], "requests": 20}}
    )
    with pytest.raises(AuditError, match="INV-4"):
        servesim.simulate(scenario)


# ------------------------------------------------------------------ leaked KV blocks


class Linear(LatencyModel):
    name = "audit-test-linear"

    def step_time_us(self, batch: BatchSummary) -> int:
        return 1000 + 2 * batch.prefill_tokens + 10 * batch.decode_requests


def run_engine_to_completion(engine: Engine, requests: list[Request]) -> int:
    now = 0
    for req in requests:
        assert engine.add_request(req, now)
    steps = 0
    while engine.has_work():
        dt = engine.form_batch(now)
        now += dt
        engine.end_step(now)
        steps += 1
        assert steps < 100_000
    return steps


def make_engine() -> tuple[Engine, list[Request]]:
    limits = EngineLimits(
        max_num_seqs=8, max_num_batched_tokens=512, block_size=16, total_blocks=120
    )
    engine = Engine(limits, Linear())
    requests = [
        Request(i, 0, 100 + 37 * i, 20 + 11 * i, prefix_group=i % 2, prefix_tokens=64)
        for i in range(12)
    ]
    return engine, requests


def test_an_engine_run_to_completion_balances_its_books():
    engine, requests = make_engine()
    run_engine_to_completion(engine, requests)
    assert engine.completed == 12
    assert engine.kv.used_blocks == 0
    assert engine.kv.check(engine.kv_owners()) == []


def test_a_leaked_block_is_reported_by_the_recount():
    engine, requests = make_engine()
    run_engine_to_completion(engine, requests)
    engine.kv.pop_blocks(1)  # a block taken by nobody
    problems = engine.kv.check(engine.kv_owners())
    assert problems
    assert any("conservation" in p and "total 120" in p for p in problems), problems


def test_a_block_leaked_mid_run_fails_the_audit(monkeypatch):
    """With audit.kv_every_step the cluster recounts after every step; a block taken by nobody
    mid-run surfaces as an INV-4 violation naming the instance."""
    original = Engine.end_step
    leaked = []

    def leaky_end_step(self, end, steps=1, ends=None):
        original(self, end, steps, ends)
        if self.index == 1 and self.step >= 20 and not leaked and self.kv.free_count > 0:
            self.kv.pop_blocks(1)
            leaked.append(self.step)

    monkeypatch.setattr(Engine, "end_step", leaky_end_step)
    config = {**SCENARIO, "audit": {"kv_every_step": True}}
    config["workload"] = {**SCENARIO["workload"], "requests": 60}
    results = servesim.simulate(servesim.load_scenario(config), raise_on_violation=False)
    assert leaked
    found = only(results.violations, "INV-4")
    assert any("instance 1" in str(v) for v in found)
    assert results.summary["audit"]["passed"] is False


# ------------------------------------------------------------------ runs cut short by a horizon


@pytest.mark.parametrize("exact_steps", [False, True], ids=["fast-forward", "exact-steps"])
def test_a_run_stopped_at_a_horizon_passes_its_audit(exact_steps):
    """A horizon may fall inside a step: the blocks allocated for that step are owned by the
    running requests, so the final KV recount must still balance (no INV-4 false positive)."""
    scenario = servesim.load_scenario(
        {
            "horizon": "2s",
            "exact_steps": exact_steps,
            "workload": {"preset": "chatbot", "rate": 10, "requests": 100},
        }
    )
    results = servesim.simulate(scenario, raise_on_violation=False)
    assert results.summary["still_running"] > 0  # the horizon did cut requests short
    assert results.violations == [], [str(v) for v in results.violations]
