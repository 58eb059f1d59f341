"""Preemption by swapping (``engine.preemption_mode: swap``; vLLM v0's swap mode, DistServe's
decode engine).

A decoding victim's KV is copied to CPU memory over PCIe and all its GPU blocks are freed; it
keeps its progress. Swapped requests come back (copied in again) before any waiting request is
admitted. Each copy lengthens the step that makes it by blocks x block bytes / PCIe bandwidth.
When the swap space cannot hold a victim, it is preempted by recompute instead, and counted.
"""

from __future__ import annotations

import pytest
from conftest import EngineHarness, run_scenario, scenario_dict

from servesim.audit import audit
from servesim.components.request import RUNNING, WAITING, Request
from servesim.simcore.errors import ScenarioError

US_PER_BLOCK = 50.0


def crowded(swap_blocks: int = 100) -> EngineHarness:
    """Four requests filling an 8-block cache (block size 4) in their first step; their decodes
    must preempt each other (as in test_preemption.py)."""
    h = EngineHarness(
        block_size=4, total_blocks=8, swap_blocks=swap_blocks, swap_us_per_block=US_PER_BLOCK
    )
    h.submit(8, 12)
    h.submit(6, 12)
    h.submit(5, 12)
    h.submit(8, 3)
    return h


def recompute_twin() -> EngineHarness:
    h = EngineHarness(block_size=4, total_blocks=8)
    for prompt, output in ((8, 12), (6, 12), (5, 12), (8, 3)):
        h.submit(prompt, output)
    return h


def books_balance(h: EngineHarness) -> None:
    assert h.check_kv() == []
    assert h.engine.check_swap() == []


def test_a_swapped_out_request_keeps_its_progress_and_its_kv_moves_to_cpu_memory():
    h = crowded()
    a, b, c, d = h.requests.values()
    h.step()
    late = h.submit(4, 1)
    step = h.step()
    assert step.preempted == [d.id]
    # d computed its 8 prompt tokens (2 blocks) and made one token: that KV goes to CPU memory
    assert d.state == WAITING and d.blocks == [] and d.num_computed == 8 and d.num_generated == 1
    assert list(h.engine.swapped) == [d] and d.swapped_blocks == 2 and h.engine.swap_used == 2
    assert h.waiting_ids() == [late.id]  # not in the wait queue: it comes back by copy
    assert h.engine.swap_outs == 1 and h.engine.swap_fallbacks == 0
    books_balance(h)


def test_the_swap_copy_lengthens_its_step_by_blocks_times_the_pcie_time_per_block():
    swap, twin = crowded(), recompute_twin()
    for h in (swap, twin):
        h.step()
    swap_out, recompute = swap.step(), twin.step()
    assert swap_out.preempted == recompute.preempted == [3]
    # the same batch runs in both; the swap-out copies d's 2 blocks over PCIe first
    assert swap_out.tokens == recompute.tokens
    assert swap_out.dt == recompute.dt + 2 * US_PER_BLOCK
    assert swap.engine.swap_us_total == 2 * US_PER_BLOCK


def test_a_swapped_request_comes_back_by_copy_before_waiting_requests_and_recomputes_nothing():
    h = crowded()
    d = h.requests[3]
    late = h.submit(4, 2)  # waits behind the batch; d, swapped out later, comes back first
    steps = h.run()
    back = next(s for s in steps if d.id in s.admitted and s.start > 0)
    late_admitted = next(s for s in steps if late.id in s.admitted)
    assert late_admitted.start > back.start
    # d computes only its next token (its KV was copied back), the copy is in the step time
    assert back.tokens[d.id] == 1 and back.hits[d.id] == 8
    assert back.dt >= 2 * US_PER_BLOCK
    assert h.engine.swap_ins == h.engine.swap_outs == h.engine.preemptions >= 3
    assert h.engine.swap_used == 0 and h.engine.swap_in_blocks == h.engine.swap_out_blocks
    assert all(r.num_generated == r.target_output for r in h.requests.values())
    # nobody re-prefilled: the prefill tokens computed are exactly the prompts
    prompts = sum(r.prompt_tokens for r in h.requests.values())
    assert sum(s.row["prefill_tokens"] for s in steps) == prompts


def test_every_step_of_a_swapping_engine_balances_gpu_and_cpu_blocks():
    h = crowded()
    h.submit(4, 2)
    while h.engine.has_work():
        h.step()
        books_balance(h)
        assert 0 <= h.engine.swap_used <= h.engine.limits.swap_blocks


def test_a_full_swap_space_falls_back_to_recompute_and_counts_it():
    h = crowded(swap_blocks=2)  # room for d's 2 blocks, not for c's next
    a, b, c, d = h.requests.values()
    steps = h.run()
    assert h.engine.swap_outs == 1 and d.swapped_blocks == 0  # d went to CPU memory
    assert h.engine.swap_fallbacks == 2  # c and b found it full: recomputed
    assert h.engine.preemptions == 3
    assert h.engine.swap_peak == 2
    recomputed = sum(s.row["prefill_tokens"] for s in steps) - sum(
        r.prompt_tokens for r in h.requests.values()
    )
    assert recomputed > 0
    books_balance(h)


def test_a_victim_still_prefilling_is_recomputed_not_swapped():
    # chunked prefill of 4 tokens per step: b is mid-prompt when a's decode needs its block
    h = EngineHarness(
        block_size=4,
        total_blocks=4,
        max_num_batched_tokens=5,
        swap_blocks=100,
        swap_us_per_block=US_PER_BLOCK,
    )
    a = h.submit(4, 6)
    b = h.submit(12, 2)
    swapped_ids = set()
    while h.engine.has_work():
        h.step()
        swapped_ids.update(r.id for r in h.engine.swapped)
        books_balance(h)
    assert b.preemptions >= 1 and b.id not in swapped_ids
    assert a.state != RUNNING


# ------------------------------------------------------------------ whole runs


def swap_scenario(**extra) -> dict:
    return scenario_dict(
        requests=60,
        rate=200,
        input=64,
        output=64,
        kv_blocks=48,
        preemption_mode="swap",
        kv_every_step=True,
        **extra,
    )


def test_a_swapping_run_passes_the_audit_and_reports_its_swaps():
    results = run_scenario(swap_scenario())
    s = results.summary
    assert results.violations == []
    assert s["swap_outs"] > 0 and s["swap_ins"] == s["swap_outs"]
    assert s["swap_fallback_recomputes"] == 0 and s["preemption_count"] == s["swap_outs"]
    info = results.record.instances[0]
    block_bytes = results.scenario.engine.kv_block_bytes
    assert s["swap_bytes"] == (info["swap_out_blocks"] + info["swap_in_blocks"]) * block_bytes
    # 4 GiB per GPU by default (vLLM's --swap-space), in blocks of this model and TP
    assert info["swap_blocks"] == 4 * 2**30 // block_bytes
    # the copies are priced at kv_cpu_bandwidth (25 GB/s)
    blocks = info["swap_out_blocks"] + info["swap_in_blocks"]
    assert s["swap_ms"] == pytest.approx(blocks * block_bytes / 25e9 * 1e3, rel=0.01)


def test_a_run_whose_swap_space_is_too_small_recomputes_instead():
    results = run_scenario(swap_scenario(swap_space="100KiB"))  # less than one block
    s = results.summary
    assert results.violations == []
    assert s["swap_outs"] == 0 and s["swap_fallback_recomputes"] == s["preemption_count"] > 0


def test_recompute_stays_the_default():
    results = run_scenario(scenario_dict(requests=60, rate=200, input=64, output=64, kv_blocks=48))
    assert results.summary["preemption_count"] > 0 and results.summary["swap_outs"] == 0


def test_the_auditor_catches_swap_books_that_do_not_balance():
    results = run_scenario(swap_scenario())
    from servesim.run import audit_input

    data = audit_input(results.record)
    assert audit(data) == []
    books = data.swap[0]
    books["in_blocks"] -= 1  # a block swapped out never came back, yet none is in CPU memory
    assert any(v.invariant == "INV-4" and "swapped out" in v.message for v in audit(data))
    books["in_blocks"] += 1
    books["peak"] = books["space"] + 1
    assert any(v.invariant == "INV-4" and "over its" in v.message for v in audit(data))


def test_swap_needs_the_model_architecture_and_refuses_speculative_decoding():
    data = swap_scenario()
    data["engine"]["speculative"] = {"draft_tokens": 2, "acceptance_rate": 0.7}
    with pytest.raises(ScenarioError) as err:
        run_scenario(data)
    assert err.value.path == "engine.preemption_mode"
    data = swap_scenario()
    data["engine"]["preemption_mode"] = "swapping"
    with pytest.raises(ScenarioError) as err:
        run_scenario(data)
    assert err.value.path == "engine.preemption_mode"


def test_a_decode_instance_with_requests_swapped_out_accepts_no_transfer():
    """Disaggregated serving: a transfer's KV reservation is new work, and swapped-out requests
    come back first (vLLM v0's order), so it waits while any is in CPU memory."""
    h = crowded()
    h.step()
    h.step()  # d is swapped out
    assert h.engine.swapped
    remote = Request(99, h.now, 4, 3, block_size=4)
    assert h.engine.reserve_remote(remote, h.now, free_blocks=8) == -1
    assert remote.finish_reason == "decode_kv_full"
    while h.engine.swapped:
        h.step()
    remote.finish_reason = ""
    assert h.engine.reserve_remote(remote, h.now, free_blocks=h.kv.free_count) >= 0
