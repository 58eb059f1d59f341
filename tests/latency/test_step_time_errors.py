"""A latency model that returns a step time below 1 µs is a bug reported by name, never clamped
silently (step by step and in fast-forwarded decode windows alike)."""

from __future__ import annotations

import numpy as np
import pytest

import servesim
from servesim.latency.base import StepTimeError
from servesim.latency.blackbox import BlackboxLatencyModel


class _Broken(BlackboxLatencyModel):
    """The bundled blackbox fit, except that decode-only steps take ``decode_us``."""

    name = "broken-for-test"
    decode_us = 0

    def step_time_us(self, batch):
        if batch.prefill_items:
            return super().step_time_us(batch)
        return self.decode_us

    def decode_steps_us(self, decode_requests, decode_context, k):
        return np.full(k, self.decode_us, dtype=np.int64)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("value", [0, -5])
def test_a_step_time_below_one_microsecond_names_the_model(monkeypatch, exact, value):
    scenario = servesim.load_scenario(
        {"workload": {"preset": "chatbot", "rate": 5, "requests": 20}, "exact_steps": exact}
    )
    from servesim.components import cluster as cluster_module

    built = cluster_module.Cluster(scenario)
    for instance in built.instances:
        broken = object.__new__(_Broken)
        broken.__dict__.update(instance.engine.latency.__dict__)
        broken.decode_us = value
        instance.engine.latency = broken
    with pytest.raises(StepTimeError, match="broken-for-test") as caught:
        built.run()
    assert f"step time of {value} µs" in str(caught.value)


class _BrokenWindows(BlackboxLatencyModel):
    """Right step by step; its vectorised decode steps (fast-forward windows) return 0."""

    name = "broken-windows-for-test"

    def decode_steps_us(self, decode_requests, decode_context, k):
        return np.zeros(k, dtype=np.int64)


def _with_latency(scenario, cls):
    from servesim.components import cluster as cluster_module

    built = cluster_module.Cluster(scenario)
    for instance in built.instances:
        model = object.__new__(cls)
        model.__dict__.update(instance.engine.latency.__dict__)
        instance.engine.latency = model
    return built


def test_a_broken_fast_forward_helper_is_caught_not_clamped():
    config = {"workload": {"preset": "chatbot", "rate": 5, "requests": 20}}
    exact = servesim.load_scenario({**config, "exact_steps": True})
    assert _with_latency(exact, _BrokenWindows).run().arrived == 20  # never asks for windows
    with pytest.raises(StepTimeError, match="broken-windows-for-test"):
        _with_latency(servesim.load_scenario(config), _BrokenWindows).run()
