"""The interference wrapper (spec §5.6): mixed prefill/decode batches slow down, pure ones do not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel
from servesim.latency.interference import InterferenceLatencyModel
from servesim.latency.trained import TrainedPhysicsLatencyModel
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import registry
from servesim.testing import check_latency_model

CTX = LatencyContext("llama-3.1-8b", "H100", 1)


class Fixed(LatencyModel):
    """A base model with a fixed step time, so the multiplier is visible exactly."""

    name = "fixed-test"
    output_token_time_us = 7
    post_decode_overhead_us = 11

    def __init__(self, step: int = 1000):
        self.step = step

    def step_time_us(self, batch):
        return self.step

    def queueing_time_us(self, prompt_tokens):
        return 3 * prompt_tokens


def mixed(prefills: int, decodes: int) -> BatchSummary:
    items = tuple((0, 100, 100) for _ in range(prefills))
    return BatchSummary(100 * prefills, items, decodes, decodes * 500)


def test_phase_pure_batches_are_unchanged():
    m = InterferenceLatencyModel(Fixed(1000), prefill_factor=2.0, decode_factor=3.0)
    assert m.step_time_us(mixed(4, 0)) == 1000
    assert m.step_time_us(mixed(0, 64)) == 1000
    assert m.multiplier(0, 10) == m.multiplier(10, 0) == 1.0


def test_mixed_batches_are_multiplied_by_one_plus_factor_times_minority_share():
    m = InterferenceLatencyModel(Fixed(1000), prefill_factor=0.5, decode_factor=0.3)
    # Decode-dominant: 2 prefills among 10 -> 1 + 0.3 * 2/10 = 1.06.
    assert m.step_time_us(mixed(2, 8)) == 1060
    # Prefill-dominant: 1 decode among 4 -> 1 + 0.5 * 1/4 = 1.125.
    assert m.step_time_us(mixed(3, 1)) == 1125
    # Tie: the larger factor -> 1 + 0.5 * 3/6 = 1.25.
    assert m.step_time_us(mixed(3, 3)) == 1250


def test_step_rounds_half_away_from_zero_and_is_at_least_one():
    # 2 µs x (1 + 0.5 x 1/2) = 2.5 exactly -> 3 (Python's round() would give 2).
    m = InterferenceLatencyModel(Fixed(2), prefill_factor=0.5, decode_factor=0.5)
    assert m.step_time_us(mixed(1, 1)) == 3
    m = InterferenceLatencyModel(Fixed(3), decode_factor=1.0)  # 3 x 1.25 = 3.75 -> 4
    assert m.step_time_us(mixed(1, 3)) == 4
    m = InterferenceLatencyModel(Fixed(9), decode_factor=0.5)  # 9 x 1.125 = 10.125 -> 10
    assert m.step_time_us(mixed(1, 3)) == 10
    assert InterferenceLatencyModel(Fixed(0)).step_time_us(mixed(1, 1)) == 1


def test_multiplier_is_never_below_one():
    m = InterferenceLatencyModel(Fixed(1000), prefill_factor=0.7, decode_factor=0.0)
    for p in range(0, 20):
        for d in range(0, 20):
            assert m.multiplier(p, d) >= 1.0
    # Zero factors: a no-op wrapper.
    noop = InterferenceLatencyModel(Fixed(1000))
    assert noop.step_time_us(mixed(5, 5)) == 1000


@pytest.mark.parametrize("value", [-0.1, 100.5, math.nan, math.inf])
def test_factors_outside_0_to_100_are_rejected_with_the_field(value):
    for key in ("prefill_factor", "decode_factor"):
        with pytest.raises(ScenarioError) as err:
            InterferenceLatencyModel.from_config(
                {"base": "trained-physics", key: value},
                CTX,
            )
        assert err.value.path == f"latency.{key}"


def test_base_model_by_name_or_mapping_with_parameters():
    by_name = InterferenceLatencyModel.from_config(
        {"base": "trained-physics", "prefill_factor": 0.4},
        CTX,
    )
    assert isinstance(by_name.base, TrainedPhysicsLatencyModel)
    nested = InterferenceLatencyModel.from_config(
        {"base": {"model": "roofline", "alpha": [100, 1, 5]}, "decode_factor": 0.2},
        CTX,
    )
    assert nested.base.name == "roofline"
    assert nested.queueing_time_us(50) == 150  # the base's α
    assert nested.output_token_time_us == 5 and nested.post_decode_overhead_us == 0
    d = nested.describe()
    assert d["model"] == "interference" and d["base"]["model"] == "roofline"
    assert d["decode_factor"] == 0.2


def test_configuration_errors_name_the_field():
    cases = [
        ({}, "latency.base"),
        ({"base": "no-such-model"}, "latency.base.model"),
        ({"base": {"alpha": [1, 2, 3]}}, "latency.base.model"),
        ({"base": {"model": "roofline", "beta": [1]}}, "latency.base.beta"),
        ({"base": "roofline", "factor": 1}, "latency.factor"),
    ]
    for params, path in cases:
        with pytest.raises(ScenarioError) as err:
            InterferenceLatencyModel.from_config(params, CTX)
        assert err.value.path == path, (params, err.value.path)


def test_alpha_overheads_come_from_the_base():
    m = InterferenceLatencyModel(Fixed(), prefill_factor=1.0)
    assert m.queueing_time_us(10) == 30
    assert (m.output_token_time_us, m.post_decode_overhead_us) == (7, 11)


def test_decode_only_fast_forward_is_the_base_models():
    base = TrainedPhysicsLatencyModel.from_config({}, CTX)
    m = InterferenceLatencyModel(base, prefill_factor=0.5, decode_factor=0.5)
    got = m.decode_steps_us(32, 32 * 900, 50)
    assert got.dtype == np.int64
    assert got.tolist() == base.decode_steps_us(32, 32 * 900, 50).tolist()
    assert got.tolist() == [
        m.step_time_us(BatchSummary(0, (), 32, 32 * 900 + 32 * i)) for i in range(50)
    ]


@pytest.mark.parametrize("base", ["trained-physics", "roofline", "blackbox"])
def test_check_latency_model_passes(base):
    m = InterferenceLatencyModel.from_config(
        {"base": base, "prefill_factor": 0.6, "decode_factor": 0.25},
        CTX,
    )
    check_latency_model(m)


def test_registered():
    assert registry("latency").get("interference") is InterferenceLatencyModel
