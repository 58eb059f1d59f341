"""Random small scenarios through the whole simulator: the auditor finds nothing, and every
request and step obeys the rules that hold for any workload.

Each scenario runs with ``audit.kv_every_step: true``, so every KV block is recounted after every
engine step (violations arrive as INV-4 notes). Scenarios are tiny (at most 60 requests, caches of
a few dozen blocks) and half of them are under KV pressure, so preemption, prefix hits, chunked
prefill and the enqueue guards all occur.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from conftest import run_scenario, scenario_dict, with_changes
from hypothesis import HealthCheck, given, settings
from strategies import scenarios

from servesim.analysis.metrics import itl_gaps
from servesim.analysis.writing import dumps_summary
from servesim.components.record import STATUS_COMPLETED, STATUS_DROPPED, STATUS_RUNNING
from servesim.run import simulate
from servesim.scenario import load_scenario

RANDOM = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def expected_outputs(data: dict[str, Any], req: dict[str, np.ndarray]) -> np.ndarray:
    """G = min(oracle, budget): the client's budget, or max_model_len − prompt when it is 0."""
    max_len = data["engine"]["max_model_len"]
    policy = data["workload"].get("max_output_tokens", "oracle")
    oracle = req["oracle_output_tokens"]
    if policy == "oracle":
        budget = oracle
    elif policy == 0:
        budget = max_len - req["prompt_tokens"]
    else:
        budget = np.full_like(oracle, policy)
    return np.minimum(oracle, budget)


def assert_request_rules(data: dict[str, Any], results) -> None:
    """Rules every request obeys, whatever the load (drained or bounded runs)."""
    req = results.requests
    engine = data["engine"]
    a0, a1, a2 = data["latency"]["alpha"]
    b0, _, b2 = data["latency"]["beta"]
    bs = engine["block_size"]
    labels = results.record.requests.labels("finish_reason")
    done = req["status"] == STATUS_COMPLETED
    prompt = req["prompt_tokens"]
    out = req["output_tokens"]

    # completed requests produced exactly their target, stopping for the stated reason
    target = expected_outputs(data, req)
    np.testing.assert_array_equal(out[done], target[done])
    reasons = np.array([labels[c] for c in req["finish_reason"]], dtype=object)
    capped = req["oracle_output_tokens"] > target
    assert set(reasons[done & capped]) <= {"length"}
    assert set(reasons[done & ~capped]) <= {"stop"}

    # enqueue guards read the prompt and the budget (never the oracle) and nothing else
    dropped = req["status"] == STATUS_DROPPED
    too_long = prompt >= engine["max_model_len"]
    too_big = -(-prompt // bs) > engine["kv_blocks"]
    policy = data["workload"].get("max_output_tokens", "oracle")
    if policy == "oracle":
        over_budget = prompt + req["oracle_output_tokens"] > engine["max_model_len"]
    elif policy == 0:
        over_budget = np.zeros_like(too_long)
    else:
        over_budget = prompt + policy > engine["max_model_len"]
    enqueued = req["enqueue_us"] >= 0
    np.testing.assert_array_equal(dropped[enqueued], (too_long | over_budget | too_big)[enqueued])

    # the α queueing delay separates arrival and enqueue exactly
    queueing = np.trunc(a0 + a1 * prompt).astype(np.int64)
    np.testing.assert_array_equal(
        (req["enqueue_us"] - req["arrival_us"])[enqueued], queueing[enqueued]
    )

    # prefix hits are whole blocks and never the whole prompt
    cached = req["cached_tokens"][req["first_scheduled_us"] >= 0]
    assert np.all(cached % bs == 0)
    assert np.all(cached <= prompt[req["first_scheduled_us"] >= 0] - 1)
    if not engine["enable_prefix_caching"]:
        assert not cached.any()

    # zero-load lower bounds: a prefill step and α before the first token, a step per later token
    min_step = max(1, int(b0))
    ttft = (req["first_token_us"] - req["arrival_us"])[done]
    assert np.all(ttft >= queueing[done] + min_step + int(a2))
    later = (req["completion_us"] - req["first_token_us"])[done]
    if "speculative" not in engine:  # speculation delivers several tokens per step
        assert np.all(later >= (out[done] - 1) * (max(1, int(b0 + b2)) + int(a2)))
    assert np.all(req["itl_sum_us"][done] == later)


def assert_step_rules(data: dict[str, Any], results) -> None:
    """Per-step limits: token budget, sequence slots, cache capacity, contiguous busy periods."""
    engine = data["engine"]
    for steps in (log.as_arrays() for log in results.record.step_logs):
        tokens = steps["prefill_tokens"] + steps["decode_tokens"]
        assert np.all(tokens <= engine["max_num_batched_tokens"])
        assert np.all(steps["batch_size"] <= engine["max_num_seqs"])
        assert np.all(steps["kv_used"] <= engine["kv_blocks"])
        assert np.all(steps["regular_tokens"] <= steps["decode_tokens"])
        assert np.all(steps["dt_us"] >= 1)


def assert_token_accounting(results) -> None:
    """Every token after a request's first has exactly one inter-token gap in the step log, and
    the gaps of the step log add up to the per-request ITL sums (drained runs)."""
    req = results.requests
    done = req["status"] == STATUS_COMPLETED
    values, weights = itl_gaps(results.record)
    assert int(weights.sum()) == int((req["output_tokens"][done] - 1).sum())
    assert int((values * weights).sum()) == int(req["itl_sum_us"][done].sum())
    assert results.summary["preemption_count"] == int(req["preemptions"].sum())


@RANDOM
@given(scenarios(max_requests=60, kv_every_step=True))
def test_random_drained_scenarios_pass_the_audit_and_obey_the_request_rules(data):
    results = run_scenario(data)
    assert results.violations == [], results.violations
    summary = results.summary
    assert summary["conservation"]["balanced"]
    assert (
        summary["completed_requests"] + summary["dropped_unservable"]
        == summary["injected_requests"]
    )
    assert_request_rules(data, results)
    assert_step_rules(data, results)
    assert_token_accounting(results)
    assert dumps_summary(summary)  # JSON-clean (no NaN, no numpy scalars)


@RANDOM
@given(scenarios(max_requests=60, horizon=True, kv_every_step=True))
def test_random_scenarios_cut_at_a_horizon_pass_the_audit(data):
    results = run_scenario(data)
    assert results.violations == [], results.violations
    horizon = results.scenario.horizon_us
    assert results.summary["conservation"]["balanced"]
    req = results.requests
    assert np.all(req["arrival_us"] < horizon)
    # nothing that happened after the horizon is recorded
    for steps in (log.as_arrays() for log in results.record.step_logs):
        assert np.all(steps["start_us"] + steps["dt_us"] <= horizon)
    done = req["status"] == STATUS_COMPLETED
    last_token_end = req["completion_us"] - req["output_tokens"] * results.record.alpha2_us
    assert np.all(last_token_end[done] <= horizon)
    assert results.record.end_us <= horizon
    assert_request_rules(data, results)
    assert_step_rules(data, results)


@settings(max_examples=25, deadline=None)
@given(scenarios(max_requests=40))
def test_the_same_scenario_and_seed_give_a_byte_identical_summary(data):
    first = dumps_summary(simulate(load_scenario(data), raise_on_violation=False).summary)
    second = dumps_summary(simulate(load_scenario(data), raise_on_violation=False).summary)
    assert first == second


def test_a_default_sized_run_is_byte_identical_across_runs_and_records_no_wall_time():
    """The bundled model, GPU and coefficients, automatic KV sizing, the chatbot preset."""
    overrides = ["workload.requests=300", "workload.prefix.tokens=64", "workload.prefix.groups=4"]
    first = simulate(load_scenario(None, overrides))
    second = simulate(load_scenario(None, overrides))
    assert dumps_summary(first.summary) == dumps_summary(second.summary)
    assert first.summary["completed_requests"] == 300
    assert "wall" not in dumps_summary(first.summary)  # the wall time stays in the record


def test_a_request_still_running_at_the_horizon_reports_the_tokens_it_generated():
    """One request decoding 500 tokens in ~1 ms steps, cut at 100 ms: every logged step ended
    before the horizon and produced one of its tokens (the first by its prefill)."""
    data = scenario_dict(
        requests=1,
        rate=100,
        input=10,
        output=500,
        kv_blocks=400,
        beta=(1000, 0, 10),
        horizon="100ms",
    )
    for exact_steps in (True, False):
        results = run_scenario(with_changes(data, exact_steps=exact_steps))
        req = results.requests
        assert req["status"][0] == STATUS_RUNNING
        assert req["output_tokens"][0] == len(results.record.step_logs[0]) > 50
