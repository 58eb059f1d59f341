"""LoRA's price on a step: adapter loads owed by the step and the punica (SGMV) kernels.

An instance with ``engine.lora`` wraps its latency model (whatever it is: blackbox, roofline,
trained-physics...) in :class:`LoRALatency`, which adds to each step

* the **load time** of the adapters this step is the first to need (vLLM loads an adapter
  synchronously, in the step that schedules it: ``set_active_adapters`` before the forward
  pass); the engine's adapter state (:mod:`servesim.components.adapters`) says how much, and
* the **LoRA kernels** when the batch holds at least one adapter: vLLM runs the shrink
  (x·A) and expand (·B) kernels over the batch's tokens for every adapted matrix, padded to
  ``max_lora_rank``, so per token ``2 x max_lora_rank x Σ(in + out)`` FLOPs over the adapted
  matrices of all layers, and per step the distinct adapters' weights are read from HBM. Their
  time is the roofline of the two at the GPU's peak rates, for each GPU's shard of the
  adapters (vLLM splits them over the tp GPUs with their layers)::

      lora_us = max(tokens x flops_per_token / peak FLOP/s,
                    adapters x slot_bytes / HBM bytes/s) x 1e6

  Kernels reach a fraction of peak, so this is a lower bound on their cost; the base model's
  own price is unchanged (the trained-physics coefficients were fitted without adapters).

Decode-only runs of steps (fast-forward) keep the batch, so they pay the same kernel time each.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servesim.latency.base import BatchSummary, LatencyModel, WrapperLatencyModel


class LoRALatency(WrapperLatencyModel):
    """Wraps an instance's latency model; ``state`` is its engine's adapter state, read for
    ``owed_us`` (load time owed by the step being priced, consumed here) and
    ``batch_adapters()`` (distinct adapters in the batch)."""

    name = "lora"

    def __init__(
        self,
        base: LatencyModel,
        state: Any,
        *,
        flops_per_token: float,
        adapter_bytes: float,
        peak_flops: float,
        peak_bytes_s: float,
    ):
        super().__init__(base)
        self.state = state
        # µs per token and per distinct adapter, on each GPU (the sizes are per GPU)
        self.us_per_token = flops_per_token / peak_flops * 1e6 if peak_flops > 0 else 0.0
        self.us_per_adapter = adapter_bytes / peak_bytes_s * 1e6 if peak_bytes_s > 0 else 0.0

    def kernel_us(self, tokens: int, adapters: int) -> int:
        """The punica kernels of one step: ``tokens`` tokens, ``adapters`` distinct adapters."""
        if adapters <= 0:
            return 0
        compute = tokens * self.us_per_token
        memory = adapters * self.us_per_adapter
        return int(round(compute if compute > memory else memory))

    def step_time_us(self, batch: BatchSummary) -> int:
        state = self.state
        dt = self.base.step_time_us(batch)
        owed = state.owed_us
        if owed:
            state.owed_us = 0
        tokens = batch.prefill_tokens + batch.decode_requests
        return int(dt) + owed + self.kernel_us(tokens, state.batch_adapters())

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        steps = np.asarray(self.base.decode_steps_us(decode_requests, decode_context, k))
        extra = self.kernel_us(decode_requests, self.state.batch_adapters())
        return steps.astype(np.int64, copy=False) + extra

    def describe(self) -> dict[str, Any]:
        """The base model's description (the model the scenario chose), plus what LoRA adds."""
        out = dict(self.base.describe())
        out["lora"] = {
            "formula": "servesim.latency.lora (adapter loads + punica kernels at peak)",
            "us_per_token": self.us_per_token,
            "us_per_adapter": self.us_per_adapter,
        }
        return out

    def __repr__(self) -> str:
        return f"LoRALatency({self.base!r})"
