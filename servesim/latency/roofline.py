"""The roofline latency model: a step takes as long as its compute or its memory traffic, whichever
is slower (``spec/blis_reference.md`` §3.2).

Per request with ``c`` tokens already computed and ``t`` new tokens (``ĉ = c + (t−1)/2`` if
``t > 1``, else ``c``)::

    FLOPs  = L·[2t(d·dq + 2d·dkv) + 2t·dq·d] + L·4H·t·ĉ·dh + MLP        (GEMM)
           + L·(5H·t·ĉ + 2t·d)                                           (vector)
    MLP    = nMoE·2t·(2·d·dffMoE)·k + nDense·2t·(2·d·dffDense)
    bytes  = 2L·Hkv·dh·bpp·t (KV write) + 2L·Hkv·dh·bpp·c (KV read) + L·d·bpp·t (activations)

    compute_s = Σ_prefill FLOPs/TP/(peak·MFU_prefill) + Σ_decode FLOPs/TP/(peak·MFU_decode)
    weights   = [L·(d(dq+2dkv) + dq·d) + nMoE·2·d·dffMoE·nEff + nDense·2·d·dffDense]·wbpp,
                nEff = E·(1 − ((E−k)/E)^N_new)   (expected distinct experts the step's tokens touch)
    memory_s  = (weights/TP + Σ bytes/TP) / bandwidth
    step_us   = max(1, trunc(max(compute_s, memory_s)·1e6))

``peak`` is the FP8 rate when weights are 1 byte and the GPU has one, else BF16. ``dh`` is the
config's ``head_dim`` when it has one (not for MLA) and ``dq = H·dh`` the Q/O width — a deliberate
departure: BLIS uses ``dh = d/H`` and ``dq = d``, which agree when ``head_dim = d/H``. The MLP keeps
BLIS's 2 matrices for every model (the MFUs were calibrated with it; exact for OPT-style MLPs).
With ``tp_comm: true`` (servesim, off by default) the step adds its 2L tensor-parallel all-reduces
on the GPU's interconnect: ``2L·[latency·steps + 2(TP−1)/TP·N·d·bpp/link]``. servesim adds one more
term to BLIS's: on sliding-window layers (``ModelSpec.sliding_window``) the attention context and
the KV read are capped at the window. Decode requests are summarised by their total context, so
the cap is applied to the batch average (``min(Σc, n·W)``), exact when every context is on the
same side of the window. Models without windows give BLIS's numbers exactly.

α: ``queueing_time_us = trunc(α0 + α1·prompt_tokens)``, ``output_token_time_us = trunc(α2)``,
no post-decode overhead; α defaults to ``[0, 0, 0]``.

With ``software: true`` (or a mapping of its parameters; servesim, off by default so BLIS's
numbers stay exact) the step and the queueing delay add the serving stack's costs of
:mod:`servesim.latency.software` to the step above: logits and sampler, the kernel-launch floor or
a CUDA-graph replay of the decode batch padded to its captured size, quantisation casts, and the
per-request accept/admit and tokenising time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from servesim.latency.base import BatchSummary, ClosedFormDecodeModel, LatencyContext
from servesim.latency.hardware import HardwareSpec
from servesim.latency.interconnect import (
    OVERRIDE_KEYS,
    Interconnect,
    interconnect_of,
    parse_overrides,
)
from servesim.latency.modelindex import context_specs
from servesim.latency.modelspec import ModelSpec
from servesim.latency.software import SoftwareCosts, SoftwareTerms, check_plain_layout
from servesim.latency.tensor_parallel import check_tensor_parallel
from servesim.simcore.config import as_bool, as_float, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register

MLP_MATRICES = 2.0
"""BLIS counts 2 MLP matrices per layer, deliberately, even for 3-matrix SwiGLU MLPs (spec §3.2).
servesim keeps it: the roofline's MFUs were calibrated with this count, and for non-gated MLPs
(OPT, GPT-2) 2 is exact. The trained-physics model uses :attr:`ModelSpec.mlp_matrices`."""


def physics_placement(
    params: Mapping[str, Any], ctx: LatencyContext, needed_for: str
) -> tuple[tuple[ModelSpec, HardwareSpec, int], dict[str, Any]]:
    """What every physics model (roofline, trained-physics) reads the same way: where it runs,
    ``(model spec, GPU, tp)`` from the context, and the keyword arguments of the keys they share
    (``sliding_window``, the interconnect overrides) plus the ``path`` their errors name."""
    path = ctx.path
    link = parse_overrides(params, path)
    spec, hardware = context_specs(ctx, path, needed_for)
    return (spec, hardware, ctx.tp), {
        "sliding_window": as_bool(params.get("sliding_window", True), f"{path}.sliding_window"),
        "interconnect_gbs": link.get("gbs"),
        "interconnect_latency_us": link.get("latency_us"),
        "interconnect": link.get("kind"),
        "path": path,
    }


def parse_coefficients(
    value: Any, path: str, *, min_len: int, max_len: int, example: str
) -> tuple[float, ...]:
    """A list of ``min_len..max_len`` finite numbers >= 0; errors name ``path[i]``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ScenarioError(path, value, f"expected a list of non-negative numbers, e.g. {example}")
    if not (min_len <= len(value) <= max_len):
        count = str(min_len) if min_len == max_len else f"{min_len} to {max_len}"
        raise ScenarioError(path, value, f"expected {count} numbers, got {len(value)}")
    return tuple(as_float(v, f"{path}[{i}]", minimum=0) for i, v in enumerate(value))


@register("latency", "roofline")
class RooflineLatencyModel(ClosedFormDecodeModel):
    """Analytical step time from the model's FLOPs and bytes and the GPU's peaks (spec §3.2)."""

    name = "roofline"

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        tp: int = 1,
        *,
        alpha: Sequence[float] = (0.0, 0.0, 0.0),
        mfu_prefill: float | None = None,
        mfu_decode: float | None = None,
        sliding_window: bool = True,
        tp_comm: bool = False,
        interconnect_gbs: float | None = None,
        interconnect_latency_us: float | None = None,
        interconnect: str | None = None,
        software: SoftwareCosts | None = None,
        path: str = "latency",
    ):
        check_tensor_parallel(model, tp, "tp")
        a0, a1, a2 = (float(x) for x in alpha)
        self.spec = model
        self.hardware = hardware
        self.tp = tp
        self.alpha = (a0, a1, a2)
        self.mfu_prefill = hardware.mfu_prefill if mfu_prefill is None else float(mfu_prefill)
        self.mfu_decode = hardware.mfu_decode if mfu_decode is None else float(mfu_decode)
        self._a0, self._a1 = a0, a1
        self.output_token_time_us = int(a2)
        self.post_decode_overhead_us = 0

        d = float(model.hidden_size)
        L = float(model.num_layers)
        H = float(model.num_heads)
        Hkv = float(model.num_kv_heads or model.num_heads)
        # An explicit head_dim is honoured (BLIS uses d/H); Q and O are then H·dh wide, not d.
        explicit = model.projection_head_dim_explicit  # not for MLA (see ModelSpec.q_dim)
        dh = float(model.explicit_head_dim) if explicit else d / H
        dq = H * dh if explicit else d
        dkv = Hkv * dh
        dff = float(model.intermediate_size) if model.intermediate_size > 0 else 4.0 * d
        dff_moe = float(model.moe_intermediate_size) if model.moe_intermediate_size > 0 else dff
        dff_dense = (
            float(model.dense_intermediate_size) if model.dense_intermediate_size > 0 else dff
        )
        n_moe, n_dense = model.moe_layer_split
        k = float(model.num_experts_per_tok)
        m = MLP_MATRICES
        bpp = model.bytes_per_param
        wbpp = model.weight_bytes_per_param

        # FLOPs per new token that do not depend on context: Q/K/V/O GEMMs, MLP, RoPE.
        mlp = float(n_moe) * 2.0 * (m * d * dff_moe) * k + float(n_dense) * 2.0 * (
            m * d * dff_dense
        )
        self._flops_per_token = (
            L * (2.0 * (d * dq + 2.0 * d * dkv) + 2.0 * dq * d) + mlp + L * 2.0 * d
        )
        # FLOPs per (new token x context token) per layer: attention GEMMs (4H·dh) + softmax etc (5H).
        self._flops_per_context = 4.0 * H * dh + 5.0 * H
        kv_per_layer_token = 2.0 * Hkv * dh * bpp
        self._kv_per_layer_token = kv_per_layer_token
        self._bytes_per_token = L * kv_per_layer_token + L * d * bpp  # KV write + activations
        self._L = L

        self._weights_static = (
            L * (d * (dq + 2.0 * dkv) + dq * d) + n_dense * m * d * dff_dense
        ) * wbpp
        self._is_moe = model.is_moe and n_moe > 0
        self._weights_per_expert = n_moe * m * d * dff_moe * wbpp
        self._experts = float(model.num_experts)
        self._miss = (self._experts - k) / self._experts if self._is_moe else 1.0

        fp8 = wbpp == 1.0 and hardware.tflops_fp8 > 0
        self.peak_tflops = hardware.tflops_fp8 if fp8 else hardware.tflops_bf16
        peak = self.peak_tflops * 1e12
        self._tp = float(tp)
        self._prefill_rate = peak * self.mfu_prefill
        self._decode_rate = peak * self.mfu_decode
        self._bandwidth = hardware.bandwidth_tbs * 1e12

        window = model.sliding_window if sliding_window else 0
        self.window = window if model.num_sliding_layers > 0 else 0
        self._window = float(self.window)
        self._L_win = float(model.num_sliding_layers) if self.window else 0.0
        self._L_full = L - self._L_win

        # Optional (servesim, not BLIS): the TP all-reduces, serial after the roofline step: 2L per
        # step (attention output, MLP output), each latency·steps + 2(TP−1)/TP·bytes/link.
        self.tp_comm = tp_comm
        overrides = {
            "interconnect": interconnect,
            "interconnect_gbs": interconnect_gbs,
            "interconnect_latency_us": interconnect_latency_us,
        }
        given = [key for key, value in overrides.items() if value is not None]
        if not tp_comm and given:
            raise ScenarioError(
                f"{path}.{given[0]}",
                overrides[given[0]],
                "the roofline model prices the interconnect only with tp_comm: true; add it",
            )
        self.interconnect: Interconnect | None = None
        self._comm_floor_us = 0.0
        self._comm_us_per_token = 0.0
        if tp_comm:
            link = interconnect_of(
                hardware,
                gbs=interconnect_gbs,
                latency_us=interconnect_latency_us,
                kind=interconnect,
                path=path,
            )
            if link is None:
                raise ScenarioError(
                    f"{path}.tp_comm",
                    True,
                    f"GPU {hardware.name} declares no interconnect; give interconnect_gbs and "
                    "interconnect_latency_us",
                )
            self.interconnect = link
            if tp > 1:
                collectives = 2.0 * L
                self._comm_floor_us = collectives * link.collective_us(0.0, tp)
                self._comm_us_per_token = collectives * (
                    link.collective_us(d * bpp, tp) - link.collective_us(0.0, tp)
                )

        # Optional (servesim): the serving stack's costs on top of the step above. The same
        # roofline without them prices the layers, so the plain path is untouched.
        self.software: SoftwareTerms | None = None
        self._layers = self
        if software is not None:
            self._layers = copy.copy(self)  # this model as built so far: no software terms
            self._layers._layers = self._layers
            self.software = SoftwareTerms(software, model, hardware, tp)

    # ---- the model ---------------------------------------------------------------------------

    def _weights(self, new_tokens: int) -> float:
        if not self._is_moe:
            return self._weights_static
        n_eff = self._experts * (1.0 - self._miss**new_tokens)
        return self._weights_static + self._weights_per_expert * n_eff

    def step_time_us(self, batch: BatchSummary) -> int:
        software = self.software
        if software is not None:
            return self._software_step_us(software, batch)
        n = batch.decode_requests
        items = batch.prefill_items
        if not items and n == 0:
            return 1
        per_token = self._flops_per_token
        per_context = self._flops_per_context
        bytes_per_token = self._bytes_per_token
        kv = self._kv_per_layer_token
        windowed = self.window > 0
        L = self._L
        pf_flops = 0.0
        pf_bytes = 0.0
        new_tokens = n
        for c, t, _ in items:
            new_tokens += t
            ctx = c + (t - 1) / 2.0 if t > 1 else float(c)
            if windowed:
                span = self._L_full * ctx + self._L_win * self._capped_mean_context(c, t)
                read = self._L_full * c + self._L_win * min(c, self.window)
            else:
                span = L * ctx
                read = L * c
            pf_flops += t * per_token + per_context * t * span
            pf_bytes += t * bytes_per_token + kv * read
        dc_flops = 0.0
        dc_bytes = 0.0
        if n:
            S = batch.decode_context
            if windowed:
                span = self._L_full * S + self._L_win * min(S, n * self.window)
            else:
                span = L * S
            dc_flops = n * per_token + per_context * span
            dc_bytes = n * bytes_per_token + kv * span
        compute_s = (
            pf_flops / self._tp / self._prefill_rate + dc_flops / self._tp / self._decode_rate
        )
        memory_s = (self._weights(new_tokens) / self._tp + (pf_bytes + dc_bytes) / self._tp) / (
            self._bandwidth
        )
        step_us = max(compute_s, memory_s) * 1e6
        if self.tp_comm:
            step_us = step_us + (self._comm_floor_us + self._comm_us_per_token * new_tokens)
        step = int(step_us)
        return step if step > 1 else 1

    def _software_step_us(self, software: SoftwareTerms, batch: BatchSummary) -> int:
        """:meth:`step_time_us` with the software terms around the layers' roofline step."""
        if not batch.prefill_items and batch.decode_requests == 0:
            return 1
        return int(software.step_us(batch, self._layers.step_time_us))

    def _capped_mean_context(self, c: int, t: int) -> float:
        """Mean over the step's new tokens j = 0..t−1 of min(c + j, W) (uncapped: ĉ)."""
        W = self.window
        if c + t - 1 <= W:
            return c + (t - 1) / 2.0 if t > 1 else float(c)
        if c >= W:
            return float(W)
        m = W - c  # tokens still inside the window
        return (m * c + m * (m - 1) / 2.0 + (t - m) * W) / t

    def decode_steps_at(self, n: int, contexts: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`step_time_us` of decode-only steps (same float operations)."""
        if self.software is not None:
            steps = self.software.decode_steps_us(n, contexts, self._layers_decode_us)
            return steps.astype(np.int64)
        S = contexts.astype(np.float64)
        if self.window > 0:
            span = self._L_full * S + self._L_win * np.minimum(S, float(n * self.window))
        else:
            span = self._L * S
        dc_flops = n * self._flops_per_token + self._flops_per_context * span
        dc_bytes = n * self._bytes_per_token + self._kv_per_layer_token * span
        # Same expressions as step_time_us with zero prefill work (x + 0.0 == x exactly).
        compute_s = 0.0 / self._tp / self._prefill_rate + dc_flops / self._tp / self._decode_rate
        memory_s = (self._weights(n) / self._tp + (0.0 + dc_bytes) / self._tp) / self._bandwidth
        step_us = np.maximum(compute_s, memory_s) * 1e6
        if self.tp_comm:
            step_us = step_us + (self._comm_floor_us + self._comm_us_per_token * n)
        return np.maximum(step_us.astype(np.int64), 1)

    def _layers_decode_us(self, n: int, contexts: np.ndarray) -> np.ndarray:
        """The layers' decode steps without the software terms, as floats for them to add to."""
        return self._layers.decode_steps_at(n, contexts).astype(np.float64)

    def queueing_time_us(self, prompt_tokens: int) -> int:
        if self.software is None:
            return int(self._a0 + self._a1 * prompt_tokens)
        return int(self._a0 + self._a1 * prompt_tokens + self.software.request_us(prompt_tokens))

    # ---- configuration -----------------------------------------------------------------------

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: LatencyContext) -> RooflineLatencyModel:
        """``latency: {model: roofline, alpha: [α0, α1, α2], mfu_prefill: .., mfu_decode: ..,
        sliding_window: true}`` — all optional; the model and GPU come from the scenario."""
        path = ctx.path
        params = expect_mapping(params, path)
        if "beta" in params:
            raise ScenarioError(
                f"{path}.beta",
                params["beta"],
                "the roofline model takes no beta coefficients; use latency.model: trained-physics "
                "for fitted corrections",
            )
        check_keys(
            params,
            (
                "alpha",
                "mfu_prefill",
                "mfu_decode",
                "sliding_window",
                "tp_comm",
                "software",
                *OVERRIDE_KEYS,
            ),
            path,
        )
        alpha: tuple[float, ...] = (0.0, 0.0, 0.0)
        if "alpha" in params:
            alpha = parse_coefficients(
                params["alpha"], f"{path}.alpha", min_len=3, max_len=3, example="[0, 0, 0]"
            )
        mfus = {
            key: as_float(params[key], f"{path}.{key}", exclusive_minimum=0, maximum=1)
            for key in ("mfu_prefill", "mfu_decode")
            if key in params
        }
        tp_comm = as_bool(params.get("tp_comm", False), f"{path}.tp_comm")
        software = SoftwareCosts.from_config(params.get("software"), f"{path}.software")
        if software is not None:
            check_plain_layout(ctx, f"{path}.software", params["software"])
        placement, common = physics_placement(params, ctx, "the roofline latency model")
        return cls(*placement, alpha=alpha, tp_comm=tp_comm, software=software, **common, **mfus)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "alpha": list(self.alpha),
            "llm": self.spec.name,
            "gpu": self.hardware.name,
            "tp": self.tp,
            "peak_tflops": self.peak_tflops,
            "bandwidth_tbs": self.hardware.bandwidth_tbs,
            "mfu_prefill": self.mfu_prefill,
            "mfu_decode": self.mfu_decode,
            "sliding_window": self.window,
            "tp_comm": self.tp_comm,
            "interconnect": None if self.interconnect is None else self.interconnect.describe(),
            **({} if self.software is None else {"software": self.software.describe()}),
            "provenance": {
                "formula": "spec/blis_reference.md §3.2 (BLIS roofline) + servesim departures "
                "(sliding-window cap, head_dim, optional TP all-reduce on the interconnect)",
                "model_config": self.spec.source or self.spec.name,
                "hardware": self.hardware.source,
            },
        }

    def __repr__(self) -> str:
        return f"RooflineLatencyModel({self.spec.name!r}, {self.hardware.name!r}, tp={self.tp})"
