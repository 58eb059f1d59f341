"""The latency-model interface: step times as pure functions of a batch summary.

A latency model never sees SimPy or a request object. The instance describes each step with a
:class:`BatchSummary` (counts and context sums, never per-token lists) and asks for an integer
number of microseconds. Models may also answer for a run of identical decode-only steps at once
(:meth:`LatencyModel.decode_steps_us`), which the instance uses to fast-forward steady decoding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from servesim.simcore.errors import ServesimError
from servesim.simcore.registry import PluginContext


class BatchSummary:
    """What one engine step computes.

    prefill_tokens   Σ new (cache-miss) prompt tokens computed this step, over prefill requests.
    prefill_items    one ``(context_before, new_tokens, prompt_len)`` per request in prefill.
    decode_requests  requests computing exactly one decode token this step.
    decode_context   Σ tokens already in the KV cache of those decode requests (before the step).
    """

    __slots__ = ("prefill_tokens", "prefill_items", "decode_requests", "decode_context")

    def __init__(
        self,
        prefill_tokens: int = 0,
        prefill_items: tuple[tuple[int, int, int], ...] | list[tuple[int, int, int]] = (),
        decode_requests: int = 0,
        decode_context: int = 0,
    ):
        self.prefill_tokens = prefill_tokens
        self.prefill_items = prefill_items
        self.decode_requests = decode_requests
        self.decode_context = decode_context

    @property
    def batch_size(self) -> int:
        return len(self.prefill_items) + self.decode_requests

    def __repr__(self) -> str:
        return (
            f"BatchSummary(prefill_tokens={self.prefill_tokens}, prefill_items={list(self.prefill_items)}, "
            f"decode_requests={self.decode_requests}, decode_context={self.decode_context})"
        )


@dataclass(frozen=True)
class LatencyContext(PluginContext):
    """The latency kind's :class:`PluginContext`: where the model runs (served model, GPU,
    tensor parallelism; the resolved model spec and hardware when the scenario has them; the
    engine's other parallelism, ``parallel``: a :class:`~servesim.latency.parallel.Parallelism`,
    None = tensor parallelism only), plus ``path`` (``latency`` unless given) and the other
    fields every plugin gets."""

    model: str
    gpu: str
    tp: int
    model_spec: Any = None
    hardware: Any = None
    parallel: Any = None
    path: str = field(default="latency", kw_only=True)


class StepTimeError(ServesimError):
    """A latency model returned a step time that is not a whole number of µs ≥ 1: a bug in the
    model (every built-in floors at 1 µs), reported instead of being clamped silently. Made by
    :meth:`of`; the message is its only argument (SimPy re-raises a copy built from ``args``)."""

    @classmethod
    def of(cls, model: Any, value: Any, batch: Any) -> StepTimeError:
        name = getattr(model, "name", "") or type(model).__name__
        return cls(
            f"latency model {name!r} ({type(model).__module__}.{type(model).__qualname__}) "
            f"returned a step time of {value!r} µs for {batch!r}; a step must take a whole "
            "number of µs of at least 1: fix its step_time_us / decode_steps_us "
            "(floor the result with max(1, ...))"
        )


def trivial_decode_steps(n: int, k: int) -> np.ndarray | None:
    """The answer of :meth:`LatencyModel.decode_steps_us` when there is nothing to compute: no
    steps (``k <= 0``) or no request decoding (each step the 1 µs floor); None otherwise."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if n == 0:
        return np.ones(k, dtype=np.int64)
    return None


def check_decode_steps(model: Any, steps: np.ndarray, n: int, context: int) -> np.ndarray:
    """``steps`` (from ``model.decode_steps_us``), refused with :class:`StepTimeError` if one
    is below 1 µs."""
    if len(steps) and int(steps.min()) < 1:
        i = int(np.argmin(steps))
        raise StepTimeError.of(model, int(steps[i]), BatchSummary(0, (), n, context + i * n))
    return steps


class LatencyModel(ABC):
    """Base class of step-time models (registered under the plugin kind ``latency``).

    Required: :meth:`step_time_us`. The α overheads default to zero:

    * ``queueing_time_us(prompt_tokens)`` — instance arrival → enqueue delay;
    * ``output_token_time_us`` (α2) — added to the TTFT and to every inter-token gap, without
      delaying the next step;
    * ``post_decode_overhead_us`` — added once to the E2E latency of a finished request.
    """

    name: ClassVar[str] = ""
    output_token_time_us: int = 0
    post_decode_overhead_us: int = 0

    @abstractmethod
    def step_time_us(self, batch: BatchSummary) -> int:
        """Duration of one step computing ``batch``, in integer µs (at least 1)."""

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return 0

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        """Durations (µs, int64) of the next ``k`` decode-only steps of a steady batch.

        Step ``i`` (0-based) has ``decode_requests`` requests with total context
        ``decode_context + i * decode_requests``. Override with a closed form when one exists;
        the result must equal calling :meth:`step_time_us` step by step.
        """
        out = np.empty(k, dtype=np.int64)
        summary = BatchSummary(0, (), decode_requests, decode_context)
        for i in range(k):
            summary.decode_context = decode_context + i * decode_requests
            out[i] = self.step_time_us(summary)
        return out

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: LatencyContext) -> LatencyModel:
        """Build the model from the scenario's ``latency`` section (validated; errors name
        ``ctx.path``); ``ctx`` says where it runs (model, GPU, TP)."""
        if params:
            from servesim.simcore.config import check_keys

            check_keys(params, [], ctx.path)
        return cls()

    def describe(self) -> dict[str, Any]:
        """Parameters and provenance, written to summary.json so a result says what produced it."""
        return {"model": self.name}


class ClosedFormDecodeModel(LatencyModel):
    """A latency model whose decode-only steps have a closed form over the steps' contexts.

    :meth:`decode_steps_us` answers the trivial cases (:func:`trivial_decode_steps`) and hands
    :meth:`decode_steps_at` the total decode context of each of the ``k`` steps, so a subclass
    writes only its formula (with the same float operations as its :meth:`step_time_us`).
    """

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        trivial = trivial_decode_steps(decode_requests, k)
        if trivial is not None:
            return trivial
        contexts = decode_context + decode_requests * np.arange(k, dtype=np.int64)
        return self.decode_steps_at(decode_requests, contexts)

    @abstractmethod
    def decode_steps_at(self, n: int, contexts: np.ndarray) -> np.ndarray:
        """Durations (µs, int64, each at least 1) of decode-only steps of ``n >= 1`` requests
        whose total contexts are ``contexts`` (int64, one per step)."""


class WrapperLatencyModel(LatencyModel):
    """A latency model built around another one, the *base*, whose price it adjusts.

    The wrapper keeps the base's α overheads and, unless it overrides it, the base's queueing
    delay, so only what it changes is written in the subclass. ``wraps_base`` tells the instance
    builder that the base already prices the parallel layout (it is not wrapped again).
    """

    wraps_base: ClassVar[bool] = True

    def __init__(self, base: LatencyModel):
        self.base = base
        self.output_token_time_us = base.output_token_time_us
        self.post_decode_overhead_us = base.post_decode_overhead_us

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return self.base.queueing_time_us(prompt_tokens)

    def describe_wrapper(self, provenance: Any, **parameters: Any) -> dict[str, Any]:
        """``describe()`` of a wrapper: its name, its own ``parameters``, the base's description,
        then ``provenance`` (one layout for every wrapper in summary.json)."""
        return {
            "model": self.name,
            **parameters,
            "base": self.base.describe(),
            "provenance": provenance,
        }
