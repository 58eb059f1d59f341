"""Measure sparsely, transport analytically: step times measured on one configuration (the
*anchor*), carried to a nearby one by the physics model's ratio.

Scenario schema (the ``latency:`` section)::

    latency:
      model: anchored
      anchor:                      # where the step times were measured
        gpu: H100                  # default: the scenario's gpu
        tp: 1                      # default: the scenario's tp
        model: llama-3.1-8b        # default: the scenario's model
        latency: {model: blackbox} # the measured step times there (any latency model; default blackbox)
      physics: trained-physics     # the ratio's model: trained-physics (default) or roofline

A step of batch ``b`` on the target takes ``anchor(b) × physics_target(b) / physics_anchor(b)``
µs (integer µs, rounded half up, at least 1), where ``anchor`` is the measured model at the
anchor and ``physics_*`` is the physics model priced at the target's and at the anchor's model,
GPU and tp. The physics model's absolute level cancels: only how it *scales* between the two
configurations counts, which is what first principles get right more often than absolute step
times. When the target is the anchor the ratio is exactly 1 and the anchor's step times come back
unchanged. The anchor's server overheads (queueing delay, per-token and post-decode α terms) are
kept as measured: they are CPU-side costs that do not scale with the GPU.

Anchors are matched by architecture identity (:func:`architecture_identity`: HF model type,
attention kind, head dimension, gated or plain MLP, dense or MoE with its top-k, sliding windows):
a size, GPU or tp change within one architecture is transported, a change of architecture is
refused naming what differs, because the physics model's ratio then compares two different
computations. How far the transport goes is described in ``describe()["transport"]`` and read by
the confidence ladder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel
from servesim.simcore.config import as_int, as_str, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register

PHYSICS_MODELS = ("trained-physics", "roofline")


def architecture_identity(spec: Any) -> dict[str, Any]:
    """What must agree between an anchor's model and the target's for a transport to make sense."""
    return {
        "model_type": spec.model_type or "?",
        "attention": spec.attention_kind,
        "head_dim": spec.head_dim,
        "mlp": "gated" if spec.gated_mlp else "plain",
        "experts": (spec.num_experts, spec.num_experts_per_tok) if spec.is_moe else "dense",
        "sliding_window": bool(spec.sliding_window),
    }


@register("latency", "anchored")
class AnchoredLatency(LatencyModel):
    """``measured × physics(target) / physics(anchor)`` (module docstring)."""

    name = "anchored"

    def __init__(
        self,
        measured: LatencyModel,
        at_target: LatencyModel,
        at_anchor: LatencyModel,
        transport: dict[str, Any],
    ):
        self.measured = measured
        self.at_target = at_target
        self.at_anchor = at_anchor
        self.transport = transport
        self.output_token_time_us = measured.output_token_time_us
        self.post_decode_overhead_us = measured.post_decode_overhead_us

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return self.measured.queueing_time_us(prompt_tokens)

    def step_time_us(self, batch: BatchSummary) -> int:
        a = self.measured.step_time_us(batch)
        p = self.at_anchor.step_time_us(batch)
        t = self.at_target.step_time_us(batch)
        return max(1, (a * t + p // 2) // p)

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        a = self.measured.decode_steps_us(decode_requests, decode_context, k)
        p = self.at_anchor.decode_steps_us(decode_requests, decode_context, k)
        t = self.at_target.decode_steps_us(decode_requests, decode_context, k)
        return np.maximum(1, (a * t + p // 2) // p)

    @classmethod
    def from_config(
        cls, params: Mapping[str, Any], context: LatencyContext, path: str
    ) -> AnchoredLatency:
        from servesim.latency.hardware import resolve_gpu
        from servesim.latency.modelindex import context_specs, resolve_model
        from servesim.simcore import registry

        check_keys(params, ("anchor", "physics"), path)
        anchor = expect_mapping(params.get("anchor"), f"{path}.anchor")
        check_keys(anchor, ("model", "gpu", "tp", "latency"), f"{path}.anchor")
        physics_name = as_str(
            params.get("physics", "trained-physics"), f"{path}.physics", choices=PHYSICS_MODELS
        )
        physics = registry.get("latency", physics_name, f"{path}.physics")
        target_spec, target_gpu = context_specs(context, path, "the anchored latency model")
        model_name = as_str(anchor.get("model", context.model), f"{path}.anchor.model")
        info = resolve_model(model_name, f"{path}.anchor.model")
        anchor_spec = info.require_spec(f"{path}.anchor.model", "the anchored latency model")
        anchor_gpu = resolve_gpu(anchor.get("gpu", context.gpu), f"{path}.anchor.gpu")
        anchor_tp = as_int(anchor.get("tp", context.tp), f"{path}.anchor.tp", minimum=1)
        _check_identity(target_spec, anchor_spec, f"{path}.anchor.model", model_name)
        anchor_ctx = LatencyContext(
            model=info.hf_id or info.name,
            gpu=anchor_gpu.name,
            tp=anchor_tp,
            model_spec=anchor_spec,
            hardware=anchor_gpu,
        )
        measured_section = expect_mapping(
            anchor.get("latency", {"model": "blackbox"}), f"{path}.anchor.latency"
        )
        name = as_str(measured_section.get("model", "blackbox"), f"{path}.anchor.latency.model")
        if name == cls.name:
            raise ScenarioError(
                f"{path}.anchor.latency.model", name, "an anchor must be measured, not anchored"
            )
        rest = {k: v for k, v in measured_section.items() if k != "model"}
        measured = registry.get("latency", name, f"{path}.anchor.latency.model").from_config(
            rest, anchor_ctx, f"{path}.anchor.latency"
        )
        transport = {
            "anchor": {
                "model": anchor_ctx.model,
                "gpu": anchor_gpu.name,
                "tp": anchor_tp,
                "latency": measured.describe(),
            },
            "physics": physics_name,
            "changes": _changes(
                (context.model, target_gpu.name, context.tp, target_spec),
                (anchor_ctx.model, anchor_gpu.name, anchor_tp, anchor_spec),
            ),
        }
        return cls(
            measured,
            physics.from_config({}, context, f"{path}.physics"),
            physics.from_config({}, anchor_ctx, f"{path}.physics"),
            transport,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "transport": self.transport,
            "provenance": {"source": "anchor", **self.transport["anchor"]},
        }


def _check_identity(target: Any, anchor: Any, path: str, name: str) -> None:
    want, have = architecture_identity(target), architecture_identity(anchor)
    differ = [f"{k}: {have[k]} (anchor) vs {want[k]} (target)" for k in want if want[k] != have[k]]
    if differ:
        raise ScenarioError(
            path,
            name,
            "a different architecture than the scenario's model ("
            + "; ".join(differ)
            + "); transport needs an anchor of the same architecture — measure one, or use a "
            "physics or fitted latency model",
        )


def _changes(target: tuple, anchor: tuple) -> list[str]:
    """What the transport changes, in words (empty: the target is the anchor)."""
    (t_model, t_gpu, t_tp, t_spec), (a_model, a_gpu, a_tp, a_spec) = target, anchor
    out = []
    if t_model != a_model:
        out.append(
            f"model {a_model} -> {t_model} (same architecture; {a_spec.num_layers} -> "
            f"{t_spec.num_layers} layers, hidden {a_spec.hidden_size} -> {t_spec.hidden_size})"
        )
    if t_gpu != a_gpu:
        out.append(f"gpu {a_gpu} -> {t_gpu}")
    if t_tp != a_tp:
        out.append(f"tp {a_tp} -> {t_tp}")
    return out
