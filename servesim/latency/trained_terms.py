"""The constants of the trained-physics latency model (``servesim/latency/trained.py``): BLIS's
fixed choices, servesim's departures from them, and the parameters that select them.

Departures from BLIS (each leaves BLIS's number unchanged where BLIS's assumption holds; see
docs/explanation/latency-models.md):

* explicit ``head_dim`` — BLIS uses ``d // H`` and ``d``-wide Q/O projections;
* ``m`` MLP matrices — BLIS always counts 3 (OPT's 2-matrix MLP is 3/2 too heavy there);
* interconnect — ``BWref`` is the reference H100's HBM bandwidth (BLIS: this GPU's), and
  ``T_link`` adds each collective's physical excess over H100 NVLink (latency floor, bandwidth;
  ``servesim/latency/interconnect.py``); a GPU without interconnect fields keeps BLIS's basis;
* decode attention — ``dkvDc = dkv`` from 4 query heads per KV head up (BLIS), below that
  ``κ·dkv + (1−κ)·(H/4)·dh`` with κ = 1.107/1.947 the kernel-measured KV-read share of β10;
  ``decode_attention: kv`` restores BLIS's basis;
* decode remainder at the reference bandwidth — the part (1−κ) of β10 beyond the kernel's KV
  read is no bandwidth cost (BLIS fitted it on H100 runs): it is priced at the reference
  H100's HBM bandwidth on every GPU, as the communication terms are (``decode_kv_width``);
* sliding windows — on windowed layers the attention span and the KV traffic are capped at the
  window (decode: ``min(Σctx, Tdc·W)``, the batch-average cap).
* prefill floor — a step's prefill FLOPs take at least ``prefill_floor`` × their time at the
  GPU's peak rate: ``prefill_term = max(β1a·Tpf_compute + β9·Tpf_kv, floor·Tpf_compute)``.
  BLIS's bundled β1a = 0.152, one fit across GPUs, prices prefill at 6.6× the peak rate, which
  no GPU reaches (the measured RTX PRO 6000 runs: ~44 µs per Llama-3.1-8B prompt token, 29 µs at
  peak). Default 1.25 (the measured GEMM rate, :data:`PREFILL_FLOOR`) with the bundled β, 0
  (BLIS) when the scenario gives its own fitted ``beta``; ``prefill_floor: 0`` restores BLIS;
* routed experts touched — ``T_weight`` reads the routed experts the step's tokens touch,
  ``nEff(T)/G`` per GPU (``moe_routing.py``; BLIS's own roofline ``nEff``), not all ``E/G``: a
  lone decoding request reads ``k`` experts per layer; ``moe_weights: all`` restores BLIS. With
  ``expert_skew`` > 0 (Zipf popularity) fewer distinct experts are touched and the busiest GPU
  of the group computes its expected share of the routed tokens instead of ``1/G``.

"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from servesim.latency.interconnect import REFERENCE_HBM_TBS
from servesim.latency.moe_routing import check_skew
from servesim.simcore.config import as_float, as_str
from servesim.simcore.errors import ScenarioError

KV_ELEMENT_BYTES = 2.0
"""The KV cache is costed at 2 bytes per element whatever the weights' precision (BLIS)."""

MOE_COMM_BACKENDS: Mapping[str, str] = {
    "naive": "allgather",
    "allgather_reducescatter": "allgather",
    "pplx": "all2all",
    "deepep_high_throughput": "all2all",
    "deepep_low_latency": "all2all",
    "mori": "all2all",
    "flashinfer_all2allv": "all2all",
}
"""vLLM MoE dispatch/combine backends → volume family (all-gather moves dense hidden states;
all-to-all moves top-k routed tokens)."""
DEFAULT_MOE_COMM_BACKEND = "allgather_reducescatter"

PREFILL_FLOOR = 1.25
"""Least time of a prefill's FLOPs, in units of their time at the datasheet's peak rate. vLLM's
bf16 GEMMs of 1k–4k rows take 1.23–1.27× it on an H100 (aiconfigurator's GEMM table, vLLM 0.24,
196 shapes per row count), and 1.26 (2k rows) to 1.33 (1k) on an RTX PRO 6000 (LLMServingSim's
profile of Llama-3.1-8B's four GEMMs, vLLM 0.19); ``bench/gemm_rate_fit.py``. BLIS's β1a (0.152) prices them at 6.6× the peak
rate; 1 is the peak itself, 0 restores BLIS. The default with the bundled β only: a β fitted for
one server (``beta:``) is taken as fitted."""

MOE_WEIGHT_READS = ("touched", "all")
"""``touched`` (default): a step reads the routed experts its tokens touch (expected, see
moe_routing.py); ``all``: every expert on the GPU, as BLIS's ``T_weight``."""

DECODE_ATTENTION_BASES = ("query-heads", "kv")
"""``query-heads`` (default): servesim's split of the decode attention basis (see the module
docstring); ``kv``: BLIS's, all of it proportional to the KV bytes."""

KERNEL_KV_READ = 1.107
"""Time of vLLM's FlashAttention-3 decode kernel per byte of KV it reads, in units of the peak
HBM time (bytes/BW), least-squares fit on the H100 decode-attention kernel table
(aiconfigurator, vLLM 0.24, bf16 KV, 5,110 shapes, 1 to 64 query heads per KV head, mean error 8 %;
bench/decode_attention_fit.py):
``t = 12.0 µs + 0.0095 µs·B + 1.107·KV/BW + 0.0001·Q/BW`` — no query-head term."""

BLIS_BETA10 = 1.94710771
"""BLIS's fitted decode KV coefficient (bundled ``trained_physics.yaml``), the reference the split
shares out."""

DECODE_KV_SHARE = KERNEL_KV_READ / BLIS_BETA10
"""Share κ of the decode attention basis that is the KV read itself (≈ 0.569)."""

DECODE_REFERENCE_GROUP = 4.0
"""Query heads per KV head from which the decode basis is BLIS's: the smallest group of the GQA
models behind BLIS's fit (Llama-3.1-8B, Mistral-Nemo, Mixtral; the others have 5 to 8)."""



def decode_kv_width(
    dkv: float, heads: int, heads_kv: int, head_dim: float, bandwidth_tbs: float
) -> float:
    """``dkvDc``: the width per context token the decode term ``β10·Tdc_kv`` is priced with.

    β10 (1.947) is a KV read and a remainder. The read, κ = 1.107/1.947 of it, is the attention
    kernel reading the KV cache (H100 kernel table): it scales with the KV bytes and this GPU's
    bandwidth. The remainder is no kernel time: it scales with the query heads (BLIS's basis from
    4 query heads per KV head up, ``(H/4)·dh`` below) and, fitted on H100 runs, costs the
    time it took there: it is priced at the reference H100's HBM bandwidth whatever this GPU's,
    like BLIS's communication terms. On an H100 (3.35 TB/s) from group 4 up this is BLIS's
    ``dkv`` exactly."""
    rest = dkv if heads >= DECODE_REFERENCE_GROUP * heads_kv else heads / DECODE_REFERENCE_GROUP * head_dim
    scale = bandwidth_tbs / REFERENCE_HBM_TBS
    if rest == dkv and scale == 1.0:
        return dkv
    return DECODE_KV_SHARE * dkv + (1.0 - DECODE_KV_SHARE) * rest * scale


TRAINED_OPTIONS = ("prefill_floor", "moe_weights", "expert_skew")
"""The scenario keys of the departures above that a scenario may set."""


def check_options(prefill_floor: Any, moe_weights: Any, expert_skew: Any, path: str) -> None:
    """Refuse a bad constructor argument of :data:`TRAINED_OPTIONS`, naming its field."""
    if (
        isinstance(prefill_floor, bool)
        or not isinstance(prefill_floor, (int, float))
        or not (0 <= prefill_floor < math.inf)
    ):
        raise ScenarioError(
            f"{path}.prefill_floor", prefill_floor, "expected a number >= 0 (1 = peak FLOPs)"
        )
    if moe_weights not in MOE_WEIGHT_READS:
        raise ScenarioError(
            f"{path}.moe_weights", moe_weights, f"expected one of {', '.join(MOE_WEIGHT_READS)}"
        )
    check_skew(expert_skew, f"{path}.expert_skew")


def trained_options(params: Mapping[str, Any], path: str, bundled_beta: bool) -> dict[str, Any]:
    """The keyword arguments of :data:`TRAINED_OPTIONS` given in ``params``, validated; the
    prefill floor defaults to :data:`PREFILL_FLOOR` with the bundled β, to 0 with a fitted one."""
    out: dict[str, Any] = {"prefill_floor": PREFILL_FLOOR if bundled_beta else 0.0}
    if "prefill_floor" in params:
        out["prefill_floor"] = as_float(params["prefill_floor"], f"{path}.prefill_floor", minimum=0)
    if "moe_weights" in params:
        out["moe_weights"] = as_str(
            params["moe_weights"], f"{path}.moe_weights", choices=list(MOE_WEIGHT_READS)
        )
    if "expert_skew" in params:
        out["expert_skew"] = check_skew(params["expert_skew"], f"{path}.expert_skew")
    return out
