"""Batch formation, one rule per test (vLLM v1 ``Scheduler.schedule``; spec §2.2, §2.4, App. A).

Most tests drive one Engine by hand (tests/conftest.py ``EngineHarness``): submit requests, run a
step, look at which requests computed how many tokens. The step time is the blackbox
``β0 + β1·prefill_tokens + β2·decode_requests`` with β = (1000, 1, 10) unless a test says otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EngineHarness, run_scenario, scenario_dict

from servesim.components.request import (
    DROP_BUDGET_TOO_LONG,
    DROP_KV_TOO_SMALL,
    DROP_PROMPT_TOO_LONG,
    DROPPED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISHED,
    WAITING,
)

# ---------------------------------------------------------------------- phase 1 before phase 2


def test_running_requests_are_scheduled_before_waiting_ones():
    h = EngineHarness(max_num_batched_tokens=10, block_size=4, total_blocks=64)
    long = h.submit(25, 3)
    assert h.step().tokens == {long.id: 10}
    short = h.submit(4, 2)  # waiting while `long` still has 15 prompt tokens to prefill
    step = h.step()
    assert step.tokens == {long.id: 10}  # the running chunk takes the whole budget
    assert h.waiting_ids() == [short.id]
    step = h.step()
    assert step.tokens == {long.id: 5, short.id: 4}  # the waiting request gets what is left
    assert step.admitted == [short.id]


def test_decoding_requests_take_their_token_before_a_waiting_prompt_is_chunked():
    h = EngineHarness(max_num_batched_tokens=4, block_size=4, total_blocks=64)
    first = h.submit(4, 5)
    h.step()
    second = h.submit(8, 1)
    step = h.step()
    assert step.tokens == {first.id: 1, second.id: 3}


# ---------------------------------------------------------------------- limits


def test_max_num_seqs_caps_the_running_batch():
    h = EngineHarness(max_num_seqs=2, block_size=4, total_blocks=64)
    a, b, c = (h.submit(4, 3) for _ in range(3))
    steps = h.run()
    assert steps[0].admitted == [a.id, b.id]
    assert h.requests[c.id].first_scheduled_us == steps[2].end  # the step where a and b finished
    assert steps[2].finished == [a.id, b.id]
    assert steps[3].admitted == [c.id]
    assert all(s.row["batch_size"] <= 2 for s in steps)


def test_the_token_budget_caps_the_tokens_of_a_step_and_the_last_admission_is_chunked():
    h = EngineHarness(max_num_batched_tokens=16, block_size=4, total_blocks=64)
    a, b, c = (h.submit(6, 2) for _ in range(3))
    step = h.step()
    assert step.tokens == {a.id: 6, b.id: 6, c.id: 4}
    assert step.row["prefill_tokens"] == 16
    step = h.step()
    assert step.tokens == {a.id: 1, b.id: 1, c.id: 2}
    assert step.row["prefill_tokens"] == 2 and step.row["decode_tokens"] == 2


def test_without_chunked_prefill_a_prompt_larger_than_the_budget_left_waits():
    h = EngineHarness(
        max_num_batched_tokens=16, block_size=4, total_blocks=64, enable_chunked_prefill=False
    )
    a, b, c = (h.submit(6, 2) for _ in range(3))
    step = h.step()
    assert step.tokens == {a.id: 6, b.id: 6}
    assert h.waiting_ids() == [c.id]


def test_a_long_prompt_is_prefilled_in_chunks_over_several_steps():
    h = EngineHarness(max_num_batched_tokens=16, block_size=4, total_blocks=64)
    r = h.submit(50, 2)
    steps = h.run()
    assert [s.tokens.get(r.id, 0) for s in steps] == [16, 16, 16, 2, 1]
    assert [s.row["prefill_tokens"] for s in steps] == [16, 16, 16, 2, 0]
    # the first token comes out of the step that computes the last prompt token, not before
    assert r.first_token_end_us == steps[3].end
    assert r.num_generated == 2 and r.state == FINISHED


def test_long_prefill_token_threshold_caps_every_chunk_but_not_the_budget_of_others():
    h = EngineHarness(max_num_batched_tokens=64, block_size=4, total_blocks=64, long_prefill_token_threshold=8)
    long = h.submit(20, 2)
    short = h.submit(5, 3)
    steps = h.run()
    assert [s.tokens.get(long.id, 0) for s in steps[:4]] == [8, 8, 4, 1]
    assert steps[0].tokens[short.id] == 5  # a prompt under the threshold is not split
    assert steps[0].row["prefill_tokens"] == 13


# ---------------------------------------------------------------------- phase 2: the wait queue


def test_a_head_that_does_not_fit_blocks_the_queue():
    h = EngineHarness(block_size=4, total_blocks=10)
    big = h.submit(24, 50)  # 6 blocks, then a 7th for its first decode token
    h.step()
    head = h.submit(20, 2)  # 5 blocks: does not fit in the 4 free
    small = h.submit(4, 2)  # 1 block: would fit, but is behind the head
    step = h.step()
    assert h.kv.free_count >= 1
    assert step.admitted == []
    assert h.waiting_ids() == [head.id, small.id]
    assert step.tokens == {big.id: 1}


def test_no_request_is_admitted_in_a_step_that_preempted():
    # Two decoders fill a 4-block cache; when the first needs a fifth block the second (last
    # admitted) is preempted. Its re-admission chunk (threshold: 4 tokens = 1 block) fits in the
    # block left free, yet it waits for the next step: phase 2 is skipped after a preemption.
    h = EngineHarness(
        block_size=4,
        total_blocks=4,
        long_prefill_token_threshold=4,
        enable_prefix_caching=False,
    )
    first, second = h.submit(4, 30), h.submit(4, 30)
    steps = [h.step() for _ in range(6)]
    assert [s.preempted for s in steps] == [[], [], [], [], [], [second.id]]
    preempting = steps[-1]
    assert preempting.admitted == [] and preempting.tokens == {first.id: 1}
    assert h.waiting_ids() == [second.id]
    assert h.kv.free_count >= 1  # room for the 4-token chunk, unused this step
    assert h.step().admitted == [second.id]


# ---------------------------------------------------------------------- enqueue guards


@pytest.mark.parametrize(
    ("prompt", "max_output_tokens", "reason"),
    [
        (32, 0, DROP_PROMPT_TOO_LONG),  # prompt >= max_model_len
        (40, 0, DROP_PROMPT_TOO_LONG),
        (20, 13, DROP_BUDGET_TOO_LONG),  # prompt + max_output_tokens > max_model_len
        (31, 2, DROP_BUDGET_TOO_LONG),
    ],
)
def test_enqueue_guards_drop_requests_that_cannot_fit_the_context(prompt, max_output_tokens, reason):
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    r = h.submit(prompt, 1, max_output_tokens=max_output_tokens)
    assert r.state == DROPPED and r.finish_reason == reason
    assert h.finished == [r] and h.engine.dropped == 1
    assert not h.engine.has_work()
    assert h.engine.total_input_tokens == 0


@pytest.mark.parametrize(("prompt", "max_output_tokens"), [(31, 0), (31, 1), (20, 12)])
def test_enqueue_guards_accept_requests_at_the_context_limit(prompt, max_output_tokens):
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    r = h.submit(prompt, 1, max_output_tokens=max_output_tokens)
    assert r.state == WAITING
    h.run()
    assert r.state == FINISHED


def test_a_prompt_needing_more_blocks_than_the_cache_is_dropped():
    h = EngineHarness(block_size=4, total_blocks=4, max_model_len=100)
    too_big = h.submit(17, 1)
    fits = h.submit(16, 1)
    assert too_big.state == DROPPED and too_big.finish_reason == DROP_KV_TOO_SMALL
    assert fits.state == WAITING


def test_enqueue_guards_never_read_the_oracle_output_length():
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    r = h.submit(10, 10**6)  # the oracle is far beyond the context, the budget is server-filled
    assert r.state == WAITING


def test_max_output_tokens_zero_is_filled_to_the_context_and_caps_a_longer_oracle():
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    capped = h.submit(10, 100, max_output_tokens=0)
    short = h.submit(10, 5, max_output_tokens=0)
    h.run()
    assert capped.num_generated == 32 - 10 and capped.finish_reason == FINISH_LENGTH
    assert short.num_generated == 5 and short.finish_reason == FINISH_STOP


def test_length_capped_requests_are_counted_in_the_summary():
    data = scenario_dict(
        requests=12, input=20, output={"type": "uniform", "min": 1, "max": 30},
        max_output_tokens=0, kv_blocks=64, block_size=4, max_model_len=40,
    )
    results = run_scenario(data)
    req = results.requests
    capped = req["oracle_output_tokens"] > 40 - 20
    assert capped.any() and (~capped).any()
    np.testing.assert_array_equal(req["output_tokens"], np.minimum(req["oracle_output_tokens"], 20))
    assert results.summary["length_capped_requests"] == int(capped.sum())
    labels = results.record.requests.labels("finish_reason")
    assert {labels[c] for c in req["finish_reason"][capped]} == {"length"}


# ---------------------------------------------------------------------- token accounting


@pytest.mark.parametrize("outputs", [1, 2, 5])
def test_output_tokens_count_the_token_produced_by_the_prefill(outputs):
    h = EngineHarness(block_size=4, total_blocks=64)
    r = h.submit(10, outputs)
    steps = h.run()
    assert len(steps) == 1 + (outputs - 1)  # one prefill step, then N-1 decode steps
    assert sum(s.row["decode_tokens"] for s in steps) == outputs - 1
    assert r.first_token_end_us == steps[0].end
    assert r.num_generated == outputs and r.finish_us == steps[-1].end
    # the final token's KV is never allocated: prompt + N - 1 tokens were computed
    assert r.num_computed == 10 + outputs - 1


def test_a_fully_cached_prompt_still_computes_its_last_block():
    h = EngineHarness(block_size=4, total_blocks=64)
    warm = h.submit(16, 1, prefix_group=0, prefix_tokens=16)
    h.run()
    same = h.submit(16, 1, prefix_group=0, prefix_tokens=16)  # every block of it is cached
    step = h.step()
    assert step.hits == {same.id: 12}  # at most (prompt - 1) // block_size blocks hit
    assert step.tokens == {same.id: 4}
    assert same.cached_tokens == 12 and warm.cached_tokens == 0


def test_a_prompt_one_token_past_a_cached_prefix_computes_one_token():
    h = EngineHarness(block_size=4, total_blocks=64)
    h.submit(16, 1, prefix_group=0, prefix_tokens=16)
    h.run()
    longer = h.submit(17, 1, prefix_group=0, prefix_tokens=16)
    step = h.step()
    assert step.hits == {longer.id: 16} and step.tokens == {longer.id: 1}
    assert step.row["prefill_tokens"] == 1


# ---------------------------------------------------------------------- same-instant rule (SimPy)


@pytest.mark.parametrize("exact_steps", [True, False])
def test_an_arrival_at_a_step_boundary_joins_the_batch_formed_at_that_instant(exact_steps, small_windows):
    # Constant arrivals every 2 ms, steps of exactly 1 ms: request 0 arrives at 2 ms and runs
    # steps [2,3) [3,4) [4,5) ms; request 1 arrives at 4 ms, exactly when a step ends.
    data = scenario_dict(
        requests=2, rate=500, arrival="constant", input=8, output=3,
        beta=(1000, 0, 0), exact_steps=exact_steps,
    )
    req = run_scenario(data).requests
    np.testing.assert_array_equal(req["arrival_us"], [2000, 4000])
    np.testing.assert_array_equal(req["first_scheduled_us"], [2000, 4000])
    np.testing.assert_array_equal(req["first_token_us"], [3000, 5000])


@pytest.mark.parametrize("exact_steps", [True, False])
def test_an_arrival_during_a_step_waits_for_the_next_step_boundary(exact_steps, small_windows):
    # Steps of 1.5 ms from 2 ms: boundaries at 3.5, 5, 6.5 ms; request 1 arrives at 4 ms.
    data = scenario_dict(
        requests=2, rate=500, arrival="constant", input=8, output=4,
        beta=(1500, 0, 0), exact_steps=exact_steps,
    )
    req = run_scenario(data).requests
    np.testing.assert_array_equal(req["first_scheduled_us"], [2000, 5000])
