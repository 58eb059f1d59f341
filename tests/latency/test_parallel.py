"""Parallelism beyond tp: pipeline rounds, expert-parallel communication, KV per rank, the
plain layout's exactness and the refusals (servesim.latency.parallel, .expert_parallel)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import scenario_dict

from servesim.latency.base import BatchSummary, LatencyModel
from servesim.latency.expert_parallel import ExpertParallelRank
from servesim.latency.hardware import resolve_gpu
from servesim.latency.interconnect import REFERENCE_LINK_GBS, Interconnect
from servesim.latency.kvcapacity import auto_kv_blocks, kv_capacity, weight_params
from servesim.latency.modelindex import resolve_model
from servesim.latency.parallel import (
    STAGE_TENSORS,
    Parallelism,
    ParallelLatency,
    pipeline_round_us,
    split_batch,
    stage_layers,
)
from servesim.latency.trained import TrainedPhysicsLatencyModel
from servesim.run import simulate
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError

QWEN_MOE = resolve_model("qwen3-30b-a3b").spec
LLAMA = resolve_model("llama-3.1-8b-instruct").spec
RTX = resolve_gpu("RTX-PRO-6000")
H100 = resolve_gpu("H100")


class PerToken(LatencyModel):
    """1000 µs per step + 10 µs per token: a whole-model step the tests can add up by hand."""

    name = "per-token"

    def step_time_us(self, batch: BatchSummary) -> int:
        return 1000 + 10 * (batch.prefill_tokens + batch.decode_requests)


LINK = Interconnect(kind="nvlink", gbs=100.0, latency_us=5.0)


def pipeline(pp: int, layers_model=LLAMA, budget: int = 0, **par) -> ParallelLatency:
    return ParallelLatency(
        PerToken(), layers_model, 1, Parallelism(pp=pp, batch_tokens=budget, **par), LINK
    )


# ---------------------------------------------------------------------------- pipeline


def test_one_request_through_the_pipeline_takes_the_stage_times_plus_the_transfers():
    # 32 layers over 4 stages of 8: the stage times add up to the whole-model step (1000 + 10·100
    # µs); each of the 3 hand-overs moves 100 tokens x (hidden + residual) x 4096 x 2 bytes
    batch = BatchSummary(100, [(0, 100, 100)], 0, 0)
    transfer = 5.0 + 100 * STAGE_TENSORS * 4096 * 2 / (100.0 * 1e3)
    assert pipeline(4).step_time_us(batch) == int(2000 + 3 * transfer)


def test_a_full_pipeline_is_bound_by_its_slowest_stage():
    # two full micro-batches of 512 tokens (the per-batch budget), each 1000 + 10·512 = 6120 µs
    # through the whole model; stages of 3 and 2 layers (stage_layers(5, 2)): the 3-layer stage
    # serves both, 0.6 x 2 x 6120 µs, longer than one micro-batch's trip (6120 µs + transfer)
    model = pipeline(2, budget=512)
    model.shares = [0.6, 0.4]
    batch = BatchSummary(1024, [(0, 512, 512), (0, 512, 512)], 0, 0)
    assert [m.prefill_tokens for m in split_batch(batch, 2, 512)] == [512, 512]
    assert model.step_time_us(batch) == int(0.6 * 2 * 6120)
    # steady state: tokens per round = the slowest stage's rate, 512 tokens per 0.6 x 6120 µs
    assert 1024 / model.step_time_us(batch) == pytest.approx(512 / (0.6 * 6120), rel=1e-3)
    # even stages: the trip of a micro-batch (stage times + the hand-over) sets the round
    even = pipeline(2, budget=512)
    transfer = 5.0 + 512 * STAGE_TENSORS * 4096 * 2 / (100.0 * 1e3)
    assert even.step_time_us(batch) == int(6120 + transfer)
    assert pipeline_round_us([6120.0, 6120.0], [0.5, 0.5], transfer, 2) == 6120 + transfer


def test_a_load_within_one_scheduler_batch_is_one_micro_batch():
    batch = BatchSummary(10, [(0, 10, 10)], 50, 5000)
    assert split_batch(batch, 4, 2048) == [batch]
    # the stages idle (bubble): the round is the batch's trip plus the hand-overs
    transfer = 5.0 + 60 * STAGE_TENSORS * 4096 * 2 / (100.0 * 1e3)
    assert pipeline(4, budget=2048).step_time_us(batch) == int(1600 + 3 * transfer)


def test_micro_batches_keep_every_token_and_the_decode_context():
    batch = BatchSummary(700, [(0, 300, 300), (50, 400, 450)], 90, 9000)
    micro = split_batch(batch, 3, 256)
    assert sum(m.prefill_tokens for m in micro) == 700
    assert sum(m.decode_requests for m in micro) == 90
    assert sum(m.decode_context for m in micro) == 9000
    assert len(micro) == 3


def test_uneven_stages_give_the_remainder_to_the_stages_before_the_last():
    assert stage_layers(40, 3) == [13, 14, 13]
    assert stage_layers(32, 4) == [8, 8, 8, 8]
    assert Parallelism(pp=3).layer_share(40) == 14 / 40


def test_a_stage_boundary_across_nodes_uses_the_inter_node_link():
    par = Parallelism(pp=2, gpus_per_node=4, internode_gbs=25.0, internode_latency_us=20.0)
    assert par.crossing_boundaries(tp=4) == 1
    model = ParallelLatency(PerToken(), LLAMA, 4, par, LINK)
    batch = BatchSummary(100, [(0, 100, 100)], 0, 0)
    transfer = 20.0 + 100 * STAGE_TENSORS * 4096 * 2 / (25.0 * 1e3)
    assert model.step_time_us(batch) == int(2000 + transfer)


def test_context_parallel_prefill_splits_the_new_tokens_and_pays_the_kv_exchange():
    from servesim.latency.kvcapacity import kv_bytes_per_token

    model = ParallelLatency(PerToken(), LLAMA, 1, Parallelism(cp=2), LINK)
    batch = BatchSummary(1000, [(0, 1000, 1000)], 0, 0)
    exchange = 5.0 + 0.5 * 1000 * kv_bytes_per_token(LLAMA, 1) / (100.0 * 1e3)
    assert model.step_time_us(batch) == int(1000 + 10 * 500 + exchange)


# ---------------------------------------------------------------------- expert parallelism


def ep_rank(
    dp: int = 2, tp: int = 1, ep: int | None = None, backend: str = "allgather_reducescatter"
) -> ExpertParallelRank:
    model = ExpertParallelRank(QWEN_MOE, RTX, tp, moe_comm_backend=backend)
    model.configure(Parallelism(dp=dp, ep=dp * tp if ep is None else ep))
    return model


def test_vllms_default_dispatch_sends_every_ranks_whole_chunk_across_the_pcie_link():
    # vLLM's default backend (allgather_reducescatter): one copy of each token; over 2 GPUs the
    # all-gather sends a rank's whole chunk to the other GPU, and the reduce-scatter brings it back
    rank = ep_rank()
    link = rank.interconnect
    assert link.kind == "pcie"
    token = 2048 * 2  # hidden x bf16
    per_byte = 1 / (link.gbs * 1e3) - 1 / (REFERENCE_LINK_GBS * 1e3)
    assert rank._comm_excess_per_token == pytest.approx(2 * 48 * token * per_byte)
    # one ring step per collective: 2 collectives on each of 48 MoE layers
    assert rank.comm_floor_us == pytest.approx(2 * 48 * max(0.0, link.latency_us - 4.5))
    # BLIS's dispatch basis (βEP), one copy at the reference H100 HBM bandwidth
    _, dispatch = rank._comm(100.0)
    assert dispatch == pytest.approx(48 * 100 * 0.5 * 2 * token / (3.35 * 1e6))
    assert rank.describe()["expert_parallel"]["dispatch"] == "all-gather/reduce-scatter"


def test_an_all_to_all_backend_pays_the_pcie_excess_for_the_top_k_copies_of_each_token():
    rank = ep_rank(backend="deepep_low_latency")
    link = rank.interconnect
    token = 2048 * 2
    share = 0.5  # (G − 1) / G of the copies go to the other GPU
    per_byte = share * (1 / (link.gbs * 1e3) - 1 / (REFERENCE_LINK_GBS * 1e3))
    # dispatch and combine on each of 48 MoE layers, 8 routed copies of each token
    assert rank._comm_excess_per_token == pytest.approx(2 * 48 * 8 * token * per_byte)
    _, dispatch = rank._comm(100.0)
    assert dispatch == pytest.approx(48 * 100 * 8 * share * 2 * token / (3.35 * 1e6))
    # 8 copies, half of them remote, are 4x the default's one whole chunk over 2 GPUs
    assert rank._comm_excess_per_token == pytest.approx(4 * ep_rank()._comm_excess_per_token)


def test_the_all_gather_link_time_grows_with_the_group():
    # a ring all-gather moves the other G − 1 ranks' chunks through each link
    two, four = ep_rank(dp=2), ep_rank(dp=4)
    per_byte = 1 / (two.interconnect.gbs * 1e3) - 1 / (REFERENCE_LINK_GBS * 1e3)
    assert four._comm_excess_per_token == pytest.approx(2 * 48 * 2048 * 2 * 3 * per_byte)
    assert four._comm_excess_per_token == pytest.approx(3 * two._comm_excess_per_token)


def test_each_gpu_reads_its_share_of_the_experts():
    whole = TrainedPhysicsLatencyModel(QWEN_MOE, RTX, 1)
    rank = ep_rank()
    expert_bytes = 48 * 128 * 3 * 2048 * 768 * 2
    assert whole.t_weight_us - rank.t_weight_us == pytest.approx(
        expert_bytes / 2 / (RTX.bandwidth_tbs * 1e6)
    )


def test_the_group_step_is_the_slowest_ranks_with_the_others_routed_tokens():
    rank = ep_rank()
    busy = BatchSummary(0, (), 64, 64 * 500)
    alone = rank.group_step_us([busy, None])
    # the idle rank runs a one-token dummy batch; the busy rank also computes its routed token
    assert alone >= rank.step_time_us(busy)
    both = rank.group_step_us([busy, busy])
    assert both >= alone
    # balanced ranks each see the other's routed tokens: the group step exceeds one rank's own
    assert both >= rank.step_time_us(busy)


def test_balanced_ranks_reproduce_blis_dp_formula_on_the_expert_terms():
    # BLIS's latency.dp prices one instance whose batch is spread evenly over dp ranks; with the
    # same tokens on both ranks the routed-expert compute and the expert weights agree
    blis = TrainedPhysicsLatencyModel(QWEN_MOE, RTX, 1, dp=2)
    rank = ep_rank(ep=1)  # dp without ep: the experts sharded over dp x tp, as vLLM does
    assert rank.t_weight_us == pytest.approx(blis.t_weight_us)
    assert rank._ffn_flops(100.0) == pytest.approx(blis._ffn_flops(100.0))


# ------------------------------------------------------------------------------ KV per rank


def test_kv_capacity_per_rank_holds_only_the_ranks_experts():
    plain = kv_capacity(QWEN_MOE, RTX, 1, 16)
    rank = kv_capacity(QWEN_MOE, RTX, 1, 16, parallel=Parallelism(dp=2, ep=2))
    parts = weight_params(QWEN_MOE)
    saved = parts["experts"] / 2 * 2 / 2**30  # half the routed experts' bf16 bytes
    assert plain.weights_gib - rank.weights_gib == pytest.approx(saved)
    assert rank.non_torch_gib == pytest.approx(0.6)  # two GPUs talk: NCCL/all-to-all buffers
    assert rank.blocks > 1.9 * plain.blocks
    assert auto_kv_blocks(QWEN_MOE, RTX, 1, 16, parallel=Parallelism(dp=2, ep=2)) == rank.blocks


def test_pipeline_stages_hold_their_layers_kv_and_context_ranks_shard_it():
    plain = kv_capacity(LLAMA, H100, 1, 16)
    staged = kv_capacity(LLAMA, H100, 1, 16, parallel=Parallelism(pp=2))
    assert staged.per_block_bytes == plain.per_block_bytes // 2
    assert staged.weights_gib < 0.6 * plain.weights_gib
    sharded = kv_capacity(LLAMA, H100, 1, 16, parallel=Parallelism(cp=2))
    assert sharded.per_block_bytes == plain.per_block_bytes
    assert sharded.blocks == 2 * (int(sharded.kv_gib * 2**30) // sharded.per_block_bytes)


# ----------------------------------------------------------------- plain layout: unchanged


def _moe_scenario(**engine) -> dict:
    data = scenario_dict(requests=30, rate=50.0, input=64, output=16, kv_blocks=4096, **engine)
    data["model"] = "qwen3-30b-a3b"
    data["gpu"] = "RTX-PRO-6000"
    data["latency"] = {"model": "trained-physics"}
    return data


@pytest.mark.parametrize("latency", ["trained-physics", "blackbox"])
def test_all_ones_give_bit_identical_runs(latency):
    base = scenario_dict(requests=30, rate=50.0, input=64, output=16, kv_blocks=512)
    if latency == "trained-physics":
        base["latency"] = {"model": "trained-physics"}
    ones = copy.deepcopy(base)
    ones["engine"].update(dp=1, ep=1, pp=1, cp=1)
    a, b = simulate(load_scenario(base)), simulate(load_scenario(ones))
    for column in ("first_token_us", "completion_us", "itl_sum_us", "instance"):
        np.testing.assert_array_equal(a.requests[column], b.requests[column])
    np.testing.assert_array_equal(
        a.record.step_logs[0].column("dt_us"), b.record.step_logs[0].column("dt_us")
    )


def test_a_scenarios_moe_comm_backend_sets_the_expert_groups_dispatch():
    # engine.ep used to force the all-to-all; latency.moe_comm_backend now decides, vLLM's
    # default (all-gather/reduce-scatter) when the scenario names none
    from servesim.projection.project import _latency_model

    def rank(**latency):
        data = _moe_scenario(dp=2, ep=2)
        data["latency"].update(latency)
        scenario = load_scenario(data)
        return _latency_model(scenario, scenario.instance_specs[0], "latency")

    default, pplx = rank(), rank(moe_comm_backend="pplx")
    assert default.describe()["expert_parallel"]["dispatch"] == "all-gather/reduce-scatter"
    assert pplx.describe()["expert_parallel"]["dispatch"] == "all-to-all (top-k copies)"
    assert pplx._comm_excess_per_token == pytest.approx(4 * default._comm_excess_per_token)
    batch = BatchSummary(0, (), 64, 64 * 500)
    assert pplx.group_step_us([batch, batch]) > default.group_step_us([batch, batch])


def test_a_lock_stepped_group_runs_its_ranks_together_and_audits_clean():
    results = simulate(load_scenario(_moe_scenario(dp=2, ep=2)))
    assert results.violations == []
    assert results.scenario.instances == 2
    logs = results.record.step_logs
    # every group step starts and ends at the same instant on both ranks
    np.testing.assert_array_equal(logs[0].column("start_us"), logs[1].column("start_us"))
    np.testing.assert_array_equal(logs[0].column("dt_us"), logs[1].column("dt_us"))
    assert (results.requests["instance"] == 1).any() and (results.requests["instance"] == 0).any()
    assert (results.requests["status"] == 0).all()


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("model", "engine", "field", "words"),
    [
        ("llama-3.1-8b-instruct", {"ep": 2, "dp": 2}, "engine.ep", "no experts"),
        ("qwen3-30b-a3b", {"ep": 4, "dp": 2}, "engine.ep", "dp × tp"),
        ("mixtral-8x7b", {"ep": 3, "dp": 3}, "engine.ep", "does not split"),
        ("llama-3.1-8b-instruct", {"pp": 40}, "engine.pp", "32 layers"),
        ("qwen3-30b-a3b", {"pp": 2, "dp": 2}, "engine.pp", "MoE ranks are not modelled"),
        ("qwen3-30b-a3b", {"cp": 2, "dp": 2}, "engine.cp", "MoE ranks is not modelled"),
        ("llama-3.1-8b-instruct", {"cp": 4, "gpus_per_node": 2}, "engine.gpus_per_node", "node"),
        (
            "llama-3.1-8b-instruct",
            {"internode_bandwidth": 0},
            "engine.internode_bandwidth",
            "positive",
        ),
    ],
)
def test_bad_combinations_are_refused_by_name(model, engine, field, words):
    data = scenario_dict(kv_blocks=512, **engine)
    data["model"] = model
    data["gpu"] = "H100"
    data["latency"] = {"model": "trained-physics"}
    with pytest.raises(ScenarioError) as info:
        load_scenario(data)
    assert info.value.path == field
    assert words in info.value.fix


def test_a_layout_describes_its_fields_but_not_the_schedulers_token_budget():
    described = Parallelism(dp=2, pp=3, batch_tokens=64).describe()
    assert described == {
        "dp": 2,
        "ep": 1,
        "pp": 3,
        "cp": 1,
        "gpus_per_node": 8,
        "internode_gbs": 50.0,
        "internode_latency_us": 10.0,
    }
    assert list(described) == [
        "dp",
        "ep",
        "pp",
        "cp",
        "gpus_per_node",
        "internode_gbs",
        "internode_latency_us",
    ]


def test_lock_stepped_moe_ranks_need_the_trained_physics_expert_terms():
    data = _moe_scenario(dp=2, ep=2)
    data["latency"] = {"model": "roofline"}
    with pytest.raises(ScenarioError) as info:
        load_scenario(data)
    assert info.value.path == "latency.model"
    assert "trained-physics" in info.value.fix


def test_data_parallel_ranks_in_disaggregated_pools_are_refused():
    data = scenario_dict(kv_blocks=512, dp=2)
    data["cluster"] = {"pools": {"prefill": {"instances": 1}, "decode": {"instances": 1}}}
    data["policies"] = {"disaggregation": "always"}
    with pytest.raises(ScenarioError) as info:
        load_scenario(data)
    assert info.value.path == "engine.dp"
