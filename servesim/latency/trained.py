"""The trained-physics latency model: roofline basis functions with learned corrections
(``spec/blis_reference.md`` §3.3), with servesim's deliberate departures from BLIS (below).

Throughputs in µs units: ``F`` = peak FLOP/µs (FP8 rate for 1-byte weights on a GPU with FP8),
``BW`` = bytes/µs; no MFU. ``dh`` = the config's ``head_dim`` (not for MLA), else ``d // H`` as
BLIS; ``dq = H·dh`` (``d`` without ``head_dim``), ``dkv = Hkv·dh``; ``m`` = MLP matrices (3 gated,
2 plain); KV elements are 2 bytes, ``kEff = max(1, k)``, ``G`` = MoE group = ``TP·DP`` for MoE
else ``TP``, ``tpdp = TP·DP``. Over a batch: ``Tpf`` prefill tokens, ``Tdc`` decode requests,
``Σctx`` their context, ``A_pf = Σ 4·(H/TP)·t·(s + t/2)·dh`` (``s`` = whole prompt), ``B``
requests::

    proj(T)     = L·2T·d·(2dq + 2dkv)/tpdp
    ffnDense(T) = nDense·T·2m·d·dffDense/tpdp
    ffnMoE(T)   = nMoE·(T·kEff/G)·2m·d·dffMoE + nMoE·T·2m·d·dShared/tpdp
    Tpf_compute = (proj(Tpf) + L·A_pf/DP + ffnDense(Tpf) + ffnMoE(Tpf)) / F
    Tpf_kv      = L·2·(dkv/tpdp)·Tpf·2 / BW
    Tdc_compute = (proj(Tdc) + L·4(H/TP)·Σctx·dh/DP + ffnDense(Tdc) + ffnMoE(Tdc)) / F
    Tdc_kv      = L·2·(dkvDc/tpdp)·2·(Σctx + Tdc) / BW
    T_weight    = [L·d(2dq+2dkv)/TP + nMoE·(E/G)·m·d·dffMoE + nMoE·m·d·dShared/TP
                   + nDense·m·d·dffDense/TP]·wbpp / BW
    V(u, T)     = u·T·d·bpp·2·(TP−1)/TP / BWref
    T_tp        = V(L, T)/DP + V(nDense, T)/DP + [V(nMoE, T) if MoE, DP = 1, TP > 1]
    T_dispatch  = MoE and DP > 1: nMoE·(T/DP)·(G−1)/G·2·d·bpp/BWref (·kEff for all-to-all)
    step        = prefill_term + decode_term + β3·T_weight + β4·T_tp + βEP·T_dispatch
                  + β5·L + β6·B + β7 + β8·nMoE·[interleaved MoE] + T_link

with ``T = Tpf + Tdc``; ``prefill_term = β1a·Tpf_compute + β9·Tpf_kv`` (≥ 9 betas, else
``β1·max(..)``) and likewise ``decode_term`` with β2a/β10 (≥ 10 betas). ``step_time_us =
max(1, trunc(step))``; an empty batch takes 1 µs. α: ``queueing_time_us = trunc(α0)``,
``post_decode_overhead_us = trunc(α1)``, ``output_token_time_us = trunc(α2)``.

Departures from BLIS (head_dim, MLP matrices, interconnect, decode attention, sliding windows,
prefill floor, routed experts touched): listed in ``servesim/latency/trained_terms.py``.

Coefficients default to the BLIS fit bundled in ``data/trained_physics.yaml``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servesim.latency.base import BatchSummary, ClosedFormDecodeModel, LatencyContext
from servesim.latency.hardware import HardwareSpec
from servesim.latency.interconnect import (
    OVERRIDE_KEYS,
    REFERENCE_HBM_TBS,
    Interconnect,
    interconnect_of,
)
from servesim.latency.modelspec import ModelSpec
from servesim.latency.moe_routing import ExpertRouting
from servesim.latency.roofline import parse_coefficients, physics_placement
from servesim.latency.tensor_parallel import check_tensor_parallel
from servesim.latency.trained_terms import (  # noqa: F401 (re-exported)
    BLIS_BETA10,
    DECODE_ATTENTION_BASES,
    DECODE_KV_SHARE,
    DECODE_REFERENCE_GROUP,
    DEFAULT_MOE_COMM_BACKEND,
    KERNEL_KV_READ,
    KV_ELEMENT_BYTES,
    MOE_COMM_BACKENDS,
    MOE_WEIGHT_READS,
    PREFILL_FLOOR,
    TRAINED_OPTIONS,
    check_options,
    decode_kv_width,
    trained_options,
)
from servesim.simcore.config import as_int, as_str, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register

COEFFICIENTS_FILE = Path(__file__).parent / "data" / "trained_physics.yaml"
_COEFFICIENTS_DISPLAY = "servesim/latency/data/trained_physics.yaml"


@functools.lru_cache(maxsize=1)
def default_coefficients() -> tuple[tuple[float, ...], tuple[float, ...], dict[str, Any]]:
    """(alpha, beta, source provenance) from the bundled ``trained_physics.yaml``."""
    data = yaml.safe_load(COEFFICIENTS_FILE.read_text(encoding="utf-8"))
    alpha = tuple(float(x) for x in data["alpha"])
    beta = tuple(float(x) for x in data["beta"])
    return alpha, beta, dict(data["source"])


@register("latency", "trained-physics")
class TrainedPhysicsLatencyModel(ClosedFormDecodeModel):
    """Roofline basis functions (compute, KV traffic, weights, TP/EP communication) weighted by
    learned coefficients, plus per-layer, per-request and per-step overheads (spec §3.3)."""

    name = "trained-physics"

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        tp: int = 1,
        *,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        dp: int = 1,
        moe_comm_backend: str = DEFAULT_MOE_COMM_BACKEND,
        sliding_window: bool = True,
        decode_attention: str = "query-heads",
        interconnect_gbs: float | None = None,
        interconnect_latency_us: float | None = None,
        interconnect: str | None = None,
        provenance: Mapping[str, Any] | None = None,
        path: str = "latency",
        prefill_floor: float | None = None,
        moe_weights: str = "touched",
        expert_skew: float = 0.0,
    ):
        default_alpha, default_beta, _ = default_coefficients()
        if prefill_floor is None:  # guards the bundled fit; a β fitted for a server is as fitted
            prefill_floor = PREFILL_FLOOR if beta is None else 0.0
        alpha = default_alpha if alpha is None else tuple(float(x) for x in alpha)
        beta = default_beta if beta is None else tuple(float(x) for x in beta)
        if len(alpha) != 3:
            raise ScenarioError(f"{path}.alpha", list(alpha), "expected exactly 3 numbers")
        if not 7 <= len(beta) <= 11:
            raise ScenarioError(f"{path}.beta", list(beta), "expected 7 to 11 numbers")
        for key, values in (("alpha", alpha), ("beta", beta)):
            for i, value in enumerate(values):
                if not (value >= 0 and math.isfinite(value)):
                    raise ScenarioError(f"{path}.{key}[{i}]", value, "must be a finite number >= 0")
        check_tensor_parallel(model, tp, "tp", kv_heads_divisible=True)
        if model.intermediate_size <= 0:
            raise ScenarioError(
                "model",
                model.source or model.name,
                "the trained-physics model needs config field 'intermediate_size' > 0",
            )
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            raise ScenarioError(f"{path}.dp", dp, "data parallelism must be a positive integer")
        if dp > 1 and not model.is_moe:
            raise ScenarioError(
                f"{path}.dp",
                dp,
                f"{model.name} is dense: data parallelism inside an instance is modelled for "
                "mixture-of-experts models only; use more instances instead",
            )
        if decode_attention not in DECODE_ATTENTION_BASES:
            raise ScenarioError(
                f"{path}.decode_attention",
                decode_attention,
                f"expected one of {', '.join(DECODE_ATTENTION_BASES)}",
            )
        check_options(prefill_floor, moe_weights, expert_skew, path)
        if moe_comm_backend not in MOE_COMM_BACKENDS:
            raise ScenarioError(
                f"{path}.moe_comm_backend",
                moe_comm_backend,
                f"unknown MoE communication backend; known: {', '.join(MOE_COMM_BACKENDS)}",
            )

        self.spec = model
        self.hardware = hardware
        self.tp = tp
        self.dp = dp
        self.moe_comm_backend = moe_comm_backend
        self.decode_attention = decode_attention
        self.interconnect: Interconnect | None = interconnect_of(
            hardware,
            gbs=interconnect_gbs,
            latency_us=interconnect_latency_us,
            kind=interconnect,
            path=path,
        )
        self.alpha = alpha
        self.beta = beta
        self.prefill_floor = float(prefill_floor)
        self.moe_weights = moe_weights
        self.provenance: dict[str, Any] = dict(provenance) if provenance else {"source": "explicit"}
        self.output_token_time_us = int(alpha[2])
        self.post_decode_overhead_us = int(alpha[1])
        self._queueing = int(alpha[0])

        # 7 betas → β8 = 0; fewer than 11 → βEP = β4.
        b = list(beta) + [0.0] * (11 - len(beta))
        if len(beta) < 11:
            b[10] = b[3]
        self._b = tuple(b)
        self._prefill_split = len(beta) >= 9
        self._decode_split = len(beta) >= 10

        n_moe, n_dense = model.moe_layer_split
        self._L = float(model.num_layers)
        self._d = float(model.hidden_size)
        self._H = float(model.num_heads)
        heads_kv = model.num_kv_heads or model.num_heads
        # An explicit head_dim is honoured (BLIS uses hidden // heads); without one, BLIS's
        # integer division and its d-sized Q/O projections are kept exactly.
        head_dim = (
            model.explicit_head_dim
            if model.projection_head_dim_explicit
            else model.hidden_size // model.num_heads
        )
        self._dh = float(head_dim)
        self._dq = float(model.q_dim)
        self._dkv = float(heads_kv * head_dim)
        self._dkv_decode = self._dkv
        if decode_attention == "query-heads":
            self._dkv_decode = decode_kv_width(
                self._dkv, model.num_heads, heads_kv, self._dh, hardware.bandwidth_tbs
            )
        m = float(model.mlp_matrices)  # 3 gated (SwiGLU), 2 plain (OPT); BLIS always 3
        self._mlp_w = m
        self._mlp_f = 2.0 * m
        dff = model.intermediate_size
        self._dff_moe = float(model.moe_intermediate_size or dff)
        self._dff_dense = float(model.dense_intermediate_size or dff)
        self._d_shared = float(model.shared_expert_intermediate_size)
        self._k_eff = float(max(1, model.num_experts_per_tok))
        self._experts = float(model.num_experts)
        self._is_moe = model.is_moe
        self._n_moe = float(n_moe)
        self._n_dense = float(n_dense)
        self._interleaved = model.is_moe and model.interleave_moe_layer_step > 0
        self._tpf = float(tp)
        self._dpf = float(dp)
        self._tpdp = float(tp) * float(dp)
        self._group = float(tp * dp) if model.is_moe else float(tp)
        self._h_per_gpu = self._H / self._tpf
        self._wbpp = model.weight_bytes_per_param
        self._abpp = model.bytes_per_param
        fp8 = self._wbpp == 1.0 and hardware.tflops_fp8 > 0
        self.peak_tflops = hardware.tflops_fp8 if fp8 else hardware.tflops_bf16
        self._F = self.peak_tflops * 1e6
        self._BW = hardware.bandwidth_tbs * 1e6
        self._all2all = MOE_COMM_BACKENDS[moe_comm_backend] == "all2all"
        self._tp_factor = float(tp - 1) / float(tp)
        # Collectives: BLIS's β4/βEP terms as fitted, at the reference H100's HBM bandwidth, plus
        # the physical excess of this GPU's fabric over H100 NVLink (servesim/latency/interconnect.py).
        # An unknown interconnect keeps BLIS's basis at this GPU's own HBM bandwidth.
        link = self.interconnect
        self._comm_bw = self._BW if link is None else REFERENCE_HBM_TBS * 1e6
        floor = 0.0
        per_token = 0.0
        if link is not None:
            token_bytes = self._d * self._abpp
            if tp > 1:
                # The all-reduces T_tp counts: L + nDense (each on T/DP tokens), + nMoE at DP = 1.
                collectives = self._L + self._n_dense
                per_token += (
                    collectives
                    / self._dpf
                    * token_bytes
                    * link.excess_us_per_byte(tp, "all_reduce")
                )
                if model.is_moe and n_moe > 0 and dp == 1:
                    collectives += self._n_moe
                    per_token += (
                        self._n_moe * token_bytes * link.excess_us_per_byte(tp, "all_reduce")
                    )
                floor += collectives * link.excess_floor_us(tp, "all_reduce")
            if model.is_moe and dp > 1:
                # Dispatch and combine per MoE layer, over the G = TP·DP expert group.
                group = tp * dp
                routed = self._k_eff if self._all2all else 0.0
                per_token += (
                    2.0 * self._n_moe / self._dpf * token_bytes
                    * link.dispatch_excess_us_per_byte(group, routed)
                )  # fmt: skip
                op = "all_to_all" if self._all2all else "all_gather"
                floor += 2.0 * self._n_moe * link.excess_floor_us(group, op)
        self._comm_excess_per_token = per_token
        self.comm_floor_us = floor

        window = model.sliding_window if sliding_window else 0
        self.window = window if model.num_sliding_layers > 0 else 0
        self._L_win = float(model.num_sliding_layers) if self.window else 0.0
        self._L_full = self._L - self._L_win

        L, d, dq, dkv, wbpp, tpf = self._L, self._d, self._dq, self._dkv, self._wbpp, self._tpf
        bytes_fixed = L * d * (2 * dq + 2 * dkv) * wbpp / tpf  # read whatever the batch
        if n_moe > 0 and self._d_shared > 0:
            bytes_fixed += self._n_moe * m * d * self._d_shared * wbpp / tpf
        if n_dense > 0:
            bytes_fixed += self._n_dense * 1 * m * d * self._dff_dense * wbpp / tpf
        self._t_fixed_weight_us = bytes_fixed / self._BW
        # one routed expert's weights over the MoE layers; a step reads those its tokens touch
        self._t_expert_us = self._n_moe * m * d * self._dff_moe * wbpp / self._BW if n_moe else 0.0
        self._set_expert_group(self._group, expert_skew)
        self._moe_overhead = (
            self._b[7] * (1.0 if self._interleaved else 0.0) * self._n_moe
        )  # β8·nMoE (interleaved archs only)

    def _set_expert_group(self, gpus: float, skew: float) -> None:
        """Hold ``E/gpus`` routed experts per GPU: the all-experts weight read (BLIS's
        ``T_weight``), and the routing statistics (``servesim/latency/moe_routing.py``)."""
        self._group = float(gpus)
        self.t_weight_us = self._t_fixed_weight_us + self._t_expert_us * self._experts / gpus
        self.routing = None
        self._routed_share = 1.0 / gpus  # of the routed picks, on the busiest GPU
        if self._is_moe and self._n_moe > 0:
            k = max(1, min(self.spec.num_experts_per_tok, self.spec.num_experts))
            self.routing = ExpertRouting(self.spec.num_experts, k, skew, round(gpus))
            self._routed_share = self.routing.busiest_share

    def _weight_us(self, tokens: float) -> float:
        """Weight read of a step computing ``tokens`` tokens (before β3): every non-routed
        weight, and the routed experts the tokens touch (all of them with ``moe_weights: all``)."""
        if self.routing is None or self.moe_weights == "all":
            return self.t_weight_us
        touched = self.routing.touched_per_gpu(tokens)
        return self._t_fixed_weight_us + self._t_expert_us * touched

    def _prefill_term(self, t_compute: float, t_kv: float) -> float:
        """BLIS's prefill term, never faster than the prefill FLOPs at ``prefill_floor`` × the
        peak-FLOPs time."""
        b = self._b
        if self._prefill_split:
            term = b[0] * t_compute + b[8] * t_kv
        else:
            term = b[0] * max(t_compute, t_kv)
        floor = self.prefill_floor * t_compute
        return term if term > floor else floor

    # ---- basis functions ---------------------------------------------------------------------

    def _ffn_flops(self, tokens: float) -> float:
        d = self._d
        flops = 0.0
        if self._n_moe > 0:
            per_gpu_tokens = tokens * self._k_eff * self._routed_share
            flops += self._n_moe * per_gpu_tokens * self._mlp_f * d * self._dff_moe
            if self._d_shared > 0:
                flops += self._n_moe * tokens * self._mlp_f * d * self._d_shared / self._tpdp
        if self._n_dense > 0:
            flops += self._n_dense * tokens * 1 * self._mlp_f * d * self._dff_dense / self._tpdp
        return flops

    def _all_reduce(self, units: float, tokens: float) -> float:
        """V(units, tokens): ring all-reduce basis, µs before β4 (0 at TP = 1), in H100-equivalent
        units of the interconnect (= BLIS's HBM basis on an H100)."""
        return units * tokens * self._d * self._abpp * 2.0 * self._tp_factor / self._comm_bw

    def _comm(self, tokens: float) -> tuple[float, float]:
        """(T_tp, T_dispatch) for a step computing ``tokens`` tokens."""
        t_tp = 0.0
        if self.tp > 1:
            t_tp = (
                self._all_reduce(self._L, tokens) / self._dpf
                + self._all_reduce(self._n_dense, tokens) / self._dpf
            )
            if self._is_moe and self._n_moe > 0 and self.dp == 1:
                t_tp += self._all_reduce(self._n_moe, tokens)
        t_dispatch = 0.0
        if self._is_moe and self.dp > 1:
            group = self._group
            if self._all2all:
                comm_tokens = (tokens / self._dpf) * self._k_eff * (group - 1) / group * 2
                basis = comm_tokens * self._d * self._abpp / self._comm_bw
            else:
                basis = (
                    (tokens / self._dpf)
                    * (group - 1)
                    / group
                    * 2
                    * self._d
                    * self._abpp
                    / self._comm_bw
                )
            t_dispatch = basis * self._n_moe
        return t_tp, t_dispatch

    def _decode_basis(self, n: int, S: Any) -> tuple[Any, Any]:
        """(Tdc_compute, Tdc_kv) for ``n`` decode requests with total context ``S`` (a float or
        an array of floats; the same operations either way)."""
        L, d, dq, dkv = self._L, self._d, self._dq, self._dkv
        dkv_decode = self._dkv_decode
        flops_proj = L * 2 * n * d * (2 * dq + 2 * dkv) / self._tpdp
        if self.window:
            cap = float(n * self.window)
            capped = np.minimum(S, cap) if isinstance(S, np.ndarray) else min(S, cap)
            span = self._L_full * S + self._L_win * capped
            flops_attn = 4 * self._h_per_gpu * span * self._dh / self._dpf
            kv_tokens = self._L_full * (S + n) + self._L_win * (capped + n)
            t_kv = 2 * (dkv_decode / self._tpdp) * KV_ELEMENT_BYTES * kv_tokens / self._BW
        else:
            flops_attn = L * 4 * self._h_per_gpu * S * self._dh / self._dpf
            t_kv = L * 2 * (dkv_decode / self._tpdp) * KV_ELEMENT_BYTES * (S + n) / self._BW
        t_compute = (flops_proj + flops_attn + self._ffn_flops(float(n))) / self._F
        return t_compute, t_kv

    # ---- the model ---------------------------------------------------------------------------

    def step_time_us(self, batch: BatchSummary) -> int:
        return self._step_us(batch, batch.prefill_tokens + batch.decode_requests)

    def _step_us(self, batch: BatchSummary, routed_tokens: float) -> int:
        """The step of ``batch``, its weight read set by the ``routed_tokens`` tokens that pick
        experts (the batch's own, or an expert group's)."""
        items = batch.prefill_items
        n = batch.decode_requests
        if not items and n == 0:
            return 1
        b = self._b
        prefill_term = 0.0
        pf_tokens = 0.0
        if items:
            h = self._h_per_gpu
            dh = self._dh
            attn = 0.0
            attn_win = 0.0
            window = self.window
            for _, t, s in items:
                pf_tokens += t
                attn += 4 * h * t * (s + t / 2) * dh
                if window:
                    attn_win += 4 * h * t * min(s + t / 2, window) * dh
            L, d, dq, dkv = self._L, self._d, self._dq, self._dkv
            flops_proj = L * 2 * pf_tokens * d * (2 * dq + 2 * dkv) / self._tpdp
            if window:
                flops_attn = (self._L_full * attn + self._L_win * attn_win) / self._dpf
            else:
                flops_attn = L * attn / self._dpf
            t_compute = (flops_proj + flops_attn + self._ffn_flops(pf_tokens)) / self._F
            t_kv = L * 2 * (dkv / self._tpdp) * pf_tokens * KV_ELEMENT_BYTES / self._BW
            prefill_term = self._prefill_term(t_compute, t_kv)
        decode_term = 0.0
        if n:
            t_compute, t_kv = self._decode_basis(n, float(batch.decode_context))
            if self._decode_split:
                decode_term = b[1] * t_compute + b[9] * t_kv
            else:
                decode_term = b[1] * max(t_compute, t_kv)
        t_tp, t_dispatch = self._comm(pf_tokens + n)
        step = (
            prefill_term
            + decode_term
            + b[2] * self._weight_us(routed_tokens)
            + b[3] * t_tp
            + b[10] * t_dispatch
            + b[4] * self._L
            + b[5] * float(len(items) + n)
            + b[6]
            + self._moe_overhead
            + (self.comm_floor_us + self._comm_excess_per_token * (pf_tokens + n))
        )
        steps = int(step)
        return steps if steps > 1 else 1

    def decode_steps_at(self, n: int, contexts: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`step_time_us` of decode-only steps (same float operations)."""
        b = self._b
        S = contexts.astype(np.float64)
        t_compute, t_kv = self._decode_basis(n, S)
        if self._decode_split:
            decode_term = b[1] * t_compute + b[9] * t_kv
        else:
            decode_term = b[1] * np.maximum(t_compute, t_kv)
        t_tp, t_dispatch = self._comm(0.0 + n)
        step = (
            0.0
            + decode_term
            + b[2] * self._weight_us(n)
            + b[3] * t_tp
            + b[10] * t_dispatch
            + b[4] * self._L
            + b[5] * float(n)
            + b[6]
            + self._moe_overhead
            + (self.comm_floor_us + self._comm_excess_per_token * (0.0 + n))
        )
        return np.maximum(step.astype(np.int64), 1)

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return self._queueing

    # ---- configuration -----------------------------------------------------------------------

    @classmethod
    def from_config(
        cls, params: Mapping[str, Any], ctx: LatencyContext
    ) -> TrainedPhysicsLatencyModel:
        """``latency: {model: trained-physics}`` with optional ``alpha`` (3 numbers), ``beta``
        (7–11 numbers), ``dp``, ``moe_comm_backend``, ``sliding_window``, ``decode_attention``
        (``query-heads``/``kv``), ``prefill_floor``, ``moe_weights`` (``touched``/``all``),
        ``expert_skew``, ``interconnect_gbs`` and ``interconnect_latency_us``."""
        path = ctx.path
        params = expect_mapping(params, path)
        check_keys(
            params,
            (
                "alpha",
                "beta",
                "dp",
                "moe_comm_backend",
                "sliding_window",
                "decode_attention",
                *TRAINED_OPTIONS,
                *OVERRIDE_KEYS,
            ),
            path,
        )
        default_alpha, default_beta, source = default_coefficients()
        alpha, beta = default_alpha, default_beta
        provenance: dict[str, Any] = {
            "source": "bundled",
            "file": _COEFFICIENTS_DISPLAY,
            "upstream": f"{source['repo']}@{source['commit']}:{source['file']} ({source['key']})",
        }
        if "alpha" in params:
            alpha = parse_coefficients(
                params["alpha"], f"{path}.alpha", min_len=3, max_len=3, example="[15000, 800, 45]"
            )
        if "beta" in params:
            beta = parse_coefficients(
                params["beta"],
                f"{path}.beta",
                min_len=7,
                max_len=11,
                example=str(list(default_beta)),
            )
        overridden = [key for key in ("alpha", "beta") if key in params]
        if overridden:
            provenance = {
                "source": "scenario" if len(overridden) == 2 else "bundled + scenario",
                "scenario": overridden,
                "defaults": provenance,
            }
        dp = as_int(params.get("dp", 1), f"{path}.dp", minimum=1)
        backend = as_str(
            params.get("moe_comm_backend", DEFAULT_MOE_COMM_BACKEND),
            f"{path}.moe_comm_backend",
            choices=list(MOE_COMM_BACKENDS),
        )
        decode_attention = as_str(
            params.get("decode_attention", "query-heads"),
            f"{path}.decode_attention",
            choices=list(DECODE_ATTENTION_BASES),
        )
        placement, common = physics_placement(params, ctx, "the trained-physics latency model")
        return cls(
            *placement,
            alpha=alpha,
            beta=beta,
            dp=dp,
            moe_comm_backend=backend,
            decode_attention=decode_attention,
            provenance=provenance,
            **trained_options(params, path, bundled_beta="beta" not in params),
            **common,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "alpha": list(self.alpha),
            "beta": list(self.beta),
            "llm": self.spec.name,
            "gpu": self.hardware.name,
            "tp": self.tp,
            "dp": self.dp,
            "moe_comm_backend": self.moe_comm_backend,
            "peak_tflops": self.peak_tflops,
            "bandwidth_tbs": self.hardware.bandwidth_tbs,
            "sliding_window": self.window,
            "decode_attention": self.decode_attention,
            "prefill_floor": self.prefill_floor,
            "moe_weights": self.moe_weights,
            **({"routing": self.routing.describe()} if self.routing is not None else {}),
            "interconnect": None if self.interconnect is None else self.interconnect.describe(),
            "comm_floor_us": self.comm_floor_us,
            "provenance": {
                **self.provenance,
                "formula": "spec/blis_reference.md §3.3 (BLIS trained-physics) + servesim departures "
                "(sliding-window cap, head_dim, MLP matrices, interconnect, decode attention split; "
                "docs/explanation/latency-models.md)",
                "model_config": self.spec.source or self.spec.name,
                "hardware": self.hardware.source,
            },
        }

    def __repr__(self) -> str:
        return (
            f"TrainedPhysicsLatencyModel({self.spec.name!r}, {self.hardware.name!r}, "
            f"tp={self.tp}, dp={self.dp})"
        )
