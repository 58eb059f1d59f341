"""The anchored latency model: measured step times transported by the physics model's ratio."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import ScenarioError, load_scenario, simulate
from servesim.latency import resolve_gpu, resolve_model
from servesim.latency.anchored import AnchoredLatency, architecture_identity
from servesim.latency.base import BatchSummary
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.latency.trained import TrainedPhysicsLatencyModel
from servesim.scenario.engine import latency_context

BATCHES = [
    BatchSummary(0, (), 1, 500),
    BatchSummary(0, (), 32, 32 * 800),
    BatchSummary(512, ((0, 512, 512),), 0, 0),
    BatchSummary(300, ((100, 300, 400),), 16, 16 * 2000),
]


def _ctx(model: str, gpu: str, tp: int = 1):
    return latency_context(resolve_model(model), resolve_gpu(gpu), tp)


def _anchored(model: str, gpu: str, tp: int, anchor: dict) -> AnchoredLatency:
    return AnchoredLatency.from_config({"anchor": anchor}, _ctx(model, gpu, tp), "latency")


def test_anchor_equal_to_target_gives_the_anchor_back_exactly():
    model = _anchored("llama-3.1-8b", "H100", 1, {})
    measured = BlackboxLatencyModel.from_config({}, _ctx("llama-3.1-8b", "H100"), "latency")
    for b in BATCHES:
        assert model.step_time_us(b) == measured.step_time_us(b)
    np.testing.assert_array_equal(
        model.decode_steps_us(24, 24 * 700, 50), measured.decode_steps_us(24, 24 * 700, 50)
    )
    assert model.queueing_time_us(512) == measured.queueing_time_us(512)
    assert model.describe()["transport"]["changes"] == []


def test_a_gpu_change_scales_by_the_physics_ratio():
    model = _anchored("llama-3.1-8b", "H200", 1, {"gpu": "H100"})
    measured = BlackboxLatencyModel.from_config({}, _ctx("llama-3.1-8b", "H100"), "latency")
    at_h100 = TrainedPhysicsLatencyModel.from_config({}, _ctx("llama-3.1-8b", "H100"), "latency")
    at_h200 = TrainedPhysicsLatencyModel.from_config({}, _ctx("llama-3.1-8b", "H200"), "latency")
    for b in BATCHES:
        a, p, t = measured.step_time_us(b), at_h100.step_time_us(b), at_h200.step_time_us(b)
        assert model.step_time_us(b) == max(1, (a * t + p // 2) // p)
        assert model.step_time_us(b) < a  # H200: more bandwidth, same compute
    assert model.describe()["transport"]["changes"] == ["gpu H100 -> H200"]


def test_run_of_decode_steps_equals_step_by_step():
    model = _anchored("llama-3.1-8b", "A100-80", 2, {"gpu": "H100", "tp": 1})
    steps = model.decode_steps_us(8, 8 * 1000, 40)
    one_by_one = [model.step_time_us(BatchSummary(0, (), 8, 8 * 1000 + i * 8)) for i in range(40)]
    assert steps.tolist() == one_by_one


def test_same_architecture_of_another_size_is_transported():
    model = _anchored("llama-3.1-70b", "H100", 4, {"model": "llama-3.1-8b", "tp": 1})
    changes = model.describe()["transport"]["changes"]
    assert changes[0].startswith("model meta-llama/llama-3.1-8b-instruct -> ")
    assert "tp 1 -> 4" in changes
    assert model.step_time_us(BATCHES[1]) > 0


@pytest.mark.parametrize(
    ("target", "anchor", "differs"),
    [
        ("qwen3-14b", "llama-3.1-8b", "model_type"),
        ("llama-3.1-8b", "llama-2-7b", "attention: MHA (anchor) vs GQA (target)"),
        ("qwen3-30b-a3b", "qwen3-14b", "experts"),
    ],
)
def test_a_foreign_anchor_is_refused_naming_the_difference(target, anchor, differs):
    with pytest.raises(ScenarioError) as err:
        _anchored(target, "H100", 1, {"model": anchor})
    assert "latency.anchor.model" in str(err.value)
    assert differs in str(err.value)


def test_identity_ignores_size_but_not_shape():
    small = architecture_identity(resolve_model("llama-3.1-8b").spec)
    large = architecture_identity(resolve_model("llama-3.1-70b").spec)
    assert small == large


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"anchor": {"latency": {"model": "anchored"}}}, "latency.anchor.latency.model"),
        ({"anchor": {"gpu": "H900"}}, "latency.anchor.gpu"),
        ({"anchor": {"tp": 0}}, "latency.anchor.tp"),
        ({"anchor": {"gpus": "H100"}}, "latency.anchor"),
        ({"physics": "blackbox"}, "latency.physics"),
        ({"anchor": {"latency": {"model": "nope"}}}, "latency.anchor.latency.model"),
    ],
)
def test_bad_anchor_fields_are_named(params, field):
    with pytest.raises(ScenarioError) as err:
        AnchoredLatency.from_config(params, _ctx("llama-3.1-8b", "H200"), "latency")
    assert str(err.value).startswith(field)


def test_an_anchored_run_audits_clean_and_records_its_transport():
    scenario = load_scenario(
        {
            "model": "llama-3.1-8b",
            "gpu": "H200",
            "latency": {"model": "anchored", "anchor": {"gpu": "H100"}},
            "workload": {"preset": "chatbot", "rate": 5, "requests": 100},
        }
    )
    summary = simulate(scenario).summary
    assert summary["completed_requests"] == 100
    assert summary["scenario"]["latency"]["transport"]["changes"] == ["gpu H100 -> H200"]
