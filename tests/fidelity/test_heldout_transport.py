"""`make fidelity` carries a fold's overheads only to runs of a model and GPU it was fitted on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import attrs

from servesim.fidelity import read_measured

ROOT = Path(__file__).resolve().parents[2]
RUN = read_measured(Path(__file__).parent / "data" / "llmservingsim_run")


def _bench():
    spec = importlib.util.spec_from_file_location("fidelity_bench", ROOT / "bench" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name: str, model: str, gpu: str = "RTX-PRO-6000"):
    return attrs.evolve(RUN, name=name, model=model, gpu=gpu)


def test_overheads_travel_to_runs_of_a_model_and_gpu_they_were_fitted_on():
    bench = _bench()
    llama, llama2 = _run("a", "meta-llama/Llama-3.1-8B"), _run("b", "meta-llama/Llama-3.1-8B")
    qwen = _run("c", "Qwen/Qwen3-30B-A3B")
    assert bench.not_transported([llama], [llama2, qwen]) == ""


def test_overheads_fitted_on_another_model_or_gpu_are_not_carried():
    bench = _bench()
    llama, qwen = _run("a", "meta-llama/Llama-3.1-8B"), _run("c", "Qwen/Qwen3-30B-A3B")
    why = bench.not_transported([llama], [qwen])
    assert "no training run of meta-llama/Llama-3.1-8B on RTX-PRO-6000" in why
    assert "fitted on Qwen/Qwen3-30B-A3B on RTX-PRO-6000 only" in why
    other_gpu = _run("d", "meta-llama/Llama-3.1-8B", gpu="H100")
    assert "on RTX-PRO-6000" in bench.not_transported([llama], [other_gpu])


def test_a_run_without_a_carried_fit_is_predicted_as_shipped():
    bench = _bench()
    fits = {"systems": {"s": [{"heldout": ["a"], "train": ["c"], "not_transported": "why"}]}}
    assert bench.heldout_overheads(fits, "s", _run("a", "m")) == "why"
    fits = {"systems": {"s": [{"heldout": ["a"], "train": ["c"], "first_token_us": 5.0,
                               "step_us": 7.0}]}}  # fmt: skip
    assert bench.heldout_overheads(fits, "s", _run("a", "m")) == (5.0, 7.0)
