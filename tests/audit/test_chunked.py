"""The step-log and request-table checks read their input a slice at a time
(``servesim.audit.chunks``): with slices of a few rows they report exactly what one slice of
everything reports, on a clean run and on each planted fault, and a spilled run read in slices
passes its audit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import servesim
from servesim.audit import AuditInput, audit
from servesim.audit import chunks as chunks_module
from servesim.audit.chunks import ServerInstants
from servesim.components import record as record_module
from servesim.run import audit_input
from tests.audit.test_timeline import multi_token_on
from tests.test_audit import SCENARIO, completed_on, copy_input


@pytest.fixture(scope="module")
def clean() -> AuditInput:
    results = servesim.simulate(servesim.load_scenario(SCENARIO), check=False)
    return audit_input(results.record)


def _shift_completion(d: AuditInput) -> None:
    d.requests["completion_us"][multi_token_on(d, 1)] += 250


def _first_token_off_step(d: AuditInput) -> None:
    d.requests["first_token_us"][completed_on(d, 0)] -= 3


def _wrong_instance(d: AuditInput) -> None:
    d.requests["instance"][multi_token_on(d, 1)] = 0


def _token_count_off(d: AuditInput) -> None:
    d.requests["output_tokens"][multi_token_on(d, 0)] += 1


def _over_budget(d: AuditInput) -> None:
    r = d.requests
    for i in np.flatnonzero(r["max_output_tokens"] > 0)[5:40:7]:
        r["output_tokens"][i] = r["max_output_tokens"][i] + 1


def _overlapping_steps(d: AuditInput) -> None:
    start, dt = d.steps[1]["start_us"], d.steps[1]["dt_us"]
    for k in np.flatnonzero(dt[:-1] > 10)[3:60:9] + 1:
        start[k] = start[k - 1] + dt[k - 1] - 5


def _zero_length_steps(d: AuditInput) -> None:
    d.steps[0]["dt_us"][:] = 0  # more than the reporting limit


def _idle_gap_with_work(d: AuditInput) -> None:
    start, dt, pending = (d.steps[0][k] for k in ("start_us", "dt_us", "pending_after"))
    ends = start + dt
    k = int(np.flatnonzero((pending[:-1] > 0) & (start[1:] == ends[:-1]))[10])
    start[k + 1 :] += 1000


def _work_left_at_the_end(d: AuditInput) -> None:
    d.steps[1]["pending_after"][-1] = 2


def _enqueued_while_idle(d: AuditInput) -> None:
    """Requests of instance 0 said to arrive after its last step, when it sat idle."""
    start, dt = d.steps[0]["start_us"], d.steps[0]["dt_us"]
    r = d.requests
    on_0 = np.flatnonzero((r["instance"] == 0) & (r["enqueue_us"] >= 0))
    r["enqueue_us"][on_0[-5:]] = start[-1] + dt[-1] + 1 + np.arange(5)


# what each fault must be reported as (a piece of the message)
EXPECTED = {
    "shift_completion": "its completion implies a step boundary",
    "first_token_off_step": "its first token implies a step boundary",
    "wrong_instance": "output tokens after their first",
    "token_count_off": "output tokens after their first",
    "over_budget": "more than max_output_tokens",
    "overlapping_steps": "before step",
    "zero_length_steps": "(< 1)",
    "idle_gap_with_work": "but the next step started 1000 µs later",
    "work_left_at_the_end": "left after the last step of a drained run",
    "enqueued_while_idle": "enqueued at an idle instance",
}

FAULTS = {
    f.__name__.strip("_"): f
    for f in (
        _shift_completion,
        _first_token_off_step,
        _wrong_instance,
        _token_count_off,
        _over_budget,
        _overlapping_steps,
        _zero_length_steps,
        _idle_gap_with_work,
        _work_left_at_the_end,
        _enqueued_while_idle,
    )
}


@pytest.mark.parametrize("size", [1, 3, 64])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_planted_fault_is_reported_alike_in_slices_of_any_size(clean, fault, size, monkeypatch):
    data = copy_input(clean)
    FAULTS[fault](data)
    whole = audit(data)
    assert any(EXPECTED[fault] in str(v) for v in whole), [str(v) for v in whole]
    monkeypatch.setattr(chunks_module, "CHUNK_ROWS", size)
    assert [str(v) for v in audit(data)] == [str(v) for v in whole]


def test_the_clean_run_passes_in_slices_of_two_rows(clean, monkeypatch):
    monkeypatch.setattr(chunks_module, "CHUNK_ROWS", 2)
    assert audit(clean) == []


@pytest.mark.parametrize("overrides", [[], ["horizon=2s"]])
def test_a_spilled_run_read_in_slices_passes_its_audit(monkeypatch, overrides):
    monkeypatch.setattr(record_module, "SPILL_ROWS", 7)
    monkeypatch.setattr(record_module, "BUCKET_IDS", 5)
    monkeypatch.setattr(chunks_module, "CHUNK_ROWS", 4)
    results = servesim.simulate(servesim.load_scenario(SCENARIO, overrides), check=False)
    assert results.record.requests.spilled
    assert audit(audit_input(results.record)) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 60), max_size=12), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 70)), max_size=30),
    st.integers(1, 5),
)
def test_server_instants_answer_like_a_scan(per_server, questions, size):
    """Membership and "last instant at or before" against a plain scan of each server's list
    (instants given unsorted, in slices of ``size``)."""

    def slices(server):
        values = np.array(per_server[server], dtype=np.int64)
        for at in range(0, len(values), size):
            yield values[at : at + size], values[at : at + size] * 10

    top = max([max(p) for p in per_server if p] + [0])
    index = ServerInstants([len(p) for p in per_server], slices, top)
    questions = [(s, t) for s, t in questions if s < len(per_server)]
    servers = np.array([s for s, _ in questions], dtype=np.int64)
    times = np.array([t for _, t in questions], dtype=np.int64)
    inside = index.contains(servers, times)
    found, at, itself = index.at_or_before(servers, np.maximum(times, 0))
    for k, (server, t) in enumerate(questions):
        mine = per_server[server]
        assert inside[k] == (t in mine)
        earlier = [x for x in mine if x <= max(t, 0)]
        assert found[k] == bool(earlier)
        if earlier:
            assert index.values[at[k]] == max(earlier) * 10
            assert itself[k] == (max(earlier) == max(t, 0))
