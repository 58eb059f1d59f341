"""Preemption by recompute (vLLM v1; spec §2.4 preempt-for-tokens, §2.5).

When the KV cache cannot hold a running request's next tokens, the last admitted running request
(fcfs) gives back all its blocks and goes to the head of the wait queue. Unlike BLIS, servesim
keeps the tokens it generated (as vLLM does): it later re-prefills prompt + generated tokens, which
may hit its own freed blocks, and the token produced by that re-prefill is its next token. Its
TTFT and first scheduling time are not reset.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EngineHarness, run_scenario, scenario_dict

from servesim.components.request import FINISH_STOP, FINISHED, WAITING


def crowded() -> EngineHarness:
    """Four requests filling an 8-block cache (block size 4) in their first step; they must
    preempt each other as their decodes grow."""
    h = EngineHarness(block_size=4, total_blocks=8)
    h.submit(8, 12)
    h.submit(6, 12)
    h.submit(5, 12)
    h.submit(8, 3)
    return h


def test_the_last_admitted_request_is_preempted_and_requeued_at_the_head():
    h = crowded()
    a, b, c, d = h.requests.values()
    first = h.step()
    assert first.admitted == [a.id, b.id, c.id, d.id] and h.kv.free_count == 0
    late = h.submit(4, 1)  # waits behind the running batch
    step = h.step()
    assert step.preempted == [d.id]
    assert d.state == WAITING and d.blocks == [] and d.num_computed == 0
    assert h.waiting_ids() == [d.id, late.id]  # the victim goes back to the head, not the tail
    assert step.tokens == {a.id: 1, b.id: 1, c.id: 1}
    assert step.admitted == []


def test_victims_are_taken_from_the_end_of_the_batch_one_at_a_time():
    h = crowded()
    steps = h.run()
    preempted = [rid for s in steps for rid in s.preempted]
    assert preempted == [3, 2, 1]  # d, then c, then b: always the last running request
    # the first request admitted is never a victim, and finishes first
    assert steps[-1].finished != [0] and h.requests[0].preemptions == 0


def test_a_preempted_request_recomputes_its_prompt_and_generated_tokens():
    h = crowded()
    d = h.requests[3]
    h.step()
    h.step()  # d is preempted after producing its first token
    generated = d.num_generated
    assert generated == 1
    while d.state == WAITING:
        step = h.step()
    assert step.admitted == [d.id]
    # nothing of d survived in the cache, so it recomputes prompt + generated tokens ...
    assert step.hits[d.id] == 0 and step.tokens[d.id] == d.prompt_tokens + generated
    assert step.row["prefill_tokens"] >= d.prompt_tokens + generated
    # ... and the end of that re-prefill produces its next token
    assert h.generated(d) == generated + 1


def test_a_preempted_request_can_hit_its_own_freed_blocks():
    # b (7 prompt tokens) is the last running request when it needs a third block for its
    # second decode token: it preempts itself. Its two full blocks keep their content on the
    # free list, so its re-prefill of 7 + 2 tokens hits 8 of them and computes one.
    h = EngineHarness(block_size=4, total_blocks=4)
    a, b = h.submit(4, 4), h.submit(7, 6)
    steps = h.run()
    assert [s.preempted for s in steps].count([b.id]) == 1
    readmission = next(s for s in steps if s.admitted == [b.id] and s.start > 0)
    assert readmission.hits == {b.id: 8} and readmission.tokens == {b.id: 1}
    assert b.cached_tokens == 0  # the request table reports hits at first admission only
    assert b.num_generated == 6 and a.num_generated == 4


def test_a_request_that_is_its_own_victim_gives_up_its_turn_and_nothing_is_admitted():
    h = EngineHarness(block_size=4, total_blocks=4)
    a, b = h.submit(4, 4), h.submit(7, 6)
    h.step()
    h.step()
    late = h.submit(1, 1)  # one block would be enough for it
    step = h.step()
    assert step.preempted == [b.id] and step.tokens == {a.id: 1}
    assert step.admitted == [] and h.waiting_ids() == [b.id, late.id]


def test_preemption_keeps_the_first_token_time_and_the_first_scheduling_time():
    h = crowded()
    first = h.step()
    before = {r.id: (r.first_scheduled_us, r.first_token_end_us) for r in h.requests.values()}
    assert all(v == (first.start, first.end) for v in before.values())
    h.run()
    after = {r.id: (r.first_scheduled_us, r.first_token_end_us) for r in h.requests.values()}
    assert after == before
    assert sum(r.preemptions for r in h.requests.values()) == 3


def test_every_preempted_request_finishes_with_all_its_tokens_and_frees_its_blocks():
    h = crowded()
    steps = h.run()
    for r in h.requests.values():
        assert r.state == FINISHED and r.finish_reason == FINISH_STOP
        assert r.num_generated == r.oracle_output_tokens
        assert r.num_computed == r.prompt_tokens + r.oracle_output_tokens - 1
    assert h.engine.preemptions == sum(len(s.preempted) for s in steps) == 3
    assert h.kv.used_blocks == 0 and h.check_kv() == []
    # every step respected the cache, and the books balanced after each one
    assert all(s.row["kv_used"] <= 8 for s in steps)


def test_kv_books_balance_after_every_step_of_a_preempting_run():
    h = crowded()
    while h.engine.has_work():
        h.step()
        assert h.check_kv() == []


@pytest.mark.parametrize("exact_steps", [True, False])
def test_a_preempting_workload_counts_its_preemptions_and_drains_the_cache(exact_steps):
    data = scenario_dict(
        requests=40,
        rate=2000,
        input={"type": "uniform", "min": 4, "max": 40},
        output={"type": "uniform", "min": 10, "max": 60},
        kv_blocks=32,
        block_size=4,
        max_model_len=100,
        kv_every_step=True,
        exact_steps=exact_steps,
    )
    results = run_scenario(data)
    assert results.violations == []
    req, summary = results.requests, results.summary
    assert summary["preemption_count"] == int(req["preemptions"].sum()) > 0
    assert summary["preempted_requests"] == int((req["preemptions"] > 0).sum())
    assert summary["completed_requests"] == 40
    np.testing.assert_array_equal(req["output_tokens"], req["oracle_output_tokens"])
    # the recount at the end includes "blocks still in use after the last request left"
    assert results.record.kv_problems == []
    # preemption interrupts token streams: those gaps are recorded one by one
    assert len(results.record.step_logs[0].irregular_gaps_us) > 0
