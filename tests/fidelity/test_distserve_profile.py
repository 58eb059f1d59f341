"""The distserve-profile latency model: simdistserve's fitted step times, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from servesim.latency.base import BatchSummary, LatencyContext
from servesim.simcore.errors import ScenarioError
from servesim.testing import check_latency_model

BUNDLED = (
    Path(__file__).resolve().parents[2]
    / "servesim"
    / "latency"
    / "data"
    / "distserve_opt13b_a100.yaml"
)
UPSTREAM = (
    Path(__file__).resolve().parents[3] / "shared/data/measured/distserve_opt13b/profile_data"
)
OPT13B_A100 = LatencyContext("facebook/opt-13b", "A100-80", 1)


@pytest.fixture(scope="module")
def profiled():
    """The module under test (registered as ``distserve-profile`` by ``servesim.latency``)."""
    from servesim.latency import profiled as module

    return module


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(BUNDLED.read_text(encoding="utf-8"))


def build(profiled, context=OPT13B_A100, **params):
    return profiled.DistServeProfileLatencyModel.from_config(params, context)


def coefficients_us(raw: dict, engine: str, tp: int, key: str) -> list[float]:
    assert raw["time_unit"] == "ms"
    return [x * 1000.0 for x in raw["engines"][engine][tp][key]]


def overheads_us(raw: dict) -> tuple[float, float, float]:
    o = raw["overheads"]
    return (
        o["prefill_per_pp_stage"] * 1000.0,
        o["step_base"] * 1000.0,
        o["step_per_context_token"] * 1000.0,
    )


@pytest.mark.parametrize("engine", ["vllm", "distserve"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_prefill_only_step_is_the_fitted_quadratic_plus_overheads(profiled, raw, engine, tp):
    model = build(profiled, engine=engine, tp=tp)
    a, b, c = coefficients_us(raw, engine, tp, "prefill")
    pp_const, base, per_token = overheads_us(raw)
    # two prompts, 300 and 1200 tokens, computed from scratch
    batch = BatchSummary(1500, ((0, 300, 300), (0, 1200, 1200)), 0, 0)
    expected = a + b * 1500 + c * (300**2 + 1200**2) + pp_const + base + per_token * 1500
    assert model.step_time_us(batch) == int(expected)


def test_a_prefill_chunk_is_priced_on_its_new_tokens_as_in_simdistserve(profiled, raw):
    model = build(profiled)
    a, b, c = coefficients_us(raw, "vllm", 1, "prefill")
    pp_const, base, per_token = overheads_us(raw)
    # the second 512-token chunk of a 1024-token prompt: the fit sees 512 tokens, the per-step
    # overhead the request's 1024 known tokens
    batch = BatchSummary(512, ((512, 512, 1024),), 0, 0)
    expected = a + b * 512 + c * 512**2 + pp_const + base + per_token * 1024
    assert model.step_time_us(batch) == int(expected)


@pytest.mark.parametrize("engine", ["vllm", "distserve"])
@pytest.mark.parametrize(
    "n, fit",
    [
        (1, "decode_small_batch"),
        (94, "decode_small_batch"),
        (95, "decode_large_batch"),
        (200, "decode_large_batch"),
    ],
)
def test_a_decode_only_step_uses_the_small_or_large_batch_fit(profiled, raw, engine, n, fit):
    model = build(profiled, engine=engine)
    assert raw["engines"][engine][1]["large_batch_threshold"] == 95
    a, b, c = coefficients_us(raw, engine, 1, fit)
    _, base, per_token = overheads_us(raw)
    context = n * 700
    # simdistserve feeds the fit each request's context + 1 (the token being generated)
    expected = a + b * (context + n) + c * n + base + per_token * context
    assert model.step_time_us(BatchSummary(0, (), n, context)) == int(expected)


def test_a_mixed_step_prices_decodes_as_simdistserve_or_as_a_sum(profiled, raw):
    a, b, c = coefficients_us(raw, "vllm", 1, "prefill")
    da, db, dc = coefficients_us(raw, "vllm", 1, "decode_small_batch")
    pp_const, base, per_token = overheads_us(raw)
    batch = BatchSummary(400, ((0, 400, 400),), 8, 8 * 1000)
    prefill = a + b * 400 + c * 400**2 + pp_const
    overhead = base + per_token * (400 + 8000)
    assert build(profiled).step_time_us(batch) == int(prefill + overhead)
    decode = da + db * (8000 + 8) + dc * 8
    assert build(profiled, mixed="sum").step_time_us(batch) == int(prefill + decode + overhead)


def test_without_overheads_a_step_is_the_bare_fit(profiled, raw):
    model = build(profiled, overheads=False)
    a, b, c = coefficients_us(raw, "vllm", 1, "decode_small_batch")
    assert model.step_time_us(BatchSummary(0, (), 4, 4000)) == int(a + b * 4004 + c * 4)
    a, b, c = coefficients_us(raw, "vllm", 1, "prefill")
    assert model.step_time_us(BatchSummary(100, ((0, 100, 100),), 0, 0)) == int(
        a + b * 100 + c * 100**2
    )


def test_pipeline_stages_divide_the_fit_and_add_the_stage_constant(profiled, raw):
    model = build(profiled, pp=2)
    a, b, c = coefficients_us(raw, "vllm", 1, "prefill")
    pp_const, base, per_token = overheads_us(raw)
    expected = (a + b * 100 + c * 100**2) * 0.5 + pp_const * 2 + base + per_token * 100
    assert model.step_time_us(BatchSummary(100, ((0, 100, 100),), 0, 0)) == int(expected)
    assert model.kv_capacity_tokens is None  # the bundled capacities are for PP=1


def test_an_empty_step_takes_one_microsecond(profiled):
    assert build(profiled).step_time_us(BatchSummary()) == 1


@pytest.mark.parametrize("engine", ["vllm", "distserve"])
@pytest.mark.parametrize("pp", [1, 3])
@pytest.mark.parametrize("overheads", [True, False])
@pytest.mark.parametrize(
    "n, context, k",
    [(1, 17, 50), (8, 8 * 900, 300), (94, 94 * 500, 40), (95, 95 * 500, 40), (256, 256 * 3000, 64)],
)
def test_decode_steps_us_equals_repeated_step_time_us(
    profiled, engine, pp, overheads, n, context, k
):
    model = build(profiled, engine=engine, pp=pp, overheads=overheads)
    got = model.decode_steps_us(n, context, k)
    assert got.dtype == np.int64 and got.shape == (k,)
    expected = [model.step_time_us(BatchSummary(0, (), n, context + i * n)) for i in range(k)]
    assert got.tolist() == expected
    assert model.decode_steps_us(n, context, 0).shape == (0,)
    assert model.decode_steps_us(0, 0, 3).tolist() == [1, 1, 1]


@pytest.mark.parametrize("engine", ["vllm", "distserve"])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("mixed", ["simdistserve", "sum"])
def test_every_bundled_fit_meets_the_latency_model_contract(profiled, engine, tp, mixed):
    check_latency_model(build(profiled, engine=engine, tp=tp, mixed=mixed))


def test_tp_defaults_to_the_scenarios_and_an_unknown_tp_lists_the_available_ones(profiled):
    assert build(profiled, LatencyContext("facebook/opt-13b", "A100-80", 2)).tp == 2
    with pytest.raises(
        ScenarioError, match=r"latency\.tp: .*no vllm fit for tp=8; available tp: 1, 2, 4"
    ):
        build(profiled, tp=8)
    with pytest.raises(ScenarioError, match="available tp: 1, 2, 4"):
        build(profiled, LatencyContext("facebook/opt-13b", "A100-80", 3))


@pytest.mark.parametrize(
    "params, match",
    [
        ({"engine": "sglang"}, r"latency\.engine: .*must be one of: distserve, vllm"),
        ({"mixed": "max"}, r"latency\.mixed: .*simdistserve, sum"),
        ({"pp": 0}, r"latency\.pp"),
        ({"overheads": "yes"}, r"latency\.overheads"),
        ({"profile": "nope"}, r"latency\.profile: .*bundled: distserve_opt13b_a100"),
        ({"profile": "/no/such/profile.yaml"}, r"latency\.profile: .*no such file"),
        ({"tpp": 2}, r"latency\.tpp: .*did you mean 'tp'"),
    ],
)
def test_bad_parameters_name_the_field_and_the_fix(profiled, params, match):
    with pytest.raises(ScenarioError, match=match):
        build(profiled, **params)


def test_the_scenarios_model_and_gpu_must_match_the_profile_unless_not_strict(profiled):
    with pytest.raises(ScenarioError, match="fitted for facebook/opt-13b"):
        build(profiled, LatencyContext("qwen3-14b", "A100-80", 1))
    with pytest.raises(ScenarioError, match="measured on A100-80"):
        build(profiled, LatencyContext("opt-13b", "H100", 1))
    assert build(profiled, LatencyContext("OPT-13B", "A100-SXM", 1)).tp == 1  # names fold
    assert build(profiled, LatencyContext("qwen3-14b", "H100", 1), strict=False).engine == "vllm"


def test_a_model_spec_is_checked_by_architecture(profiled):
    from servesim.latency.modelindex import resolve_model

    # Qwen3-14B shares OPT-13B's layers, width and heads, not its KV heads or vocabulary
    spec = resolve_model("qwen3-14b").spec
    with pytest.raises(ScenarioError, match="num_kv_heads=8, vocab_size=151936"):
        build(profiled, LatencyContext("facebook/opt-13b", "A100-80", 1, model_spec=spec))


def test_a_local_opt_13b_config_passes_the_architecture_check(profiled, tmp_path):
    from servesim.latency.modelindex import resolve_model

    config = {
        "model_type": "opt",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "ffn_dim": 20480,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "torch_dtype": "float16",
    }
    file = tmp_path / "config.json"
    file.write_text(json.dumps(config), encoding="utf-8")
    info = resolve_model(str(file))
    context = LatencyContext(info.hf_id or info.name, "A100-80", 1, model_spec=info.spec)
    assert build(profiled, context).tp == 1


def test_a_profile_file_with_an_error_names_the_file_and_key(profiled, tmp_path, raw):
    broken = dict(raw)
    broken["engines"] = {"vllm": {1: {**raw["engines"]["vllm"][1], "prefill": [1.0, 2.0]}}}
    file = tmp_path / "profile.yaml"
    file.write_text(yaml.safe_dump(broken), encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"profile\.yaml: engines\.vllm\.1\.prefill"):
        build(profiled, profile=str(file))


def test_a_profile_file_in_microseconds_is_used_as_given(profiled, tmp_path):
    profile = {
        "model": "facebook/opt-13b",
        "gpu": "A100-80",
        "time_unit": "us",
        "engines": {
            "vllm": {
                1: {
                    "prefill": [100.0, 2.0, 0.0],
                    "decode_small_batch": [50.0, 0.5, 1.0],
                    "decode_large_batch": [40.0, 0.5, 2.0],
                    "large_batch_threshold": 4,
                }
            }
        },
    }
    file = tmp_path / "us.yaml"
    file.write_text(yaml.safe_dump(profile), encoding="utf-8")
    model = build(profiled, profile=str(file))
    assert model.step_time_us(BatchSummary(10, ((0, 10, 10),), 0, 0)) == 120  # no overheads given
    assert model.step_time_us(BatchSummary(0, (), 2, 20)) == int(50 + 0.5 * 22 + 2)
    assert model.step_time_us(BatchSummary(0, (), 4, 40)) == int(40 + 0.5 * 44 + 8)


def test_describe_names_the_fit_and_its_provenance(profiled):
    info = build(profiled, engine="distserve", tp=2).describe()
    json.dumps(info)
    assert info["model"] == "distserve-profile"
    assert info["profile"] == "servesim/latency/data/distserve_opt13b_a100.yaml"
    assert (info["engine"], info["tp"], info["pp"]) == ("distserve", 2, 1)
    assert info["kv_capacity_tokens"] == 163008
    assert info["source"]["coefficients_commit"].startswith("4c68ed9")


def test_the_plugin_is_registered_under_its_kebab_case_name(profiled):
    from servesim.simcore.registry import get

    assert get("latency", "distserve-profile") is profiled.DistServeProfileLatencyModel


def test_the_bundled_profile_header_carries_the_attribution():
    header = BUNDLED.read_text(encoding="utf-8").split("\nformat:", 1)[0]
    for text in ("NOTICE", "Apache License, Version 2.0", "github.com/LLMServe/DistServe",
                 "20a1633ed6f2be5f456d84d1c283865c3e5112d5", "profiler-a100-80g.vllm.json",
                 "profiler-a100-80g.distserve.json", "max_num_tokens.csv"):  # fmt: skip
        assert text in header


def test_the_bundled_coefficients_equal_the_upstream_json(raw):
    if not UPSTREAM.is_dir():
        pytest.skip(f"{UPSTREAM} is not on this machine")
    for engine in ("vllm", "distserve"):
        upstream = json.loads((UPSTREAM / f"profiler-a100-80g.{engine}.json").read_text())
        fits = upstream["facebook/opt-13b"]
        assert sorted(int(tp) for tp in fits) == sorted(raw["engines"][engine])
        for tp, fit in fits.items():
            ours = raw["engines"][engine][int(tp)]
            assert ours["prefill"] == fit["prefill"]
            assert ours["decode_small_batch"] == fit["decoding_smallbs"]
            assert ours["decode_large_batch"] == fit["decoding_largebs"]
            assert ours["large_batch_threshold"] == fit["decoding_large_small_bs_threshold"]
    rows = (UPSTREAM / "max_num_tokens.csv").read_text().splitlines()[1:]
    capacity = {
        int(tp): int(tokens)
        for model, tp, pp, tokens in (row.split(",") for row in rows)
        if model == "facebook/opt-13b" and pp == "1"
    }
    assert {tp: capacity[tp] for tp in raw["max_num_tokens"]} == raw["max_num_tokens"]
