"""Calibrated serving overheads on top of any latency model (``latency: {model: overheads}``).

Step-time models price the GPU work. A real server adds software time the kernels do not show:
work done once per request before its first step (HTTP and tokenizer, scheduling it in) and work
done once per engine step (the scheduler, input preparation, sampling, detokenising). This wrapper
adds both, fitted to measured runs by ``servesim calibrate --latency overheads`` and off unless given::

    queueing_time_us(prompt) = base.queueing_time_us(prompt) + first_token_us
    step_time_us(batch)      = base.step_time_us(batch) + step_us

``first_token_us`` delays a request's entry into the wait queue, so it lands in its TTFT and E2E
but occupies no GPU time; ``step_us`` lengthens every step, so it slows every request in the
batch. Decode-only windows are the base model's plus ``step_us`` per step, so fast-forward stays
exact. The base model's own α overheads are kept.

Parameters: ``base`` (a latency-model name or ``{model: NAME, ...its parameters}``) and either
``first_token`` + ``step`` (durations: ``2ms``, ``150us`` or µs numbers; each defaults to 0) or
``file``, a YAML written by ``servesim calibrate --latency overheads`` (its fit provenance is kept in
``describe()``).

``software: true`` (or a mapping of its parameters) adds the serving stack's physics terms of
:mod:`servesim.latency.software` to any base, off by default: logits and sampler, the kernel-launch
floor or the CUDA-graph replay of a decode batch padded to its captured size (the base prices the
padded batch), quantisation casts, and the per-request accept/admit and tokenising time (on the
queueing delay). It needs the scenario's model architecture and GPU, and a plain tensor-parallel
instance. A base that already prices these (``roofline`` with ``software``) is refused::

    step_time_us(batch) = software.step(batch, base) + step_us
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from servesim.latency.base import (
    BatchSummary,
    ClosedFormDecodeModel,
    LatencyContext,
    LatencyModel,
    WrapperLatencyModel,
    trivial_decode_steps,
)
from servesim.latency.blackbox import PROVENANCE_KEYS
from servesim.latency.software import SoftwareCosts, SoftwareTerms, check_plain_layout
from servesim.simcore.config import check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register, registry

OVERHEADS_FILE_FORMAT = "servesim-overheads/1"
_FILE_KEYS = ("format", "model", "first_token_us", "step_us", *PROVENANCE_KEYS)


def build_base(params: Mapping[str, Any], ctx: LatencyContext) -> LatencyModel:
    """The model a wrapper wraps: ``params["base"]`` is a latency-model name or a mapping
    ``{model: NAME, ...its parameters}``; errors are named ``<ctx.path>.base...``."""
    path = ctx.path
    if "base" not in params:
        raise ScenarioError(
            f"{path}.base",
            None,
            "missing; name the latency model to wrap, e.g. base: trained-physics, or "
            "base: {model: roofline, alpha: [0, 0, 0]}",
        )
    section = params["base"]
    if isinstance(section, str):
        section = {"model": section}
    section = expect_mapping(section, f"{path}.base")
    if "model" not in section:
        raise ScenarioError(f"{path}.base.model", None, "missing; name the latency model to wrap")
    registry("latency").get(section["model"], f"{path}.base.model")
    from servesim.latency.expert_parallel import instance_latency

    # the base prices the instance's parallel layout (expert groups, pipeline stages)
    return instance_latency(
        section["model"],
        {k: v for k, v in section.items() if k != "model"},
        ctx,
        f"{path}.base",
    )


def _duration(value: Any, path: str) -> int:
    """A non-negative duration; bare numbers are microseconds."""
    from servesim.simcore.config import parse_duration_us

    return parse_duration_us(value, path, bare_unit="us")


@register("latency", "overheads")
class OverheadsLatencyModel(WrapperLatencyModel):
    """A base latency model plus a per-request first-token overhead and a per-step overhead."""

    name = "overheads"

    def __init__(
        self,
        base: LatencyModel,
        first_token_us: int = 0,
        step_us: int = 0,
        provenance: Mapping[str, Any] | None = None,
        software: SoftwareTerms | None = None,
    ):
        super().__init__(base)
        self.first_token_us = int(first_token_us)
        self.step_us = int(step_us)
        self.provenance = dict(provenance or {"source": "scenario"})
        self.software = software

    def step_time_us(self, batch: BatchSummary) -> int:
        if self.software is None or (not batch.prefill_items and batch.decode_requests == 0):
            return self.base.step_time_us(batch) + self.step_us
        return int(self.software.step_us(batch, self.base.step_time_us)) + self.step_us

    # a lock-stepped data-parallel rank (servesim.components.lockstep): the base's group step
    def group_step_us(self, batches: Any) -> int:
        return self.base.group_step_us(batches) + self.step_us

    @property
    def last_batch(self) -> BatchSummary:
        return self.base.last_batch

    @property
    def last_step_us(self) -> int:
        return self.base.last_step_us + self.step_us

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        n = decode_requests
        if self.software is None or trivial_decode_steps(n, k) is not None:
            steps = np.asarray(self.base.decode_steps_us(n, decode_context, k))
            return steps.astype(np.int64, copy=False) + self.step_us
        contexts = decode_context + n * np.arange(k, dtype=np.int64)
        steps = self.software.decode_steps_us(n, contexts, self._base_decode_us)
        return steps.astype(np.int64) + self.step_us

    def _base_decode_us(self, size: int, contexts: np.ndarray) -> np.ndarray:
        """The base's decode-only steps of ``size`` requests at these total contexts (float µs):
        its closed form when it has one, else step by step."""
        if isinstance(self.base, ClosedFormDecodeModel):
            return self.base.decode_steps_at(size, contexts).astype(np.float64)
        step = self.base.step_time_us
        return np.array(
            [step(BatchSummary(0, (), size, int(c))) for c in contexts], dtype=np.float64
        )

    def queueing_time_us(self, prompt_tokens: int) -> int:
        queued = super().queueing_time_us(prompt_tokens) + self.first_token_us
        if self.software is None:
            return queued
        return queued + int(self.software.request_us(prompt_tokens))

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: LatencyContext) -> OverheadsLatencyModel:
        path = ctx.path
        params = expect_mapping(params, path)
        check_keys(params, ("base", "first_token", "step", "file", "software"), path)
        base = build_base(params, ctx)
        software = software_terms(params.get("software"), base, ctx)
        from servesim.latency.blackbox import file_param

        file = file_param(params, ("first_token", "step"), "the overheads", ctx, path)
        if file is not None:
            first, step, provenance = load_overheads_file(file)
            return cls(base, first, step, provenance, software)
        first = _duration(params.get("first_token", 0), f"{path}.first_token")
        step = _duration(params.get("step", 0), f"{path}.step")
        return cls(base, first, step, software=software)

    def describe(self) -> dict[str, Any]:
        extra = {} if self.software is None else {"software": self.software.describe()}
        return self.describe_wrapper(
            self.provenance, first_token_us=self.first_token_us, step_us=self.step_us, **extra
        )

    def __repr__(self) -> str:
        return (
            f"OverheadsLatencyModel({self.base!r}, first_token_us={self.first_token_us}, "
            f"step_us={self.step_us})"
        )


def software_terms(value: Any, base: LatencyModel, ctx: LatencyContext) -> SoftwareTerms | None:
    """The ``software`` parameter of a wrapper, bound to the scenario's model and GPU (None: off);
    refused on a base that prices it already and on layouts beyond tensor parallelism."""
    path = f"{ctx.path}.software"
    costs = SoftwareCosts.from_config(value, path)
    if costs is None:
        return None
    if getattr(base, "software", None) is not None:
        raise ScenarioError(
            path, value, "the base already prices the software costs; give software once, here"
        )
    check_plain_layout(ctx, path, value)
    from servesim.latency.modelindex import context_specs

    spec, hardware = context_specs(ctx, path, "the software costs")
    return SoftwareTerms(costs, spec, hardware, ctx.tp)


def load_overheads_file(file: str | Path) -> tuple[int, int, dict[str, Any]]:
    """(first_token_us, step_us, provenance) from a YAML written by ``servesim calibrate --latency
    overheads``; errors are named ``<file>: <field>``."""
    from servesim.latency.blackbox import _plain, read_fit_file
    from servesim.simcore.config import as_float

    where, data = read_fit_file(file, _FILE_KEYS, "overheads", "first_token_us and step_us")
    fmt = data.get("format", OVERHEADS_FILE_FORMAT)
    if fmt != OVERHEADS_FILE_FORMAT:
        raise ScenarioError(f"{where}: format", fmt, f"expected {OVERHEADS_FILE_FORMAT}")
    if data.get("model", "overheads") != "overheads":
        raise ScenarioError(
            f"{where}: model",
            data.get("model"),
            "this file holds another model's coefficients; an overheads file says model: overheads",
        )
    values = []
    for key in ("first_token_us", "step_us"):
        if key not in data:
            raise ScenarioError(f"{where}: {key}", None, "missing; expected microseconds >= 0")
        values.append(int(round(as_float(data[key], f"{where}: {key}", minimum=0))))
    provenance: dict[str, Any] = {"source": "file", "file": where}
    for key in _FILE_KEYS[4:]:
        if data.get(key) is not None:
            provenance[key] = _plain(data[key])
    return values[0], values[1], provenance
