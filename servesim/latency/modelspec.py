"""A model's architecture spec (:class:`ModelSpec`), read from a HuggingFace ``config.json``.

:func:`load_model_spec` reads a user file; the bundled index and name resolution live in
:mod:`servesim.latency.modelindex`. Bundled data lives in ``servesim/latency/data``
(``models.yaml``, ``models/*.json``, ``hardware.yaml``); see ``NOTICE.md`` there for provenance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from servesim.latency.hfconfig import (
    FULL_ATTENTION,
    LAYER_TYPE_ALIASES,
    SLIDING_ATTENTION,
    _number,
    _quantized_bytes_per_param,
)
from servesim.simcore.errors import ScenarioError

MOE_MIN_EXPERTS = 2
"""A config with fewer routed experts than this is dense (a 1-expert MoE is dense-equivalent)."""

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
        model_type = model_type if isinstance(model_type, str) else ""
        tied = raw.get("tie_word_embeddings")
        window, layer_types = _attention_layout(raw, num_layers, model_type, where=where, path=path)
        return cls(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            vocab_size=_int_field(raw, "vocab_size"),
            intermediate_size=intermediate_size,
            bytes_per_param=DTYPE_BYTES[dtype],
            model_type=model_type,
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
            else model_type in TIED_BY_DEFAULT_MODEL_TYPES,
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


def _int_field(raw: Mapping[str, Any], key: str) -> int:
    """A JSON number as an int (truncated), 0 when absent, null or not a number (BLIS ``getInt``)."""
    value = _number(raw.get(key))
    return 0 if value is None else int(value)


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
