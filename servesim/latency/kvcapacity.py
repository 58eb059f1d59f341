"""KV-cache capacity and GPU memory accounting: :func:`auto_kv_blocks` sizes the KV cache as
vLLM's start-up profiling does (weights, the activation peak of a dummy pass, non-torch memory;
the weight count follows ``spec/blis_reference.md`` §3.6, after llm-d-benchmark's
``capacity_planner.py``), and :func:`auto_max_model_len` derives the context limit from the
config (§2.10)."""

from __future__ import annotations

import math
from typing import Any

import attrs

from servesim.latency.hardware import HardwareSpec
from servesim.latency.modelspec import (
    EXPERT_COUNT_FIELDS,
    ROPE_TYPES_PRESCALED,
    SWIGLU_ACTIVATIONS,
    ModelSpec,
)
from servesim.latency.tensor_parallel import _heads_not_divided, _smallest_valid_tp
from servesim.simcore.errors import ScenarioError

GIB = 1 << 30
"""Bytes in a GiB (the capacity formula works in GiB of 2^30 bytes)."""

NON_TORCH_GIB_TP1 = 0.15
NON_TORCH_GIB_PER_GPU_MULTI = 0.6
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
"""The profile run's token count when none is given (servesim's and vLLM v1's serving default)."""
DEFAULT_MAX_NUM_SEQS = 256
"""The profile run's request count (sampled rows) when none is given (vLLM's default)."""
SAMPLER_FP32_BYTES = 8
"""Bytes per vocabulary entry per sampled row the sampler adds beside the model-dtype logits:
an fp32 copy of the logits and fp32 probabilities (vLLM v1's profile run skips top-k/top-p
sorting, see ``gpu_model_runner._dummy_sampler_run``)."""

# --------------------------------------------------------------------------------------------
# KV capacity (spec §3.6) and max model length (spec §2.10)
# --------------------------------------------------------------------------------------------


def kv_bytes_per_token(model: ModelSpec, tp: int = 1, *, path: str = "tp") -> float:
    """KV-cache bytes one token occupies on each GPU of a ``tp``-way instance.

    Standard attention: ``L·2·head_dim·Hkv·bpp / tp``. MLA: one latent of
    ``kv_lora_rank + qk_rope_head_dim`` per layer, replicated on every rank (not divided by tp).
    With fewer KV heads than ``tp`` vLLM replicates heads; dividing by tp is BLIS's optimistic
    approximation and is kept for parity.
    """
    if tp <= 0:
        raise ScenarioError(path, tp, "tensor parallelism must be a positive integer")
    if model.is_mla:
        return (
            float(model.num_layers)
            * float(model.kv_lora_rank + model.qk_rope_head_dim)
            * model.bytes_per_param
        )
    kv_heads = model.num_kv_heads
    if kv_heads >= tp and kv_heads % tp != 0:
        raise _heads_not_divided(model, kv_heads, "KV heads", tp, path)
    if model.explicit_head_dim <= 0 and model.hidden_size % model.num_heads != 0:
        raise ScenarioError(
            path,
            tp,
            f"{model.source or model.name}: hidden_size {model.hidden_size} is not divisible by "
            f"num_attention_heads {model.num_heads}; add head_dim to the config",
        )
    per_token = (
        float(model.num_layers)
        * 2.0
        * float(model.head_dim)
        * float(kv_heads)
        * model.bytes_per_param
    )
    return per_token / float(tp)


def kv_tokens_held(model: ModelSpec, context_len: int) -> float:
    """Layer-averaged tokens one sequence of ``context_len`` tokens keeps in the KV cache:
    ``context_len`` on full-attention layers, at most ``sliding_window`` on windowed layers."""
    sliding = model.num_sliding_layers
    if sliding == 0 or context_len <= model.sliding_window:
        return float(context_len)
    full = model.num_layers - sliding
    return (full * context_len + sliding * model.sliding_window) / model.num_layers


def kv_bytes_per_sequence(
    model: ModelSpec, tp: int, context_len: int, *, path: str = "tp"
) -> float:
    """KV bytes a sequence of ``context_len`` tokens occupies on each GPU (token granularity),
    with sliding-window layers capped at the window."""
    return kv_bytes_per_token(model, tp, path=path) * kv_tokens_held(model, context_len)


def weight_params(model: ModelSpec, *, path: str = "model") -> dict[str, int]:
    """Parameter counts by part (all TP ranks together), as llm-d's capacity planner counts them
    (spec §3.6): ``embeddings``, ``attention`` (Q,K,V,O), ``norms``, ``dense_mlp`` (MLP of dense
    layers), ``experts`` (routed), ``shared_experts``, ``router``, ``lm_head`` (0 when tied). The
    first ``first_k_dense_replace`` layers of an MoE model are dense.

    Two departures from the spec's formula: an MLP has :attr:`ModelSpec.mlp_matrices` matrices
    (2 for OPT/GPT-2-style MLPs; the spec always counts 3), and Q and O are ``heads x head_dim``
    wide rather than ``hidden_size`` (equal unless the config sets a wider head_dim).
    """
    if not model.is_moe and (model.n_shared_experts > 0 or model.num_experts_per_tok > 0):
        field = "n_shared_experts" if model.n_shared_experts > 0 else "num_experts_per_tok"
        raise ScenarioError(
            path,
            model.source or model.name,
            f"the config looks like a mixture-of-experts model ({field} is set) but gives no total "
            f"expert count ({', '.join(EXPERT_COUNT_FIELDS)}); add one, or set engine.kv_blocks "
            "to an integer",
        )
    d = model.hidden_size
    vocab = model.vocab_size
    layers = model.num_layers
    kv_dim = model.num_kv_heads * model.head_dim
    # Q and O project to the heads' total width, which a config with an explicit head_dim can
    # set apart from hidden_size (Qwen3-32B: 64 x 128 = 8192 on a 5120 hidden size). MLA keeps
    # BLIS's d x d approximation (its projections go through low-rank latents).
    q_dim = d if model.is_mla else model.num_heads * model.head_dim
    attention = d * (q_dim + 2 * kv_dim) + q_dim * d
    m = model.mlp_matrices  # 3 gated (SwiGLU), 2 plain (OPT, GPT-2)
    parts = {
        "embeddings": vocab * d,
        "attention": layers * attention,
        "norms": layers * 2 * d + d,
        "dense_mlp": 0,
        "experts": 0,
        "shared_experts": 0,
        "router": 0,
        "lm_head": 0 if model.tie_word_embeddings else vocab * d,
    }
    dense_mlp = m * d * model.intermediate_size
    if model.is_moe:
        experts = model.num_experts
        expert_ffn = model.moe_intermediate_size or model.intermediate_size
        dense_prefix_mlp = dense_mlp
        if model.dense_intermediate_size > 0:
            dense_prefix_mlp = m * d * model.dense_intermediate_size
        dense_layers = min(max(model.first_k_dense_replace, 0), layers)
        moe_layers = layers - dense_layers
        parts["dense_mlp"] = dense_layers * dense_prefix_mlp
        parts["experts"] = moe_layers * m * d * expert_ffn * experts
        parts["router"] = moe_layers * experts * d
        if model.shared_expert_intermediate_size > 0:
            parts["shared_experts"] = moe_layers * m * d * model.shared_expert_intermediate_size
    else:
        parts["dense_mlp"] = layers * dense_mlp
    return parts


def weights_bytes(model: ModelSpec, *, path: str = "model") -> int:
    """Estimated total weight bytes (all TP ranks together), as llm-d's capacity planner counts them.

    Embeddings + per layer (Q,K,V,O projections + 2 norms + an MLP of
    :attr:`ModelSpec.mlp_matrices` matrices) + lm_head unless
    tied + final norm. MoE layers count every routed expert, the shared experts and the router;
    the first ``first_k_dense_replace`` layers of a MoE model are dense. Every weight is counted
    at ``weight_bytes_per_param`` (the quantized width when the config names one).
    """
    total = sum(weight_params(model, path=path).values())
    return int(float(total) * model.weight_bytes_per_param)


def non_torch_gib(gpus: int) -> float:
    """Memory outside PyTorch's allocator that an instance of ``gpus`` GPUs gains while vLLM
    profiles it (cuBLAS/attention workspaces; NCCL and all-reduce buffers once GPUs talk to each
    other), all GPUs together: 0.15 GiB on one GPU, 0.6 GiB per GPU beyond (llm-d's constants).
    The CUDA context and NCCL's start-up buffers exist before vLLM's memory snapshot and come
    out of the ``1 − gpu_memory_utilization`` headroom, not out of the KV budget."""
    per_gpu = NON_TORCH_GIB_TP1 if gpus == 1 else NON_TORCH_GIB_PER_GPU_MULTI
    return per_gpu * float(gpus)


_non_torch_gib = non_torch_gib


def activation_peak_bytes(
    model: ModelSpec,
    tp: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> dict[str, int]:
    """Peak PyTorch memory of vLLM's profile run on each GPU, from the model's shape (bytes).

    vLLM v1 sizes the KV cache after a dummy forward pass of ``max_num_batched_tokens`` tokens
    followed by a dummy sampler run over ``min(max_num_seqs, tokens)`` rows
    (``Worker.determine_available_memory``, ``GPUModelRunner.profile_run``). Layers run one at a
    time, so the peak is one layer's intermediates plus the residual stream, or the sampler's
    logits, whichever is larger. With T tokens, activation width b (the config's dtype), TP
    degree t:

    * ``residual`` = 2·T·hidden·b (hidden state and residual, full width on every GPU);
    * ``attention`` = T·(2·q + 2·kv)·head_dim·b (Q, K, V and the attention output; q and kv are
      the heads on one GPU, at least one KV head);
    * ``mlp`` = 3·T·ffn·b / t (gate and up projections, 2·ffn, and the activated ffn), for a MoE
      layer T·top_k·(3·expert_ffn + hidden)·b / t (the fused-MoE intermediates) plus the shared
      experts' 3·T·shared_ffn·b / t and the router's fp32 logits;
    * ``forward`` = residual + max(attention, mlp);
    * ``sampler`` = R·vocab·(b + 8) + T·hidden·b: the logits of R = min(max_num_seqs, T) rows in
      the model dtype plus an fp32 copy and fp32 probabilities, while the pass's hidden states
      are still held;
    * ``peak`` = max(forward, sampler).

    Returns every term, so ``servesim memory`` can show them. For Llama-3.1-8B at 2048 tokens the
    MLP's 3·ffn dominates (0.16 of 0.19 GiB); at 256 sampled rows the 128k-entry vocabulary's
    logits take 0.31 GiB and set the peak.
    """
    tokens = int(max_num_batched_tokens)
    rows = min(int(max_num_seqs), tokens)
    b = model.bytes_per_param
    d = model.hidden_size
    head_dim = model.head_dim
    q_heads = model.num_heads / tp
    kv_heads = max(model.num_kv_heads / tp, 1.0)
    residual = 2.0 * tokens * d * b
    attention = tokens * (2.0 * q_heads + 2.0 * kv_heads) * head_dim * b
    dense_ffn = model.dense_intermediate_size or model.intermediate_size
    dense_mlp = 3.0 * tokens * dense_ffn * b / tp
    mlp = dense_mlp if (not model.is_moe or model.first_k_dense_replace > 0) else 0.0
    if model.is_moe:
        expert_ffn = model.expert_intermediate_size
        top_k = max(model.num_experts_per_tok, 1)
        moe = tokens * top_k * (3.0 * expert_ffn + d) * b / tp
        moe += 3.0 * tokens * model.shared_expert_intermediate_size * b / tp
        moe += tokens * model.num_experts * 4.0
        mlp = max(mlp, moe)
    forward = residual + max(attention, mlp)
    sampler = rows * model.vocab_size * (b + SAMPLER_FP32_BYTES) + tokens * d * b
    terms = {
        "tokens": tokens,
        "sampled_rows": rows,
        "residual": residual,
        "attention": attention,
        "mlp": mlp,
        "forward": forward,
        "sampler": sampler,
        "peak": max(forward, sampler),
    }
    return {k: int(v) for k, v in terms.items()}


@attrs.frozen
class KVCapacity:
    """One instance's memory per GPU as vLLM's profile run splits it (GiB), and the KV blocks.

    ``requested`` = memory × gpu_memory_utilization; the KV cache gets what is left of it after
    ``weights`` (this GPU's share), ``activation`` (:func:`activation_peak_bytes` peak),
    ``non_torch`` (:func:`non_torch_gib` / GPUs), ``cuda_graphs`` (only when attributed: vLLM
    releases that do not estimate graph memory at start-up take it from the headroom) and
    ``adapters``.
    """

    gpus: int
    requested_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    adapter_gib: float
    per_block_bytes: int
    kv_shards: int = 1  # context-parallel ranks the KV cache is sharded over (blocks x cp)

    @property
    def overhead_gib(self) -> float:
        return (
            self.weights_gib
            + self.activation_gib
            + self.non_torch_gib
            + self.cuda_graph_gib
            + self.adapter_gib
        )

    @property
    def kv_gib(self) -> float:
        return self.requested_gib - self.overhead_gib

    @property
    def fits(self) -> bool:
        return self.kv_gib > 0

    @property
    def blocks(self) -> int:
        """KV blocks each GPU holds (every GPU holds its heads' share of every block)."""
        if not self.fits or self.per_block_bytes <= 0:
            return 0
        return int(self.kv_gib * float(GIB)) // self.per_block_bytes * self.kv_shards


def kv_capacity(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    *,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    cuda_graph_gib: float = 0.0,
    adapter_reserved_bytes: int = 0,
    parallel: Any = None,
    path: str = "engine.kv_blocks",
) -> KVCapacity:
    """The per-GPU memory terms of a ``tp``-GPU instance (see :class:`KVCapacity`); validates
    the arguments and the config as :func:`auto_kv_blocks` does, without requiring a fit.
    ``parallel`` sizes one data-parallel rank (:func:`rank_weights_bytes`, largest stage's KV)."""
    if not (0 < gpu_memory_utilization <= 1) or not math.isfinite(gpu_memory_utilization):
        raise ScenarioError(
            path, gpu_memory_utilization, "gpu_memory_utilization must be in (0, 1]"
        )
    if adapter_reserved_bytes < 0:
        raise ScenarioError(path, adapter_reserved_bytes, "adapter_reserved_bytes must be >= 0")
    if not (cuda_graph_gib >= 0) or not math.isfinite(cuda_graph_gib):
        raise ScenarioError(path, cuda_graph_gib, "cuda_graph_gib must be a finite number >= 0")
    if block_size <= 0:
        raise ScenarioError(path, block_size, "block_size must be a positive integer")
    if tp < 1:
        raise ScenarioError(path, tp, "tensor parallelism must be a positive integer")
    for name, value in (
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScenarioError(path, value, f"{name} must be a positive integer")
    _check_sizable(model, path)
    plain = parallel is None or parallel.plain
    share = 1.0 if plain else parallel.layer_share(model.num_layers)
    per_block = int(kv_bytes_per_token(model, tp, path=path) * share * float(block_size))
    if per_block <= 0:
        raise ScenarioError(
            path, block_size, f"one block of {model.name} would hold 0 bytes; raise block_size"
        )
    activation = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)["peak"]
    weights_gib = float(weights_bytes(model, path=path)) / float(GIB) / tp
    gpus = tp if plain else parallel.group_gpus(model, tp)
    if not plain:
        weights_gib = rank_weights_bytes(model, tp, parallel, path=path) / float(GIB)
    return KVCapacity(
        gpus=tp if plain else parallel.rank_gpus(tp),
        requested_gib=hardware.memory_gib * gpu_memory_utilization,
        weights_gib=weights_gib,
        activation_gib=activation / float(GIB),
        non_torch_gib=non_torch_gib(gpus) / gpus,
        cuda_graph_gib=float(cuda_graph_gib),
        adapter_gib=float(adapter_reserved_bytes) / float(GIB) / tp,
        per_block_bytes=per_block,
        kv_shards=1 if plain else parallel.cp,
    )


def rank_weights_bytes(model: ModelSpec, tp: int, parallel: Any, *, path: str = "model") -> float:
    """Weight bytes on the busiest GPU of one data-parallel rank: routed experts over
    ``parallel.expert_shards`` GPUs, the rest over ``tp``; with pipeline stages the largest
    stage's layers plus the larger of the embeddings and LM head (first and last stage)."""
    parts = weight_params(model, path=path)
    first, last, experts = parts["embeddings"], parts["lm_head"], parts["experts"]
    ends = max(first, last) if parallel.pp > 1 else first + last
    layered = sum(parts.values()) - first - last - experts
    shards = parallel.expert_shards(model, tp)
    per_gpu = (layered / tp + experts / shards) * parallel.layer_share(model.num_layers)
    return (per_gpu + ends / tp) * float(model.weight_bytes_per_param)


def _check_sizable(model: ModelSpec, path: str) -> None:
    where = model.source or model.name
    if model.intermediate_size <= 0:
        raise ScenarioError(
            path, where, "the config needs intermediate_size > 0 to estimate weights"
        )
    if model.vocab_size <= 0:
        raise ScenarioError(path, where, "the config needs vocab_size > 0 to estimate weights")
    if model.hidden_act not in SWIGLU_ACTIVATIONS:
        raise ScenarioError(
            path,
            model.hidden_act,
            f"{where}: only gated (SwiGLU-family) MLPs are modelled "
            f"({', '.join(sorted(a for a in SWIGLU_ACTIVATIONS if a))}); set engine.kv_blocks to an integer",
        )


def auto_kv_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    *,
    dp: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    cuda_graph_gib: float = 0.0,
    adapter_reserved_bytes: int = 0,
    parallel: Any = None,
    path: str = "engine.kv_blocks",
) -> int:
    """Number of KV blocks vLLM's start-up profiling would allocate on a ``tp``-GPU instance.

    Per GPU, as vLLM v1's ``determine_available_memory``: ``memory·utilisation − weights/tp −
    activation peak of a dummy pass of max_num_batched_tokens tokens (and the sampler over
    min(max_num_seqs, tokens) rows) − non-torch memory − CUDA-graph memory (0 unless given) −
    adapters``, divided by one GPU's block (``trunc(kv_bytes_per_token·block_size)``); times
    ``dp`` for an MoE model. See :class:`KVCapacity` and :func:`activation_peak_bytes`. Raises
    a ScenarioError naming the minimum GPU count when the model does not fit.
    """
    if dp < 1:
        raise ScenarioError(path, dp, "dp must be at least 1")
    profiling = {
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "cuda_graph_gib": cuda_graph_gib,
        "adapter_reserved_bytes": adapter_reserved_bytes,
    }  # what the capacity and, when the model does not fit, the minimum GPU count are sized for
    cap = kv_capacity(
        model,
        hardware,
        tp,
        block_size,
        gpu_memory_utilization,
        parallel=parallel,
        path=path,
        **profiling,
    )
    if not cap.fits:
        adapters = f" + {cap.adapter_gib:.2f} adapters" if adapter_reserved_bytes else ""
        graphs = f" + {cap.cuda_graph_gib:.2f} CUDA graphs" if cuda_graph_gib else ""
        raise ScenarioError(
            path,
            "auto",
            f"{model.name} does not fit on {tp} x {hardware.name}{'' if parallel is None else parallel.label()}: "
            "each GPU needs "
            f"{cap.overhead_gib:.2f} GiB ({cap.weights_gib:.2f} weights + "
            f"{cap.activation_gib:.2f} activation peak + {cap.non_torch_gib:.2f} non-torch"
            f"{graphs}{adapters}) but {hardware.memory_gib:g} GiB x {gpu_memory_utilization:g} "
            f"utilisation gives {cap.requested_gib:.2f} GiB. "
            + _minimum_gpus_hint(
                model,
                cap.requested_gib,
                minimum_gpus(model, hardware, gpu_memory_utilization, path=path, **profiling),
            ),
        )
    blocks = cap.blocks
    if blocks <= 0:
        raise ScenarioError(
            path,
            "auto",
            f"no KV block fits: {cap.kv_gib:.3f} GiB left per GPU for the KV cache, "
            f"{cap.per_block_bytes} bytes per block; use more GPUs (tp), a larger GPU or a "
            "smaller block_size",
        )
    if model.is_moe and dp > 1:
        blocks *= dp
    return blocks


def _fits(
    weights_gib: float,
    activation_gib: float,
    adapter_gib: float,
    hardware: HardwareSpec,
    gpu_memory_utilization: float,
    gpus: int,
    cuda_graph_gib: float = 0.0,
) -> bool:
    """Whether the overhead of an instance of ``gpus`` GPUs stays below the memory it may use,
    all GPUs together; ``activation_gib`` and ``cuda_graph_gib`` are per GPU."""
    available = hardware.memory_gib * gpu_memory_utilization * float(gpus)
    overhead = (
        weights_gib
        + (activation_gib + cuda_graph_gib) * float(gpus)
        + _non_torch_gib(gpus)
        + adapter_gib
    )
    return overhead < available


def minimum_gpus(
    model: ModelSpec,
    hardware: HardwareSpec,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    *,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    cuda_graph_gib: float = 0.0,
    adapter_reserved_bytes: int = 0,
    limit: int = 4096,
    path: str = "model",
) -> tuple[int | None, int | None]:
    """(smallest GPU count whose memory covers weights, activation peak and reserves, smallest
    tp >= it that splits the heads); ``(None, None)`` when no count up to ``limit`` suffices.
    :func:`auto_kv_blocks` names these counts when a model does not fit."""
    if hardware.memory_gib * gpu_memory_utilization <= NON_TORCH_GIB_PER_GPU_MULTI:
        return None, None
    weights_gib = float(weights_bytes(model, path=path)) / float(GIB)
    adapter_gib = float(adapter_reserved_bytes) / float(GIB)

    def fits(gpus: int) -> bool:
        peak = activation_peak_bytes(model, gpus, max_num_batched_tokens, max_num_seqs)["peak"]
        return _fits(
            weights_gib,
            peak / float(GIB),
            adapter_gib,
            hardware,
            gpu_memory_utilization,
            gpus,
            cuda_graph_gib,
        )

    smallest = next((n for n in range(1, limit + 1) if fits(n)), None)
    if smallest is None:
        return None, None
    return smallest, _smallest_valid_tp(model, smallest)


def _minimum_gpus_hint(
    model: ModelSpec, per_gpu_gib: float, minimum: tuple[int | None, int | None], limit: int = 4096
) -> str:
    """'Minimum GPUs per instance: N' (``minimum``: what :func:`minimum_gpus` found up to
    ``limit``), plus the smallest valid tp when N does not divide the model's heads."""
    if per_gpu_gib <= NON_TORCH_GIB_PER_GPU_MULTI:
        return "It cannot fit on this GPU at any tp; use a GPU with more memory."
    smallest, tp_ok = minimum
    if smallest is None:
        return f"It does not fit on {limit} GPUs either; use a GPU with more memory."
    hint = f"Minimum GPUs per instance: {smallest}; set tp to at least {smallest}"
    if tp_ok is not None and tp_ok != smallest:
        hint += f" (tp must divide the {model.num_heads} attention heads, so tp={tp_ok})"
    return hint + ", use a GPU with more memory, or give engine.kv_blocks as an integer."


def auto_max_model_len(
    model: ModelSpec, *, kv_blocks: int | None = None, block_size: int | None = None
) -> int | None:
    """The context limit vLLM derives from the config (spec §2.10); None when the config has none.

    ``max_position_embeddings``, times ``rope_scaling.factor`` (> 1) unless the type already
    includes it (su, longrope, llama3) or the model is Gemma-3; YaRN scales
    ``original_max_position_embeddings`` when given. With ``kv_blocks`` and ``block_size`` the
    result is capped to what the KV cache holds (``kv_blocks·block_size``).
    """
    length = model.max_position_embeddings
    if length <= 0:
        return None
    factor = model.rope_scaling_factor
    if (
        "gemma3" not in model.model_type
        and model.rope_scaling_type not in ROPE_TYPES_PRESCALED
        and factor > 1.0
    ):
        base = length
        if model.rope_scaling_type == "yarn" and model.rope_original_max_position_embeddings > 0:
            base = model.rope_original_max_position_embeddings
        length = int(float(base) * factor)
    if kv_blocks is not None and block_size:
        if -(-length // block_size) > kv_blocks:
            length = kv_blocks * block_size
    return length
