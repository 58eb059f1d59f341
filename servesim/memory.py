"""Where a GPU's memory goes when it serves a model: ``servesim memory``.

:func:`memory_breakdown` splits an instance's memory the way vLLM's start-up profiling does:
weights (by part, per GPU), the activation peak of a dummy forward pass of
``max_num_batched_tokens`` tokens and of the sampler (by term), non-torch memory, CUDA-graph
memory (when attributed) and the KV cache, and says how many sequences of a given context length
fit at once. The KV block count is exactly what ``engine.kv_blocks: auto`` gives the simulator
(:func:`~servesim.latency.kvcapacity.auto_kv_blocks`): the weight estimate counts every weight at the
config's weight precision (its quantized width, with the block-scale overhead of MXFP4/NVFP4),
the activation peak comes from the model's shape
(:func:`~servesim.latency.kvcapacity.activation_peak_bytes`).

Sliding-window layers hold at most ``sliding_window`` tokens of a sequence; the per-sequence KV
figures and the concurrency at a context length account for that (the block count does not
depend on it).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from servesim.latency.hardware import HardwareSpec, resolve_gpu
from servesim.latency.kvcapacity import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    GIB,
    activation_peak_bytes,
    auto_kv_blocks,
    auto_max_model_len,
    kv_bytes_per_token,
    kv_capacity,
    minimum_gpus,
    rank_weights_bytes,
    weight_params,
)
from servesim.latency.modelindex import ModelInfo, resolve_model
from servesim.latency.modelspec import ModelSpec
from servesim.latency.parallel import Parallelism, check_parallelism, stage_layers
from servesim.latency.tensor_parallel import check_tensor_parallel
from servesim.simcore.commands import Command
from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger

__all__ = ["add_memory_parser", "cmd_memory", "format_breakdown", "memory_breakdown"]

_WEIGHT_PARTS = (
    "embeddings",
    "attention",
    "norms",
    "dense_mlp",
    "experts",
    "shared_experts",
    "router",
    "lm_head",
)
_SHARDED_BY_EP = frozenset({"experts"})


def _quantization(spec: ModelSpec) -> str:
    if spec.quantized_bytes_per_param <= 0:
        return "none"
    bits = spec.quantized_bytes_per_param * 8
    method = spec.quant_method or "from the model name"
    return f"{method}, {bits:g} bits/weight"


def _spec_of(model: ModelInfo | ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    info = resolve_model(model, "model") if isinstance(model, str) else model
    return info.require_spec("model", "the memory breakdown")


def memory_breakdown(
    model_info: ModelInfo | ModelSpec | str,
    gpu: HardwareSpec | str,
    tp: int,
    block_size: int = 16,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    context_len: int | None = None,
    *,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    cuda_graph_gib: float = 0.0,
    parallel: Any = None,
) -> dict[str, Any]:
    """The memory of one ``tp``-GPU instance, as a JSON-ready dict (bytes unless named ``_gib``).

    ``parallel`` (a :class:`~servesim.latency.parallel.Parallelism`) gives the terms of one
    data-parallel rank instead (routed experts over ``dp·tp`` GPUs with dp or ep, the largest
    pipeline stage's layers and KV, KV blocks × cp), under ``parallel``: the layout, the rank's
    GPUs and the stages' layers.

    Keys: ``model``, ``gpu``, ``tp``, ``block_size``, ``gpu_memory_utilization``, ``attention``
    (MHA/GQA/MQA/MLA), ``sliding_window``/``sliding_layers``, ``quantization``,
    ``weight_bytes_per_param``, ``weights`` (bytes per part, all GPUs), ``weights_per_gpu``
    (per part: TP-sharded; routed experts sharded over the expert-parallel group, which is the
    tp GPUs, whole experts each), ``experts_per_gpu``, ``weights_total``/``weights_total_per_gpu``,
    ``kv_bytes_per_token`` (per GPU, full attention), ``kv_bytes_per_token_all_gpus``,
    ``max_num_batched_tokens``, ``max_num_seqs``, ``activation`` (bytes per GPU by term:
    residual, attention, mlp, forward, sampler, peak), and per GPU in GiB ``requested_gib``
    (memory × utilisation), ``weights_gib_per_gpu``, ``activation_peak_gib``,
    ``non_torch_gib``, ``cuda_graph_gib``, ``kv_cache_gib_per_gpu``; over all GPUs
    ``available_gib`` (tp × memory × utilisation), ``weights_gib``, ``overhead_gib``,
    ``feasible``; when feasible ``kv_cache_bytes``,
    ``per_block_bytes``, ``kv_blocks``, ``kv_tokens``, and at ``context_len`` (default: the
    model's max length) ``kv_bytes_per_sequence`` (per GPU, window-capped),
    ``blocks_per_sequence`` and ``max_concurrent_sequences``; when not feasible ``min_gpus``
    (smallest GPU count that holds the weights and reserves) and ``min_tp`` (smallest valid tp).
    """
    spec = _spec_of(model_info)
    hardware = resolve_gpu(gpu, "gpu") if isinstance(gpu, str) else gpu
    check_tensor_parallel(spec, tp, "tp")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ScenarioError("block_size", block_size, "must be a positive integer")
    if not (0 < gpu_memory_utilization <= 1) or not math.isfinite(gpu_memory_utilization):
        raise ScenarioError("gpu_memory_utilization", gpu_memory_utilization, "must be in (0, 1]")
    if context_len is not None and (isinstance(context_len, bool) or context_len < 1):
        raise ScenarioError("context_len", context_len, "must be a positive integer")

    wbpp = spec.weight_bytes_per_param
    params = weight_params(spec)
    weights = {part: int(float(params[part]) * wbpp) for part in _WEIGHT_PARTS}
    # Every part is split over the tp GPUs: tensor-sharded, or (routed experts, with expert
    # parallelism) whole experts per GPU; the bytes per GPU are the same either way.
    per_gpu = {part: weights[part] / tp for part in _WEIGHT_PARTS}
    total_weights = int(float(sum(params.values())) * wbpp)  # = weights_bytes(spec)
    plain = parallel is None or parallel.plain
    rank_gpus = tp if plain else parallel.rank_gpus(tp)
    total_per_gpu = total_weights / tp
    if not plain:
        check_parallelism(spec, tp, parallel, "parallel")
        per_gpu = _rank_weights(spec, weights, tp, parallel)
        total_per_gpu = rank_weights_bytes(spec, tp, parallel)
    # vLLM's start-up profiling pass: the same settings size the KV budget, the block count and,
    # when the model does not fit, the smallest GPU count that would hold it
    profiling = {
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "cuda_graph_gib": cuda_graph_gib,
    }
    try:
        cap = kv_capacity(
            spec,
            hardware,
            tp,
            block_size,
            gpu_memory_utilization,
            **profiling,
            parallel=parallel,
            path="kv_blocks",
        )
    except ScenarioError as exc:
        for name in profiling:
            if name in exc.fix:
                raise ScenarioError(name, exc.value, exc.fix) from None
        raise
    activation = activation_peak_bytes(spec, tp, max_num_batched_tokens, max_num_seqs)
    weights_gib = float(total_weights) / float(GIB)
    available_gib = cap.requested_gib * float(rank_gpus)
    overhead_gib = cap.overhead_gib * float(rank_gpus)
    kv_token = kv_bytes_per_token(spec, tp)
    kv_token_all = kv_token * tp  # MLA: the same latent on every GPU
    out: dict[str, Any] = {
        "model": spec.name,
        "gpu": hardware.name,
        "gpu_memory_gib": hardware.memory_gib,
        "tp": tp,
        "block_size": block_size,
        "gpu_memory_utilization": gpu_memory_utilization,
        "attention": spec.attention_kind,
        "num_heads": spec.num_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "sliding_window": spec.sliding_window,
        "sliding_layers": spec.num_sliding_layers,
        "num_layers": spec.num_layers,
        "moe": spec.is_moe,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "experts_per_gpu": (
            spec.num_experts / (tp if plain else parallel.expert_shards(spec, tp))
            if spec.is_moe
            else 0
        ),
        "tie_word_embeddings": spec.tie_word_embeddings,
        "dtype_bytes": spec.bytes_per_param,
        "weight_bytes_per_param": wbpp,
        "quantization": _quantization(spec),
        "params": params,
        "params_total": sum(params.values()),
        "weights": weights,
        "weights_per_gpu": per_gpu,
        "weights_total": total_weights,
        "weights_total_per_gpu": total_per_gpu,
        "kv_bytes_per_token": kv_token,
        "kv_bytes_per_token_all_gpus": kv_token_all,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "activation": activation,
        "requested_gib": cap.requested_gib,
        "weights_gib_per_gpu": cap.weights_gib,
        "activation_peak_gib": cap.activation_gib,
        "non_torch_gib": cap.non_torch_gib,
        "cuda_graph_gib": cap.cuda_graph_gib,
        "kv_cache_gib_per_gpu": cap.kv_gib,
        "available_gib": available_gib,
        "weights_gib": weights_gib,
        "overhead_gib": overhead_gib,
        "feasible": cap.fits,
    }
    if not plain:
        out["parallel"] = {
            **parallel.describe(),
            "rank_gpus": rank_gpus,
            "group_gpus": parallel.group_gpus(spec, tp),
            "expert_gpus": parallel.expert_shards(spec, tp) if spec.is_moe else 0,
            "stage_layers": stage_layers(spec.num_layers, parallel.pp),
        }
    if not out["feasible"]:
        smallest, smallest_tp = minimum_gpus(spec, hardware, gpu_memory_utilization, **profiling)
        out["min_gpus"] = smallest
        out["min_tp"] = smallest_tp
        return out

    kv_cache_bytes = int(cap.kv_gib * float(GIB)) * rank_gpus
    per_block = cap.per_block_bytes
    blocks = auto_kv_blocks(
        spec,
        hardware,
        tp,
        block_size,
        gpu_memory_utilization,
        **profiling,
        **({} if plain else {"parallel": parallel}),
        path="kv_blocks",
    )
    out.update(
        kv_cache_bytes=kv_cache_bytes,
        kv_cache_gib=kv_cache_bytes / GIB,
        per_block_bytes=per_block,
        kv_blocks=blocks,
        kv_tokens=blocks * block_size,
    )
    if context_len is None:
        context_len = auto_max_model_len(spec)
    out["context_len"] = context_len
    if context_len is not None:
        full_blocks = -(-context_len // block_size)
        layers = spec.num_layers
        sliding = spec.num_sliding_layers
        window_blocks = full_blocks
        if sliding:
            window_blocks = -(-min(context_len, spec.sliding_window) // block_size)
        # Block-equivalents per sequence, in units of layers x blocks (exact integer arithmetic).
        layer_blocks = (layers - sliding) * full_blocks + sliding * window_blocks
        out["blocks_per_sequence"] = layer_blocks / layers
        out["kv_bytes_per_sequence"] = per_block * layer_blocks / layers
        out["max_concurrent_sequences"] = (blocks * layers) // layer_blocks
    return out


def _rank_weights(spec: ModelSpec, weights: dict, tp: int, parallel: Any) -> dict[str, float]:
    """Bytes per GPU of each weight part on one rank's busiest GPU (largest pipeline stage;
    with stages, the embeddings sit on the first and the LM head on the last)."""
    share = parallel.layer_share(spec.num_layers)
    shards = parallel.expert_shards(spec, tp)
    out = {}
    for part in _WEIGHT_PARTS:
        if part in ("embeddings", "lm_head"):
            out[part] = weights[part] / tp
        else:
            out[part] = weights[part] / (shards if part == "experts" else tp) * share
    return out


def _gib(value: float) -> str:
    """Bytes as GiB, or MiB below 1 GiB (norms and routers are small)."""
    if abs(value) < GIB:
        return f"{value / (1 << 20):,.2f} MiB"
    return f"{value / GIB:,.2f} GiB"


def format_breakdown(d: dict[str, Any]) -> str:
    """A human-readable table of :func:`memory_breakdown`'s result."""
    tp = d["tp"]
    lines = [
        f"{d['model']} on {tp} x {d['gpu']} ({d['gpu_memory_gib']:g} GiB each), "
        f"gpu_memory_utilization {d['gpu_memory_utilization']:g}, block size {d['block_size']}",
    ]
    par = d.get("parallel")
    if par:
        lines.append(f"  {'per rank':<22}{_layout(par, tp)}")
    if d["attention"] == "MLA":
        attention = (
            f"MLA: {d['num_heads']} heads, latent {d['kv_lora_rank']} + rope "
            f"{d['qk_rope_head_dim']} per layer (replicated on every GPU)"
        )
    else:
        attention = (
            f"{d['attention']}: {d['num_heads']} query heads, {d['num_kv_heads']} KV heads, "
            f"head_dim {d['head_dim']}"
        )
    if d["sliding_layers"]:
        attention += (
            f"; {d['sliding_layers']} of {d['num_layers']} layers use a "
            f"{d['sliding_window']}-token sliding window"
        )
    lines.append(f"  {'attention':<22}{attention}")
    if d["moe"]:
        lines.append(
            f"  {'experts':<22}{d['num_experts']} routed, {d['num_experts_per_tok']} per token; "
            f"{d['experts_per_gpu']:g} per GPU, split over the "
            f"{par['expert_gpus'] if par else tp} GPUs"
        )
    lines.append(
        f"  {'weights':<22}{d['params_total'] / 1e9:,.2f} B params at {d['weight_bytes_per_param']:g} "
        f"bytes (quantization: {d['quantization']}): {_gib(d['weights_total'])} total, "
        f"{_gib(d['weights_total_per_gpu'])} per GPU"
    )
    for part in _WEIGHT_PARTS:
        if d["weights"][part]:
            lines.append(
                f"    {part:<20}{_gib(d['weights'][part]):>14} total {_gib(d['weights_per_gpu'][part]):>14} per GPU"
            )
    a = d["activation"]
    lines.append(
        f"  {'per GPU':<22}{d['gpu_memory_gib']:g} GiB x {d['gpu_memory_utilization']:g} "
        f"utilisation = {d['requested_gib']:.2f} GiB requested, split as vLLM's start-up "
        "profiling splits it:"
    )
    lines.append(f"    {'weights':<20}{d['weights_gib_per_gpu']:>10.2f} GiB")
    lines.append(
        f"    {'activation peak':<20}{d['activation_peak_gib']:>10.2f} GiB  dummy pass of "
        f"{a['tokens']:,} tokens (max_num_batched_tokens): residual {_gib(a['residual'])} + "
        f"max(attention {_gib(a['attention'])}, mlp {_gib(a['mlp'])}) = {_gib(a['forward'])}; "
        f"sampler over {a['sampled_rows']} rows (max_num_seqs) {_gib(a['sampler'])}"
    )
    lines.append(
        f"    {'non-torch':<20}{d['non_torch_gib']:>10.2f} GiB  workspaces"
        + (", NCCL/all-reduce buffers" if tp > 1 else "")
        + " (CUDA context and NCCL start-up: in the headroom)"
    )
    lines.append(
        f"    {'cuda graphs':<20}{d['cuda_graph_gib']:>10.2f} GiB  "
        + (
            "attributed (--cuda-graph-gib)"
            if d["cuda_graph_gib"]
            else "not attributed: captured after the KV cache, in the headroom"
        )
    )
    lines.append(
        f"    {'KV cache':<20}{d['kv_cache_gib_per_gpu']:>10.2f} GiB  = requested - the above"
    )
    gpus = par["rank_gpus"] if par else tp
    lines.append(
        f"  {'whole rank' if par else 'whole instance':<22}{d['available_gib']:.2f} GiB "
        f"({gpus} x {d['requested_gib']:.2f}); "
        f"weights, activations and reserves {d['overhead_gib']:.2f} GiB"
    )
    lines.append(
        f"  {'KV per token':<22}{d['kv_bytes_per_token']:,.0f} bytes per GPU "
        f"({d['kv_bytes_per_token_all_gpus']:,.0f} over all GPUs)"
    )
    if not d["feasible"]:
        if d.get("min_gpus") is None:
            lines.append("  does not fit on any number of these GPUs")
        else:
            lines.append(f"  does not fit: needs at least {d['min_gpus']} GPUs (tp={d['min_tp']})")
        return "\n".join(lines)
    lines.append(
        f"  {'KV cache':<22}{d['kv_cache_gib']:.2f} GiB ({d['kv_cache_gib'] / gpus:.2f} GiB per GPU) = "
        f"{d['kv_blocks']:,} blocks of {d['per_block_bytes']:,} bytes per GPU = {d['kv_tokens']:,} tokens"
    )
    if d.get("context_len"):
        lines.append(
            f"  {'at context ' + format(d['context_len'], ','):<22}"
            f"{d['blocks_per_sequence']:,.1f} blocks ({_gib(d['kv_bytes_per_sequence'])} per GPU) "
            f"per sequence; max concurrent sequences: {d['max_concurrent_sequences']:,}"
        )
    return "\n".join(lines)


def _layout(par: dict[str, Any], tp: int) -> str:
    """One line on a rank's parallel layout for :func:`format_breakdown`."""
    parts = [f"{par['rank_gpus']} GPU{'s' if par['rank_gpus'] > 1 else ''} (tp {tp}"]
    parts[0] += (
        f", {par['pp']} pipeline stages of {par['stage_layers']} layers" if par["pp"] > 1 else ""
    )
    parts[0] += f", KV sharded over {par['cp']} context ranks" if par["cp"] > 1 else ""
    parts[0] += ")"
    if par["dp"] > 1:
        parts.append(f"one of {par['dp']} data-parallel ranks")
    if par["expert_gpus"] > tp:
        kind = "whole experts (ep)" if par["ep"] > 1 else "experts sharded"
        parts.append(f"{kind} over the group's {par['expert_gpus']} GPUs")
    return "; ".join(parts)


def _memory_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="model name (servesim list models) or path to a config.json"
    )
    p.add_argument(
        "--gpu", default="H100", help="GPU name (servesim list gpus) or path to a GPU YAML file"
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (GPUs per instance)")
    for flag, what in (
        ("dp", "data-parallel ranks (the breakdown is one rank's)"),
        ("ep", "expert parallelism: dp x tp, or 1"),
        ("pp", "pipeline stages"),
        ("cp", "context-parallel ranks (KV sharded over them)"),
    ):
        p.add_argument(f"--{flag}", type=int, default=1, help=f"{what} (default 1)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        metavar="FRACTION",
        help="fraction of GPU memory vLLM may use (default 0.9)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        metavar="TOKENS",
        help="tokens of vLLM's profiling pass, the engine's token budget (default 2048)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=DEFAULT_MAX_NUM_SEQS,
        metavar="N",
        help="requests per step; the profiling sampler's rows (default 256)",
    )
    p.add_argument(
        "--cuda-graph-gib",
        type=float,
        default=0.0,
        metavar="GIB",
        help="CUDA-graph memory per GPU to take from the KV budget, as vLLM releases that "
        "estimate it at start-up do (default 0: graphs live in the headroom)",
    )
    p.add_argument(
        "--context-len",
        type=int,
        default=None,
        metavar="TOKENS",
        help="context length for the concurrency figure (default: the model's max length)",
    )
    p.add_argument("--json", action="store_true", help="print the breakdown as JSON")


_BREAKDOWN_OPTIONS = (
    "block_size",
    "gpu_memory_utilization",
    "context_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "cuda_graph_gib",
)
"""Options passed to :func:`memory_breakdown` under their own name; an error in one of them is
reported as its flag (``--block-size``)."""


def cmd_memory(args: argparse.Namespace) -> int:
    """Print the breakdown; raise a ScenarioError (one line, minimum GPU count) if it does not fit."""
    info = resolve_model(args.model, "--model")
    spec = info.require_spec("--model", "the memory breakdown")
    log = get_logger("servesim.memory")
    for item in info.unmodelled:  # e.g. an encoder's weights are not in the breakdown
        log.warning(
            f"model config field {', '.join(item.fields)} not modelled",
            model=info.name,
            kind=item.kind,
            effect=item.effect,
        )
    gpu = resolve_gpu(args.gpu, "--gpu")
    try:
        d = memory_breakdown(
            spec,
            gpu,
            args.tp,
            **{name: getattr(args, name) for name in _BREAKDOWN_OPTIONS},
            parallel=Parallelism(dp=args.dp, ep=args.ep, pp=args.pp, cp=args.cp, batch_tokens=0),
        )
    except ScenarioError as exc:
        if exc.path.startswith("parallel."):
            raise ScenarioError("--" + exc.path.split(".")[1], exc.value, exc.fix) from None
        if exc.path == "tp" or exc.path in _BREAKDOWN_OPTIONS:
            flag = "--" + exc.path.replace("_", "-")
            raise ScenarioError(flag, exc.value, exc.fix) from None
        raise
    if getattr(args, "json", False):
        print(json.dumps(d, indent=2, sort_keys=True))
    else:
        print(format_breakdown(d))
    if not d["feasible"]:
        needed = (
            f"needs {d['overhead_gib']:.2f} GiB (weights, activation peak, reserves) but {args.tp} x "
            f"{gpu.name} give {d['available_gib']:.2f} GiB"
        )
        if d["min_gpus"] is None:
            fix = f"{d['model']} does not fit: {needed}; no number of {gpu.name} GPUs suffices"
        else:
            tp_note = f" (tp={d['min_tp']})" if d["min_tp"] not in (None, d["min_gpus"]) else ""
            fix = (
                f"{d['model']} does not fit on {args.tp} x {gpu.name}: {needed}; "
                f"minimum GPU count: {d['min_gpus']}{tp_note}"
            )
        raise ScenarioError("--tp", args.tp, fix)
    return 0


add_memory_parser = Command(
    "memory",
    help="show where GPU memory goes: weights, activation peak, non-torch, KV cache",
    description=(
        "Break one instance's GPU memory into weights (per GPU), the activation peak of "
        "vLLM's profile run (a dummy pass of max_num_batched_tokens tokens and the sampler), "
        "non-torch memory, CUDA-graph memory and KV cache, as engine.kv_blocks: auto "
        "computes it, and the number of sequences that fit at a context length. Exits 2 "
        "with the minimum GPU count when the model does not fit."
    ),
    arguments=_memory_arguments,
    handler=cmd_memory,
)
"""Add the ``memory`` command to the CLI's subparsers; dispatch it to :func:`cmd_memory`."""
