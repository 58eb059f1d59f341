"""Any HuggingFace model: a config.json path, a model directory, or an id in the local HF cache;
and the config fields servesim does not model, each named in a warning."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from servesim.cli import main
from servesim.latency.hfconfig import (
    MODELLED_ARCHITECTURES,
    WARNED_KINDS,
    find_in_hf_cache,
    hf_hub_cache,
    unmodelled_fields,
)
from servesim.latency.modelindex import bundled_models, resolve_model
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger


def tiny_config(**overrides):
    config = {
        "model_type": "llama",
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


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty HF home in tmp_path (HF_HUB_CACHE unset, so $HF_HOME/hub is the cache)."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


def cache_snapshot(hf_home: Path, repo: str, revision: str, config: dict, mtime: float) -> Path:
    """A snapshot as huggingface_hub lays it out: models--org--name/snapshots/<rev>/config.json."""
    folder = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    file = folder / "snapshots" / revision / "config.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(config))
    os.utime(file, (mtime, mtime))
    return folder


# ------------------------------------------------------------------ locating a config


def test_a_config_json_path_and_a_model_directory_are_models(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    by_file = resolve_model(str(folder / "config.json"))
    by_dir = resolve_model(str(folder))
    assert by_file.spec == by_dir.spec and by_dir.name == "my-model"
    assert by_file.origin == by_dir.origin == "file"


def test_a_directory_without_config_json_is_a_scenario_error(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        resolve_model(str(tmp_path), "model")


def test_hf_cache_location_follows_huggingface_hub(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    assert hf_hub_cache() == Path("~/.cache/huggingface/hub").expanduser()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hf_hub_cache() == tmp_path / "legacy"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    assert hf_hub_cache() == tmp_path / "hub-cache"


def test_an_hf_id_in_the_cache_resolves_to_the_snapshot_refs_main_names(hf_home):
    old = cache_snapshot(hf_home, "Acme/Tiny-7B", "aaa111", tiny_config(hidden_size=64), 1_000)
    cache_snapshot(hf_home, "Acme/Tiny-7B", "bbb222", tiny_config(hidden_size=128), 2_000)
    (old / "refs").mkdir()
    (old / "refs" / "main").write_text("aaa111")  # main points at the older snapshot
    info = resolve_model("Acme/Tiny-7B")
    assert info.spec is not None and info.spec.hidden_size == 64
    assert info.name == "Acme/Tiny-7B" and info.hf_repo == "Acme/Tiny-7B"
    assert info.hf_id == "acme/tiny-7b"
    assert info.origin == "HF cache (refs/main)"
    assert info.config_path.endswith("snapshots/aaa111/config.json")
    assert resolve_model("acme/tiny-7b").spec == info.spec  # case-insensitive id


def test_without_refs_main_the_newest_snapshot_is_used(hf_home):
    cache_snapshot(hf_home, "Acme/Tiny-7B", "bbb222", tiny_config(hidden_size=128), 2_000)
    cache_snapshot(hf_home, "Acme/Tiny-7B", "aaa111", tiny_config(hidden_size=64), 1_000)
    info = resolve_model("Acme/Tiny-7B")
    assert info.spec.hidden_size == 128 and info.origin == "HF cache (newest snapshot)"


def test_a_revision_or_branch_picks_the_snapshot(hf_home):
    folder = cache_snapshot(hf_home, "Acme/Tiny-7B", "aaa111", tiny_config(hidden_size=64), 1_000)
    cache_snapshot(hf_home, "Acme/Tiny-7B", "bbb222", tiny_config(hidden_size=128), 2_000)
    (folder / "refs").mkdir()
    (folder / "refs" / "dev").write_text("aaa111\n")
    assert resolve_model("Acme/Tiny-7B@aaa111").spec.hidden_size == 64
    assert resolve_model("Acme/Tiny-7B@dev").origin == "HF cache (refs/dev)"
    with pytest.raises(ScenarioError, match="cached revisions: aaa111, bbb222"):
        resolve_model("Acme/Tiny-7B@ccc333", "model")


def test_a_bundled_name_wins_over_the_cache(hf_home):
    cache_snapshot(hf_home, "Qwen/Qwen3-14B", "aaa111", tiny_config(), 1_000)
    info = resolve_model("Qwen/Qwen3-14B")
    assert info.name == "qwen3-14b" and info.origin == "bundled"
    assert info.spec.num_layers == 40


def test_a_bundled_model_without_config_takes_it_from_the_cache(hf_home):
    cache_snapshot(hf_home, "microsoft/phi-4", "aaa111", tiny_config(), 1_000)
    info = resolve_model("phi-4")
    assert info.name == "phi-4" and info.hf_id == "microsoft/phi-4"  # blackbox key kept
    assert info.spec is not None and info.origin == "HF cache (newest snapshot)"


def test_a_bundled_model_known_by_its_lowercase_id_only_finds_the_cache_folder(hf_home):
    cache_snapshot(hf_home, "openai/gpt-oss-20b", "aaa111", tiny_config(), 1_000)
    info = resolve_model("gpt-oss-20b")
    assert info.hf_id == "openai/gpt-oss-20b" and info.spec is not None


def test_check_prints_the_cache_origin_and_the_warnings(hf_home, capsys):
    config = tiny_config(num_nextn_predict_layers=1)
    cache_snapshot(hf_home, "Acme/Tiny-7B", "aaa111", config, 1_000)
    args = ["check", "--model", "Acme/Tiny-7B", "--latency-model", "roofline"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "snapshots/aaa111/config.json; HF cache (newest snapshot))" in out
    assert "  warning: config field num_nextn_predict_layers not modelled: " in out


def test_a_cache_folder_without_a_config_is_not_a_model(hf_home):
    (hf_home / "hub" / "models--Acme--Empty" / "snapshots" / "aaa111").mkdir(parents=True)
    assert find_in_hf_cache("Acme/Empty") is None


def test_an_unknown_id_says_where_the_hf_cache_was_searched(hf_home):
    with pytest.raises(ScenarioError) as err:
        resolve_model("Acme/Missing-1B", "model")
    message = str(err.value)
    assert err.value.path == "model"
    assert str(hf_home / "hub" / "models--Acme--Missing-1B" / "snapshots") in message
    assert "huggingface-cli download Acme/Missing-1B config.json" in message
    assert "model: path/to/config.json" in message


def test_a_scenario_names_a_cached_model(hf_home):
    cache_snapshot(hf_home, "Acme/Tiny-7B", "aaa111", tiny_config(), 1_000)
    scenario = load_scenario(None, ["model=Acme/Tiny-7B", "latency.model=roofline"])
    assert scenario.model.spec.hidden_size == 64


# ------------------------------------------------------------------ unmodelled fields


def kinds(config) -> list[str]:
    return [item.kind for item in unmodelled_fields(config)]


def test_a_plain_modelled_config_has_no_warnings():
    assert unmodelled_fields(tiny_config(rope_scaling={"rope_type": "yarn", "factor": 4.0})) == ()
    assert unmodelled_fields(tiny_config(attention_bias=True, mlp_bias=False)) == ()


def test_every_bundled_architecture_is_in_the_modelled_list():
    for name in bundled_models():
        assert "architecture" not in [u.kind for u in resolve_model(name).unmodelled], name
    assert {"llama", "qwen3", "qwen3_moe", "deepseek_v2", "mixtral"} <= MODELLED_ARCHITECTURES


def test_an_unknown_architecture_is_warned():
    (item,) = unmodelled_fields(tiny_config(model_type="rwkv"))
    assert item.kind == "architecture" and item.fields == ("model_type",)
    assert "'rwkv'" in item.effect


def test_the_text_config_model_type_is_the_one_checked():
    config = {"model_type": "llama4", "text_config": tiny_config(model_type="llama4_text")}
    assert kinds(config) == []


def test_a_vision_or_audio_encoder_is_warned():
    (item,) = unmodelled_fields(tiny_config(vision_config={"hidden_size": 1408}))
    assert item.kind == "encoder" and item.fields == ("vision_config",)
    assert kinds(tiny_config(audio_config={"d_model": 8})) == ["encoder"]
    assert kinds(tiny_config(is_encoder_decoder=True, encoder_layers=12)) == ["encoder"]


def test_multi_token_prediction_layers_are_warned():
    (item,) = unmodelled_fields(tiny_config(num_nextn_predict_layers=1))
    assert item.kind == "multi-token-prediction"
    assert item.fields == ("num_nextn_predict_layers",)
    assert kinds(tiny_config(num_nextn_predict_layers=0)) == []


def test_mamba_and_linear_attention_layers_are_warned():
    assert kinds(tiny_config(hybrid_override_pattern="M-M*-")) == ["hybrid-layers"]
    assert kinds(tiny_config(mamba_d_state=128, attn_layer_period=8)) == ["hybrid-layers"]
    layer_types = ["linear_attention", "full_attention"]
    (item,) = unmodelled_fields(tiny_config(layer_types=layer_types))
    assert item.fields == ("layer_types",)
    assert kinds(tiny_config(layer_types=["sliding_attention", "full_attention"])) == []


def test_sparse_chunked_and_unrecognised_mla_attention_are_warned():
    (item,) = unmodelled_fields(tiny_config(index_topk=2048, index_n_heads=32))
    assert item.kind == "attention-variant"
    assert item.fields == ("index_topk", "index_n_heads")
    assert kinds(tiny_config(attention_chunk_size=8192)) == ["attention-variant"]
    assert kinds(tiny_config(use_mla=True)) == ["attention-variant"]
    assert kinds(tiny_config(use_mla=True, kv_lora_rank=512)) == []


def test_moe_layouts_beyond_the_modelled_ones_are_warned():
    assert kinds(tiny_config(decoder_sparse_step=2)) == ["moe-layout"]
    assert kinds(tiny_config(mlp_only_layers=[0, 1])) == ["moe-layout"]
    assert kinds(tiny_config(moe_layer_freq=2)) == ["moe-layout"]
    assert kinds(tiny_config(decoder_sparse_step=1, mlp_only_layers=[], moe_layer_freq=1)) == []


def test_unread_quantization_and_a_quantized_kv_cache_are_warned():
    (item,) = unmodelled_fields(tiny_config(quantization_config={"quant_method": "hqq"}))
    assert item.kind == "quantization"
    assert item.fields == ("quantization_config.quant_method=hqq",)
    assert kinds(tiny_config(quantization_config={"quant_method": "fp8"})) == []
    scheme = {"quant_method": "fp8", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}
    (item,) = unmodelled_fields(tiny_config(quantization_config=scheme))
    assert item.fields == ("quantization_config.kv_cache_scheme",)


def test_the_warned_kinds_are_the_documented_list():
    assert WARNED_KINDS == (
        "architecture",
        "encoder",
        "multi-token-prediction",
        "hybrid-layers",
        "attention-variant",
        "moe-layout",
        "quantization",
    )


def test_bundled_configs_carry_their_unmodelled_fields():
    glm = resolve_model("glm-5.2-fp8")
    assert [u.kind for u in glm.unmodelled] == ["multi-token-prediction", "attention-variant"]
    scout = resolve_model("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    assert [u.kind for u in scout.unmodelled] == ["encoder", "attention-variant"]
    assert resolve_model("qwen3-14b").unmodelled == ()


def test_a_scenario_logs_one_warning_per_unmodelled_class(tmp_path):
    file = tmp_path / "config.json"
    file.write_text(json.dumps(tiny_config(num_nextn_predict_layers=1, vision_config={"a": 1})))
    get_logger("servesim.test")  # configure structlog first, so capture_logs is not overridden
    with capture_logs() as logs:
        load_scenario(None, [f"model={file}", "latency.model=roofline"])
    warnings = [e for e in logs if e.get("log_level") == "warning" and "not modelled" in e["event"]]
    assert [w["kind"] for w in warnings] == ["encoder", "multi-token-prediction"]
    assert warnings[1]["event"] == "model config field num_nextn_predict_layers not modelled"
