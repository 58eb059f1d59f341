"""servesim.testing: the plugin-author checks accept good models and name what a bad one breaks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from servesim.latency.base import BatchSummary, LatencyModel
from servesim.simcore.registry import registry
from servesim.testing import check_latency_model


class Linear(LatencyModel):
    """A well-behaved model: 100 µs + 2 µs/prefill token + 5 µs/decode + context cost."""

    name = "linear-test"
    output_token_time_us = 3

    def step_time_us(self, batch: BatchSummary) -> int:
        return (
            100
            + 2 * batch.prefill_tokens
            + 5 * batch.decode_requests
            + batch.decode_context // 1000
        )

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return 10 + prompt_tokens // 100


def test_a_well_behaved_model_passes_including_the_default_fast_forward():
    check_latency_model(Linear())


def test_every_registered_latency_model_that_builds_without_params_passes():
    from servesim.latency.base import LatencyContext

    for name in registry("latency").names():
        cls = registry("latency").get(name)
        try:
            model = cls.from_config({}, LatencyContext("qwen3-14b", "H100", 1), "latency")
        except Exception:  # needs parameters; covered by its own tests
            continue
        check_latency_model(model)


class NonDeterministic(Linear):
    def __init__(self):
        self._counter = itertools.count()

    def step_time_us(self, batch):
        return super().step_time_us(batch) + next(self._counter) % 2


class ReturnsFloat(Linear):
    def step_time_us(self, batch):
        return 100.5


class ReturnsZeroWhenIdle(Linear):
    def step_time_us(self, batch):
        return 0 if batch.batch_size == 0 else super().step_time_us(batch)


class FasterWithMorePrefill(Linear):
    def step_time_us(self, batch):
        return max(1, 10_000 - batch.prefill_tokens)


class FasterWithMoreDecodes(Linear):
    def step_time_us(self, batch):
        return 5000 + 2 * batch.prefill_tokens - 3 * batch.decode_requests


class NegativeQueueing(Linear):
    def queueing_time_us(self, prompt_tokens):
        return -1


class FloatOutputTokenTime(Linear):
    output_token_time_us = 2.5  # type: ignore[assignment]


class WrongFastForward(Linear):
    def decode_steps_us(self, decode_requests, decode_context, k):
        # Forgets that contexts grow by decode_requests every step.
        return np.full(
            k,
            self.step_time_us(BatchSummary(0, (), decode_requests, decode_context)),
            dtype=np.int64,
        )


class FastForwardWrongDtype(Linear):
    def decode_steps_us(self, decode_requests, decode_context, k):
        return super().decode_steps_us(decode_requests, decode_context, k).astype(np.float64)


class Undescribable(Linear):
    def describe(self):
        return {"model": self.name, "array": object()}


@pytest.mark.parametrize(
    "model, prop",
    [
        (NonDeterministic(), "deterministic"),
        (ReturnsFloat(), "step_time_us returns an int"),
        (ReturnsZeroWhenIdle(), "at least 1"),
        (FasterWithMorePrefill(), "non-decreasing in prefill tokens"),
        (FasterWithMoreDecodes(), "non-decreasing in decode requests"),
        (NegativeQueueing(), "queueing_time_us returns an int >= 0"),
        (FloatOutputTokenTime(), "output_token_time_us is an int >= 0"),
        (WrongFastForward(), "decode_steps_us equals step-by-step"),
        (FastForwardWrongDtype(), "int64 array"),
        (Undescribable(), "JSON-serialisable"),
    ],
)
def test_each_broken_property_is_reported_by_name(model, prop):
    with pytest.raises(AssertionError) as err:
        check_latency_model(model)
    message = str(err.value)
    assert message.startswith(f"check_latency_model({type(model).__name__})")
    assert prop in message
