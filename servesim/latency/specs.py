"""Model architecture and GPU specs, and the KV-cache capacity they imply.

A scenario names a model (``qwen3-14b``, ``meta-llama/llama-3.1-8b-instruct`` or a path to a
HuggingFace ``config.json``) and a GPU (``H100``). :func:`resolve_model` and :func:`resolve_gpu`
turn those names into a :class:`ModelInfo` (carrying a :class:`ModelSpec` when a config is
available) and a :class:`HardwareSpec`. :func:`auto_kv_blocks` sizes the KV cache as vLLM's start-up profiling
does (weights, the activation peak of a dummy pass, non-torch memory; the weight count follows
``spec/blis_reference.md`` §3.6, after llm-d-benchmark's ``capacity_planner.py``), and
:func:`auto_max_model_len` derives the context limit from the config (§2.10).

Bundled data lives in ``servesim/latency/data`` (``models.yaml``, ``models/*.json``,
``hardware.yaml``); see ``NOTICE.md`` there for provenance.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from servesim.latency.hfconfig import (
    CONFIG_FILE,
    UnmodelledField,
    cache_miss_hint,
    find_in_hf_cache,
    looks_like_repo_id,
    unmodelled_fields,
)
from servesim.simcore.config import as_float
from servesim.simcore.errors import ScenarioError

GIB = 1 << 30
"""Bytes in a GiB (the capacity formula works in GiB of 2^30 bytes)."""

MOE_MIN_EXPERTS = 2
"""A config with fewer routed experts than this is dense (a 1-expert MoE is dense-equivalent)."""

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

SWIGLU_ACTIVATIONS = frozenset({"silu", "swiglu", "geglu", "situ", ""})
"""Activations with a 3-matrix gated MLP (gate, up, down): the only ones the KV-capacity calculation
sizes (BLIS's rule, kept by :func:`auto_kv_blocks`)."""

NON_GATED_MODEL_TYPES = frozenset(
    {"opt", "gpt2", "gpt_neo", "gpt_neox", "gptj", "gpt_bigcode", "bloom", "falcon", "phi",
     "starcoder2", "mpt", "codegen"}
)  # fmt: skip
"""HF ``model_type`` values whose MLP is two matrices (up, activation, down) with no gate."""

GATED_MODEL_TYPE_PREFIXES = ("gemma",)
"""Families with a gated MLP whose activation name alone would not say so (Gemma: GeGLU written as
``gelu_pytorch_tanh``)."""

PLAIN_ACTIVATIONS = frozenset(
    {"relu", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "gelu_10",
     "relu2", "relu6", "tanh", "sigmoid", "mish"}
)  # fmt: skip
"""Activations that, outside the gated families above, mean a 2-matrix MLP."""

TIED_BY_DEFAULT_MODEL_TYPES = frozenset({"opt", "gpt2", "bloom", "gpt_bigcode", "falcon"})
"""Families whose HF config class ties the LM head to the embeddings when the config omits
``tie_word_embeddings`` (OPT's config.json, bundled, does)."""

DTYPE_BYTES: Mapping[str, float] = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "int8": 1.0,
    "uint8": 1.0,
    "fp8": 1.0,
    "int4": 1.0,  # BLIS convention: often stored in 1-byte containers
    "nf4": 1.0,
}

EXPERT_COUNT_FIELDS = (
    "num_experts",  # Jamba, Qwen-MoE
    "moe_num_experts",  # DBRX
    "n_routed_experts",  # DeepSeek, GLM
    "num_local_experts",  # Mixtral, Llama-4
    "num_routed_experts",  # BLIS-historical alias
)
"""Fields carrying the total routed-expert count, in vLLM's ``get_num_experts`` order."""

KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
"""KV-head count fields: HF standard, Falcon, ChatGLM (first non-zero wins; default = heads)."""

ROPE_TYPES_PRESCALED = frozenset({"su", "longrope", "llama3"})
"""rope_scaling types whose max_position_embeddings already includes the scaling (vLLM rule)."""

SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"
LAYER_TYPE_ALIASES: Mapping[str, str] = {
    "sliding_attention": SLIDING_ATTENTION,
    "local_attention": SLIDING_ATTENTION,
    "full_attention": FULL_ATTENTION,
    "global_attention": FULL_ATTENTION,
    "attention": FULL_ATTENTION,
}
"""``layer_types`` entries servesim models (HF names), normalised to sliding or full attention.
Linear-attention, Mamba and chunked-attention layers are not modelled (a ScenarioError says so)."""

MXFP4_BYTES_PER_PARAM = 4.25 / 8
"""OCP MX FP4: 4-bit E2M1 elements plus one 8-bit E8M0 scale per block of 32 = 4.25 bits."""

NVFP4_BYTES_PER_PARAM = 4.5 / 8
"""NVIDIA NVFP4: 4-bit E2M1 elements plus one 8-bit E4M3 scale per block of 16 = 4.5 bits."""

_DATA_DIR = Path(__file__).parent / "data"
_DATA_DISPLAY = "servesim/latency/data"


# --------------------------------------------------------------------------------------------
# Model specs
# --------------------------------------------------------------------------------------------


@attrs.frozen
class ModelSpec:
    """A transformer LLM's architecture, as read from its HuggingFace ``config.json`` (spec §3.5).

    Counts are as the config states them; 0 means "absent". Derived quantities (effective head
    dimension, weight precision, MoE/MLA) are properties so every consumer agrees on them.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    intermediate_size: int
    bytes_per_param: float
    """Compute/activation dtype bytes (``torch_dtype``); the KV cache is stored at this precision."""
    model_type: str = ""
    hidden_act: str = ""
    explicit_head_dim: int = 0
    """``head_dim`` from the config; 0 = absent (then ``hidden_size / num_heads``)."""
    quantized_bytes_per_param: float = 0.0
    """Weight bytes from ``quantization_config`` or the model name; 0 = not quantized."""
    quant_method: str = ""
    num_experts: int = 0
    """Total routed experts (0 = dense)."""
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    """FFN dim of one routed expert; 0 = ``intermediate_size`` (Mixtral convention)."""
    shared_expert_intermediate_size: int = 0
    """Total FFN dim of the shared experts; 0 = none."""
    interleave_moe_layer_step: int = 0
    dense_intermediate_size: int = 0
    """``intermediate_size_mlp``: FFN dim of dense layers in a hybrid MoE model; 0 = ``intermediate_size``."""
    first_k_dense_replace: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    max_position_embeddings: int = 0
    rope_scaling_type: str = ""
    rope_scaling_factor: float = 0.0
    rope_original_max_position_embeddings: int = 0
    tie_word_embeddings: bool = False
    sliding_window: int = 0
    """Attention window (tokens) of the sliding-window layers; 0 = every layer attends fully."""
    layer_types: tuple[str, ...] = ()
    """Per-layer attention kind (``sliding_attention`` / ``full_attention``); empty = all full."""
    source: str = ""
    """Where the config came from (bundled file or user path), for messages and provenance."""

    @property
    def head_dim(self) -> int:
        """Attention head dimension: the explicit ``head_dim`` if set, else ``hidden / heads``."""
        if self.explicit_head_dim > 0:
            return self.explicit_head_dim
        return self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection's output, ``H·head_dim`` (= ``hidden_size`` unless the
        config sets a ``head_dim`` that differs from ``hidden / heads``, as Qwen3 and Mistral-Nemo
        do). MLA models keep ``hidden_size``: their ``head_dim`` field does not size per-head Q/K/V
        (GLM-5.2: ``head_dim`` 192, query heads 192 + 64 wide, values 256)."""
        if self.projection_head_dim_explicit:
            return self.num_heads * self.explicit_head_dim
        return self.hidden_size

    @property
    def projection_head_dim_explicit(self) -> bool:
        """Whether the step-time models size attention from the config's ``head_dim`` (set, and
        not an MLA model) rather than from ``hidden // heads`` as BLIS does."""
        return self.explicit_head_dim > 0 and not self.is_mla

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection's output, ``Hkv·head_dim``."""
        return self.num_kv_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP has a gate (SwiGLU/GeGLU: gate, up, down = 3 matrices) or not (OPT,
        GPT-2, BLOOM, Falcon: up, down = 2 matrices). Read from ``model_type`` and ``hidden_act``
        (OPT's ``activation_function``); an unknown activation is taken as gated (BLIS's assumption)."""
        if self.model_type in NON_GATED_MODEL_TYPES:
            return False
        if self.hidden_act in SWIGLU_ACTIVATIONS:
            return True
        if self.model_type.startswith(GATED_MODEL_TYPE_PREFIXES):
            return True
        return self.hidden_act not in PLAIN_ACTIVATIONS

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (dense layer, routed or shared expert): 3 gated, 2 not."""
        return 3 if self.gated_mlp else 2

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per weight: the quantized precision if known, else the compute dtype."""
        if self.quantized_bytes_per_param > 0:
            return self.quantized_bytes_per_param
        return self.bytes_per_param

    @property
    def is_moe(self) -> bool:
        return self.num_experts >= MOE_MIN_EXPERTS

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, GLM-5): the KV cache holds one latent."""
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        """``MLA``, ``MHA`` (one KV head per query head), ``MQA`` (one KV head) or ``GQA``."""
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def num_sliding_layers(self) -> int:
        """Layers that attend over a sliding window of ``sliding_window`` tokens."""
        if self.sliding_window <= 0:
            return 0
        return sum(1 for t in self.layer_types if t == SLIDING_ATTENTION)

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    @property
    def moe_layer_split(self) -> tuple[int, int]:
        """(MoE layers, dense layers) as the latency models count them (spec §3.2).

        ``interleave_moe_layer_step = s > 0``: ``⌊L/(s+1)⌋`` MoE layers (BLIS's reading of the
        Llama-4 field); otherwise every layer of an MoE model is MoE (``first_k_dense_replace``
        is ignored here, as in BLIS) and every layer of a dense model is dense.
        """
        if not self.is_moe:
            return 0, self.num_layers
        if self.interleave_moe_layer_step > 0:
            moe = self.num_layers // (self.interleave_moe_layer_step + 1)
            return moe, self.num_layers - moe
        return self.num_layers, 0

    @property
    def expert_intermediate_size(self) -> int:
        """FFN dim of one routed expert (``moe_intermediate_size``, else ``intermediate_size``)."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def dense_layer_intermediate_size(self) -> int:
        """FFN dim of a dense layer (``intermediate_size_mlp``, else ``intermediate_size``)."""
        return self.dense_intermediate_size or self.intermediate_size

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        *,
        name: str,
        model_id: str | None = None,
        source: str = "",
        path: str = "model",
    ) -> ModelSpec:
        """Read a parsed ``config.json``; errors name ``path`` and the config field.

        ``model_id`` (default ``name``) feeds the weight-precision fallback used when
        ``quantization_config`` says nothing (``...-w4a16`` → 0.5 bytes, ``...-fp8`` → 1).
        """
        where = source or name
        if not isinstance(config, Mapping):
            raise ScenarioError(path, where, "a HuggingFace config.json must hold a JSON object")
        raw: dict[str, Any] = dict(config)
        text_config = raw.get("text_config")
        if isinstance(text_config, Mapping):
            # Multimodal configs (Llama-4, Gemma-3): the language model's fields win.
            raw.update(text_config)

        def positive(key: str) -> int:
            value = _int_field(raw, key)
            if value <= 0:
                raise ScenarioError(
                    path, raw.get(key), f"{where}: config field {key!r} must be a positive integer"
                )
            return value

        def non_negative(key: str) -> int:
            value = _int_field(raw, key)
            if value < 0:
                raise ScenarioError(path, value, f"{where}: config field {key!r} must be >= 0")
            return value

        num_layers = positive("num_hidden_layers")
        hidden_size = positive("hidden_size")
        num_heads = positive("num_attention_heads")
        num_kv_heads = next((v for v in (_int_field(raw, k) for k in KV_HEAD_FIELDS) if v != 0), 0)
        if num_kv_heads < 0:
            raise ScenarioError(path, num_kv_heads, f"{where}: the KV-head count must be >= 0")
        if num_kv_heads == 0:
            num_kv_heads = num_heads  # multi-head attention

        dtype = raw.get("torch_dtype")
        if not isinstance(dtype, str):
            dtype = raw.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise ScenarioError(
                path,
                dtype,
                f"{where}: config field 'torch_dtype' (or 'dtype') must be one of "
                f"{', '.join(DTYPE_BYTES)}",
            )

        intermediate_size = next(
            (
                v
                for v in (
                    _int_field(raw, k) for k in ("intermediate_size", "ffn_hidden_size", "ffn_dim")
                )
                if v
            ),
            0,
        )
        num_experts = next(
            (v for v in (_int_field(raw, k) for k in EXPERT_COUNT_FIELDS) if v >= MOE_MIN_EXPERTS),
            0,
        )
        experts_per_tok = _int_field(raw, "num_experts_per_tok")
        if experts_per_tok < 0:
            raise ScenarioError(
                path, experts_per_tok, f"{where}: config field 'num_experts_per_tok' must be >= 0"
            )
        if num_experts >= MOE_MIN_EXPERTS:
            if experts_per_tok == 0:
                raise ScenarioError(
                    path,
                    where,
                    f"{where}: a mixture-of-experts config ({num_experts} experts) needs "
                    "config field 'num_experts_per_tok' > 0",
                )
            if experts_per_tok > num_experts:
                raise ScenarioError(
                    path,
                    experts_per_tok,
                    f"{where}: config field 'num_experts_per_tok' ({experts_per_tok}) exceeds the "
                    f"number of routed experts ({num_experts})",
                )
        moe_intermediate_size = _int_field(raw, "moe_intermediate_size")
        n_shared_experts = _int_field(raw, "n_shared_experts")
        shared = _int_field(raw, "shared_expert_intermediate_size")
        if shared <= 0:
            shared = 0
            if n_shared_experts > 0:
                shared = n_shared_experts * (moe_intermediate_size or intermediate_size)

        quant_method = ""
        quantized = 0.0
        qc = raw.get("quantization_config")
        if isinstance(qc, Mapping):
            method = qc.get("quant_method")
            quant_method = method if isinstance(method, str) else ""
            quantized = _quantized_bytes_per_param(qc)
        if quantized == 0.0:
            quantized = weight_bytes_from_model_name(model_id or name)

        rope_type, rope_factor, rope_original = "", 0.0, 0
        rope = raw.get("rope_scaling")
        if isinstance(rope, Mapping):
            kind = rope.get("type")
            if not isinstance(kind, str) or not kind:
                kind = rope.get("rope_type")
            rope_type = kind if isinstance(kind, str) else ""
            factor = _number(rope.get("factor"))
            if factor is not None:
                rope_factor = float(factor)
            original = _number(rope.get("original_max_position_embeddings"))
            if original is not None and original > 0:
                rope_original = int(original)

        hidden_act = raw.get(
            "hidden_act", raw.get("activation_function")
        )  # OPT: activation_function
        model_type = raw.get("model_type")
        tied = raw.get("tie_word_embeddings")
        window, layer_types = _attention_layout(
            raw,
            num_layers,
            model_type if isinstance(model_type, str) else "",
            where=where,
            path=path,
        )
        return cls(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            vocab_size=_int_field(raw, "vocab_size"),
            intermediate_size=intermediate_size,
            bytes_per_param=DTYPE_BYTES[dtype],
            model_type=model_type if isinstance(model_type, str) else "",
            hidden_act=hidden_act if isinstance(hidden_act, str) else "",
            explicit_head_dim=non_negative("head_dim"),
            quantized_bytes_per_param=quantized,
            quant_method=quant_method,
            num_experts=num_experts,
            num_experts_per_tok=experts_per_tok,
            n_shared_experts=n_shared_experts,
            moe_intermediate_size=moe_intermediate_size,
            shared_expert_intermediate_size=shared,
            interleave_moe_layer_step=_int_field(raw, "interleave_moe_layer_step"),
            dense_intermediate_size=_int_field(raw, "intermediate_size_mlp"),
            first_k_dense_replace=non_negative("first_k_dense_replace"),
            kv_lora_rank=non_negative("kv_lora_rank"),
            qk_rope_head_dim=non_negative("qk_rope_head_dim"),
            max_position_embeddings=_int_field(raw, "max_position_embeddings"),
            rope_scaling_type=rope_type,
            rope_scaling_factor=rope_factor,
            rope_original_max_position_embeddings=rope_original,
            tie_word_embeddings=tied
            if isinstance(tied, bool)
            else (isinstance(model_type, str) and model_type in TIED_BY_DEFAULT_MODEL_TYPES),
            sliding_window=window,
            layer_types=layer_types,
            source=source,
        )


def _attention_layout(
    raw: Mapping[str, Any], num_layers: int, model_type: str, *, where: str, path: str
) -> tuple[int, tuple[str, ...]]:
    """(sliding window, per-layer attention kinds) from a config, as HF transformers reads them.

    * ``layer_types`` (Gemma-3, gpt-oss, Qwen-2/3, Cohere-2 in recent transformers) lists every
      layer's kind explicitly and wins;
    * else ``sliding_window`` > 0 (and ``use_sliding_window`` not false) enables the window on
      the layers chosen by ``sliding_window_pattern = p`` (layer i is local unless (i+1) % p == 0,
      Gemma-3/Cohere-2), by Gemma-2's alternation (even layers local), by Qwen's
      ``max_window_layers = m`` (layers i >= m are local), or on every layer (Mistral).

    Returns ``(0, ())`` when no layer is windowed.
    """
    window = _int_field(raw, "sliding_window")
    if window < 0:
        raise ScenarioError(path, window, f"{where}: config field 'sliding_window' must be >= 0")
    types_raw = raw.get("layer_types")
    if types_raw is not None:
        if isinstance(types_raw, (str, bytes)) or not isinstance(types_raw, (list, tuple)):
            raise ScenarioError(
                path, types_raw, f"{where}: config field 'layer_types' must be a list of strings"
            )
        if len(types_raw) != num_layers:
            raise ScenarioError(
                path,
                len(types_raw),
                f"{where}: config field 'layer_types' has {len(types_raw)} entries but the "
                f"model has {num_layers} layers (num_hidden_layers)",
            )
        kinds = []
        for i, kind in enumerate(types_raw):
            normalised = LAYER_TYPE_ALIASES.get(kind) if isinstance(kind, str) else None
            if normalised is None:
                raise ScenarioError(
                    path,
                    kind,
                    f"{where}: config field 'layer_types[{i}]' is not modelled; servesim models "
                    f"{', '.join(sorted(LAYER_TYPE_ALIASES))}",
                )
            kinds.append(normalised)
        if SLIDING_ATTENTION not in kinds:
            return 0, ()
        if window <= 0:
            raise ScenarioError(
                path,
                raw.get("sliding_window"),
                f"{where}: config field 'layer_types' marks sliding-window layers but "
                "'sliding_window' is not a positive integer",
            )
        return window, tuple(kinds)
    if window <= 0 or raw.get("use_sliding_window") is False:
        return 0, ()
    pattern = _int_field(raw, "sliding_window_pattern")
    if pattern < 0:
        raise ScenarioError(
            path, pattern, f"{where}: config field 'sliding_window_pattern' must be >= 0"
        )
    if pattern > 0:
        sliding = [(i + 1) % pattern != 0 for i in range(num_layers)]
    elif model_type == "gemma2":
        sliding = [i % 2 == 0 for i in range(num_layers)]
    elif raw.get("use_sliding_window") is True and "max_window_layers" in raw:
        first = _int_field(raw, "max_window_layers")
        sliding = [i >= first for i in range(num_layers)]
    else:
        sliding = [True] * num_layers
    if not any(sliding):
        return 0, ()
    return window, tuple(SLIDING_ATTENTION if w else FULL_ATTENTION for w in sliding)


def load_model_spec(file: str | Path, *, name: str | None = None, path: str = "model") -> ModelSpec:
    """Read a HuggingFace ``config.json`` file (or a directory holding one) into a :class:`ModelSpec`."""
    p = Path(file).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ScenarioError(
            path, str(file), "no such file; give the path to a HuggingFace config.json"
        )
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(path, str(file), f"cannot read it as JSON ({exc})") from None
    if name is None:
        name = p.parent.name if p.name == "config.json" else p.stem
    return ModelSpec.from_hf_config(config, name=name, source=str(p), path=path)


def _number(value: Any) -> float | None:
    """A finite JSON number, or None (absent, null, a bool, a string, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _int_field(raw: Mapping[str, Any], key: str) -> int:
    """A JSON number as an int (truncated), 0 when absent, null or not a number (BLIS ``getInt``)."""
    value = _number(raw.get(key))
    return 0 if value is None else int(value)


def _quantized_bytes_per_param(qc: Mapping[str, Any]) -> float:
    """Weight bytes from ``quantization_config``; 0 = unknown.

    ``bits`` (GPTQ, AWQ: ``bits/8``, group scales not counted, as BLIS), ``quant_method: fp8``,
    compressed-tensors ``config_groups.*.weights.num_bits`` (first group in key order), bitsandbytes
    ``load_in_4bit``/``load_in_8bit``, and the block-scaled 4-bit formats with their scale
    overhead: ``mxfp4`` (4.25 bits) and ModelOpt ``NVFP4`` (4.5 bits).
    """
    method = qc.get("quant_method")
    method = method.lower() if isinstance(method, str) else ""
    if method == "mxfp4":
        return MXFP4_BYTES_PER_PARAM
    if method == "modelopt":
        algo = qc.get("quant_algo")
        algo = algo.upper() if isinstance(algo, str) else ""
        if algo == "NVFP4":
            return NVFP4_BYTES_PER_PARAM
        if algo.startswith("FP8"):
            return 1.0
    if method == "bitsandbytes":
        if qc.get("load_in_4bit") is True:
            return 0.5
        if qc.get("load_in_8bit") is True:
            return 1.0
    bits_raw = qc.get("bits")
    bits = 0
    bits_number = _number(bits_raw)
    if bits_number is not None:
        bits = int(bits_number)
    elif isinstance(bits_raw, str):
        try:
            bits = int(bits_raw)
        except ValueError:
            bits = 0
    if bits > 0:
        return bits / 8
    if method in ("fp8", "fbgemm_fp8"):
        return 1.0
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if isinstance(groups, Mapping):
            for key in sorted(groups):
                group = groups[key]
                weights = group.get("weights") if isinstance(group, Mapping) else None
                num_bits = (
                    _number(weights.get("num_bits")) if isinstance(weights, Mapping) else None
                )
                if num_bits is not None and num_bits > 0:
                    return num_bits / 8
    return 0.0


_NAME_WXAY = re.compile(r"(?i)(?:^|[.\-_/])w(\d+)a\d+(?:$|[.\-_])")
_NAME_FP8 = re.compile(r"(?i)(?:^|[.\-_/])fp8(?:$|[.\-_])")


def weight_bytes_from_model_name(name: str) -> float:
    """Weight bytes implied by a model name (``...-w4a16`` → 0.5, ``...-FP8-dynamic`` → 1); 0 = none."""
    match = _NAME_WXAY.search(name)
    if match and int(match.group(1)) > 0:
        return int(match.group(1)) / 8
    if _NAME_FP8.search(name):
        return 1.0
    return 0.0


# --------------------------------------------------------------------------------------------
# Bundled model index and name resolution
# --------------------------------------------------------------------------------------------


@attrs.frozen
class ModelInfo:
    """A resolved ``model:`` field: canonical name, ids for coefficient tables, and the spec.

    ``spec`` is None for models known only by their coefficients (no bundled config).
    """

    name: str
    hf_id: str | None = None
    """Lowercase HuggingFace-style id, the key of the bundled coefficient tables."""
    hf_repo: str | None = None
    spec: ModelSpec | None = None
    config_path: str | None = None
    aliases: tuple[str, ...] = ()
    origin: str = ""
    """Where the config came from: ``bundled``, ``file`` or ``HF cache (<how the snapshot was
    chosen>)``; empty without a config."""
    unmodelled: tuple[UnmodelledField, ...] = ()
    """Config fields with a performance effect servesim does not model (logged as warnings)."""

    def require_spec(self, path: str = "model", needed_for: str = "this setting") -> ModelSpec:
        """The spec, or a ScenarioError saying how to supply a config.json."""
        if self.spec is None:
            raise ScenarioError(
                path,
                self.name,
                f"servesim bundles no architecture config for {self.name}, which {needed_for} "
                "needs; give the path to its HuggingFace config.json (model: path/to/config.json) "
                f"or put it in the local HF cache (huggingface-cli download {self.hf_repo or 'ORG/NAME'} "
                "config.json)",
            )
        return self.spec


@attrs.frozen
class _IndexEntry:
    name: str
    hf_id: str | None
    hf_repo: str | None
    config: str | None
    aliases: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def _model_index() -> tuple[dict[str, _IndexEntry], dict[str, str]]:
    """(canonical name → entry, lowercase lookup key → canonical name) from ``models.yaml``."""
    data = yaml.safe_load((_DATA_DIR / "models.yaml").read_text(encoding="utf-8"))
    entries: dict[str, _IndexEntry] = {}
    lookup: dict[str, str] = {}
    for name, fields in data["models"].items():
        entry = _IndexEntry(
            name=name,
            hf_id=fields.get("hf_id"),
            hf_repo=fields.get("hf_repo"),
            config=fields.get("config"),
            aliases=tuple(fields.get("aliases") or ()),
        )
        entries[name] = entry
        for key in (name, entry.hf_id, entry.hf_repo, *entry.aliases):
            if key:
                previous = lookup.setdefault(key.lower(), name)
                if previous != name:
                    raise ValueError(f"models.yaml: {key!r} names both {previous} and {name}")
    return entries, lookup


@functools.cache
def _bundled_config(name: str) -> tuple[ModelSpec, tuple[UnmodelledField, ...]] | None:
    entry = _model_index()[0][name]
    if entry.config is None:
        return None
    file = _DATA_DIR / "models" / entry.config
    config = json.loads(file.read_text(encoding="utf-8"))
    spec = ModelSpec.from_hf_config(
        config, name=name, model_id=entry.hf_id, source=f"{_DATA_DISPLAY}/models/{entry.config}"
    )
    return spec, unmodelled_fields(config)


def bundled_models() -> list[str]:
    """Canonical short names of every bundled model (with or without an architecture config)."""
    return sorted(_model_index()[0])


def _read_config(file: Path, path: str, shown: str) -> dict[str, Any]:
    """A ``config.json`` file parsed, or a ScenarioError naming ``shown``."""
    if not file.is_file():
        raise ScenarioError(path, shown, "no such file; give the path to a HuggingFace config.json")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(path, shown, f"cannot read it as JSON ({exc})") from None


def _from_hf_cache(text: str, path: str, *, hf_id: str | None = None, name: str | None = None):
    """A ModelInfo from the HF cache's config of ``text`` (an HF id), or None when not cached."""
    cached = find_in_hf_cache(text, path)
    if cached is None:
        return None
    config = _read_config(cached.file, path, str(cached.file))
    shown = name or cached.repo_id
    spec = ModelSpec.from_hf_config(
        config, name=shown, model_id=cached.repo_id, source=str(cached.file), path=path
    )
    return ModelInfo(
        name=shown,
        hf_id=hf_id or cached.repo_id.lower(),
        hf_repo=cached.repo_id,
        spec=spec,
        config_path=str(cached.file),
        origin=f"HF cache ({cached.chosen_by})",
        unmodelled=unmodelled_fields(config),
    )


def resolve_model(
    name: str, path: str = "model", *, base_dir: str | Path | None = None
) -> ModelInfo:
    """Resolve a scenario's ``model:`` value, first match wins:

    1. a bundled short name, alias, HuggingFace id or repo (case-insensitive); a bundled model
       without an architecture config takes it from the local HF cache when its repo is there;
    2. a path to a ``config.json`` or to a model directory holding one (relative paths against
       ``base_dir``);
    3. a HuggingFace id (``org/name[@revision]``) in the local HF cache (:mod:`.hfconfig`).
    """
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(
            path,
            name,
            "expected a model name such as qwen3-14b, a path to a HuggingFace config.json or "
            "a model directory, or a HuggingFace id in the local HF cache",
        )
    text = name.strip()
    entries, lookup = _model_index()
    canonical = lookup.get(text.lower())
    if canonical is not None:
        entry = entries[canonical]
        bundled = _bundled_config(canonical)
        repo = entry.hf_repo or entry.hf_id  # gpt-oss: BLIS names only the lowercase id
        if bundled is None and repo:
            cached = _from_hf_cache(repo, path, hf_id=entry.hf_id, name=entry.name)
            if cached is not None:
                return attrs.evolve(cached, aliases=entry.aliases)
        return ModelInfo(
            name=entry.name,
            hf_id=entry.hf_id,
            hf_repo=entry.hf_repo,
            spec=None if bundled is None else bundled[0],
            config_path=f"{_DATA_DISPLAY}/models/{entry.config}" if entry.config else None,
            aliases=entry.aliases,
            origin="bundled" if bundled is not None else "",
            unmodelled=() if bundled is None else bundled[1],
        )

    file = Path(text).expanduser()
    if base_dir is not None and not file.is_absolute():
        file = Path(base_dir) / file
    if text.lower().endswith(".json") or file.exists():
        config_file = file / CONFIG_FILE if file.is_dir() else file
        config = _read_config(config_file, path, str(file))
        spec_name = (
            file.name
            if file.is_dir()
            else (config_file.parent.name if config_file.name == CONFIG_FILE else config_file.stem)
        )
        spec = ModelSpec.from_hf_config(config, name=spec_name, source=str(config_file), path=path)
        return ModelInfo(
            name=spec.name,
            spec=spec,
            config_path=str(file),
            origin="file",
            unmodelled=unmodelled_fields(config),
        )

    cache_hint = ""
    if looks_like_repo_id(text):
        cached = _from_hf_cache(text, path)
        if cached is not None:
            return cached
        cache_hint = f"{cache_miss_hint(text)}; "

    close = difflib.get_close_matches(text.lower(), list(lookup), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(sorted({lookup[c] for c in close}))}? " if close else ""
    raise ScenarioError(
        path,
        name,
        f"unknown model; {hint}{cache_hint}bundled models: {', '.join(bundled_models())}. "
        "For another model give the path to its HuggingFace config.json or model directory "
        "(model: path/to/config.json), or its HuggingFace id once it is in the local HF cache",
    )


# --------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------


@attrs.frozen
class HardwareSpec:
    """One GPU's peak throughput, bandwidth, memory and assumed MFUs (spec §3.5)."""

    name: str
    tflops_bf16: float
    """Peak dense BF16/FP16 TFLOP/s."""
    tflops_fp8: float
    """Peak dense FP8 TFLOP/s; 0 = no native FP8."""
    bandwidth_tbs: float
    """Peak memory bandwidth, TB/s (10^12 bytes/s)."""
    memory_gib: float
    mfu_prefill: float
    mfu_decode: float
    aliases: tuple[str, ...] = ()
    source: str = ""
    cost_per_hour: float | None = None
    """USD per GPU-hour (optional; ``servesim plan`` prices fleets with it). None = unknown."""
    interconnect: str = ""
    """GPU-to-GPU fabric inside an instance: ``nvlink``, ``infinity-fabric`` (switched or fully
    connected: a small collective is one step) or ``pcie`` (a ring: ``2(n−1)`` steps for an
    all-reduce). Empty = unknown (the trained-physics model then keeps BLIS's HBM-bandwidth basis)."""
    interconnect_generation: str = ""
    """Human-readable generation, e.g. ``NVLink 4``, ``PCIe 4.0 x16`` (reported, not computed with)."""
    interconnect_gbs: float = 0.0
    """Per-GPU, per-direction (unidirectional) peak interconnect bandwidth, GB/s (10^9 bytes/s), as
    the datasheet gives it (halved when the datasheet quotes bidirectional). 0 = unknown."""
    interconnect_latency_us: float = 0.0
    """Latency floor of one collective step, µs: what a tiny all-reduce costs per step."""

    _FIELDS = (
        "tflops_bf16",
        "tflops_fp8",
        "bandwidth_tbs",
        "memory_gib",
        "mfu_prefill",
        "mfu_decode",
    )

    @classmethod
    def from_mapping(cls, name: str, values: Mapping[str, Any], path: str) -> HardwareSpec:
        """Build a (user-defined or bundled) GPU from a mapping; errors name ``path.field``."""
        from servesim.simcore.config import check_keys

        check_keys(
            values, (*cls._FIELDS, "aliases", "source", "cost_per_hour", *INTERCONNECT_FIELDS), path
        )
        numbers: dict[str, float] = {}
        for field in cls._FIELDS:
            if field not in values:
                raise ScenarioError(
                    f"{path}.{field}", None, f"required; fields: {', '.join(cls._FIELDS)}"
                )
            if field == "tflops_fp8":
                numbers[field] = as_float(values[field], f"{path}.{field}", minimum=0)
            elif field.startswith("mfu_"):
                numbers[field] = as_float(
                    values[field], f"{path}.{field}", exclusive_minimum=0, maximum=1
                )
            else:
                numbers[field] = as_float(values[field], f"{path}.{field}", exclusive_minimum=0)
        aliases = values.get("aliases") or ()
        cost = values.get("cost_per_hour")
        return cls(
            name=name,
            aliases=tuple(str(a) for a in aliases),
            source=str(values.get("source", "")),
            cost_per_hour=None
            if cost is None
            else as_float(cost, f"{path}.cost_per_hour", minimum=0),
            **numbers,
            **parse_interconnect(values, path),
        )


INTERCONNECT_KINDS = ("nvlink", "infinity-fabric", "pcie")
"""Fabric kinds: the first two are switched or fully connected (one step per small collective),
PCIe is a ring through the host's root complex (``2(n−1)`` steps per all-reduce)."""

INTERCONNECT_FIELDS = (
    "interconnect",
    "interconnect_generation",
    "interconnect_gbs",
    "interconnect_latency_us",
)


def parse_interconnect(values: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The optional interconnect fields of a GPU mapping, validated; all-or-nothing for the
    numbers (a kind with no bandwidth could not price a collective)."""
    out: dict[str, Any] = {}
    kind = values.get("interconnect")
    if kind is not None:
        if not isinstance(kind, str) or kind.strip().lower() not in INTERCONNECT_KINDS:
            raise ScenarioError(
                f"{path}.interconnect", kind, f"expected one of {', '.join(INTERCONNECT_KINDS)}"
            )
        out["interconnect"] = kind.strip().lower()
    if "interconnect_generation" in values:
        out["interconnect_generation"] = str(values["interconnect_generation"])
    for field in ("interconnect_gbs", "interconnect_latency_us"):
        if field in values:
            minimum = {"exclusive_minimum": 0} if field == "interconnect_gbs" else {"minimum": 0}
            out[field] = as_float(values[field], f"{path}.{field}", **minimum)
    given = [f for f in ("interconnect", "interconnect_gbs", "interconnect_latency_us") if f in out]
    if given and len(given) != 3:
        missing = [
            f
            for f in ("interconnect", "interconnect_gbs", "interconnect_latency_us")
            if f not in out
        ]
        raise ScenarioError(
            f"{path}.{missing[0]}",
            None,
            f"required with {', '.join(given)}: give interconnect ({'|'.join(INTERCONNECT_KINDS)}), "
            "interconnect_gbs (per GPU, per direction) and interconnect_latency_us together",
        )
    return out


@functools.lru_cache(maxsize=1)
def _hardware_table() -> tuple[dict[str, HardwareSpec], dict[str, str]]:
    data = yaml.safe_load((_DATA_DIR / "hardware.yaml").read_text(encoding="utf-8"))
    specs: dict[str, HardwareSpec] = {}
    lookup: dict[str, str] = {}
    for name, values in data["gpus"].items():
        spec = HardwareSpec.from_mapping(name, values, f"{_DATA_DISPLAY}/hardware.yaml:gpus.{name}")
        specs[name] = spec
        for key in (name, *spec.aliases):
            lookup[key.lower()] = name
    return specs, lookup


def bundled_gpus() -> list[str]:
    """Canonical names of the bundled GPUs."""
    return sorted(_hardware_table()[0])


def resolve_gpu(
    name: str, path: str = "gpu", *, base_dir: str | Path | None = None
) -> HardwareSpec:
    """The bundled GPU called ``name`` (or one of its aliases, case-insensitive), or a GPU defined
    in a YAML file (``gpu: path/to/gpu.yaml``; relative paths against ``base_dir``)."""
    specs, lookup = _hardware_table()
    canonical = lookup.get(name.strip().lower()) if isinstance(name, str) else None
    if canonical is not None:
        return specs[canonical]
    if isinstance(name, str) and name.strip():
        text = name.strip()
        file = Path(text).expanduser()
        if base_dir is not None and not file.is_absolute():
            file = Path(base_dir) / file
        if text.lower().endswith((".yaml", ".yml", ".json")) or file.is_file():
            return load_gpu_spec(file, path=path)
    known = ", ".join(
        f"{n} (alias {', '.join(s.aliases)})" if s.aliases else n for n, s in specs.items()
    )
    raise ScenarioError(
        path,
        name,
        f"unknown GPU; known: {known}. For another GPU give the path to a YAML file with "
        f"{', '.join(HardwareSpec._FIELDS)}",
    )


def load_gpu_spec(file: str | Path, *, path: str = "gpu") -> HardwareSpec:
    """Read a user-defined GPU: a YAML (or JSON) mapping with the fields of ``hardware.yaml``
    (``tflops_bf16``, ``tflops_fp8``, ``bandwidth_tbs``, ``memory_gib``, ``mfu_prefill``,
    ``mfu_decode``) plus an optional ``name`` (default: the file's stem), ``source`` and
    ``cost_per_hour`` (USD per GPU-hour, read by ``servesim plan``)."""
    p = Path(file).expanduser()
    if not p.is_file():
        raise ScenarioError(
            path,
            str(file),
            "no such file; give a bundled GPU name (servesim list gpus) or the path to a GPU "
            f"YAML file with {', '.join(HardwareSpec._FIELDS)}",
        )
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ScenarioError(path, str(file), f"cannot read it as YAML ({reason})") from None
    if not isinstance(data, Mapping):
        raise ScenarioError(
            path, str(file), f"a GPU file must hold a mapping of {', '.join(HardwareSpec._FIELDS)}"
        )
    values = dict(data)
    name = values.pop("name", None)
    if name is None:
        name = p.stem
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(f"{path}.name", name, "expected the GPU's name as a string")
    values.setdefault("source", f"user file {p}")
    return HardwareSpec.from_mapping(name.strip(), values, path)


def context_specs(context: Any, path: str, needed_for: str) -> tuple[ModelSpec, HardwareSpec]:
    """The model and GPU specs of a :class:`~servesim.latency.base.LatencyContext`, resolving
    its names when the context carries no specs (as in plugin tests that pass names only)."""
    spec = getattr(context, "model_spec", None)
    if spec is None:
        info = resolve_model(context.model, "model")
        spec = info.require_spec("model", needed_for)
    hardware = getattr(context, "hardware", None)
    if hardware is None:
        hardware = resolve_gpu(context.gpu, "gpu")
    if not isinstance(spec, ModelSpec) or not isinstance(hardware, HardwareSpec):
        raise ScenarioError(
            path, context.model, "the latency context carries no usable model/GPU spec"
        )
    return spec, hardware


def check_tensor_parallel(
    model: ModelSpec, tp: int, path: str = "tp", *, kv_heads_divisible: bool = False
) -> None:
    """Tensor parallelism must split the attention heads evenly (vLLM's rule).

    KV heads: ``tp`` must divide them, or (GQA/MQA with fewer KV heads than GPUs) be a multiple
    of them, when vLLM replicates each KV head; ``kv_heads_divisible`` demands the former (the
    trained-physics model's validation, spec §3.3). MLA has no per-head KV cache to split.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ScenarioError(path, tp, "tensor parallelism must be a positive integer")
    heads = model.num_heads
    if heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise ScenarioError(
            path,
            tp,
            f"{model.name} has {heads} attention heads (num_attention_heads), which tp={tp} "
            f"does not divide; use one of {', '.join(map(str, divisors))}",
        )
    if model.is_mla:
        return
    kv = model.num_kv_heads
    if kv % tp == 0 or (not kv_heads_divisible and tp % kv == 0):
        return
    divisors = [d for d in range(1, kv + 1) if kv % d == 0]
    if kv_heads_divisible:
        fix = f"this latency model needs tp to divide them: use one of {', '.join(map(str, divisors))}"
    else:
        fix = "tp must divide them or be a multiple of them"
    raise ScenarioError(path, tp, f"{model.name} has {kv} KV heads (num_key_value_heads); {fix}")


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
        divisors = [d for d in range(1, kv_heads + 1) if kv_heads % d == 0]
        raise ScenarioError(
            path,
            tp,
            f"{model.name} has {kv_heads} KV heads, which tp={tp} does not divide; "
            f"use one of {', '.join(map(str, divisors))}",
        )
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
        return int(self.kv_gib * float(GIB)) // self.per_block_bytes


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
    path: str = "engine.kv_blocks",
) -> KVCapacity:
    """The per-GPU memory terms of a ``tp``-GPU instance (see :class:`KVCapacity`); validates
    the arguments and the config as :func:`auto_kv_blocks` does, without requiring a fit."""
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
    per_block = int(kv_bytes_per_token(model, tp, path=path) * float(block_size))
    if per_block <= 0:
        raise ScenarioError(
            path, block_size, f"one block of {model.name} would hold 0 bytes; raise block_size"
        )
    activation = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)["peak"]
    return KVCapacity(
        gpus=tp,
        requested_gib=hardware.memory_gib * gpu_memory_utilization,
        weights_gib=float(weights_bytes(model, path=path)) / float(GIB) / tp,
        activation_gib=activation / float(GIB),
        non_torch_gib=non_torch_gib(tp) / tp,
        cuda_graph_gib=float(cuda_graph_gib),
        adapter_gib=float(adapter_reserved_bytes) / float(GIB) / tp,
        per_block_bytes=per_block,
    )


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
    cap = kv_capacity(
        model,
        hardware,
        tp,
        block_size,
        gpu_memory_utilization,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        cuda_graph_gib=cuda_graph_gib,
        adapter_reserved_bytes=adapter_reserved_bytes,
        path=path,
    )
    if not cap.fits:
        adapters = f" + {cap.adapter_gib:.2f} adapters" if adapter_reserved_bytes else ""
        graphs = f" + {cap.cuda_graph_gib:.2f} CUDA graphs" if cuda_graph_gib else ""
        raise ScenarioError(
            path,
            "auto",
            f"{model.name} does not fit on {tp} x {hardware.name}: each GPU needs "
            f"{cap.overhead_gib:.2f} GiB ({cap.weights_gib:.2f} weights + "
            f"{cap.activation_gib:.2f} activation peak + {cap.non_torch_gib:.2f} non-torch"
            f"{graphs}{adapters}) but {hardware.memory_gib:g} GiB x {gpu_memory_utilization:g} "
            f"utilisation gives {cap.requested_gib:.2f} GiB. "
            + _minimum_gpus_hint(
                model,
                _fits_function(
                    model,
                    hardware,
                    gpu_memory_utilization,
                    max_num_batched_tokens,
                    max_num_seqs,
                    cuda_graph_gib,
                    adapter_reserved_bytes,
                    path,
                ),
                cap.requested_gib,
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
) -> tuple[bool, float, float]:
    """(overhead < available, available GiB, overhead GiB) for an instance of ``gpus`` GPUs,
    all GPUs together; ``activation_gib`` and ``cuda_graph_gib`` are per GPU."""
    available = hardware.memory_gib * gpu_memory_utilization * float(gpus)
    overhead = (
        weights_gib
        + (activation_gib + cuda_graph_gib) * float(gpus)
        + _non_torch_gib(gpus)
        + adapter_gib
    )
    return overhead < available, available, overhead


def _fits_function(
    model: ModelSpec,
    hardware: HardwareSpec,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    cuda_graph_gib: float,
    adapter_reserved_bytes: int,
    path: str,
) -> Any:
    """fits(gpus) -> (fits, available GiB, overhead GiB) with the activation peak at that TP."""
    weights_gib = float(weights_bytes(model, path=path)) / float(GIB)
    adapter_gib = float(adapter_reserved_bytes) / float(GIB)

    def fits(gpus: int) -> tuple[bool, float, float]:
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

    return fits


def _smallest_fit(fits: Any, per_gpu_gib: float, limit: int) -> int | None:
    if per_gpu_gib <= NON_TORCH_GIB_PER_GPU_MULTI:
        return None
    return next((n for n in range(1, limit + 1) if fits(n)[0]), None)


def _smallest_valid_tp(model: ModelSpec, minimum: int) -> int | None:
    """The smallest tp >= ``minimum`` that splits the model's heads (up to 4x ``minimum``)."""

    def valid_tp(t: int) -> bool:
        if model.num_heads % t:
            return False
        return model.is_mla or model.num_kv_heads < t or model.num_kv_heads % t == 0

    return next((t for t in range(minimum, 4 * minimum + 1) if valid_tp(t)), None)


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
    tp >= it that splits the heads); ``(None, None)`` when no count up to ``limit`` suffices."""
    fits = _fits_function(
        model,
        hardware,
        gpu_memory_utilization,
        max_num_batched_tokens,
        max_num_seqs,
        cuda_graph_gib,
        adapter_reserved_bytes,
        path,
    )
    smallest = _smallest_fit(fits, hardware.memory_gib * gpu_memory_utilization, limit)
    if smallest is None:
        return None, None
    return smallest, _smallest_valid_tp(model, smallest)


def _minimum_gpus_hint(model: ModelSpec, fits: Any, per_gpu_gib: float, limit: int = 4096) -> str:
    """'Minimum GPUs per instance: N' (the smallest count whose memory covers the overhead), plus
    the smallest valid tp when N does not divide the model's heads."""
    if per_gpu_gib <= NON_TORCH_GIB_PER_GPU_MULTI:
        return "It cannot fit on this GPU at any tp; use a GPU with more memory."
    minimum = _smallest_fit(fits, per_gpu_gib, limit)
    if minimum is None:
        return f"It does not fit on {limit} GPUs either; use a GPU with more memory."
    hint = f"Minimum GPUs per instance: {minimum}; set tp to at least {minimum}"
    tp_ok = _smallest_valid_tp(model, minimum)
    if tp_ok is not None and tp_ok != minimum:
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
