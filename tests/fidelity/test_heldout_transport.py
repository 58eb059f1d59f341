"""A fit is carried to a held-out run only when its training runs include the run's model and GPU
(`make fidelity`; `servesim calibrate --folds` notes the folds that do not)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import attrs

from servesim.fidelity import read_measured
from servesim.fidelity.fits.runs import not_transported

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
    llama, llama2 = _run("a", "meta-llama/Llama-3.1-8B"), _run("b", "meta-llama/Llama-3.1-8B")
    qwen = _run("c", "Qwen/Qwen3-30B-A3B")
    assert not_transported([llama], [llama2, qwen]) == ""


def test_overheads_fitted_on_another_model_or_gpu_are_not_carried():
    llama, qwen = _run("a", "meta-llama/Llama-3.1-8B"), _run("c", "Qwen/Qwen3-30B-A3B")
    why = not_transported([llama], [qwen])
    assert "no training run of meta-llama/Llama-3.1-8B on RTX-PRO-6000" in why
    assert "fitted on Qwen/Qwen3-30B-A3B on RTX-PRO-6000 only" in why
    other_gpu = _run("d", "meta-llama/Llama-3.1-8B", gpu="H100")
    assert "on RTX-PRO-6000" in not_transported([llama], [other_gpu])


def test_a_run_without_a_carried_fit_is_predicted_as_shipped():
    bench = _bench()
    fits = {"systems": {"s": [{"heldout": ["a"], "train": ["c"], "not_transported": "why"}]}}
    assert bench.heldout_overheads(fits, "s", _run("a", "m")) == "why"
    fits = {"systems": {"s": [{"heldout": ["a"], "train": ["c"], "first_token_us": 5.0,
                               "step_us": 7.0}]}}  # fmt: skip
    assert bench.heldout_overheads(fits, "s", _run("a", "m")) == (5.0, 7.0)


def test_calibrate_notes_a_fold_that_carries_a_fit_across_models():
    from servesim.fidelity.fits import runs as fits_runs

    llama, qwen = _run("a", "meta-llama/Llama-3.1-8B"), _run("c", "Qwen/Qwen3-30B-A3B")

    class Objective:
        evaluations = 1

        def errors(self, coefficients):
            return [{"ttft_ms.mean": 0.1}]

    notes: list[str] = []
    fits_runs._run_folds(
        [llama, qwen], 2, lambda train: ((0.0, 0.0), 0.0, Objective()), lambda held: Objective(),
        1, notes,
    )  # fmt: skip
    assert len(notes) == 2 and all("across models or GPUs" in n for n in notes)
    assert notes[0].startswith("fold 0: no training run of meta-llama/Llama-3.1-8B")
