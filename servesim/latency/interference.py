"""The interference wrapper: mixed prefill+decode batches run slower than their parts suggest
(``spec/blis_reference.md`` §5.6, from BLIS's ``pd`` branch).

It wraps another latency model (the *base*) and multiplies the step time of a batch that mixes
phases::

    prefill_count = requests in prefill, decode_count = B − prefill_count
    minority      = min(prefill_count, decode_count)
    multiplier    = 1                                  if minority = 0 (phase-pure batch)
                  = 1 + f·minority/B                   otherwise
    f             = prefill_factor if prefill-dominant, decode_factor if decode-dominant,
                    max(both) on a tie
    step_time_us  = max(1, round(base_step_us · multiplier))    (halves round away from zero)

Factors lie in [0, 100]; 0 disables the slowdown for that side, so the multiplier is never below 1
(INV-P2-3: interference only slows a batch down). The α overheads and decode-only fast-forward
are the base model's: a decode-only batch is phase-pure, so its multiplier is 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel, WrapperLatencyModel
from servesim.simcore.config import as_float, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register

MAX_FACTOR = 100.0


@register("latency", "interference")
class InterferenceLatencyModel(WrapperLatencyModel):
    """Wraps a latency model; slows mixed prefill/decode batches down by a multiplier ≥ 1."""

    name = "interference"

    def __init__(
        self,
        base: LatencyModel,
        prefill_factor: float = 0.0,
        decode_factor: float = 0.0,
        *,
        path: str = "latency",
    ):
        for key, value in (("prefill_factor", prefill_factor), ("decode_factor", decode_factor)):
            if not (0.0 <= value <= MAX_FACTOR) or not math.isfinite(value):
                raise ScenarioError(
                    f"{path}.{key}",
                    value,
                    f"must be in [0, {MAX_FACTOR:g}]: the multiplier 1 + factor·minority/batch "
                    "must be at least 1 (interference only slows a batch down)",
                )
        super().__init__(base)
        self.prefill_factor = float(prefill_factor)
        self.decode_factor = float(decode_factor)
        self._tie_factor = max(self.prefill_factor, self.decode_factor)

    def multiplier(self, prefill_count: int, decode_count: int) -> float:
        """The slowdown of a batch with these request counts (1.0 for a phase-pure batch)."""
        minority = prefill_count if prefill_count < decode_count else decode_count
        if minority <= 0:
            return 1.0
        if prefill_count > decode_count:
            f = self.prefill_factor
        elif decode_count > prefill_count:
            f = self.decode_factor
        else:
            f = self._tie_factor
        return 1.0 + f * minority / (prefill_count + decode_count)

    def step_time_us(self, batch: BatchSummary) -> int:
        base = self.base.step_time_us(batch)
        prefills = len(batch.prefill_items)
        decodes = batch.decode_requests
        if prefills == 0 or decodes == 0:
            return base if base > 1 else 1
        step = math.floor(base * self.multiplier(prefills, decodes) + 0.5)
        return step if step > 1 else 1

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        """Decode-only steps are phase-pure: the base model's durations, floored at 1."""
        steps = np.asarray(self.base.decode_steps_us(decode_requests, decode_context, k))
        return np.maximum(steps.astype(np.int64, copy=False), 1)

    @classmethod
    def from_config(
        cls, params: Mapping[str, Any], ctx: LatencyContext
    ) -> InterferenceLatencyModel:
        """``latency: {model: interference, base: trained-physics, prefill_factor: 0.4,
        decode_factor: 0.2}``; ``base`` is a latency-model name or a mapping
        ``{model: NAME, ...its parameters}``."""
        path = ctx.path
        params = expect_mapping(params, path)
        check_keys(params, ("base", "prefill_factor", "decode_factor"), path)
        from servesim.latency.overheads import build_base

        base = build_base(params, ctx)
        factors = {
            key: as_float(params.get(key, 0.0), f"{path}.{key}", minimum=0, maximum=MAX_FACTOR)
            for key in ("prefill_factor", "decode_factor")
        }
        return cls(base, path=path, **factors)

    def describe(self) -> dict[str, Any]:
        return self.describe_wrapper(
            {"formula": "spec/blis_reference.md §5.6 (BLIS pd branch, PR #647)"},
            prefill_factor=self.prefill_factor,
            decode_factor=self.decode_factor,
        )

    def __repr__(self) -> str:
        return (
            f"InterferenceLatencyModel({self.base!r}, prefill_factor={self.prefill_factor}, "
            f"decode_factor={self.decode_factor})"
        )
