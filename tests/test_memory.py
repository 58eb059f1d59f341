"""servesim memory: the breakdown of an instance's GPU memory, its KV capacity and the CLI command."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from servesim.latency.hardware import resolve_gpu
from servesim.latency.kvcapacity import auto_kv_blocks
from servesim.latency.modelindex import bundled_models, resolve_model
from servesim.latency.modelspec import ModelSpec
from servesim.memory import add_memory_parser, cmd_memory, format_breakdown, memory_breakdown
from servesim.simcore.errors import ScenarioError

GIB = 2**30
BUNDLED_CONFIGS = [n for n in bundled_models() if resolve_model(n).spec is not None]
# Configs whose MLP is not gated (OPT's ReLU MLP): the memory model refuses to size them.
UNGATED = [n for n in BUNDLED_CONFIGS if resolve_model(n).spec.hidden_act == "relu"]
GATED = [n for n in BUNDLED_CONFIGS if n not in UNGATED]


def profile_formula_blocks(
    s: ModelSpec,
    memory_gib: float,
    tp: int,
    block_size: int = 16,
    tokens: int = 2048,
    seqs: int = 256,
) -> int:
    """vLLM's start-up accounting, transcribed independently of servesim.latency.kvcapacity: per GPU,
    memory x 0.9 - weights/tp - the profile run's activation peak - non-torch memory, in blocks
    of one GPU's share. Weights as spec/blis_reference.md §3.6 counts them, with Q and O
    heads x head_dim wide."""
    d, L, V = s.hidden_size, s.num_layers, s.vocab_size
    head_dim = s.explicit_head_dim or d // s.num_heads
    if s.kv_lora_rank:
        kv_per_token = L * (s.kv_lora_rank + s.qk_rope_head_dim) * s.bytes_per_param
    else:
        kv_per_token = L * 2 * head_dim * s.num_kv_heads * s.bytes_per_param / tp
    per_block = math.trunc(kv_per_token * block_size)
    dff_dense = s.dense_intermediate_size or s.intermediate_size
    dff_expert = s.moe_intermediate_size or s.intermediate_size
    if s.is_moe:
        K = s.first_k_dense_replace
        E = s.num_experts
        mlp = K * 3 * d * dff_dense + (L - K) * (
            3 * d * dff_expert * E + 3 * d * s.shared_expert_intermediate_size + E * d
        )
    else:
        mlp = L * 3 * d * s.intermediate_size
    q = d if s.kv_lora_rank else s.num_heads * head_dim
    params = (
        V * d
        + L * (d * (q + 2 * s.num_kv_heads * head_dim) + q * d + 2 * d)
        + mlp
        + (0 if s.tie_word_embeddings else V * d)
        + d
    )
    weights = params * s.weight_bytes_per_param / tp
    b, T, R = s.bytes_per_param, tokens, min(seqs, tokens)
    attention = T * (2 * s.num_heads / tp + 2 * max(s.num_kv_heads / tp, 1)) * head_dim * b
    ffn = 3 * T * dff_dense * b / tp if (not s.is_moe or s.first_k_dense_replace) else 0
    if s.is_moe:
        routed = T * s.num_experts_per_tok * (3 * dff_expert + d) * b / tp
        shared = 3 * T * s.shared_expert_intermediate_size * b / tp
        ffn = max(ffn, routed + shared + T * s.num_experts * 4)
    forward = 2 * T * d * b + max(attention, ffn)
    sampler = R * V * (b + 8) + T * d * b
    non_torch = 0.15 if tp == 1 else 0.6
    kv = memory_gib * 0.9 * GIB - weights - max(forward, sampler) - non_torch * GIB
    return math.floor(kv / per_block)


def smallest_tp(s: ModelSpec, memory_gib: float) -> int:
    for tp in (1, 2, 4, 8, 16, 32):
        ok_heads = s.num_heads % tp == 0 and (
            s.is_mla or s.num_kv_heads % tp == 0 or tp % s.num_kv_heads == 0
        )
        if ok_heads and profile_formula_blocks(s, memory_gib, tp) > 0:
            return tp
    raise AssertionError(f"{s.name} fits on no tp")


def test_an_ungated_mlp_is_refused_with_the_fix():
    assert UNGATED == ["opt-13b"]
    with pytest.raises(ScenarioError, match="set engine.kv_blocks to an integer"):
        memory_breakdown("opt-13b", "A100-80", 1)


@pytest.mark.parametrize("name", GATED)
@pytest.mark.parametrize("gpu", ["H100", "B200"])
def test_kv_capacity_of_every_shipped_config_matches_the_profile_formula(name, gpu):
    s = resolve_model(name).spec
    hw = resolve_gpu(gpu)
    tp = smallest_tp(s, hw.memory_gib)
    d = memory_breakdown(resolve_model(name), hw, tp)
    expected = profile_formula_blocks(s, hw.memory_gib, tp)
    assert d["feasible"]
    assert abs(d["kv_blocks"] - expected) <= 0.02 * expected, (name, tp, d["kv_blocks"], expected)
    # ... and it is exactly what engine.kv_blocks: auto gives the simulator.
    assert d["kv_blocks"] == auto_kv_blocks(s, hw, tp, 16)
    assert d["kv_tokens"] == d["kv_blocks"] * 16


def test_there_are_14_shipped_configs():
    assert len(BUNDLED_CONFIGS) == 14


def test_llama_3_1_8b_on_one_h100_by_hand():
    # weights 8,030,261,248 params x 2 bytes = 14.96 GiB; the profile run's peak is the sampler's
    # 256 x 128,256 logits (bf16 + fp32 copy + fp32 probabilities) + the pass's hidden states =
    # 345,112,576 bytes; non-torch 0.15 GiB; requested 72 GiB.
    d = memory_breakdown("llama-3.1-8b", "H100", 1)
    assert d["params_total"] == 8_030_261_248
    assert d["weights_total"] == 16_060_522_496
    assert d["activation"]["peak"] == d["activation"]["sampler"] == 345_112_576
    assert d["overhead_gib"] == pytest.approx((16_060_522_496 + 345_112_576) / GIB + 0.15)
    assert d["kv_bytes_per_token"] == 131_072 and d["per_block_bytes"] == 2_097_152
    assert (
        d["kv_blocks"]
        == int(72 * GIB - 16_060_522_496 - 345_112_576 - 0.15 * GIB) // 2_097_152
        == 28_964
    )
    # At the model's 131,072-token max length a sequence needs 8192 blocks: 3 fit at once.
    assert d["context_len"] == 131_072
    assert d["blocks_per_sequence"] == 8192 and d["max_concurrent_sequences"] == 3
    assert (
        memory_breakdown("llama-3.1-8b", "H100", 1, context_len=4000)["max_concurrent_sequences"]
        == 28_964 // 250
    )


def test_each_term_of_vllms_accounting_is_reported_and_they_add_up():
    d = memory_breakdown("llama-3.1-8b", "L40S", 2, max_num_batched_tokens=8192, max_num_seqs=128)
    assert d["max_num_batched_tokens"] == 8192 and d["max_num_seqs"] == 128
    assert d["activation"]["tokens"] == 8192 and d["activation"]["sampled_rows"] == 128
    terms = (
        d["weights_gib_per_gpu"],
        d["activation_peak_gib"],
        d["non_torch_gib"],
        d["cuda_graph_gib"],
        d["kv_cache_gib_per_gpu"],
    )
    assert sum(terms) == pytest.approx(d["requested_gib"])
    assert d["weights_gib_per_gpu"] == pytest.approx(d["weights_gib"] / 2)
    assert d["non_torch_gib"] == 0.6  # grows once GPUs talk to each other (0.15 alone)
    assert memory_breakdown("llama-3.1-8b", "L40S", 1)["non_torch_gib"] == 0.15
    more = memory_breakdown("llama-3.1-8b", "L40S", 2, max_num_batched_tokens=32768)
    assert more["activation_peak_gib"] > d["activation_peak_gib"]
    assert more["kv_blocks"] < d["kv_blocks"]
    graphs = memory_breakdown("llama-3.1-8b", "L40S", 2, max_num_batched_tokens=8192,
                              max_num_seqs=128, cuda_graph_gib=0.5)  # fmt: skip
    assert graphs["kv_cache_gib_per_gpu"] == pytest.approx(d["kv_cache_gib_per_gpu"] - 0.5)


def test_weights_are_sharded_per_gpu_and_experts_over_the_expert_parallel_group():
    d = memory_breakdown("qwen3-30b-a3b", "H100", 4)
    assert d["weights_total_per_gpu"] == d["weights_total"] / 4
    assert d["weights_per_gpu"]["experts"] == d["weights"]["experts"] / 4
    assert d["experts_per_gpu"] == 32  # 128 routed experts over 4 GPUs
    assert d["weights"]["experts"] > 0.9 * d["weights_total"]
    mla = memory_breakdown("deepseek-v2-lite", "H100", 2)
    assert mla["attention"] == "MLA" and mla["weights"]["shared_experts"] > 0
    assert mla["kv_bytes_per_token"] == 27 * (512 + 64) * 2  # replicated, not divided by tp


def test_quantized_widths_shrink_weights():
    fp8 = memory_breakdown("glm-5.2-fp8", "B200", 8)
    assert fp8["weight_bytes_per_param"] == 1.0 and fp8["quantization"].startswith("fp8")
    assert fp8["weights_total"] == fp8["params_total"]
    bf16 = memory_breakdown("llama-3.1-8b", "H100", 1)
    assert bf16["quantization"] == "none" and bf16["weights_total"] == 2 * bf16["params_total"]


def windowed_spec(**overrides) -> ModelSpec:
    config = {
        "num_hidden_layers": 8,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "intermediate_size": 8192,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "sliding_window": 4096,
        "sliding_window_pattern": 4,  # 6 local + 2 global layers
    }
    config.update(overrides)
    return ModelSpec.from_hf_config(config, name="swa")


def test_sliding_window_caps_kv_bytes_per_sequence_and_raises_concurrency():
    swa = memory_breakdown(windowed_spec(), "L40S", 1, context_len=65536)
    full = memory_breakdown(windowed_spec(sliding_window=None), "L40S", 1, context_len=65536)
    assert swa["kv_blocks"] == full["kv_blocks"]  # the block pool does not depend on windows
    # Global layers hold 4096 blocks of the 65,536-token sequence, local ones 256 blocks:
    # (2·4096 + 6·256)/8 = 1216 block-equivalents instead of 4096.
    assert full["blocks_per_sequence"] == 4096
    assert swa["blocks_per_sequence"] == (2 * 4096 + 6 * 256) / 8 == 1216
    assert swa["kv_bytes_per_sequence"] == swa["per_block_bytes"] * 1216
    assert swa["max_concurrent_sequences"] == (swa["kv_blocks"] * 8) // (2 * 4096 + 6 * 256)
    assert swa["max_concurrent_sequences"] > 3 * full["max_concurrent_sequences"]
    short = memory_breakdown(windowed_spec(), "L40S", 1, context_len=2048)
    assert short["blocks_per_sequence"] == 128  # inside the window: no saving


def test_infeasible_config_reports_the_minimum_gpu_count():
    d = memory_breakdown("llama-3.1-70b", "L40S", 2)
    assert not d["feasible"] and d["min_gpus"] == 4 and d["min_tp"] == 4
    assert "kv_blocks" not in d
    glm = memory_breakdown("glm-5.2-fp8", "H100", 8)
    assert (glm["min_gpus"], glm["min_tp"]) == (10, 16)  # tp must divide 64 heads


def test_bad_arguments_are_scenario_errors():
    with pytest.raises(ScenarioError) as err:
        memory_breakdown("qwen3-14b", "H100", 3)
    assert err.value.path == "tp"
    with pytest.raises(ScenarioError):
        memory_breakdown("qwen3-14b", "H100", 1, block_size=0)
    with pytest.raises(ScenarioError):
        memory_breakdown("qwen3-14b", "H100", 1, gpu_memory_utilization=1.2)
    with pytest.raises(ScenarioError, match="no architecture config"):
        memory_breakdown("phi-4", "H100", 1)


def test_format_breakdown_lists_every_part():
    text = format_breakdown(memory_breakdown("deepseek-v2-lite", "H100", 1, context_len=8192))
    for fragment in (
        "deepseek-v2-lite on 1 x H100",
        "MLA",
        "experts",
        "shared_experts",
        "weights",
        "activation peak",
        "dummy pass of 2,048 tokens",
        "sampler over 256 rows",
        "non-torch",
        "cuda graphs",
        "KV cache",
        "max concurrent sequences",
    ):
        assert fragment in text, fragment
    assert "sliding window" in format_breakdown(memory_breakdown(windowed_spec(), "L40S", 1))


# --- the CLI command ---------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="servesim")
    sub = parser.add_subparsers(dest="command")
    add_memory_parser(sub)
    return parser.parse_args(argv)


def test_cmd_memory_prints_the_breakdown(capsys):
    args = parse(
        ["memory", "--model", "llama-3.1-8b", "--gpu", "H100", "--tp", "1", "--context-len", "8192"]
    )
    assert args.handler is cmd_memory
    assert cmd_memory(args) == 0
    out = capsys.readouterr().out
    assert "28,964 blocks" in out and "at context 8,192" in out
    args = parse(["memory", "--model", "llama-3.1-8b", "--max-num-batched-tokens", "16384",
                  "--max-num-seqs", "64", "--cuda-graph-gib", "0.5"])  # fmt: skip
    assert cmd_memory(args) == 0
    out = capsys.readouterr().out
    assert "dummy pass of 16,384 tokens" in out and "sampler over 64 rows" in out
    assert "0.50 GiB  attributed" in out


def test_cmd_memory_json(capsys):
    assert (
        cmd_memory(parse(["memory", "--model", "qwen3-14b", "--json", "--block-size", "32"])) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert d["block_size"] == 32 and d["kv_blocks"] == auto_kv_blocks(
        resolve_model("qwen3-14b").spec, resolve_gpu("H100"), 1, 32
    )


def test_cmd_memory_infeasible_prints_then_raises_one_line_with_the_minimum(capsys):
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "llama-3.1-70b", "--gpu", "L40S", "--tp", "2"]))
    message = str(err.value)
    assert "\n" not in message and "minimum GPU count: 4" in message
    assert err.value.path == "--tp"
    assert "does not fit: needs at least 4 GPUs" in capsys.readouterr().out


def test_cmd_memory_bad_flags_name_the_flag(tmp_path):
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "qwen3-14b", "--tp", "3"]))
    assert err.value.path == "--tp"
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "no-such-model"]))
    assert err.value.path == "--model"
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "phi-4"]))  # coefficients only, no config
    assert err.value.path == "--model" and "config.json" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "qwen3-14b", "--gpu", "TPU"]))
    assert err.value.path == "--gpu"
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "qwen3-14b", "--gpu-memory-utilization", "0"]))
    assert err.value.path == "--gpu-memory-utilization"
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "qwen3-14b", "--max-num-batched-tokens", "0"]))
    assert err.value.path == "--max-num-batched-tokens"
    with pytest.raises(ScenarioError) as err:
        cmd_memory(parse(["memory", "--model", "qwen3-14b", "--cuda-graph-gib", "-1"]))
    assert err.value.path == "--cuda-graph-gib"


def test_cmd_memory_accepts_a_user_gpu_file(tmp_path, capsys):
    f = tmp_path / "card.yaml"
    f.write_text(
        "tflops_bf16: 100\ntflops_fp8: 0\nbandwidth_tbs: 1\nmemory_gib: 32\n"
        "mfu_prefill: 0.4\nmfu_decode: 0.2\n"
    )
    assert cmd_memory(parse(["memory", "--model", "llama-3.1-8b", "--gpu", str(f)])) == 0
    assert "1 x card (32 GiB each)" in capsys.readouterr().out


# --- against vLLM's own block counts -----------------------------------------------------------

# LLMServingSim's later bench records (github.com/casys-kaist/LLMServingSim, bench/examples/
# RTXPRO6000/*/vllm/meta.json, vLLM 0.28.0): kv_cache.num_gpu_blocks (per engine), on RTX PRO 6000
# Blackwell Server Edition GPUs of 101,976,440,832 bytes at gpu_memory_utilization 0.92, with
# max_num_batched_tokens 2048 and max_num_seqs 128. The shared copies (vLLM 0.19.0) lack them.
RTX_PRO_6000_BYTES = 101_976_440_832
QWEN3_32B = ModelSpec(
    name="qwen3-32b",
    num_layers=64,
    hidden_size=5120,
    num_heads=64,
    num_kv_heads=8,
    vocab_size=151936,
    intermediate_size=25600,
    bytes_per_param=2.0,
    hidden_act="silu",
    explicit_head_dim=128,
)


@pytest.mark.parametrize(
    ("model", "tp", "recorded"),
    [("llama-3.1-8b", 1, 35_913), (QWEN3_32B, 2, 28_884)],
    ids=["llama-3.1-8b-tp1", "qwen3-32b-tp2"],
)
def test_the_kv_capacity_is_within_5_percent_of_what_vllm_allocated(model, tp, recorded):
    import attrs

    gpu = attrs.evolve(resolve_gpu("RTX-PRO-6000"), memory_gib=RTX_PRO_6000_BYTES / GIB)
    spec = model if isinstance(model, ModelSpec) else resolve_model(model).spec
    blocks = auto_kv_blocks(spec, gpu, tp, 16, 0.92, max_num_batched_tokens=2048, max_num_seqs=128)
    assert abs(blocks / recorded - 1) < 0.05, (blocks, recorded)  # +2.8% and -0.6% today
