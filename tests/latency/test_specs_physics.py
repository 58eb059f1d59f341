"""Model-spec physics: attention layouts, MoE, MLA, quantization, validation, the GPU table."""

from __future__ import annotations

import pytest

from servesim.latency.hardware import bundled_gpus, load_gpu_spec, resolve_gpu
from servesim.latency.hfconfig import MXFP4_BYTES_PER_PARAM
from servesim.latency.kvcapacity import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    weight_params,
    weights_bytes,
)
from servesim.latency.modelindex import resolve_model
from servesim.latency.modelspec import ModelSpec
from servesim.latency.tensor_parallel import check_tensor_parallel
from servesim.simcore.errors import ScenarioError


def config(**overrides):
    c = {
        "num_hidden_layers": 6,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
    }
    c.update(overrides)
    return c


def load(**overrides) -> ModelSpec:
    return ModelSpec.from_hf_config(config(**overrides), name="m")


def spec(name: str) -> ModelSpec:
    s = resolve_model(name).spec
    assert s is not None
    return s


# --- sliding-window and interleaved local/global attention -----------------------------------------


def test_no_window_by_default_and_for_every_bundled_config():
    assert load().sliding_window == 0 and load().num_sliding_layers == 0
    # Qwen configs carry sliding_window with use_sliding_window: false; Mistral-Nemo has null.
    for name in (
        "qwen2.5-7b-instruct",
        "qwen3-14b",
        "mistral-nemo-instruct-2407",
        "mixtral-8x7b-v0.1",
    ):
        assert spec(name).num_sliding_layers == 0, name


def test_mistral_style_window_applies_to_every_layer():
    s = load(sliding_window=4096)
    assert (
        s.sliding_window == 4096 and s.num_sliding_layers == 6 and s.num_full_attention_layers == 0
    )


def test_gemma2_alternates_local_and_global_layers():
    s = load(model_type="gemma2", sliding_window=4096)
    assert s.layer_types == ("sliding_attention", "full_attention") * 3


def test_sliding_window_pattern_makes_every_pth_layer_global():
    s = load(sliding_window=1024, sliding_window_pattern=3)  # Gemma-3 uses 6
    assert s.layer_types == ("sliding_attention", "sliding_attention", "full_attention") * 2
    assert s.num_sliding_layers == 4


def test_qwen_max_window_layers_windows_the_layers_above_it():
    s = load(sliding_window=4096, use_sliding_window=True, max_window_layers=4)
    assert s.layer_types == ("full_attention",) * 4 + ("sliding_attention",) * 2
    off = load(sliding_window=4096, use_sliding_window=False, max_window_layers=4)
    assert off.num_sliding_layers == 0


def test_explicit_layer_types_win():
    types = ["sliding_attention", "full_attention", "sliding_attention"] * 2
    s = load(sliding_window=128, sliding_window_pattern=6, layer_types=types)  # gpt-oss style
    assert s.layer_types == tuple(types) and s.num_sliding_layers == 4
    assert load(layer_types=["full_attention"] * 6).num_sliding_layers == 0


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ({"layer_types": ["full_attention"] * 5}, "'layer_types' has 5 entries"),
        ({"layer_types": ["linear_attention"] * 6, "sliding_window": 64}, "'layer_types[0]'"),
        ({"layer_types": ["sliding_attention"] * 6}, "'sliding_window'"),
        ({"layer_types": "sliding_attention"}, "'layer_types' must be a list"),
        ({"sliding_window": -1}, "'sliding_window'"),
    ],
)
def test_bad_attention_layouts_name_the_config_field(overrides, fragment):
    with pytest.raises(ScenarioError) as err:
        load(**overrides)
    assert fragment in str(err.value) and err.value.path == "model"


def test_sliding_window_caps_kv_bytes_per_sequence():
    s = load(sliding_window=4096, sliding_window_pattern=3)  # 4 local + 2 global layers
    per_token = kv_bytes_per_token(s, 1)  # 6 layers x 2 x 64 x 2 heads x 2 bytes = 3072
    assert per_token == 6 * 2 * 64 * 2 * 2
    assert kv_bytes_per_sequence(s, 1, 1000) == per_token * 1000  # inside the window
    # 100k tokens: 2 global layers hold all of them, 4 local layers hold 4096.
    assert kv_bytes_per_sequence(s, 1, 100_000) == pytest.approx(
        per_token / 6 * (2 * 100_000 + 4 * 4096)
    )
    assert kv_bytes_per_sequence(load(), 1, 100_000) == per_token * 100_000


# --- attention kinds, MoE, MLA, embeddings ----------------------------------------------------


def test_attention_kinds():
    assert load(num_key_value_heads=8).attention_kind == "MHA"
    assert load().attention_kind == "GQA"
    assert load(num_key_value_heads=1).attention_kind == "MQA"
    assert spec("deepseek-v2-lite").attention_kind == "MLA"
    assert spec("llama-3.1-8b").attention_kind == "GQA"
    assert spec("llama-2-7b-hf").attention_kind == "MHA"


def test_moe_experts_per_token_must_not_exceed_experts():
    with pytest.raises(ScenarioError) as err:
        load(num_local_experts=8, num_experts_per_tok=9)
    assert "'num_experts_per_tok'" in str(err.value) and "(9)" in str(err.value)
    with pytest.raises(ScenarioError, match="'num_experts_per_tok' > 0"):
        load(num_experts=8)


def test_moe_shared_experts_and_interleaved_layers():
    s = load(
        n_routed_experts=16, num_experts_per_tok=2, moe_intermediate_size=256, n_shared_experts=2
    )
    assert s.is_moe and s.expert_intermediate_size == 256
    assert s.shared_expert_intermediate_size == 512  # 2 shared x 256
    assert s.moe_layer_split == (6, 0)
    qwen2_moe = load(num_experts=8, num_experts_per_tok=2, shared_expert_intermediate_size=700)
    assert qwen2_moe.shared_expert_intermediate_size == 700
    scout = spec("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    assert scout.moe_layer_split == (24, 24)  # ⌊48/(1+1)⌋, BLIS's reading of the step
    assert scout.dense_layer_intermediate_size == 16384 and scout.expert_intermediate_size == 8192
    assert spec("llama-3.1-8b").moe_layer_split == (0, 32)


def test_mla_kv_is_one_latent_per_layer_replicated_on_every_gpu():
    s = spec("deepseek-v2-lite")
    assert kv_bytes_per_token(s, 1) == kv_bytes_per_token(s, 4) == 27 * (512 + 64) * 2


def test_tied_embeddings_drop_the_lm_head():
    untied, tied = load(), load(tie_word_embeddings=True)
    assert weight_params(untied)["lm_head"] == 1000 * 512 and weight_params(tied)["lm_head"] == 0
    assert weights_bytes(untied) - weights_bytes(tied) == 1000 * 512 * 2


def test_weight_params_sum_to_weights_bytes_for_every_bundled_config():
    from servesim.latency.modelindex import bundled_models

    for name in bundled_models():
        s = resolve_model(name).spec
        if s is None:
            continue
        assert int(
            float(sum(weight_params(s).values())) * s.weight_bytes_per_param
        ) == weights_bytes(s)


# --- quantization ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "qc,expected",
    [
        (None, 2.0),  # bf16
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 1.0),
        ({"quant_method": "fbgemm_fp8"}, 1.0),
        ({"quant_method": "gptq", "bits": 8}, 1.0),  # int8
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, 0.5),  # int4 / w4a16
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}},
            },
            0.5,
        ),
        ({"quant_method": "mxfp4"}, 4.25 / 8),  # 4-bit + E8M0 scale per 32
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 4.5 / 8),  # + E4M3 scale per 16
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, 1.0),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0),
    ],
)
def test_quantization_configs_give_weight_bytes(qc, expected):
    s = load(quantization_config=qc) if qc else load()
    assert s.weight_bytes_per_param == expected
    assert s.bytes_per_param == 2.0  # activations and KV cache stay at the compute dtype
    assert weights_bytes(s) == int(float(sum(weight_params(s).values())) * expected)


def test_mxfp4_carries_its_block_scale_overhead():
    assert MXFP4_BYTES_PER_PARAM == 0.53125  # (4 + 8/32) bits / 8
    gpt_oss_like = load(
        num_local_experts=32,
        num_experts_per_tok=4,
        quantization_config={"quant_method": "mxfp4"},
    )
    assert weights_bytes(gpt_oss_like) > int(sum(weight_params(gpt_oss_like).values()) * 0.5)


# --- validation -------------------------------------------------------------------------------------


def test_missing_hidden_size_names_the_field():
    c = config()
    del c["hidden_size"]
    with pytest.raises(ScenarioError) as err:
        ModelSpec.from_hf_config(c, name="m", path="model")
    assert "'hidden_size'" in str(err.value) and err.value.path == "model"


def test_heads_not_divisible_by_tp_name_the_fields():
    s = spec("qwen3-14b")  # 40 heads, 8 KV heads
    with pytest.raises(ScenarioError) as err:
        check_tensor_parallel(s, 3, "tp")
    assert err.value.path == "tp" and "num_attention_heads" in str(err.value)
    assert "1, 2, 4, 5, 8, 10, 20, 40" in str(err.value)
    check_tensor_parallel(s, 8)
    # 20 does not divide the 8 KV heads and is not a multiple of them.
    with pytest.raises(ScenarioError, match="num_key_value_heads"):
        check_tensor_parallel(s, 20)
    # Fewer KV heads than GPUs: vLLM replicates them (4 KV heads on 8 GPUs) ...
    check_tensor_parallel(spec("qwen2.5-7b-instruct"), 4)
    check_tensor_parallel(load(num_attention_heads=8, num_key_value_heads=2), 8)
    # ... unless the caller needs an even split (the trained-physics basis).
    with pytest.raises(ScenarioError, match="num_key_value_heads"):
        check_tensor_parallel(
            load(num_attention_heads=8, num_key_value_heads=2), 8, kv_heads_divisible=True
        )
    check_tensor_parallel(spec("deepseek-v2-lite"), 16)  # MLA: no per-head KV split
    with pytest.raises(ScenarioError, match="positive"):
        check_tensor_parallel(s, 0)


# --- GPUs -------------------------------------------------------------------------------------------


REQUIRED_GPUS = {
    "H100",
    "H200",
    "A100-40",
    "A100-80",
    "L40S",
    "B200",
    "MI300X",
    "MI355X",
    "RTX-PRO-6000",
    "RTX-4090",
}


def test_hardware_table_covers_the_required_gpus_with_sources():
    assert REQUIRED_GPUS <= set(bundled_gpus())
    for name in bundled_gpus():
        g = resolve_gpu(name)
        assert g.source, name
        assert g.tflops_bf16 > 0 and g.bandwidth_tbs > 0 and g.memory_gib > 0
        assert 0 < g.mfu_decode <= g.mfu_prefill <= 1
        if g.tflops_fp8:  # FP8 runs at (at least) twice the BF16 rate on every GPU that has it
            assert g.tflops_fp8 >= 1.9 * g.tflops_bf16
    # The three BLIS GPUs are BLIS's hardware_config.json, except L40S FP8 (BLIS: 1466, sparse).
    assert (resolve_gpu("H100").tflops_bf16, resolve_gpu("H100").bandwidth_tbs) == (989.5, 3.35)
    assert resolve_gpu("A100-SXM") is resolve_gpu("A100-80")
    assert resolve_gpu("L40S").tflops_fp8 == 733.0
    assert resolve_gpu("A100-40").tflops_fp8 == 0.0  # Ampere: no FP8
    assert resolve_gpu("rtx pro 6000 blackwell").name == "RTX-PRO-6000"
    assert resolve_gpu("RTX 4090").memory_gib == 24.0
    assert resolve_gpu("h200").memory_gib == 141.0


GPU_YAML = """\
name: my-gpu
tflops_bf16: 200
tflops_fp8: 400
bandwidth_tbs: 1.5
memory_gib: 64
mfu_prefill: 0.4
mfu_decode: 0.2
"""


def test_user_gpu_from_a_yaml_file(tmp_path):
    f = tmp_path / "gpu.yaml"
    f.write_text(GPU_YAML)
    g = resolve_gpu(str(f))
    assert (g.name, g.tflops_bf16, g.memory_gib) == ("my-gpu", 200.0, 64.0)
    assert "user file" in g.source
    assert resolve_gpu("gpu.yaml", base_dir=tmp_path) == g
    nameless = tmp_path / "lab-card.yml"
    nameless.write_text(GPU_YAML.replace("name: my-gpu\n", ""))
    assert load_gpu_spec(nameless).name == "lab-card"


def test_user_gpu_file_errors_name_the_field(tmp_path):
    f = tmp_path / "gpu.yaml"
    f.write_text(GPU_YAML.replace("memory_gib: 64\n", ""))
    with pytest.raises(ScenarioError) as err:
        resolve_gpu(str(f), "gpu")
    assert err.value.path == "gpu.memory_gib"
    f.write_text(GPU_YAML.replace("mfu_decode: 0.2", "mfu_decode: 2"))
    with pytest.raises(ScenarioError) as err:
        resolve_gpu(str(f), "gpu")
    assert err.value.path == "gpu.mfu_decode"
    f.write_text(GPU_YAML + "clock_mhz: 1800\n")
    with pytest.raises(ScenarioError) as err:
        resolve_gpu(str(f), "gpu")
    assert "clock_mhz" in str(err.value)
    with pytest.raises(ScenarioError, match="no such file"):
        resolve_gpu(str(tmp_path / "missing.yaml"), "gpu")
    f.write_text("[1, 2]")
    with pytest.raises(ScenarioError, match="mapping"):
        resolve_gpu(str(f), "gpu")
