"""The blackbox latency model: BLIS's linear step-time fit (spec §3.4) and its coefficient table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.latency.base import BatchSummary, LatencyContext
from servesim.latency.blackbox import (
    BlackboxLatencyModel,
    CoefficientEntry,
    coefficient_table,
    normalize_vllm_version,
    select_coefficients,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import get
from servesim.testing import check_latency_model

# qwen/qwen3-14b on H100, TP=1 (BLIS defaults.yaml @ 938f8d88, vllm 0.11.0).
QWEN_BETA = (13578.186662538783, 39.44465647189146, 27.3227753326911)
QWEN_ALPHA = (8888.089034078324, 0.18488961143592303, 0.0)


def qwen_h100(tp: int = 1, gpu: str = "H100", model: str = "qwen3-14b") -> BlackboxLatencyModel:
    return BlackboxLatencyModel.from_config({}, LatencyContext(model, gpu, tp))


def prefill_batch(tokens: int, decodes: int = 0, context_each: int = 0) -> BatchSummary:
    items = ((0, tokens, tokens),) if tokens else ()
    return BatchSummary(tokens, items, decodes, decodes * context_each)


def test_blackbox_is_registered_under_its_name():
    assert get("latency", "blackbox") is BlackboxLatencyModel


def test_bundled_lookup_finds_the_exact_qwen3_14b_h100_tp1_fit():
    model = qwen_h100()
    assert model.beta == QWEN_BETA
    assert model.alpha == QWEN_ALPHA
    prov = model.describe()["provenance"]
    assert prov["model"] == "qwen/qwen3-14b"
    assert (prov["gpu"], prov["tp"], prov["vllm_version"]) == ("H100", 1, "0.11.0")


@pytest.mark.parametrize("name", ["qwen3-14b", "Qwen/Qwen3-14B", "qwen/qwen3-14b", "QWEN3-14B"])
def test_model_names_resolve_to_the_same_coefficients(name):
    assert qwen_h100(model=name).beta == QWEN_BETA


def test_gpu_name_is_case_insensitive_and_aliases_map_to_the_table_name():
    assert qwen_h100(gpu="h100").beta == QWEN_BETA
    # A100-SXM is an alias of A100-80, the name the coefficient table uses.
    via_alias = BlackboxLatencyModel.from_config(
        {},
        LatencyContext("llama-3.1-8b", "A100-SXM", 1),
    )
    assert via_alias.describe()["provenance"]["gpu"] == "A100-80"


def test_step_time_matches_hand_computed_values():
    model = qwen_h100()
    b0, b1, b2 = QWEN_BETA
    # Empty batch: trunc(13578.186...) = 13578.
    assert model.step_time_us(BatchSummary()) == 13578
    # 512 prefill tokens + 10 decodes: 13578.1867 + 39.4447*512 + 27.3228*10 = 34047.0785 -> 34047.
    assert model.step_time_us(prefill_batch(512, decodes=10, context_each=300)) == 34047
    assert math.trunc(b0 + b1 * 512 + b2 * 10) == 34047
    # 2048 prefill tokens + 100 decodes: 13578.1867 + 80782.6565 + 2732.2775 = 97093.1207 -> 97093.
    assert model.step_time_us(prefill_batch(2048, decodes=100, context_each=50)) == 97093


def test_step_time_ignores_context_length():
    model = qwen_h100()
    assert model.step_time_us(BatchSummary(0, (), 64, 64)) == model.step_time_us(
        BatchSummary(0, (), 64, 64 * 30000)
    )
    # 13578.1867 + 27.3228*64 = 15326.8443 -> 15326
    assert model.step_time_us(BatchSummary(0, (), 64, 1000)) == 15326


def test_alpha_overheads_match_hand_computed_values():
    model = qwen_h100()
    # trunc(8888.0890 + 0.18489*1000) = trunc(9072.9786) = 9072
    assert model.queueing_time_us(1000) == 9072
    assert model.queueing_time_us(1) == 8888
    assert model.output_token_time_us == 0  # trunc(α2 = 0.0)
    assert model.post_decode_overhead_us == 0
    assert isinstance(model.output_token_time_us, int)


def test_explicit_alpha_and_beta_are_used_as_given():
    model = BlackboxLatencyModel.from_config(
        {"alpha": [100, 0.5, 7.9], "beta": [1000, 2.5, 10]},
        LatencyContext("some-unknown-model", "TPUv9", 3),
    )
    assert model.step_time_us(prefill_batch(100, decodes=4)) == 1000 + 250 + 40
    assert model.queueing_time_us(11) == 105  # trunc(100 + 5.5)
    assert model.output_token_time_us == 7  # trunc(7.9)
    assert model.describe() == {
        "model": "blackbox",
        "alpha": [100.0, 0.5, 7.9],
        "beta": [1000.0, 2.5, 10.0],
        "provenance": {"source": "scenario"},
    }


def test_step_time_is_floored_at_one_microsecond():
    model = BlackboxLatencyModel([0, 0, 0], [0, 0, 0])
    assert model.step_time_us(BatchSummary()) == 1
    assert model.step_time_us(prefill_batch(10, decodes=3)) == 1
    assert model.decode_steps_us(3, 30, 4).tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("n, ctx, k", [(1, 0, 1), (7, 700, 13), (256, 256 * 4000, 50), (5, 5, 0)])
def test_decode_steps_closed_form_equals_step_by_step(n, ctx, k):
    model = qwen_h100()
    got = model.decode_steps_us(n, ctx, k)
    assert got.dtype == np.int64 and got.shape == (k,)
    expected = [model.step_time_us(BatchSummary(0, (), n, ctx + i * n)) for i in range(k)]
    assert got.tolist() == expected


def test_blackbox_passes_the_plugin_contract_checks():
    check_latency_model(qwen_h100())
    check_latency_model(BlackboxLatencyModel([0, 0, 0], [0, 0, 0]))
    check_latency_model(BlackboxLatencyModel([5.5, 1e-3, 3.2], [1, 1e-4, 1e-4]))


# --- parameter validation -------------------------------------------------------------------


def explicit(**params):
    return BlackboxLatencyModel.from_config(
        params,
        LatencyContext("qwen3-14b", "H100", 1),
    )


@pytest.mark.parametrize(
    "params, field",
    [
        ({"alpha": [1, 2, 3], "beta": [1, -2, 3]}, "latency.beta[1]"),
        ({"alpha": [1, 2, 3], "beta": [1, 2, float("nan")]}, "latency.beta[2]"),
        ({"alpha": [1, "x", 3], "beta": [1, 2, 3]}, "latency.alpha[1]"),
        ({"alpha": [1, 2, 3], "beta": [1, True, 3]}, "latency.beta[1]"),
        ({"alpha": [1, 2, 3], "beta": [1, 2]}, "latency.beta"),
        ({"alpha": [1, 2, 3, 4], "beta": [1, 2, 3]}, "latency.alpha"),
        ({"alpha": "1,2,3", "beta": [1, 2, 3]}, "latency.alpha"),
        ({"alpha": [1, 2, 3]}, "latency.beta"),
        ({"beta": [1, 2, 3]}, "latency.alpha"),
        ({"alpha": [1, 2, 3], "beta": [1, 2, 3], "vllm_version": "0.8.4"}, "latency.vllm_version"),
        ({"betas": [1, 2, 3]}, "latency.betas"),
    ],
)
def test_bad_parameters_raise_a_scenario_error_naming_the_field(params, field):
    with pytest.raises(ScenarioError) as err:
        explicit(**params)
    assert err.value.path == field


def test_unknown_key_suggests_the_closest_field():
    with pytest.raises(ScenarioError, match="did you mean 'beta'"):
        explicit(betas=[1, 2, 3])


# --- lookup errors --------------------------------------------------------------------------


def test_unknown_gpu_for_a_known_model_lists_the_available_combinations():
    with pytest.raises(ScenarioError) as err:
        qwen_h100(gpu="L40S")
    message = str(err.value)
    assert err.value.path == "latency"
    assert "qwen/qwen3-14b on L40S with tp=1" in message
    assert "H100 tp=1" in message
    assert "or give latency.alpha and latency.beta" in message


def test_unknown_tp_lists_the_available_combinations():
    with pytest.raises(ScenarioError) as err:
        BlackboxLatencyModel.from_config({}, LatencyContext("llama-3.1-8b", "H100", 8))
    message = str(err.value)
    assert "tp=8" in message
    for combo in ("A100-80 tp=1", "A100-80 tp=4", "H100 tp=1", "H100 tp=2", "H100 tp=4"):
        assert combo in message


def test_model_without_coefficients_names_close_models():
    with pytest.raises(ScenarioError) as err:
        BlackboxLatencyModel.from_config({}, LatencyContext("qwen/qwen3-15b", "H100", 1))
    message = str(err.value)
    assert "no bundled blackbox coefficients for model qwen/qwen3-15b" in message
    assert "qwen/qwen3-14b" in message
    assert "or give latency.alpha and latency.beta" in message


def test_bundled_model_without_coefficients_says_how_to_proceed():
    # deepseek-v2-lite ships an architecture config but no blackbox fit.
    with pytest.raises(ScenarioError, match="or give latency.alpha and latency.beta"):
        BlackboxLatencyModel.from_config(
            {},
            LatencyContext("deepseek-v2-lite", "H100", 1),
        )


# --- table selection rules --------------------------------------------------------------------


def entry(version: str, loss: float | None, index: int, b0: float = 1.0) -> CoefficientEntry:
    return CoefficientEntry(
        "org/m", "H100", 1, version, (0.0, 0.0, 0.0), (b0, 0.0, 0.0), loss, index
    )


def test_newest_vllm_version_wins_and_versions_compare_numerically():
    entries = [entry("0.8.4", 1.0, 0), entry("0.10.1.1", 9.0, 1), entry("0.9.2", 0.5, 2)]
    assert select_coefficients(entries, "org/m", "H100", 1).source_index == 1


def test_vllm_version_parameter_picks_an_older_fit():
    entries = [entry("0.8.4", 1.0, 0), entry("0.11.0", 9.0, 1)]
    assert select_coefficients(entries, "org/m", "h100", 1, "v0.8.4").source_index == 0
    with pytest.raises(ScenarioError) as err:
        select_coefficients(entries, "org/m", "H100", 1, "0.9.0")
    assert err.value.path == "latency.vllm_version"
    assert "0.8.4, 0.11.0" in str(err.value)


def test_same_version_duplicates_prefer_the_lowest_fit_loss_then_file_order():
    entries = [entry("0.8.4", None, 0), entry("0.8.4", 5.0, 1), entry("0.8.4", 5.0, 2)]
    assert select_coefficients(entries, "org/m", "H100", 1).source_index == 1


def test_bundled_duplicate_fits_resolve_to_the_lower_loss_one():
    # redhatai/phi-4-fp8-dynamic on H100 tp=1 has two vllm 0.8.4 fits (losses 198.6 and 501.3).
    model = BlackboxLatencyModel.from_config(
        {},
        LatencyContext("redhatai/phi-4-fp8-dynamic", "H100", 1),
    )
    assert model.describe()["provenance"]["fit_loss"] == pytest.approx(198.5839129752874)


def test_vllm_version_param_selects_bundled_fits():
    model = BlackboxLatencyModel.from_config(
        {"vllm_version": "vllm/vllm-openai:v0.11.0"},
        LatencyContext("qwen3-14b", "H100", 1),
    )
    assert model.beta == QWEN_BETA
    with pytest.raises(ScenarioError, match="available: 0.11.0"):
        BlackboxLatencyModel.from_config(
            {"vllm_version": "0.8.4"},
            LatencyContext("qwen3-14b", "H100", 1),
        )


def test_normalize_vllm_version_accepts_tags():
    assert normalize_vllm_version("vllm/vllm-openai:v0.10.1.1") == "0.10.1.1"
    assert normalize_vllm_version("v0.8.4") == "0.8.4"
    assert normalize_vllm_version("0.11.0") == "0.11.0"


def test_bundled_table_is_well_formed():
    source, entries = coefficient_table()
    assert source["commit"].startswith("938f8d88")
    assert len(entries) == 92  # 111 source rows minus 19 exact duplicates
    for e in entries:
        assert e.model == e.model.lower()
        assert len(e.alpha) == 3 and len(e.beta) == 3
        assert all(math.isfinite(x) and x >= 0 for x in (*e.alpha, *e.beta))
        assert e.tp in (1, 2, 4, 8)
