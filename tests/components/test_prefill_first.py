"""vLLM v0's scheduler (``engine.prefill_first``): prefill-only steps first, decode-only otherwise.

vLLM v0 ``Scheduler._schedule`` without chunked prefill: while nothing is swapped out, admit whole
prompts from the wait queue (token budget, ``max_num_seqs``, and a KV watermark of 1% of the
blocks); if any was admitted the step runs only those prefills and every running request waits;
otherwise the running requests decode (preempting the latest by recompute when the cache is full)
and nothing is admitted. The step time is the blackbox ``β0 + β1·prefill_tokens + β2·decode``
with β = (1000, 1, 10).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EngineHarness, run_scenario, scenario_dict

from servesim.components.request import DROP_KV_TOO_SMALL, DROPPED, FINISHED
from servesim.simcore.errors import ScenarioError


def v0(**limits):
    limits.setdefault("block_size", 4)
    limits.setdefault("total_blocks", 64)
    limits.setdefault("max_num_batched_tokens", 64)
    return EngineHarness(prefill_first=True, enable_chunked_prefill=False, **limits)


def test_a_step_that_admits_a_prompt_prefills_only_and_every_decoder_waits():
    h = v0()
    first = h.submit(8, 10)
    assert h.step().tokens == {first.id: 8}  # first token made
    h.step()  # first decodes
    second = h.submit(12, 3)
    step = h.step()
    assert step.tokens == {second.id: 12}  # first got no token this step
    assert step.row["decode_tokens"] == 0
    assert step.dt == 1000 + 12  # priced as a prefill-only batch
    step = h.step()
    assert step.tokens == {first.id: 1, second.id: 1}  # both decode together again


def test_the_same_arrivals_under_v1_mix_the_prompt_into_the_decode_step():
    h = EngineHarness(block_size=4, total_blocks=64, max_num_batched_tokens=64)
    first = h.submit(8, 10)
    h.step()
    h.step()
    second = h.submit(12, 3)
    assert h.step().tokens == {first.id: 1, second.id: 12}


def test_a_waiting_decoders_next_token_gap_spans_the_prefill_step():
    h = v0()
    first = h.submit(8, 4)
    h.step()
    h.step()  # 1010 µs decode step
    h.submit(12, 2)
    prefill = h.step()
    decode = h.step()
    gaps = h.engine.log.irregular_gaps_us
    # the gap from first's previous token to its next one covers the prefill and the decode step
    assert gaps[-1] == prefill.dt + decode.dt
    assert h.run()[-1].finished  # drains
    assert first.num_generated == 4


def test_a_step_whose_head_cannot_be_admitted_decodes_only():
    h = v0(total_blocks=6)  # 6 blocks: the watermark int(0.01 * 6) is 0
    a = h.submit(8, 6)  # 2 blocks
    h.step()
    b = h.submit(20, 2)  # 5 blocks > the 4 free: it waits, and the step decodes a only
    c = h.submit(4, 2)  # would fit, but v0 admits head first and stops at the first misfit
    step = h.step()
    assert step.tokens == {a.id: 1}
    assert step.admitted == []
    assert h.waiting_ids() == [b.id, c.id]


def test_admission_keeps_the_watermark_free():
    h = v0(total_blocks=10, watermark_blocks=2)
    a = h.submit(28, 2)  # 7 blocks: 10 - 7 = 3 >= 2 left, admitted
    b = h.submit(8, 2)  # 2 more would leave 1 < 2: waits
    step = h.step()
    assert step.admitted == [a.id]
    assert h.waiting_ids() == [b.id]


def test_a_preempted_request_grown_past_the_watermark_is_readmitted_once_alone():
    h = v0(total_blocks=10, watermark_blocks=5)
    c = h.submit(4, 30)  # 1 block, admitted first
    h.step()
    a = h.submit(16, 30)  # 4 blocks: 4 <= 9 free - 5 reserved; later in batch order: the victim
    h.step()
    h.run()  # would never drain if the watermark applied with nothing running
    assert a.preemptions >= 1
    assert c.state == a.state == FINISHED
    assert h.engine.kv.free_count == 10


def test_a_prompt_larger_than_the_cache_minus_the_watermark_is_dropped_at_enqueue():
    h = v0(total_blocks=10, watermark_blocks=2)
    r = h.submit(36, 2)  # 9 blocks > 10 - 2
    assert r.state == DROPPED and r.finish_reason == DROP_KV_TOO_SMALL


def test_prompts_are_admitted_whole_up_to_the_budget_and_max_num_seqs():
    h = v0(max_num_batched_tokens=20, max_num_seqs=2)
    a, b, c = h.submit(8, 2), h.submit(8, 2), h.submit(4, 2)
    step = h.step()
    assert step.tokens == {a.id: 8, b.id: 8}  # c fits the budget but not max_num_seqs
    assert h.waiting_ids() == [c.id]


def test_the_kv_recount_holds_after_every_step_under_pressure():
    h = v0(total_blocks=12, max_num_batched_tokens=32)
    rng = np.random.default_rng(3)
    for _ in range(40):
        if rng.random() < 0.5:
            h.submit(int(rng.integers(1, 20)), int(rng.integers(1, 12)))
        if h.engine.has_work():
            h.step()
            assert h.check_kv() == []
    h.run()
    assert h.engine.kv.free_count == 12


def test_a_scenario_with_prefill_first_passes_the_audit_with_kv_checked_every_step():
    data = scenario_dict(
        requests=80,
        rate=400.0,
        kv_blocks=40,
        block_size=4,
        max_model_len=64,
        max_num_batched_tokens=64,
        enable_chunked_prefill=False,
        prefill_first=True,
        kv_every_step=True,
    )
    results = run_scenario(data)
    assert results.summary["audit"]["passed"]
    engine = results.summary["scenario"]["engine"]
    assert engine["prefill_first"] is True
    steps = results.record.step_logs[0].as_arrays()
    mixed = (steps["prefill_tokens"] > 0) & (steps["decode_tokens"] > 0)
    assert steps["prefill_tokens"].sum() > 0 and not mixed.any()


@pytest.mark.parametrize(
    ("engine", "field"),
    [
        ({"prefill_first": True, "enable_chunked_prefill": True}, "engine.enable_chunked_prefill"),
        (
            {"prefill_first": True, "long_prefill_token_threshold": 8},
            "engine.long_prefill_token_threshold",
        ),
        (
            {"prefill_first": True, "speculative": {"draft_tokens": 2, "acceptance_rate": 0.5}},
            "engine.prefill_first",
        ),
        ({"prefill_first": "sometimes"}, "engine.prefill_first"),
    ],
)
def test_contradictory_prefill_first_settings_are_refused_by_name(engine, field):
    data = scenario_dict(requests=4, rate=10.0, max_num_batched_tokens=512)
    del data["engine"]["enable_chunked_prefill"]
    data["engine"].update(engine)
    with pytest.raises(ScenarioError) as info:
        run_scenario(data)
    assert info.value.path == field


def test_prefill_first_defaults_the_budget_to_the_context_limit_as_vllm_v0_did():
    data = scenario_dict(requests=4, rate=10.0, kv_blocks=1000, max_model_len=3000)
    data["engine"].pop("max_num_batched_tokens", None)
    data["engine"].pop("enable_chunked_prefill", None)
    data["engine"]["prefill_first"] = True
    engine = run_scenario(data).summary["scenario"]["engine"]
    assert engine["max_num_batched_tokens"] == 3000  # max(max_model_len, 2048)
    assert engine["enable_chunked_prefill"] is False
