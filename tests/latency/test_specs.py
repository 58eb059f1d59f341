"""Model/GPU specs, name resolution, KV capacity (spec §3.6) and max-model-len (spec §2.10)."""

from __future__ import annotations

import json
from fractions import Fraction

import attrs
import pytest

from servesim.latency.hardware import HardwareSpec, bundled_gpus, resolve_gpu
from servesim.latency.kvcapacity import (
    activation_peak_bytes,
    auto_kv_blocks,
    auto_max_model_len,
    kv_bytes_per_token,
    kv_capacity,
    minimum_gpus,
    weights_bytes,
)
from servesim.latency.modelindex import bundled_models, resolve_model
from servesim.latency.modelspec import ModelSpec, load_model_spec, weight_bytes_from_model_name
from servesim.simcore.errors import ScenarioError

GIB = 2**30


def spec(name: str) -> ModelSpec:
    info = resolve_model(name)
    assert info.spec is not None
    return info.spec


def minimal_config(**overrides):
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
    }
    config.update(overrides)
    return config


# --- name resolution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["qwen3-14b", "Qwen3-14B", "qwen/qwen3-14b", "Qwen/Qwen3-14B", "  qwen3-14b "]
)
def test_qwen3_14b_resolves_from_short_name_or_hf_id(name):
    info = resolve_model(name)
    assert info.name == "qwen3-14b"
    assert info.hf_id == "qwen/qwen3-14b"
    assert info.hf_repo == "Qwen/Qwen3-14B"
    assert info.spec is not None and info.spec.num_layers == 40


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.1-8b",
        "llama-3.1-8b-instruct",
        "meta-llama/llama-3.1-8b-instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
    ],
)
def test_llama_3_1_8b_resolves_to_the_instruct_model_and_its_config(name):
    info = resolve_model(name)
    assert info.name == "llama-3.1-8b-instruct"
    assert info.hf_id == "meta-llama/llama-3.1-8b-instruct"
    assert info.config_path == "servesim/latency/data/models/llama-3.1-8b-instruct.json"
    assert info.spec is not None and info.spec.vocab_size == 128256


def test_every_bundled_config_loads():
    with_config = [n for n in bundled_models() if resolve_model(n).spec is not None]
    assert len(with_config) == 14
    for name in with_config:
        s = spec(name)
        assert kv_bytes_per_token(s, 1) > 0
        assert weights_bytes(s) > 0


def test_models_with_coefficients_but_no_config_resolve_without_a_spec():
    info = resolve_model("microsoft/phi-4")
    assert info.name == "phi-4" and info.spec is None
    with pytest.raises(ScenarioError, match="model: path/to/config.json"):
        info.require_spec("model", "engine.kv_blocks: auto")


def test_unknown_model_lists_known_names_and_the_config_json_option():
    with pytest.raises(ScenarioError) as err:
        resolve_model("qwen3-15b", "model")
    message = str(err.value)
    assert err.value.path == "model"
    assert "did you mean" in message and "qwen3-14b" in message
    assert "llama-3.1-8b-instruct" in message
    assert "model: path/to/config.json" in message


def test_a_path_to_a_config_json_is_a_model(tmp_path):
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(minimal_config()))
    by_file = resolve_model(str(folder / "config.json"))
    assert by_file.name == "tiny-model" and by_file.hf_id is None
    assert by_file.spec is not None and by_file.spec.num_kv_heads == 2
    assert resolve_model(str(folder)).spec == by_file.spec  # a directory holding config.json
    relative = resolve_model("tiny-model/config.json", base_dir=tmp_path)
    assert relative.spec is not None and relative.spec.hidden_size == 64


def test_missing_or_broken_config_files_are_scenario_errors(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        resolve_model(str(tmp_path / "nope.json"), "model")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ScenarioError, match="JSON"):
        resolve_model(str(bad), "model")
    no_layers = tmp_path / "no_layers.json"
    no_layers.write_text(json.dumps(minimal_config(num_hidden_layers=None)))
    with pytest.raises(ScenarioError, match="num_hidden_layers"):
        load_model_spec(no_layers)
    odd_dtype = tmp_path / "odd_dtype.json"
    odd_dtype.write_text(json.dumps(minimal_config(torch_dtype="float8_e4m3")))
    with pytest.raises(ScenarioError, match="torch_dtype"):
        load_model_spec(odd_dtype)


# --- GPUs ----------------------------------------------------------------------------------------


def test_bundled_gpus_carry_blis_hardware_figures():
    h100 = resolve_gpu("H100")
    assert (h100.tflops_bf16, h100.tflops_fp8, h100.bandwidth_tbs, h100.memory_gib) == (
        989.5,
        1979.0,
        3.35,
        80.0,
    )
    assert (h100.mfu_prefill, h100.mfu_decode) == (0.45, 0.30)
    l40s = resolve_gpu("l40s")
    # BLIS's figures except FP8: BLIS lists 1466, the 2:4-sparsity figure; dense is 733
    assert (l40s.tflops_bf16, l40s.tflops_fp8, l40s.bandwidth_tbs, l40s.memory_gib) == (
        362.05,
        733.0,
        0.864,
        48.0,
    )
    assert resolve_gpu("a100-sxm") is resolve_gpu("A100-80")
    assert resolve_gpu("A100-80").tflops_fp8 == 0.0
    assert {"H100", "A100-80", "L40S"} <= set(bundled_gpus())
    assert all(resolve_gpu(g).source for g in bundled_gpus())


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ScenarioError) as err:
        resolve_gpu("TPU-v5e", "cluster.gpu")
    assert err.value.path == "cluster.gpu"
    assert "H100" in str(err.value) and "A100-80 (alias A100-SXM)" in str(err.value)


def test_user_defined_gpu_is_validated_field_by_field():
    values = dict(
        tflops_bf16=100,
        tflops_fp8=0,
        bandwidth_tbs=1,
        memory_gib=24,
        mfu_prefill=0.4,
        mfu_decode=0.2,
    )
    assert HardwareSpec.from_mapping("mygpu", values, "gpu").memory_gib == 24.0
    with pytest.raises(ScenarioError) as err:
        HardwareSpec.from_mapping("mygpu", {**values, "memory_gib": -1}, "gpu")
    assert err.value.path == "gpu.memory_gib"


# --- ModelSpec reading ---------------------------------------------------------------------------


def test_dense_config_qwen3_14b():
    s = spec("qwen3-14b")
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads) == (40, 5120, 40, 8)
    assert (s.head_dim, s.vocab_size, s.intermediate_size) == (128, 151936, 17408)
    assert s.bytes_per_param == 2.0 and s.weight_bytes_per_param == 2.0
    assert not s.is_moe and not s.is_mla and not s.tie_word_embeddings


def test_moe_config_qwen3_30b_a3b_uses_num_experts_and_explicit_head_dim():
    s = spec("qwen3-30b-a3b")
    assert s.is_moe and s.num_experts == 128 and s.num_experts_per_tok == 8
    assert s.moe_intermediate_size == 768
    assert s.head_dim == 128  # explicit, not 2048 / 32 = 64
    assert kv_bytes_per_token(s, 1) == 48 * 2 * 128 * 4 * 2


def test_moe_config_mixtral_uses_num_local_experts_and_intermediate_size_per_expert():
    s = spec("mixtral-8x7b-v0.1")
    assert s.is_moe and s.num_experts == 8 and s.num_experts_per_tok == 2
    assert s.moe_intermediate_size == 0  # Mixtral convention: intermediate_size is per expert
    # Hand count: d=4096, V=32000, L=32, kv_dim=8*128=1024
    #   attention 4096*(4096+2*1024) + 4096^2            = 41,943,040
    #   MoE MLP   3*4096*14336*8 experts + 8*4096 router  = 1,409,318,912
    #   norms     2*4096                                  = 8,192
    #   32 layers * 1,451,270,144 + embeddings 2*32000*4096 + final norm 4096 = 46,702,792,704 params
    assert weights_bytes(s) == 46_702_792_704 * 2


def test_mla_config_deepseek_v2_lite():
    s = spec("deepseek-v2-lite")
    assert s.is_mla and s.kv_lora_rank == 512 and s.qk_rope_head_dim == 64
    assert s.is_moe and s.num_experts == 64 and s.first_k_dense_replace == 1
    assert s.shared_expert_intermediate_size == 2 * 1408  # n_shared_experts x moe_intermediate_size
    # One latent of 512 + 64 values per layer, bf16, replicated on every TP rank.
    for tp in (1, 2, 4):
        assert kv_bytes_per_token(s, tp) == 27 * (512 + 64) * 2
    # Hand count: d=2048, V=102400, L=27 (1 dense + 26 MoE), kv_dim=16*128
    #   attention+norms 2048*(2048+4096) + 2048^2 + 2*2048 = 16,781,312 per layer
    #   dense MLP       3*2048*10944                       = 67,239,936
    #   MoE MLP         3*2048*1408*64 + 64*2048 + 3*2048*2816 = 571,080,704
    params = 2 * 102400 * 2048 + 27 * 16_781_312 + 67_239_936 + 26 * 571_080_704 + 2048
    assert weights_bytes(s) == params * 2


def test_multimodal_config_merges_text_config_and_reads_compressed_tensors_bits():
    s = spec("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    assert s.model_type == "llama4_text"
    assert (s.num_layers, s.hidden_size, s.num_experts) == (48, 5120, 16)
    assert s.dense_intermediate_size == 16384 and s.interleave_moe_layer_step == 1
    assert s.quant_method == "compressed-tensors" and s.weight_bytes_per_param == 1.0
    assert s.bytes_per_param == 2.0  # the KV cache stays at the compute dtype


def test_fp8_quant_method_and_dtype_field():
    s = spec("glm-5.2-fp8")
    # fp8 weights (quant_method); compute dtype from "dtype", as this config has no "torch_dtype".
    assert s.weight_bytes_per_param == 1.0 and s.bytes_per_param == 2.0
    assert s.head_dim == 192 and s.is_mla and s.first_k_dense_replace == 3


def test_kv_head_fallbacks_and_quantization_rules():
    base = minimal_config()
    del base["num_key_value_heads"]
    assert ModelSpec.from_hf_config(base, name="m").num_kv_heads == 4  # MHA default
    assert ModelSpec.from_hf_config({**base, "num_kv_heads": 1}, name="m").num_kv_heads == 1
    assert (
        ModelSpec.from_hf_config({**base, "multi_query_group_num": 2}, name="m").num_kv_heads == 2
    )
    gptq = {**base, "quantization_config": {"quant_method": "gptq", "bits": 4}}
    assert ModelSpec.from_hf_config(gptq, name="m").weight_bytes_per_param == 0.5
    by_name = ModelSpec.from_hf_config(base, name="m", model_id="org/model-quantized.w4a16")
    assert by_name.weight_bytes_per_param == 0.5
    assert weight_bytes_from_model_name("RedHatAI/phi-4-FP8-dynamic") == 1.0
    assert weight_bytes_from_model_name("qwen3-14b") == 0.0


def test_single_expert_configs_are_dense():
    s = ModelSpec.from_hf_config(minimal_config(num_local_experts=1), name="m")
    assert not s.is_moe and s.num_experts == 0


# --- KV capacity ---------------------------------------------------------------------------------


def test_kv_bytes_per_token_divides_by_tp_and_checks_divisibility():
    s = spec("llama-3.1-8b")
    assert kv_bytes_per_token(s, 1) == 32 * 2 * 128 * 8 * 2 == 131072
    assert kv_bytes_per_token(s, 4) == 131072 / 4
    with pytest.raises(ScenarioError, match="does not divide"):
        kv_bytes_per_token(s, 3)
    # Fewer KV heads than GPUs: accepted (vLLM replicates heads); BLIS's optimistic division.
    assert kv_bytes_per_token(spec("qwen2.5-7b-instruct"), 8) == 28 * 2 * 128 * 4 * 2 / 8


def test_auto_kv_blocks_qwen3_14b_h100_tp1_matches_hand_computation():
    # Numbers from qwen3-14b's config.json (L=40, d=5120, H=40, Hkv=8, head_dim=128, V=151936,
    # dff=17408, bfloat16, untied), put through vLLM's profile-run accounting by hand:
    #   per token  = 40 * 2 * 128 * 8 * 2 bytes         = 163,840;  per 16-token block = 2,621,440
    #   per layer  = 5120*(5120+2*1024) + 5120^2 (attn) + 3*5120*17408 (MLP) + 2*5120 (norms)
    #              = 62,914,560 + 267,386,880 + 10,240 = 330,311,680
    #   params     = 151936*5120 (embed) + 40*330,311,680 + 151936*5120 (lm_head) + 5120
    #              = 14,768,296,960  -> weights = 29,536,593,920 bytes (27.508 GiB)
    #   activation = the sampler's 256 rows x 151936 x (2 + 8) bytes + 2048 x 5120 x 2 (hidden)
    #              = 409,927,680 (the forward pass's 255,852,544 is smaller)
    #   KV bytes   = 72 GiB - weights - activation - 0.15 GiB (non-torch) = 47,201,828,454
    #   blocks     = floor(47,201,828,454 / 2,621,440) = 18,006
    weights = 29_536_593_920
    s = spec("qwen3-14b")
    assert weights_bytes(s) == weights
    assert activation_peak_bytes(s, 1, 2048, 256)["forward"] == 255_852_544
    assert activation_peak_bytes(s, 1, 2048, 256)["peak"] == 409_927_680
    kv_bytes = int(72 * GIB - weights - 409_927_680 - Fraction("0.15") * GIB)
    assert kv_bytes == 47_201_828_454
    assert kv_bytes // 2_621_440 == 18_006
    assert auto_kv_blocks(s, resolve_gpu("H100"), tp=1, block_size=16) == 18_006


def test_auto_kv_blocks_llama_3_1_8b_h100_tp1_matches_hand_computation():
    # llama-3.1-8b-instruct config.json: L=32, d=4096, H=32, Hkv=8, head_dim=128, V=128256,
    # dff=14336, bfloat16, untied.
    #   per token  = 32 * 2 * 128 * 8 * 2 = 131,072 bytes; per 16-token block = 2,097,152
    #   per layer  = 4096*(4096+2*1024) + 4096^2 + 3*4096*14336 + 2*4096
    #              = 41,943,040 + 176,160,768 + 8,192 = 218,112,000
    #   params     = 2 * 128256*4096 + 32*218,112,000 + 4096 = 8,030,261,248
    #   weights    = 16,060,522,496 bytes (14.958 GiB)
    #   forward    = residual 2*2048*4096*2 + mlp 3*2048*14336*2 = 33,554,432 + 176,160,768
    #   sampler    = 256 * 128256 * 10 + 2048*4096*2 = 345,112,576 (the peak)
    #   KV bytes   = 72 GiB - weights - 345,112,576 - 0.15 GiB = 60,742,714,982
    #   blocks     = floor(60,742,714,982 / 2,097,152) = 28,964
    weights = 16_060_522_496
    s = spec("llama-3.1-8b")
    assert weights_bytes(s) == weights
    act = activation_peak_bytes(s, 1, 2048, 256)
    assert act["forward"] == 33_554_432 + 176_160_768
    assert act["peak"] == act["sampler"] == 345_112_576
    kv_bytes = int(72 * GIB - weights - 345_112_576 - Fraction("0.15") * GIB)
    assert kv_bytes == 60_742_714_982
    assert kv_bytes // 2_097_152 == 28_964
    assert auto_kv_blocks(s, resolve_gpu("H100"), tp=1, block_size=16) == 28_964


def test_the_activation_peak_grows_with_the_token_budget_and_shrinks_with_tp():
    s = spec("llama-3.1-8b")
    small, large = (activation_peak_bytes(s, 1, t, 256)["forward"] for t in (2048, 16384))
    assert large == 8 * small  # every forward term is linear in the tokens
    # At 16k tokens the forward pass, not the sampler, sets the peak ...
    assert activation_peak_bytes(s, 1, 16384, 256)["peak"] == large
    h100 = resolve_gpu("H100")
    assert auto_kv_blocks(s, h100, 1, 16, max_num_batched_tokens=16384) < auto_kv_blocks(
        s, h100, 1, 16
    )
    # ... and TP splits the MLP and the heads, not the residual stream.
    tp2 = activation_peak_bytes(s, 2, 16384, 256)
    assert tp2["mlp"] * 2 == activation_peak_bytes(s, 1, 16384, 256)["mlp"]
    assert tp2["residual"] == activation_peak_bytes(s, 1, 16384, 256)["residual"]
    # The sampler's rows are min(max_num_seqs, tokens).
    assert activation_peak_bytes(s, 1, 64, 256)["sampled_rows"] == 64


def test_auto_kv_blocks_scales_with_utilisation_block_size_and_tp():
    s, h100 = spec("llama-3.1-8b"), resolve_gpu("H100")
    base = auto_kv_blocks(s, h100, 1, 16)
    assert auto_kv_blocks(s, h100, 1, 32) == base // 2
    assert auto_kv_blocks(s, h100, 1, 16, gpu_memory_utilization=0.5) < base
    # tp=2: each GPU has 72 GiB, holds half the weights, its activation peak and 0.6 GiB of
    # non-torch memory; its blocks are half as many bytes, so about twice tp=1's pool.
    tp2 = auto_kv_blocks(s, h100, 2, 16)
    peak = activation_peak_bytes(s, 2, 2048, 256)["peak"]
    assert tp2 == int(72 * GIB - 16_060_522_496 / 2 - peak - 0.6 * GIB) // 1_048_576
    assert 2 * base < tp2 < 2.5 * base


def test_a_24_gib_card_holds_what_vllm_allocates_there():
    # Llama-3.1-8B on one 24 GiB card at 0.9: 21.6 GiB - 14.96 weights - 0.32 activations -
    # 0.15 non-torch = 6.17 GiB = 50k tokens. (The old flat 5.5 GiB reserve left 0.98 GiB, 8k
    # tokens: a fifth of it.)
    blocks = auto_kv_blocks(spec("llama-3.1-8b"), resolve_gpu("RTX-4090"), 1, 16)
    assert 40_000 < blocks * 16 < 60_000


def test_cuda_graph_memory_is_taken_only_when_attributed():
    s, h100 = spec("llama-3.1-8b"), resolve_gpu("H100")
    base = kv_capacity(s, h100, 1, 16)
    assert base.cuda_graph_gib == 0
    graphs = kv_capacity(s, h100, 1, 16, cuda_graph_gib=1.0)
    assert graphs.kv_gib == pytest.approx(base.kv_gib - 1.0)
    assert auto_kv_blocks(s, h100, 1, 16, cuda_graph_gib=1.0) == graphs.blocks < base.blocks


def test_moe_activation_counts_the_fused_moe_intermediates_and_scales_with_dp():
    s, h100 = spec("qwen3-30b-a3b"), resolve_gpu("H100")
    act = activation_peak_bytes(s, 1, 2048, 256)
    # 2048 tokens x 8 experts x (3 x 768 + 2048) x 2 bytes + the router's fp32 logits
    assert act["mlp"] == 2048 * 8 * (3 * 768 + 2048) * 2 + 2048 * 128 * 4
    weights_gib = weights_bytes(s) / GIB
    per_block = int(kv_bytes_per_token(s, 1) * 16)
    expected = int((72.0 - weights_gib - act["peak"] / GIB - 0.15) * GIB) // per_block
    assert auto_kv_blocks(s, h100, 1, 16) == expected
    assert auto_kv_blocks(s, h100, 1, 16, dp=2) == 2 * expected
    dense = spec("qwen3-14b")
    assert auto_kv_blocks(dense, h100, 1, 16, dp=2) == auto_kv_blocks(dense, h100, 1, 16)


def test_infeasible_model_names_the_minimum_gpu_count():
    # llama-3.1-70b: ~131.4 GiB of bf16 weights on 48 GiB L40S cards (43.2 GiB usable each,
    # less the activation peak and 0.6 GiB non-torch per GPU when tp > 1): 4 GPUs are needed.
    with pytest.raises(ScenarioError) as err:
        auto_kv_blocks(spec("llama-3.1-70b"), resolve_gpu("L40S"), tp=1, block_size=16)
    message = str(err.value)
    assert err.value.path == "engine.kv_blocks"
    assert "Minimum GPUs per instance: 4" in message
    assert "does not fit on 1 x L40S" in message
    assert auto_kv_blocks(spec("llama-3.1-70b"), resolve_gpu("L40S"), tp=4, block_size=16) > 0


def test_minimum_gpu_hint_names_a_tp_that_divides_the_heads():
    # glm-5.2-fp8 (~697 GiB of fp8 weights) needs 10 H100s, but tp must divide its 64 heads.
    with pytest.raises(ScenarioError, match=r"Minimum GPUs per instance: 10.*so tp=16"):
        auto_kv_blocks(spec("glm-5.2-fp8"), resolve_gpu("H100"), tp=8, block_size=16)


def test_the_infeasibility_hint_counts_with_minimum_gpus_and_its_reserves():
    # The hint asks minimum_gpus with the same profiling knobs: a CUDA-graph reserve of 10 GiB
    # per GPU moves both to the same larger count (4 -> 5 L40S, computed by minimum_gpus).
    model, l40s = spec("llama-3.1-70b"), resolve_gpu("L40S")
    for graphs in (0.0, 10.0):
        smallest, _ = minimum_gpus(model, l40s, cuda_graph_gib=graphs)
        with pytest.raises(ScenarioError, match=f"Minimum GPUs per instance: {smallest};"):
            auto_kv_blocks(model, l40s, tp=1, block_size=16, cuda_graph_gib=graphs)
    assert minimum_gpus(model, l40s, cuda_graph_gib=10.0)[0] > minimum_gpus(model, l40s)[0]


def test_a_model_too_large_for_the_gpu_count_limit_says_so():
    assert minimum_gpus(spec("llama-3.1-70b"), resolve_gpu("L40S"), limit=2) == (None, None)
    tiny = attrs.evolve(resolve_gpu("L40S"), name="tiny", memory_gib=0.5)
    with pytest.raises(ScenarioError, match="cannot fit on this GPU at any tp"):
        auto_kv_blocks(spec("llama-3.1-70b"), tiny, tp=1, block_size=16)


def test_non_gated_activation_and_bad_arguments_are_rejected():
    gelu = ModelSpec.from_hf_config(minimal_config(hidden_act="gelu"), name="m")
    h100 = resolve_gpu("H100")
    with pytest.raises(ScenarioError, match="SwiGLU"):
        auto_kv_blocks(gelu, h100, 1, 16)
    ok = ModelSpec.from_hf_config(minimal_config(), name="m")
    for kwargs in (
        {"block_size": 0},
        {"gpu_memory_utilization": 1.5},
        {"dp": 0},
        {"max_num_batched_tokens": 0},
        {"max_num_seqs": 0},
        {"cuda_graph_gib": -1.0},
    ):
        args = {"tp": 1, "block_size": 16, **kwargs}
        with pytest.raises(ScenarioError):
            auto_kv_blocks(ok, h100, **args)


def test_moe_hint_without_expert_count_is_rejected():
    s = ModelSpec.from_hf_config(minimal_config(num_experts_per_tok=2), name="m")
    with pytest.raises(ScenarioError, match="expert count"):
        weights_bytes(s)


# --- max model length (§2.10) ---------------------------------------------------------------------


def test_auto_max_model_len_of_bundled_configs():
    assert auto_max_model_len(spec("qwen3-14b")) == 40960
    assert auto_max_model_len(spec("llama-3.1-8b")) == 131072  # no rope_scaling field
    assert auto_max_model_len(spec("llama-3.1-70b")) == 131072  # llama3 type: already scaled
    assert auto_max_model_len(spec("deepseek-v2-lite")) == 4096 * 40  # yarn: original x factor
    assert auto_max_model_len(spec("llama-4-scout-17b-16e-instruct-fp8-dynamic")) == 10485760


def test_auto_max_model_len_rope_rules():
    linear = minimal_config(rope_scaling={"type": "linear", "factor": 2.0})
    assert auto_max_model_len(ModelSpec.from_hf_config(linear, name="m")) == 8192
    dynamic = minimal_config(rope_scaling={"rope_type": "dynamic", "factor": 4})
    assert auto_max_model_len(ModelSpec.from_hf_config(dynamic, name="m")) == 16384
    for kind in ("su", "longrope", "llama3"):
        cfg = minimal_config(rope_scaling={"type": kind, "factor": 8.0})
        assert auto_max_model_len(ModelSpec.from_hf_config(cfg, name="m")) == 4096
    shrink = minimal_config(rope_scaling={"type": "linear", "factor": 0.5})
    assert auto_max_model_len(ModelSpec.from_hf_config(shrink, name="m")) == 4096
    gemma = minimal_config(model_type="gemma3_text", rope_scaling={"type": "linear", "factor": 8.0})
    assert auto_max_model_len(ModelSpec.from_hf_config(gemma, name="m")) == 4096
    missing = minimal_config(max_position_embeddings=None)
    assert auto_max_model_len(ModelSpec.from_hf_config(missing, name="m")) is None


def test_auto_max_model_len_is_capped_by_the_kv_cache():
    s = spec("qwen3-14b")
    assert auto_max_model_len(s, kv_blocks=100, block_size=16) == 1600
    assert auto_max_model_len(s, kv_blocks=2560, block_size=16) == 40960  # exactly fits
