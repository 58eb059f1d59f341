"""Request times and token counts cross-checked against the step log (``servesim.audit.timeline``):
each seeded fault is caught and named, and clean runs of every kind pass."""

from __future__ import annotations

import numpy as np
import pytest

import servesim
from servesim.audit import COMPLETED, AuditInput, audit
from servesim.run import audit_input
from tests.test_audit import SCENARIO, completed_on, copy_input, only


@pytest.fixture(scope="module")
def clean() -> AuditInput:
    results = servesim.simulate(servesim.load_scenario(SCENARIO), check=False)
    return audit_input(results.record)


@pytest.fixture
def data(clean) -> AuditInput:
    return copy_input(clean)


def multi_token_on(data: AuditInput, instance: int) -> int:
    """Row of a completed request of ``instance`` with several output tokens."""
    r = data.requests
    rows = np.flatnonzero(
        (r["status"] == COMPLETED) & (r["instance"] == instance) & (r["output_tokens"] > 3)
    )
    assert len(rows) > 3
    return int(rows[len(rows) // 2])


def test_the_clean_run_feeds_every_cross_check(clean):
    assert audit(clean) == []
    assert len(clean.alpha2_us) == len(clean.post_decode_us) == len(clean.steps) == 2
    assert len(clean.irregular_tokens) == 2 and len(clean.max_model_len) == 2
    assert (clean.requests["max_output_tokens"] > 0).all()  # budgets are set: the rule bites


@pytest.mark.parametrize("shift_us", [1, 250, 40_000])
def test_a_completion_shifted_later_than_its_last_step_is_caught(data, shift_us):
    i = multi_token_on(data, 1)
    rid = int(data.requests["id"][i])
    data.requests["completion_us"][i] += shift_us
    found = only(audit(data), "STEP-LOG")
    assert [(v.request, v.server) for v in found] == [(rid, 1)]
    assert "completion" in str(found[0]) and "end of no step" in str(found[0])


def test_a_first_token_shifted_off_its_step_is_caught(data):
    i = completed_on(data, 0)
    data.requests["first_token_us"][i] -= 3
    v = only(audit(data), "STEP-LOG")[0]
    assert v.request == int(data.requests["id"][i]) and "first token" in str(v)


def test_a_request_recorded_on_the_wrong_instance_is_caught(data):
    i = multi_token_on(data, 1)
    rid = int(data.requests["id"][i])
    data.requests["instance"][i] = 0
    found = only(audit(data), "STEP-LOG")
    on_request = [v for v in found if v.request == rid]
    assert on_request and all(v.server == 0 for v in on_request)
    # the token books of both instances no longer balance
    assert {v.server for v in found if v.request is None} == {0, 1}


@pytest.mark.parametrize("delta", [1, -1])
def test_an_output_token_count_off_by_one_is_caught(data, delta):
    i = multi_token_on(data, 0)
    data.requests["output_tokens"][i] += delta
    found = only(audit(data), "STEP-LOG")
    books = [v for v in found if v.request is None]
    assert [v.server for v in books] == [0]
    assert "output tokens after their first" in str(books[0])


def test_output_past_max_output_tokens_is_caught(data):
    r = data.requests
    i = multi_token_on(data, 1)
    r["max_output_tokens"][i] = r["output_tokens"][i] - 1
    v = only(audit(data), "OUTPUT")[0]
    assert v.request == int(r["id"][i]) and v.server == 1
    assert "max_output_tokens" in str(v)


def test_output_past_the_sampled_length_or_the_context_window_is_caught(data):
    r = data.requests
    i, j = multi_token_on(data, 0), multi_token_on(data, 1)
    r["oracle_output_tokens"][i] = r["output_tokens"][i] - 1
    r["prompt_tokens"][j] = data.max_model_len[1] - r["output_tokens"][j] + 1
    found = only(audit(data), "OUTPUT")
    texts = {v.request: str(v) for v in found}
    assert "sampled output length" in texts[int(r["id"][i])]
    assert "context window" in texts[int(r["id"][j])]


def test_a_saved_run_without_the_overheads_skips_the_time_cross_check(data):
    data.requests["completion_us"][multi_token_on(data, 1)] += 7
    data.alpha2_us = ()
    assert not [v for v in audit(data) if "completion" in v.message]


CLEAN_RUNS = {
    "preemption-and-chunking": {
        "seed": 3,
        "cluster": {"instances": 3},
        "engine": {"kv_blocks": 120, "max_num_batched_tokens": 256, "max_model_len": 1536},
        "workload": {"preset": "chatbot", "rate": 60, "requests": 120},
    },
    "swap": {
        "seed": 5,
        "engine": {
            "kv_blocks": 150,
            "max_model_len": 2048,
            "preemption_mode": "swap",
            "swap_space": "4GB",
        },
        "workload": {"preset": "chatbot", "rate": 60, "requests": 100},
    },
    "speculative-exact-steps": {
        "seed": 9,
        "exact_steps": True,
        "engine": {"speculative": {"draft_tokens": 3, "acceptance_rate": 0.6}},
        "workload": {"preset": "chatbot", "rate": 20, "requests": 60},
    },
    "horizon": {
        "seed": 2,
        "horizon": "3s",
        "cluster": {"instances": 2},
        "workload": {"preset": "chatbot", "rate": 40, "requests": 400},
    },
}


# what each clean run must exercise, so that passing means something
EXERCISES = {
    "preemption-and-chunking": lambda r, d: sum(d.irregular_tokens) > 0,
    "swap": lambda r, d: any(i["swap_outs"] for i in r.record.instances),
    "speculative-exact-steps": lambda r, d: any(s["burst_tokens"].sum() for s in d.steps),
    "horizon": lambda r, d: d.bounded and (r.requests["status"] != COMPLETED).any(),
}


@pytest.mark.parametrize("name", CLEAN_RUNS)
def test_clean_runs_pass_the_step_log_cross_checks(name):
    results = servesim.simulate(servesim.load_scenario(CLEAN_RUNS[name]), check=False)
    data = audit_input(results.record)
    assert EXERCISES[name](results, data)
    assert audit(data) == []
