"""Two departures of trained-physics from BLIS: the prefill floor (no prefill faster than the
GPU's peak FLOP rate) and the routed experts a step touches (servesim/latency/moe_routing.py).
Every expected number is derived in the test from the config, the H100 datasheet and the
bundled β."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.latency.base import BatchSummary, LatencyContext
from servesim.latency.moe_routing import ExpertRouting, busiest_share, pick_probabilities
from servesim.latency.trained import TrainedPhysicsLatencyModel, default_coefficients
from servesim.simcore.errors import ScenarioError
from servesim.testing import check_latency_model

BETA = list(default_coefficients()[1])
H100_BW = 3.35e6  # bytes/µs


def trained(name: str, gpu: str = "H100", tp: int = 1, **params) -> TrainedPhysicsLatencyModel:
    return TrainedPhysicsLatencyModel.from_config(params, LatencyContext(name, gpu, tp))


def decodes(n: int, context_each: int = 1000) -> BatchSummary:
    return BatchSummary(0, (), n, n * context_each)


PREFILL_512 = BatchSummary(512, ((0, 512, 512),), 0, 0)


# --- routing statistics ---------------------------------------------------------------------


def test_uniform_routing_touches_the_rooflines_expected_distinct_experts():
    r = ExpertRouting(128, 8, 0.0, gpus=2)
    assert r.touched(0) == 0
    assert r.touched(1) == pytest.approx(8)  # one token reads its k experts
    # two tokens: E·(1 − (1 − k/E)²) = 128·(1 − (120/128)²) = 15.5
    assert r.touched(2) == pytest.approx(15.5)
    assert r.touched(2) / 2 == r.touched_per_gpu(2)
    assert r.touched(10_000) == pytest.approx(128)
    assert r.busiest_share == 0.5


def test_zipf_pick_probabilities_sum_to_k_and_fall_with_rank():
    q = pick_probabilities(64, 2, 0.7)
    assert sum(q) == pytest.approx(2)
    assert all(a > b for a, b in zip(q, q[1:]))
    # 1/i^s weights: q1 / q2 = 2^s
    assert q[0] / q[1] == pytest.approx(2**0.7)


@pytest.mark.parametrize("skew", [0.5, 3.0, 20.0, 200.0])
def test_pick_probabilities_sum_to_k_at_any_skew(skew):
    """A token always picks k distinct experts, however popular the first ones are."""
    q = pick_probabilities(128, 8, skew)
    assert sum(q) == pytest.approx(8)
    assert max(q) <= 1.0


def test_the_single_expert_limit_reads_the_same_k_experts_for_every_token():
    """Zipf's limits: skew 0 is uniform (above); a very large skew sends every token to the same
    top-k experts, so any number of tokens reads exactly k of them (k = 1: a single expert)."""
    for k in (1, 8):
        r = ExpertRouting(128, k, 200.0, gpus=2)
        assert r.touched(1) == pytest.approx(k)
        assert r.touched(10_000) == pytest.approx(k)
    assert busiest_share(128, 1, 200.0, 2) == pytest.approx(1.0)


def test_the_busiest_gpu_share_of_two_experts_on_two_gpus_is_the_popular_ones():
    # E = 2, k = 1, G = 2: each GPU holds one expert, the busiest holds the popular one,
    # p1 = 1 / (1 + 2^-s)
    s = 1.3
    assert busiest_share(2, 1, s, 2) == pytest.approx(1 / (1 + 2**-s))


def test_skewed_routing_touches_fewer_experts_and_loads_one_gpu_more():
    flat, skewed = ExpertRouting(128, 8, 0.0, 2), ExpertRouting(128, 8, 1.0, 2)
    assert skewed.touched(16) < flat.touched(16)
    assert 0.5 < skewed.busiest_share < 1
    assert busiest_share(128, 8, 1.0, 2) == skewed.busiest_share  # tabulated, deterministic
    assert busiest_share(128, 8, 1.0, 1) == 1.0


@given(
    tokens=st.integers(0, 5000),
    skew=st.sampled_from([0.0, 0.4, 1.0]),
    gpus=st.sampled_from([1, 2, 4, 8]),
)
def test_touched_experts_grow_with_tokens_and_stay_within_the_gpus_share(tokens, skew, gpus):
    r = ExpertRouting(64, 6, skew, gpus)
    assert 0 <= r.touched_per_gpu(tokens) <= 64 / gpus + 1e-9
    assert r.touched(tokens + 1) >= r.touched(tokens)
    assert r.touched(tokens) <= min(64, 6 * tokens) + 1e-9


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, True, "1"])
def test_a_bad_expert_skew_names_the_field(bad):
    with pytest.raises(ScenarioError, match="latency.expert_skew"):
        trained("qwen3-30b-a3b", expert_skew=bad)


# --- the routed experts a step reads ------------------------------------------------------------


def test_one_decoding_request_reads_its_k_experts_not_all_of_them():
    # qwen3-30b-a3b: 48 MoE layers, 3 matrices of 2048 x 768, bf16: one expert over the layers
    # is 48·3·2048·768·2 = 452,984,832 bytes = 135.22 µs at 3.35 TB/s. One token reads 8 of 128.
    expert_us = 48 * 3 * 2048 * 768 * 2 / H100_BW
    touched, every = trained("qwen3-30b-a3b"), trained("qwen3-30b-a3b", moe_weights="all")
    saved = every.step_time_us(decodes(1)) - touched.step_time_us(decodes(1))
    assert saved == pytest.approx(BETA[2] * expert_us * (128 - 8), abs=1)
    # a large batch touches them all: BLIS's T_weight again
    assert touched.step_time_us(decodes(1024)) == pytest.approx(
        every.step_time_us(decodes(1024)), abs=1
    )


def test_a_dense_model_reads_the_same_weights_either_way():
    for batch in (decodes(1), decodes(64), PREFILL_512):
        assert trained("llama-3.1-8b").step_time_us(batch) == trained(
            "llama-3.1-8b", moe_weights="all"
        ).step_time_us(batch)


def test_decode_windows_match_single_steps_with_touched_experts():
    check_latency_model(trained("qwen3-30b-a3b"))
    check_latency_model(trained("mixtral-8x7b-v0.1", tp=2, expert_skew=0.8))


def test_a_bad_moe_weights_value_names_the_field():
    with pytest.raises(ScenarioError, match="latency.moe_weights"):
        trained("qwen3-30b-a3b", moe_weights="some")


# --- the prefill floor ----------------------------------------------------------------------------


def test_prefill_is_never_faster_than_its_flops_at_the_measured_gemm_rate():
    # llama-3.1-8b, one H100, prefill of 512 tokens: Tpf_compute = 7431.01 µs (the hand
    # computation of test_trained_physics.py). BLIS prices it at β1a = 0.152 of that; the floor
    # at 1.25 times it (vLLM's bf16 GEMMs at 80% of the peak rate, PREFILL_FLOOR).
    floored, blis = trained("llama-3.1-8b"), trained("llama-3.1-8b", prefill_floor=0)
    added = floored.step_time_us(PREFILL_512) - blis.step_time_us(PREFILL_512)
    assert added == pytest.approx((1.25 - BETA[0]) * 7431.01, abs=1)
    # the peak itself
    peak = trained("llama-3.1-8b", prefill_floor=1).step_time_us(PREFILL_512)
    assert peak - blis.step_time_us(PREFILL_512) == pytest.approx((1 - BETA[0]) * 7431.01, abs=1)
    # half the peak rate at most: twice the time
    slower = trained("llama-3.1-8b", prefill_floor=2).step_time_us(PREFILL_512)
    assert slower - blis.step_time_us(PREFILL_512) == pytest.approx((2 - BETA[0]) * 7431.01, abs=1)


def test_the_floor_leaves_decode_steps_and_physical_fits_alone():
    floored, blis = trained("llama-3.1-8b"), trained("llama-3.1-8b", prefill_floor=0)
    assert floored.step_time_us(decodes(64)) == blis.step_time_us(decodes(64))
    slow_prefill = [2.0, *BETA[1:]]  # a β1a above 1 is above the floor
    assert trained("llama-3.1-8b", beta=slow_prefill, prefill_floor=1).step_time_us(
        PREFILL_512
    ) == trained("llama-3.1-8b", beta=slow_prefill).step_time_us(PREFILL_512)


def test_a_scenario_beta_is_taken_as_fitted_unless_the_floor_is_asked_for():
    fitted = trained("llama-3.1-8b", beta=BETA)
    assert fitted.prefill_floor == 0
    assert fitted.step_time_us(PREFILL_512) == trained(
        "llama-3.1-8b", prefill_floor=0
    ).step_time_us(PREFILL_512)
    assert trained("llama-3.1-8b", beta=BETA, prefill_floor=1).prefill_floor == 1
    assert trained("llama-3.1-8b").describe()["prefill_floor"] == 1.25


@pytest.mark.parametrize("bad", [-1, "fast", math.nan])
def test_a_bad_prefill_floor_names_the_field(bad):
    with pytest.raises(ScenarioError, match="latency.prefill_floor"):
        trained("llama-3.1-8b", prefill_floor=bad)


# --- an expert-parallel group --------------------------------------------------------------------


def test_a_lockstepped_group_reads_the_experts_all_its_ranks_tokens_touch():
    from servesim.latency.expert_parallel import ExpertParallelRank
    from servesim.latency.hardware import resolve_gpu
    from servesim.latency.modelindex import resolve_model
    from servesim.latency.parallel import Parallelism

    spec, gpu = resolve_model("qwen3-30b-a3b").spec, resolve_gpu("RTX-PRO-6000")

    def rank(**params) -> ExpertParallelRank:
        model = ExpertParallelRank(spec, gpu, 1, **params)
        model.configure(Parallelism(dp=2, ep=2))
        return model

    touched, every = rank(), rank(moe_weights="all")
    one = decodes(1)
    # two tokens (one per rank) touch 128·(1 − (120/128)²) = 15.5 experts, 7.75 per GPU of the
    # 64 each holds; the group step reads those instead of 64
    expert_us = 48 * 3 * 2048 * 768 * 2 / (gpu.bandwidth_tbs * 1e6)
    saved = every.group_step_us([one, one]) - touched.group_step_us([one, one])
    assert saved == pytest.approx(BETA[2] * expert_us * (64 - 7.75), abs=1)
    # the group's prefill: the other rank's routed prefill tokens are floored at peak as well
    chunk = BatchSummary(2048, ((0, 2048, 2048),), 0, 0)
    blis = rank(prefill_floor=0)
    assert touched.group_step_us([chunk, None]) > blis.group_step_us([chunk, None])
