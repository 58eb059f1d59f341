"""`servesim list models`: which latency models each model can use and where coefficients exist."""

from __future__ import annotations

import json

from servesim.cli import main
from servesim.latency.catalog import model_catalog
from servesim.latency.modelindex import bundled_models


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def section_rows(out: str, title: str) -> dict[str, str]:
    """Table rows (model name → line) of the section whose heading starts with ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("model "))
    rows = {}
    for line in lines[header + 1 :]:
        if not line:
            break
        rows[line.split()[0]] = line
    return rows


def test_models_with_and_without_a_bundled_architecture_are_listed_apart(capsys):
    out = run(capsys, "list", "models")
    with_config = section_rows(out, "Models with an architecture config")
    without = section_rows(out, "Blackbox coefficient ids without a bundled architecture")
    assert "qwen3-14b" in with_config and "opt-13b" in with_config
    assert "phi-4" in without and "gpt-oss-20b" in without
    assert set(with_config) & set(without) == set()
    assert set(with_config) | set(without) == set(bundled_models())
    assert "path/to/config.json" in out and "HF cache" in out


def test_each_row_names_its_tp_sizes_and_blackbox_coefficients(capsys):
    out = run(capsys, "list", "models")
    rows = section_rows(out, "Models with an architecture config")
    # Qwen2.5-7B: 28 heads, 4 KV heads -> tp 1, 2, 4; blackbox fits on A100-80 and H100
    assert rows["qwen2.5-7b-instruct"].split()[1:4] == ["1,2,4", "A100-80", "1,2,4;"]
    # Llama-3.1-8B: 8 KV heads; roofline replicates them at tp 16, trained-physics does not
    assert "1,2,4,8,16 (trained-physics 1,2,4,8)" in rows["llama-3.1-8b-instruct"]
    assert "distserve-profile: A100-80 tp 1,2,4" in rows["opt-13b"]
    assert "not modelled: multi-token-prediction, attention-variant" in rows["glm-5.2-fp8"]
    blackbox_only = section_rows(out, "Blackbox coefficient ids")
    assert blackbox_only["phi-4"].split()[1:] == [
        "microsoft/phi-4",
        "A100-80",
        "1,2;",
        "H100",
        "1,2",
    ]


def test_list_models_json_is_the_catalogue(capsys):
    data = json.loads(run(capsys, "list", "models", "--json"))
    by_name = {m["name"]: m for m in data["models"]}
    assert set(by_name) == set(bundled_models())
    qwen = by_name["qwen3-14b"]["latency_models"]
    assert qwen["blackbox"] == {"H100": [1]}
    assert qwen["trained-physics"] == {"gpus": "any", "tp": [1, 2, 4, 8]}
    phi = by_name["phi-4"]
    assert phi["config"] is None and phi["latency_models"]["roofline"] is None
    assert by_name["opt-13b"]["latency_models"]["distserve-profile"] == {
        "distserve_opt13b_a100": {"gpu": "A100-80", "tp": [1, 2, 4]}
    }


def test_the_catalogue_covers_every_bundled_model_once():
    assert [e.name for e in model_catalog()] == bundled_models()


def test_a_config_in_the_hf_cache_moves_a_blackbox_only_model_to_the_first_group(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    config = {
        "model_type": "phi3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    }
    for repo, body in (("microsoft/phi-4", config), ("openai/gpt-oss-20b", {"torch_dtype": 1})):
        snapshot = tmp_path / ("models--" + repo.replace("/", "--")) / "snapshots" / "abc"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(body))
    out = run(capsys, "list", "models")
    phi = section_rows(out, "Models with an architecture config")["phi-4"]
    assert "1,2,4 " in phi and "A100-80 1,2; H100 1,2" in phi and "config from the HF cache" in phi
    gpt = section_rows(out, "Blackbox coefficient ids")["gpt-oss-20b"]
    assert "HF-cache config unusable" in gpt
