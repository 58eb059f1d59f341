"""SGLang's scheduler (``engine.profile: sglang``), one rule at a time, on a hand-driven engine.

Step time is the blackbox ``β0 + β1·prefill_tokens + β2·decode`` with β = (1000, 1, 10). KV
slots hold one token (SGLang's page size). See docs/explanation/sglang.md for the sources.
"""

from __future__ import annotations

import pytest
from conftest import EngineHarness, run_scenario, scenario_dict

from servesim.components.engine import EngineLimits
from servesim.components.request import FINISHED, Request
from servesim.components.sglang import (
    INIT_NEW_TOKEN_RATIO,
    LPM_QUEUE_LIMIT,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    SGLangEngine,
    default_chunked_prefill_size,
    default_max_running_requests,
)
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError


def sglang(
    policy: str = "fcfs", conservativeness: float = 1.0, max_prefill: int = 16384, **limits
) -> EngineHarness:
    """A harness whose engine is SGLang's (page size 1)."""
    limits.setdefault("total_blocks", 1000)
    limits.setdefault("max_num_batched_tokens", 256)
    h = EngineHarness(block_size=1, **limits)
    h.engine = SGLangEngine(
        EngineLimits(block_size=1, **limits),
        h.engine.latency,
        policy=policy,
        conservativeness=conservativeness,
        max_prefill_tokens=max_prefill,
        on_finish=h.finished.append,
    )
    return h


def finish_all(h: EngineHarness) -> None:
    h.run()
    assert h.check_kv() == []


# ---------------------------------------------------------------------- the radix cache in use


@pytest.mark.parametrize("shared, vllm_hit", [(20, 16), (12, 0)])
def test_sglang_reuses_a_shared_prefix_to_the_token_where_vllm_v1_reuses_whole_blocks(
    shared, vllm_hit
):
    vllm = EngineHarness(block_size=16, total_blocks=100, max_num_batched_tokens=256)
    radix = sglang()
    for h, expected in ((vllm, vllm_hit), (radix, shared)):
        h.submit(50, 4, prefix_group=0, prefix_tokens=shared, max_output_tokens=4)
        finish_all(h)
        h.submit(50, 4, prefix_group=0, prefix_tokens=shared, max_output_tokens=4)
        assert h.step().hits == {1: expected}
        finish_all(h)


def test_a_finished_requests_output_is_cached_for_the_conversations_next_round():
    h = sglang()
    first = h.submit(40, 6, max_output_tokens=6)
    finish_all(h)
    # the next round: the first prompt, its whole answer, and a new question
    follow_up = Request(1, h.now, 40 + 6 + 10, 3, segments=((0, 40), (1, 6), (2, 10)), block_size=1)
    h.requests[1] = follow_up
    h.engine.add_request(follow_up, h.now)
    # every computed token of the first round: its prompt and its answer but the last token
    assert h.step().hits == {1: 40 + 5}
    assert first.state == FINISHED


def test_a_prompt_is_found_while_its_request_still_decodes():
    h = sglang()
    h.submit(60, 30, prefix_group=0, prefix_tokens=50, max_output_tokens=30)
    h.step()  # prefilled; its prompt is in the tree, held by it
    h.step()
    h.submit(60, 3, prefix_group=0, prefix_tokens=50, max_output_tokens=3)
    assert h.step().hits == {1: 50}
    finish_all(h)


def test_the_auditors_recount_holds_at_every_step():
    h = sglang(total_blocks=400, max_num_batched_tokens=64)
    for k in range(6):
        h.submit(
            30 + 10 * k,
            5 + 7 * k,
            prefix_group=k % 2,
            prefix_tokens=25,
            max_output_tokens=5 + 7 * k,
        )
    while h.engine.has_work():
        h.step()
        assert h.check_kv() == []
    assert h.kv.used_blocks == 0  # all that is left is free or cached


# ---------------------------------------------------------------------- batches


def test_a_prefill_batch_runs_alone_and_every_decoder_waits():
    h = sglang()
    first = h.submit(20, 10, max_output_tokens=10)
    h.step()
    h.step()
    second = h.submit(30, 4, max_output_tokens=4)
    step = h.step()
    assert step.tokens == {second.id: 30}
    assert step.row["decode_tokens"] == 0
    assert h.step().tokens == {first.id: 1, second.id: 1}


def test_a_long_prompt_is_chunked_and_the_decoders_wait_for_every_chunk():
    h = sglang(max_num_batched_tokens=64)
    first = h.submit(10, 20, max_output_tokens=20)
    h.step()
    long = h.submit(150, 2, max_output_tokens=2)
    assert [h.step().tokens for _ in range(3)] == [{long.id: 64}, {long.id: 64}, {long.id: 22}]
    assert h.step().tokens == {first.id: 1, long.id: 1}


def test_a_continuing_chunk_counts_against_max_prefill_tokens():
    h = sglang(max_prefill=64, max_num_batched_tokens=256)
    long = h.submit(300, 2, max_output_tokens=2)
    assert h.step().tokens == {long.id: 256}  # the first request of a batch may exceed 64
    short = h.submit(30, 2, max_output_tokens=2)
    assert h.step().tokens == {long.id: 44}  # 20 prompt tokens left in the batch: not 30
    assert h.step().admitted == [short.id]


def test_a_request_whose_expected_output_does_not_fit_waits_until_one_finishes():
    # 200 token slots. The first request reserves its prompt and its 100-token budget; the
    # second (50 + 100) does not fit beside the first's expected remaining output, although the
    # slots themselves would hold it (vLLM would admit it at once)
    h = sglang(total_blocks=200, max_model_len=200)
    first = h.submit(50, 100, max_output_tokens=100)
    h.step()
    second = h.submit(50, 100, max_output_tokens=100)
    assert h.step().admitted == []
    assert h.engine.batch_full  # no admission is tried again until a request leaves
    waited = 1
    while first.state != FINISHED:
        assert h.step().admitted == []
        waited += 1
    assert waited == 99
    assert h.step().admitted == [second.id]


def test_max_running_requests_marks_the_batch_full():
    h = sglang(max_num_seqs=2)
    for _ in range(3):
        h.submit(10, 5, max_output_tokens=5)
    assert h.step().admitted == [0, 1]
    assert h.engine.batch_full


# ---------------------------------------------------------------------- retraction


def test_decodes_that_run_out_of_memory_retract_the_request_with_the_fewest_outputs():
    # a low reservation ratio lets three requests in whose outputs do not fit together
    h = sglang(conservativeness=0.1, total_blocks=300, max_model_len=300)
    a = h.submit(40, 90, max_output_tokens=100)
    b = h.submit(40, 90, max_output_tokens=100)
    h.step()
    c = h.submit(40, 100, max_output_tokens=100)
    assert h.step().admitted == [c.id]
    readmitted = None
    while h.engine.has_work():
        step = h.step()
        assert h.check_kv() == []
        if step.preempted:
            assert step.preempted == [c.id]  # the latest: fewest output tokens
            assert h.waiting_ids() == [c.id]
            # its prompt stays cached; the free slots cover 20 decode steps of the rest
            assert h.kv.free >= 20 * 2
            # their outputs when the step was formed (each decoded one token in it since)
            generated = h.generated(a) + h.generated(b) - 2
            assert h.engine.new_token_ratio == pytest.approx((generated + 2 * 20) / 200)
        if c.id in step.admitted:
            readmitted = step
    assert (a.preemptions, b.preemptions, c.preemptions) == (0, 0, 1)
    assert h.engine.retractions == 1
    assert readmitted.hits == {c.id: 40}  # back at the prompt it had cached
    assert c.finish_us > max(a.finish_us, b.finish_us)


def test_the_ratio_decays_with_decode_steps_and_resets_when_idle():
    h = sglang()
    h.submit(10, 50, max_output_tokens=50)
    h.run()
    decayed = h.engine.new_token_ratio
    init = INIT_NEW_TOKEN_RATIO
    step = (init - 0.14 * init) / NEW_TOKEN_RATIO_DECAY_STEPS
    assert decayed == pytest.approx(init - 49 * step)  # 49 decode steps after the prefill
    h.submit(10, 2, max_output_tokens=2)
    assert h.engine.new_token_ratio == init


# ---------------------------------------------------------------------- policies


def _prime(h: EngineHarness, group: int, prefix: int) -> None:
    h.submit(prefix + 5, 2, prefix_group=group, prefix_tokens=prefix, max_output_tokens=2)
    finish_all(h)


@pytest.mark.parametrize("policy, order", [("fcfs", [1, 2, 3]), ("lpm", [2, 1, 3])])
def test_lpm_admits_the_longest_cached_prefix_first(policy, order):
    h = sglang(policy)
    _prime(h, 0, 60)
    h.submit(30, 2, max_output_tokens=2)  # nothing cached
    h.submit(80, 2, prefix_group=0, prefix_tokens=60, max_output_tokens=2)  # 60 cached
    h.submit(
        30, 2, prefix_group=5, prefix_tokens=20, max_output_tokens=2
    )  # a prefix nobody computed yet
    assert h.step().admitted == order


def test_lpm_holds_back_a_request_that_shares_an_uncached_prefix_with_an_earlier_one():
    h = sglang("lpm", max_num_seqs=2)
    first = h.submit(50, 2, prefix_group=1, prefix_tokens=40, max_output_tokens=2)
    twin = h.submit(50, 2, prefix_group=1, prefix_tokens=40, max_output_tokens=2)
    other = h.submit(30, 2, max_output_tokens=2)
    assert h.step().admitted == [first.id, other.id]
    finish_all(h)
    assert twin.cached_tokens == 40  # admitted after its twin cached the prefix


def test_lpm_is_plain_fcfs_above_128_waiting_requests():
    for waiting, admitted_first in ((LPM_QUEUE_LIMIT, "cached"), (LPM_QUEUE_LIMIT + 1, "head")):
        h = sglang("lpm", max_num_seqs=1, total_blocks=100_000)
        _prime(h, 0, 60)
        head = h.submit(10, 1, max_output_tokens=1)
        for _ in range(waiting - 2):
            h.submit(10, 1, max_output_tokens=1)
        cached = h.submit(70, 1, prefix_group=0, prefix_tokens=60, max_output_tokens=1)
        expected = cached if admitted_first == "cached" else head
        assert h.step().admitted == [expected.id]


# ---------------------------------------------------------------------- the scenario


def _sglang_scenario(**engine):
    data = scenario_dict(kv_blocks=2000, block_size=1, max_model_len=1000, profile="sglang")
    data["engine"].update(engine)
    return data


def test_the_profile_builds_sglang_engines_and_runs_clean():
    data = scenario_dict(
        requests=60,
        rate=400,
        input={"type": "uniform", "min": 20, "max": 200},
        output={"type": "uniform", "min": 2, "max": 60},
        prefix={"groups": 2, "tokens": 30},
        kv_blocks=1500,
        block_size=1,
        max_model_len=600,
        kv_every_step=True,
        profile="sglang",
        schedule_policy="lpm",
    )
    results = run_scenario(data)
    assert results.violations == []
    assert results.record.instances[0]["kv_hit_blocks"] > 0


@pytest.mark.parametrize(
    "engine, field",
    [
        ({"block_size": 16}, "engine.block_size"),
        ({"prefill_first": True, "enable_chunked_prefill": False}, "engine.prefill_first"),
        ({"speculative": {"draft_tokens": 2, "acceptance_rate": 0.5}}, "engine.speculative"),
        ({"schedule_policy": "dfs-weight"}, "engine.schedule_policy"),
        ({"schedule_conservativeness": 0}, "engine.schedule_conservativeness"),
        ({"profile": "trtllm"}, "engine.profile"),
    ],
)
def test_what_the_profile_does_not_model_is_refused_by_name(engine, field):
    data = _sglang_scenario()
    data["engine"].pop("block_size")
    data["engine"].update(engine)
    with pytest.raises(ScenarioError) as error:
        load_scenario(data)
    assert error.value.path == field


@pytest.mark.parametrize("key, value", [("schedule_policy", "lpm"), ("max_prefill_tokens", 64)])
def test_sglangs_own_knobs_are_refused_without_the_profile(key, value):
    data = scenario_dict(**{key: value})
    with pytest.raises(ScenarioError) as error:
        load_scenario(data)
    assert error.value.path == f"engine.{key}"
    load_scenario(scenario_dict(**{key: value}, profile="sglang", block_size=1))


def test_the_profile_is_refused_in_disaggregated_pools():
    data = _sglang_scenario()
    data["policies"] = {"disaggregation": "always"}
    data["cluster"] = {"pools": {"prefill": {"instances": 1}, "decode": {"instances": 1}}}
    with pytest.raises(ScenarioError) as error:
        load_scenario(data)
    assert error.value.path == "cluster.pools.prefill.engine.profile"


def test_sglangs_defaults_fill_the_limits_not_given():
    data = _sglang_scenario()
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        data["engine"].pop(key)
    engine = load_scenario(data).instance_specs[0].engine
    assert engine.block_size == 1
    assert engine.max_num_batched_tokens == 8192  # H100, 80 GiB
    assert engine.max_num_seqs == 1000  # half of the 2000 KV tokens
    assert (engine.schedule_policy, engine.max_prefill_tokens) == ("fcfs", 16384)


def test_the_default_sizes_follow_sglangs_rules():
    assert [default_chunked_prefill_size(g) for g in (24, 80, 141, 192)] == [
        2048,
        8192,
        8192,
        16384,
    ]
    assert default_max_running_requests(24_000, 4096) == 3000  # the request pool: 24000/4096*512
    assert default_max_running_requests(1_000_000, 8192) == 4096
    assert default_max_running_requests(3000, 8192) == 1500
