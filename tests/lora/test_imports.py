"""Adapters named by imported workloads: inference-perf's lora_traffic_split, a trace's columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim import ScenarioError, load_scenario, simulate
from servesim.cli import main
from servesim.simcore.config import load_yaml

DATA = Path(__file__).parent / "data"


def test_lora_traffic_split_converts_to_the_adapter_mix(tmp_path):
    """The golden file was written by the converter and checked by hand: the splits become the
    weights of workload.adapters, and the note says to give engine.lora the same names."""
    out = tmp_path / "lora.yaml"
    assert (
        main(["convert", "inference-perf", "--spec", str(DATA / "lora_split.yaml"), "-o", str(out)])
        == 0
    )
    expected = (DATA / "lora_split.expected.yaml").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == expected


def test_the_converted_mix_runs_and_its_shares_show_in_by_adapter():
    sections = load_yaml((DATA / "lora_split.expected.yaml").read_text(encoding="utf-8"))
    sections["workload"].pop("stages")
    sections["workload"].update(rate=10, requests=400)
    scenario = {
        "model": "llama-3.1-8b",
        "engine": {"lora": {"max_loras": 3, "adapters": ["sql", "chat", "docs"]}},
        **sections,
    }
    s = simulate(load_scenario(scenario)).summary
    shares = {name: row["requests"] / 400 for name, row in s["by_adapter"].items()}
    assert shares == pytest.approx({"sql": 0.5, "chat": 0.3, "docs": 0.2}, abs=0.06)


@pytest.mark.parametrize(
    "split, field",
    [
        ([{"name": "a", "split": 0.5}, {"name": "b", "split": 0.4}], "lora_traffic_split"),
        ([{"name": "a", "weight": 1.0}], "lora_traffic_split[0].weight"),
    ],
)
def test_a_bad_split_is_refused_by_name(split, field):
    from servesim.workloads.inferenceperf import convert_inference_perf

    config = {
        "load": {"stages": [{"rate": 1, "duration": 1}], "lora_traffic_split": split},
        "data": {"type": "random"},
    }
    with pytest.raises(ScenarioError) as err:
        convert_inference_perf(config)
    assert err.value.path.endswith(field)


TRACE = """# servesim-trace v1
arrival_us,input_tokens,output_tokens,model,adapter
0,100,20,llama-3.1-8b,sql
1000,120,20,qwen3-14b,
2000,80,10,llama-3.1-8b,chat
3000,80,10,,
"""


def trace_scenario(tmp_path, text=TRACE) -> dict:
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    return {
        "model": "llama-3.1-8b",
        "latency": {"model": "roofline"},
        "cluster": {
            "groups": [
                {"model": "llama-3.1-8b", "engine": {"lora": {"adapters": ["sql", "chat"]}}},
                {"model": "qwen3-14b"},
            ]
        },
        "workload": {"trace": str(tmp_path / "t.csv")},
    }


def test_a_trace_names_each_request_model_and_adapter(tmp_path):
    results = simulate(load_scenario(trace_scenario(tmp_path)))
    assert results.summary["audit"]["passed"]
    books = results.record.lora
    names = [books["models"][c] for c in books["model_code"]]
    adapters = [books["adapters"][c] for c in books["adapter_code"]]
    # the blank model is the scenario's
    assert names == ["llama-3.1-8b-instruct", "qwen3-14b"] + ["llama-3.1-8b-instruct"] * 2
    assert adapters == ["sql", "", "chat", ""]
    assert np.array_equal(results.requests["instance"], [0, 1, 0, 0])


def test_an_unknown_adapter_in_a_trace_is_refused_at_load(tmp_path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(trace_scenario(tmp_path, TRACE.replace(",chat", ",nope")))
    assert err.value.path == "workload.trace" and err.value.value == "nope"
    assert "sql" in err.value.fix


def test_a_written_workload_trace_replays_the_same_models_and_adapters(tmp_path):
    """output.workload_trace writes the model and adapter columns; replaying the trace on the
    same fleet gives every request the same model, adapter and instance."""
    data = trace_scenario(tmp_path)
    data["output"] = {"workload_trace": True}
    first = simulate(load_scenario(data))
    out = first.write(tmp_path / "run")
    data["workload"] = {"trace": str(out / "workload.csv.gz")}
    data["output"] = {}
    again = simulate(load_scenario(data))
    for key in ("model_code", "adapter_code"):
        assert np.array_equal(first.record.lora[key], again.record.lora[key])
    assert np.array_equal(first.requests["instance"], again.requests["instance"])
