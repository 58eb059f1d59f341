"""The trained-physics latency model (spec §3.3): hand computations, DP/EP, INV-BC-DP1, contract."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.latency.base import BatchSummary, LatencyContext
from servesim.latency.hardware import resolve_gpu
from servesim.latency.modelindex import resolve_model
from servesim.latency.modelspec import ModelSpec
from servesim.latency.trained import TrainedPhysicsLatencyModel, default_coefficients
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import registry
from servesim.testing import check_latency_model

# Spec §3.3, from BLIS defaults.yaml trained_physics_coefficients.
ALPHA = [15563.199579, 777.3455, 45.907545]
BETA = [
    0.152128,  # β1a prefill compute
    0.0,  # β2a decode compute
    1.36252915,  # β3 weights
    0.752037,  # β4 TP all-reduce
    32.09546717,  # β5 per layer (µs)
    4.41684444,  # β6 per request (µs)
    126.024825,  # β7 per step (µs)
    481.8613888,  # β8 per MoE layer, interleaved only (µs)
    0.0,  # β9 prefill KV
    1.94710771,  # β10 decode KV
    0.752037,  # β11 MoE dispatch (βEP)
]
H100_F = 989.5e6  # FLOP/µs (bf16)
H100_F_FP8 = 1979.0e6
H100_BW = 3.35e6  # bytes/µs


BLIS_TERMS = {"prefill_floor": 0, "moe_weights": "all"}
"""The two departures the hand computations below leave out (BLIS's own terms); the departures
are tested in test_prefill_floor_and_experts.py."""


def trained(name: str, gpu: str = "H100", tp: int = 1, **params) -> TrainedPhysicsLatencyModel:
    """The model as BLIS's formula prices it (``BLIS_TERMS``) unless ``params`` say otherwise."""
    return TrainedPhysicsLatencyModel.from_config(
        {**BLIS_TERMS, **params}, LatencyContext(name, gpu, tp)
    )


def spec(name: str) -> ModelSpec:
    s = resolve_model(name).spec
    assert s is not None
    return s


def prefill(tokens: int, context: int = 0) -> tuple[int, int, int]:
    return (context, tokens, context + tokens)


def batch(prefills=(), decodes: int = 0, context_each: int = 0) -> BatchSummary:
    return BatchSummary(
        sum(p[1] for p in prefills), tuple(prefills), decodes, decodes * context_each
    )


# --- coefficients ----------------------------------------------------------------------------------


def test_default_coefficients_are_blis_trained_physics_coefficients():
    alpha, beta, source = default_coefficients()
    assert list(alpha) == ALPHA and list(beta) == BETA
    assert source["commit"] == "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"
    m = trained("llama-3.1-8b")
    assert m.queueing_time_us(1) == m.queueing_time_us(30000) == 15563  # α0, constant
    assert m.post_decode_overhead_us == 777  # α1
    assert m.output_token_time_us == 45  # α2
    assert m.describe()["provenance"]["source"] == "bundled"


# --- dense: llama-3.1-8b on one H100 ------------------------------------------------------------


# llama-3.1-8b: d=4096, L=32, H=32, Hkv=8, dh=d//H=128, dkv=1024, dff=14336, wbpp=bpp=2.
D, L, H, HKV, DH, DKV, DFF = 4096, 32, 32, 8, 128, 1024, 14336
# T_weight = [L·d(2d+2dkv) + L·3d·dff]·wbpp / BW = 13,958,643,712 bytes / 3.35e6 = 4166.76 µs
T_WEIGHT_8B = (L * D * (2 * D + 2 * DKV) * 2 + L * 3 * D * DFF * 2) / H100_BW


def test_dense_prefill_of_512_tokens_matches_the_hand_computation():
    # One request, whole prompt s = 512, t = 512 new tokens, TP = DP = 1.
    T, s = 512, 512
    proj = L * 2 * T * D * (2 * D + 2 * DKV)  # 1,374,389,534,720 FLOPs
    attention = L * 4 * H * T * (s + T / 2) * DH  # L·A_pf = 206,158,430,208
    ffn = L * T * 6 * D * DFF  # 5,772,436,045,824
    tpf_compute = (proj + attention + ffn) / H100_F  # 7431.01 µs
    tpf_kv = L * 2 * DKV * T * 2 / H100_BW  # 20.03 µs (β9 = 0 ignores it)
    assert round(tpf_compute, 2) == 7431.01 and round(T_WEIGHT_8B, 2) == 4166.76
    step = (
        BETA[0] * tpf_compute
        + BETA[8] * tpf_kv  # 9+ betas: split prefill term
        + BETA[2] * T_WEIGHT_8B  # 5677.35
        + BETA[4] * L  # 1027.05
        + BETA[5] * 1  # one request
        + BETA[6]
    )
    assert int(step) == 7965
    assert trained("llama-3.1-8b").step_time_us(batch([prefill(512)])) == 7965


def test_dense_decode_batch_matches_the_hand_computation():
    # 64 decode requests, 1000 tokens of context each: Σctx = 64,000.
    n, S = 64, 64_000
    compute = L * 2 * n * D * (2 * D + 2 * DKV) + L * 4 * H * S * DH + L * n * 6 * D * DFF
    tdc_compute = compute / H100_F  # 936.74 µs, weighted by β2a = 0
    tdc_kv = L * 2 * DKV * 2 * (S + n) / H100_BW  # 2506.57 µs
    step = BETA[1] * tdc_compute + BETA[9] * tdc_kv + BETA[2] * T_WEIGHT_8B + BETA[4] * L
    step += BETA[5] * n + BETA[6]
    assert int(step) == 11_993
    assert trained("llama-3.1-8b").step_time_us(batch(decodes=64, context_each=1000)) == 11_993


def test_prefill_attention_uses_the_whole_prompt_not_the_cached_context():
    # A_pf = Σ 4·(H/TP)·t·(s + t/2)·dh with s = input length: a 256-token chunk at the end of a
    # 4096-token prompt costs s = 4096 whatever its position (BLIS's basis).
    m = trained("llama-3.1-8b")
    late = BatchSummary(256, ((3840, 256, 4096),), 0, 0)
    early = BatchSummary(256, ((0, 256, 4096),), 0, 0)
    assert m.step_time_us(late) == m.step_time_us(early)


def test_tensor_parallelism_adds_the_all_reduce_term():
    # TP=2, dense: T_tp = V(L,T) + V(nDense=L,T) with V(u,T) = u·T·d·bpp·2·(TP−1)/TP / BW.
    T = 512
    V = L * T * D * 2 * 2 * (1 / 2) / H100_BW  # 20.03 µs per unit group
    tp = 2
    proj = L * 2 * T * D * (2 * D + 2 * DKV) / tp
    attention = L * 4 * (H / tp) * T * (512 + T / 2) * DH
    ffn = L * T * 6 * D * DFF / tp
    t_weight = T_WEIGHT_8B / tp
    step = BETA[0] * (proj + attention + ffn) / H100_F + BETA[2] * t_weight + BETA[3] * (V + V)
    step += BETA[4] * L + BETA[5] * 1 + BETA[6]
    assert trained("llama-3.1-8b", tp=2).step_time_us(batch([prefill(512)])) == int(step)


# --- INV-BC-DP1 --------------------------------------------------------------------------------


def pre_dp_step(s: ModelSpec, gpu: str, tp: int, b: BatchSummary) -> int:
    """The trained-physics step time before DP/EP (#1419), dense models: T_tp = V(2L, T).

    An independent transcription of spec §3.3 at DP = 1 for a dense model, used as the oracle.
    """
    hw = resolve_gpu(gpu)
    F, BW = hw.tflops_bf16 * 1e6, hw.bandwidth_tbs * 1e6
    d, Lf, dh = float(s.hidden_size), float(s.num_layers), float(s.hidden_size // s.num_heads)
    dkv = s.num_kv_heads * dh
    dff = float(s.dense_intermediate_size or s.intermediate_size)
    hpg = s.num_heads / tp
    Tpf = float(sum(t for _, t, _ in b.prefill_items))
    Tdc, S = b.decode_requests, float(b.decode_context)
    A = sum(4 * hpg * t * (p + t / 2) * dh for _, t, p in b.prefill_items)
    pf_c = (Lf * 2 * Tpf * d * (2 * d + 2 * dkv) / tp + Lf * A + Lf * Tpf * 6 * d * dff / tp) / F
    pf_kv = Lf * 2 * (dkv / tp) * Tpf * 2 / BW
    dc_c = (
        Lf * 2 * Tdc * d * (2 * d + 2 * dkv) / tp
        + Lf * 4 * hpg * S * dh
        + Lf * Tdc * 6 * d * dff / tp
    ) / F
    dc_kv = Lf * 2 * (dkv / tp) * 2 * (S + Tdc) / BW
    w = (Lf * d * (2 * d + 2 * dkv) * 2 / tp + Lf * 3 * d * dff * 2 / tp) / BW
    T = Tpf + Tdc
    t_tp = (2 * Lf) * T * d * 2 * 2.0 * ((tp - 1) / tp) / BW if tp > 1 else 0.0
    step = (
        (BETA[0] * pf_c + BETA[8] * pf_kv)
        + (BETA[1] * dc_c + BETA[9] * dc_kv)
        + BETA[2] * w
        + BETA[3] * t_tp
        + BETA[4] * Lf
        + BETA[5] * (len(b.prefill_items) + Tdc)
        + BETA[6]
    )
    return max(1, int(step))


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b", "qwen3-14b", "llama-3.1-70b", "codellama-34b-instruct"]
)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_inv_bc_dp1_dense_dp1_equals_the_pre_dp_formula(name, tp):
    # BLIS's decode KV basis (decode_attention: kv); on an H100 the interconnect basis is BLIS's.
    m = trained(name, tp=tp, decode_attention="kv")
    batches = [
        batch([prefill(512)]),
        batch([prefill(2048, 4096), prefill(100)], decodes=37, context_each=1234),
        batch(decodes=256, context_each=3000),
        batch(decodes=1, context_each=1),
        batch([prefill(8192)]),
    ]
    for b in batches:
        assert m.step_time_us(b) == pre_dp_step(spec(name), "H100", tp, b), (name, tp, b)


# --- MoE ---------------------------------------------------------------------------------------


def test_moe_qwen3_30b_a3b_tp2_matches_the_hand_computation():
    # qwen3-30b-a3b: d=2048, L=48 (all MoE), H=32, Hkv=4, explicit head_dim 128 (servesim
    # departure: BLIS uses 2048//32 = 64), so Q/O width dq = H·dh = 4096 ≠ d, dkv=512, E=128, k=8,
    # dffMoE=768, no shared experts. BLIS's decode KV basis (decode_attention: kv).
    # TP=2, DP=1 -> G = 2, tpdp = 2. Batch: one 256-token prefill (s=256) + 8 decodes, Σctx=4000.
    d, L_, H_, dh, dq, dkv, E, k, dffm, tp = 2048, 48, 32, 128, 4096, 512, 128, 8, 768, 2
    Tpf, Tdc, S = 256, 8, 4000
    proj = lambda T: L_ * 2 * T * d * (2 * dq + 2 * dkv) / tp  # noqa: E731
    moe = lambda T: L_ * (T * k / tp) * 6 * d * dffm  # noqa: E731  (routed tokens / G)
    A_pf = 4 * (H_ / tp) * Tpf * (256 + Tpf / 2) * dh
    tpf_c = (proj(Tpf) + L_ * A_pf + moe(Tpf)) / H100_F
    tpf_kv = L_ * 2 * (dkv / tp) * Tpf * 2 / H100_BW
    tdc_c = (proj(Tdc) + L_ * 4 * (H_ / tp) * S * dh + moe(Tdc)) / H100_F
    tdc_kv = L_ * 2 * (dkv / tp) * 2 * (S + Tdc) / H100_BW
    # Weights: attention /TP, routed experts E/G per GPU (3 matrices each).
    t_weight = (L_ * d * (2 * dq + 2 * dkv) * 2 / tp + L_ * (E / tp) * 3 * d * dffm * 2) / H100_BW
    V = lambda u, T: u * T * d * 2 * 2 * ((tp - 1) / tp) / H100_BW  # noqa: E731
    # attention all-reduce + MoE all-reduce (MoE, DP = 1, TP > 1); no dense layers.
    t_tp = V(L_, Tpf + Tdc) + V(0, Tpf + Tdc) + V(L_, Tpf + Tdc)
    step = (
        BETA[0] * tpf_c
        + BETA[8] * tpf_kv
        + BETA[1] * tdc_c
        + BETA[9] * tdc_kv
        + BETA[2] * t_weight
        + BETA[3] * t_tp
        + BETA[4] * L_
        + BETA[5] * 9
        + BETA[6]
    )  # uniform MoE: no β8 term
    b = batch([prefill(256)], decodes=8, context_each=500)
    assert trained("qwen3-30b-a3b", tp=2, decode_attention="kv").step_time_us(b) == int(step)


@pytest.mark.parametrize(
    "backend,top_k", [("allgather_reducescatter", 1), ("deepep_low_latency", 8)]
)
def test_moe_data_parallel_shards_experts_over_tp_dp_and_adds_dispatch(backend, top_k):
    # qwen3-30b-a3b at TP=2, DP=2: G = tpdp = 4. Decode-only batch of 16, Σctx = 16,000.
    # head_dim 128 honoured (dq = 4096, dkv = 512); BLIS's decode KV basis.
    d, L_, H_, dh, dq, dkv, E, k, dffm = 2048, 48, 32, 128, 4096, 512, 128, 8, 768
    tp, dp, G = 2, 2, 4
    n, S = 16, 16_000
    compute = L_ * 2 * n * d * (2 * dq + 2 * dkv) / G + L_ * 4 * (H_ / tp) * S * dh / dp
    compute += L_ * (n * k / G) * 6 * d * dffm
    tdc_kv = L_ * 2 * (dkv / G) * 2 * (S + n) / H100_BW
    t_weight = (L_ * d * (2 * dq + 2 * dkv) * 2 / tp + L_ * (E / G) * 3 * d * dffm * 2) / H100_BW
    V = lambda u, T: u * T * d * 2 * 2 * ((tp - 1) / tp) / H100_BW  # noqa: E731
    t_tp = V(L_, n) / dp + V(0, n) / dp  # no MoE all-reduce at DP > 1 ...
    # ... but a dispatch/combine: all-gather moves hidden states, all-to-all top-k routed tokens.
    t_dispatch = L_ * (n / dp) * top_k * (G - 1) / G * 2 * d * 2 / H100_BW
    step = BETA[1] * compute / H100_F + BETA[9] * tdc_kv + BETA[2] * t_weight + BETA[3] * t_tp
    step += BETA[10] * t_dispatch + BETA[4] * L_ + BETA[5] * n + BETA[6]
    m = trained("qwen3-30b-a3b", tp=2, dp=2, moe_comm_backend=backend, decode_attention="kv")
    assert m.step_time_us(batch(decodes=n, context_each=1000)) == int(step)


def test_mla_moe_deepseek_v2_lite_counts_shared_experts():
    # deepseek-v2-lite: d=2048, L=27 (all MoE: first_k_dense_replace ignored), H=Hkv=16, dh=128,
    # dkv=2048 (the standard KV basis, not the MLA latent), E=64, k=6, dffMoE=1408,
    # dShared = 2 shared experts x 1408 = 2816. One decode request, 4096 tokens of context.
    d, L_, H_, dh, dkv, E, k, dffm, dsh = 2048, 27, 16, 128, 2048, 64, 6, 1408, 2816
    n, S = 1, 4096
    compute = L_ * 2 * n * d * (2 * d + 2 * dkv) + L_ * 4 * H_ * S * dh
    compute += L_ * (n * k / 1) * 6 * d * dffm + L_ * n * 6 * d * dsh
    tdc_kv = L_ * 2 * dkv * 2 * (S + n) / H100_BW
    t_weight = (
        L_ * d * (2 * d + 2 * dkv) * 2 + L_ * E * 3 * d * dffm * 2 + L_ * 3 * d * dsh * 2
    ) / H100_BW
    step = BETA[1] * compute / H100_F + BETA[9] * tdc_kv + BETA[2] * t_weight
    step += BETA[4] * L_ + BETA[5] * n + BETA[6]
    m = trained("deepseek-v2-lite", decode_attention="kv")  # BLIS's decode KV basis
    assert m.step_time_us(batch(decodes=1, context_each=4096)) == int(step)


def test_interleaved_moe_pays_the_per_moe_layer_overhead_and_fp8_peak():
    # Llama-4 Scout: interleave_moe_layer_step=1 -> nMoE = ⌊48/2⌋ = 24, nDense = 24 (BLIS's
    # reading); β8·24 = 11,564.67 µs per step. FP8 weights on H100 -> F = 1979e6 FLOP/µs.
    m = trained("llama-4-scout-17b-16e-instruct-fp8-dynamic", tp=2)
    assert m.peak_tflops == 1979.0
    assert m._moe_overhead == pytest.approx(BETA[7] * 24)
    mixtral = trained("mixtral-8x7b-v0.1", tp=2)  # uniform MoE: no β8 term
    assert mixtral._moe_overhead == 0.0
    assert m.step_time_us(batch(decodes=1, context_each=10)) > BETA[7] * 24


# --- beta vector length ------------------------------------------------------------------------


def test_beta_vector_length_selects_split_terms_and_defaults():
    # The 64-request llama-3.1-8b decode batch: Tdc_compute = 936.74 µs, Tdc_kv = 2506.57 µs.
    b = batch(decodes=64, context_each=1000)
    only_decode = [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    seven = trained("llama-3.1-8b", beta=only_decode)  # β2·max(compute, kv)
    assert seven.step_time_us(b) == 2506
    ten = trained("llama-3.1-8b", beta=only_decode + [0.0, 0.0, 1.0])  # β2a·compute + β2b·kv
    assert ten.step_time_us(b) == int(936.7434356 + 2506.5661516)  # 3443
    # Prefill: 9 betas split it the same way (β1a·compute + β1b·kv).
    pf = batch([prefill(512)])
    nine = trained("llama-3.1-8b", beta=[1.0] + [0.0] * 7 + [1.0])
    eight = trained("llama-3.1-8b", beta=[1.0] + [0.0] * 7)
    assert nine.step_time_us(pf) == int(7431.0096117 + 20.0324967)
    assert eight.step_time_us(pf) == 7431
    # Defaults for short vectors: β8 = 0 (7 betas), βEP = β4 (fewer than 11).
    short = trained("qwen3-30b-a3b", tp=2, dp=2, beta=BETA[:7])
    assert short._b[7] == 0.0 and short._b[10] == BETA[3]
    assert short.describe()["provenance"]["source"] == "bundled + scenario"


# --- sliding window ------------------------------------------------------------------------------


def windowed(pattern: int = 0, window: bool = True) -> TrainedPhysicsLatencyModel:
    config = {
        "num_hidden_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "sliding_window": 4096,
    }
    if pattern:
        config["sliding_window_pattern"] = pattern
    s = ModelSpec.from_hf_config(config, name="swa")
    return TrainedPhysicsLatencyModel(s, resolve_gpu("H100"), 1, sliding_window=window)


def test_sliding_window_caps_decode_attention_and_kv_at_the_window():
    capped, plain = windowed(), windowed(window=False)
    short = batch(decodes=8, context_each=1000)
    assert capped.step_time_us(short) == plain.step_time_us(short)
    long = batch(decodes=8, context_each=60_000)
    assert capped.step_time_us(long) == plain.step_time_us(batch(decodes=8, context_each=4096))
    half = windowed(pattern=2)  # every 2nd layer global
    assert capped.step_time_us(long) < half.step_time_us(long) < plain.step_time_us(long)


def test_sliding_window_caps_prefill_attention_span():
    capped, plain = windowed(), windowed(window=False)
    b = BatchSummary(8192, ((0, 8192, 32768),), 0, 0)  # s + t/2 = 36,864 > W
    assert capped.step_time_us(b) < plain.step_time_us(b)


# --- validation ------------------------------------------------------------------------------------


def test_validation_errors_name_the_field():
    ctx = LatencyContext("llama-3.1-8b", "H100", 1)
    cases = [
        ({"beta": [1] * 6}, "latency.beta"),
        ({"beta": [1] * 12}, "latency.beta"),
        ({"alpha": [1, 2, -3]}, "latency.alpha[2]"),
        ({"beta": [1, 1, 1, float("nan"), 1, 1, 1]}, "latency.beta[3]"),
        ({"dp": 2}, "latency.dp"),  # dense model
        ({"dp": 0}, "latency.dp"),
        ({"moe_comm_backend": "nccl"}, "latency.moe_comm_backend"),
        ({"sliding_window": "maybe"}, "latency.sliding_window"),
    ]
    for params, path in cases:
        with pytest.raises(ScenarioError) as err:
            TrainedPhysicsLatencyModel.from_config(params, ctx)
        assert err.value.path == path, (params, err.value.path)


def test_tp_must_divide_heads_and_kv_heads():
    with pytest.raises(ScenarioError) as err:
        trained("qwen3-30b-a3b", tp=8)  # 4 KV heads
    assert err.value.path == "tp" and "num_key_value_heads" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        trained("qwen3-14b", tp=3)  # 40 heads
    assert err.value.path == "tp" and "num_attention_heads" in str(err.value)


def test_registered_and_described():
    assert registry("latency").get("trained-physics") is TrainedPhysicsLatencyModel
    d = trained("qwen3-30b-a3b", "B200", 2, dp=2).describe()
    assert (d["model"], d["gpu"], d["tp"], d["dp"]) == ("trained-physics", "B200", 2, 2)
    assert d["moe_comm_backend"] == "allgather_reducescatter"
    assert "§3.3" in d["provenance"]["formula"]
    assert "trained_physics_coefficients" in d["provenance"]["upstream"]


# --- contract and fast-forward --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,gpu,tp,params",
    [
        ("llama-3.1-8b", "H100", 1, {}),
        ("qwen3-30b-a3b", "H100", 2, {"dp": 4, "moe_comm_backend": "pplx"}),
        ("deepseek-v2-lite", "MI355X", 2, {}),
        ("llama-4-scout-17b-16e-instruct-fp8-dynamic", "H200", 4, {}),
        ("llama-3.1-70b", "A100-80", 8, {"beta": BETA[:8]}),
    ],
)
def test_check_latency_model_passes(name, gpu, tp, params):
    check_latency_model(trained(name, gpu, tp, **params))


def test_check_latency_model_passes_with_sliding_windows():
    check_latency_model(windowed())
    check_latency_model(windowed(pattern=4))


@pytest.mark.parametrize(
    "make",
    [
        lambda: trained("llama-3.1-8b", tp=4),
        lambda: trained("qwen3-30b-a3b", tp=2, dp=2),
        lambda: trained("llama-3.1-8b", beta=BETA[:7]),
        lambda: windowed(),
        lambda: windowed(pattern=3),
    ],
)
def test_decode_steps_equal_step_by_step(make):
    m = make()
    rng = np.random.default_rng(11)
    for _ in range(40):
        n = int(rng.integers(1, 300))
        ctx = n * int(rng.integers(1, 8000))
        k = int(rng.integers(0, 300))
        fast = m.decode_steps_us(n, ctx, k)
        slow = [m.step_time_us(BatchSummary(0, (), n, ctx + i * n)) for i in range(k)]
        assert fast.dtype == np.int64 and fast.tolist() == slow
