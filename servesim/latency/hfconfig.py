"""Where a model's HuggingFace ``config.json`` comes from, and what in it servesim does not model.

Besides a bundled name, a scenario's ``model:`` may be a path to a ``config.json``, a model
directory holding one, or a HuggingFace model id (``Qwen/Qwen3-8B``) already in the local HF cache
(servesim never downloads). The cache is the one ``huggingface_hub`` uses: ``$HF_HUB_CACHE``, else
``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub`` (``HF_HOME`` defaults to
``$XDG_CACHE_HOME/huggingface``, i.e. ``~/.cache/huggingface``). A model is the folder
``models--<org>--<name>`` there; its config is ``snapshots/<revision>/config.json``. The snapshot
is the one ``refs/main`` names; without a usable ``refs/main``, the snapshot whose ``config.json``
was modified last (ties: the greater revision name). ``org/name@rev`` picks a branch or tag under
``refs/`` or a revision hash explicitly.

:func:`unmodelled_fields` names the config fields that change performance in a way servesim's
latency and memory models do not capture; the scenario loader logs each as a warning.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from servesim.simcore.errors import ScenarioError

CONFIG_FILE = "config.json"

_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*(?:@[\w./-]+)?$")


def hf_hub_cache() -> Path:
    """The HuggingFace hub cache directory, resolved from the environment as huggingface_hub does."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(variable)
        if value:
            return Path(value).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path("~/.cache").expanduser()
    return base / "huggingface" / "hub"


def looks_like_repo_id(text: str) -> bool:
    """``org/name``, ``name`` or either with ``@revision``; not a ``.json`` file name."""
    return bool(_REPO_ID.match(text)) and not text.lower().endswith(".json")


def cache_folder_name(repo_id: str) -> str:
    """``Qwen/Qwen3-8B`` → ``models--Qwen--Qwen3-8B`` (huggingface_hub's layout)."""
    return "models--" + repo_id.replace("/", "--")


@attrs.frozen
class CachedConfig:
    """A ``config.json`` found in the HF cache."""

    repo_id: str
    """The id as the cache spells it (from the folder name, original case)."""
    file: Path
    revision: str
    """The snapshot folder's name (a commit hash)."""
    chosen_by: str
    """Why this snapshot: ``refs/main``, ``refs/<name>``, ``revision`` or ``newest snapshot``."""


def find_in_hf_cache(
    model_id: str, path: str = "model", *, cache: Path | None = None
) -> CachedConfig | None:
    """The cached ``config.json`` of ``model_id`` (``org/name[@revision]``), or None when the
    cache holds no snapshot of it with a config. Matching of the id is case-insensitive when the
    exact spelling is absent; two cached spellings of one id are an error (ambiguous)."""
    repo_id, _, revision = model_id.partition("@")
    root = hf_hub_cache() if cache is None else cache
    folder = _model_folder(root, repo_id, model_id, path)
    if folder is None:
        return None
    cached_id = folder.name[len("models--") :].replace("--", "/")
    snapshots = folder / "snapshots"
    if revision:
        ref = folder / "refs" / revision
        commit = _read_ref(ref) or revision
        file = snapshots / commit / CONFIG_FILE
        if not file.is_file():
            raise ScenarioError(
                path,
                model_id,
                f"the HF cache holds {cached_id} but no config.json for revision {revision!r} "
                f"(looked for {file}); cached revisions: {', '.join(_revisions(snapshots)) or 'none'}",
            )
        return CachedConfig(
            cached_id, file, commit, "revision" if commit == revision else f"refs/{revision}"
        )
    commit = _read_ref(folder / "refs" / "main")
    if commit:
        file = snapshots / commit / CONFIG_FILE
        if file.is_file():
            return CachedConfig(cached_id, file, commit, "refs/main")
    candidates = [s / CONFIG_FILE for s in _snapshot_dirs(snapshots) if (s / CONFIG_FILE).is_file()]
    if not candidates:
        return None
    newest = max(candidates, key=lambda f: (f.stat().st_mtime_ns, f.parent.name))
    return CachedConfig(cached_id, newest, newest.parent.name, "newest snapshot")


def cache_miss_hint(model_id: str) -> str:
    """Where the HF cache was searched for ``model_id``, for an unknown-model error."""
    repo_id = model_id.partition("@")[0]
    root = hf_hub_cache()
    where = root / cache_folder_name(repo_id) / "snapshots" / "*" / CONFIG_FILE
    return (
        f"not in the HF cache either (looked for {where}; the cache is $HF_HUB_CACHE, else "
        "$HF_HOME/hub, default ~/.cache/huggingface/hub; fetch the file with "
        f"`huggingface-cli download {repo_id} config.json`)"
    )


def _model_folder(root: Path, repo_id: str, model_id: str, path: str) -> Path | None:
    exact = root / cache_folder_name(repo_id)
    if exact.is_dir():
        return exact
    if not root.is_dir():
        return None
    wanted = cache_folder_name(repo_id).lower()
    matches = sorted(p for p in root.iterdir() if p.name.lower() == wanted and p.is_dir())
    if len(matches) > 1:
        raise ScenarioError(
            path,
            model_id,
            f"the HF cache {root} holds several spellings of this id "
            f"({', '.join(p.name for p in matches)}); write the id exactly as one of them",
        )
    return matches[0] if matches else None


def _read_ref(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8").strip() if file.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return ""


def _snapshot_dirs(snapshots: Path) -> list[Path]:
    return sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []


def _revisions(snapshots: Path) -> list[str]:
    return [p.name for p in _snapshot_dirs(snapshots)]


# --------------------------------------------------------------------------------------------
# Config fields servesim does not model
# --------------------------------------------------------------------------------------------

MODELLED_ARCHITECTURES = frozenset(
    {
        "llama",  # Llama 2/3, CodeLlama, Yi, Nemotron-70B
        "llama4_text",  # Llama-4 language model (text_config)
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "deepseek_v2",
        "deepseek_v3",
        "glm_moe_dsa",  # GLM-5 (its sparse-attention indexer is warned about separately)
        "gemma2",
        "gemma3_text",
        "cohere2",
        "gpt_oss",
        "granite",
        "phi3",  # Phi-3, Phi-4
        "smollm3",
        "opt",  # not gated: distserve-profile only (see models.yaml)
    }
)
"""``model_type`` values (of ``text_config`` when present) whose layers are decoder blocks that
servesim's formulas describe: attention (MHA/GQA/MLA, full or sliding window) and a gated MLP or
mixture of experts. Any other value gets a warning: the generic formulas are applied to it."""

MTP_FIELD_PATTERN = re.compile(r"(?i)nextn|(?:^|_)mtp(?:_|$)")
"""Multi-token-prediction layers: DeepSeek-V3's and GLM's ``num_nextn_predict_layers``."""

HYBRID_FIELDS = ("hybrid_override_pattern", "layers_block_type", "attn_layer_period")
"""Fields that lay out non-attention layers: Nemotron-H, Zamba, Jamba."""

STATE_SPACE_PREFIXES = ("mamba", "ssm_", "linear_")
"""Field-name prefixes of state-space (Mamba) and linear-attention layer settings."""

ENCODER_FIELDS = ("vision_config", "audio_config", "encoder_layers", "encoder_config")
"""Fields of an encoder servesim does not simulate (multimodal towers, encoder-decoder models)."""

SPARSE_ATTENTION_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")
"""DeepSeek-V3.2 / GLM-5 sparse-attention indexer (top-k tokens attended per query)."""


@attrs.frozen
class UnmodelledField:
    """Config fields with a performance effect servesim does not capture, and that effect."""

    kind: str
    """The class of the fields (``architecture``, ``multi-token-prediction``, ``encoder``, ...)."""
    fields: tuple[str, ...]
    effect: str

    def message(self) -> str:
        return f"config field {', '.join(self.fields)} not modelled: {self.effect}"


def unmodelled_fields(config: Mapping[str, Any]) -> tuple[UnmodelledField, ...]:
    """Every field of a HuggingFace config whose performance effect servesim does not model.

    ``text_config`` (multimodal wrappers) is merged over the top level as
    :meth:`ModelSpec.from_hf_config` does. Fields with no performance effect (biases, norms,
    ``rope_theta``) and fields servesim models (``rope_scaling`` through the context limit,
    ``sliding_window``, ``layer_types`` of attention, MoE and MLA fields) are not reported.
    """
    if not isinstance(config, Mapping):
        return ()
    raw = dict(config)
    text = raw.get("text_config")
    if isinstance(text, Mapping):
        raw.update(text)
    found: list[UnmodelledField] = []
    for check in _CHECKS:
        item = check(raw, config)
        if item is not None:
            found.append(item)
    return tuple(found)


def _set(value: Any) -> bool:
    """A field that is present and switches something on (not null, false, 0, '' or empty)."""
    return value is not None and value is not False and value != 0 and value != "" and value != []


def _architecture(raw: Mapping[str, Any], top: Mapping[str, Any]) -> UnmodelledField | None:
    kind = raw.get("model_type")
    if not isinstance(kind, str) or kind in MODELLED_ARCHITECTURES:
        return None
    return UnmodelledField(
        "architecture",
        ("model_type",),
        f"{kind!r} is not among the architectures servesim's formulas were checked against "
        f"({', '.join(sorted(MODELLED_ARCHITECTURES))}); it is simulated as a generic decoder "
        "(attention + gated MLP/MoE per layer), so layers of other kinds are priced wrongly",
    )


def _encoder(raw: Mapping[str, Any], top: Mapping[str, Any]) -> UnmodelledField | None:
    fields = [f for f in ENCODER_FIELDS if _set(top.get(f))]
    if top.get("is_encoder_decoder") is True:
        fields.append("is_encoder_decoder")
    if not fields:
        return None
    return UnmodelledField(
        "encoder",
        tuple(fields),
        "the encoder (vision/audio tower or encoder stack) is not simulated: only the language "
        "model's steps, weights and KV cache are; encoder time and weights are missing",
    )


def _multi_token_prediction(
    raw: Mapping[str, Any], top: Mapping[str, Any]
) -> UnmodelledField | None:
    fields = tuple(
        k
        for k in raw
        if MTP_FIELD_PATTERN.search(k) and _set(raw[k]) and not isinstance(raw[k], bool)
    )
    if not fields:
        return None
    return UnmodelledField(
        "multi-token-prediction",
        fields,
        "the model's multi-token-prediction layers are not used on their own: without "
        "engine.speculative servesim decodes one token per request per step; with it, the draft "
        "is priced by engine.speculative.draft_cost, not from these layers; their weights are not "
        "counted in memory",
    )


def _hybrid_layers(raw: Mapping[str, Any], top: Mapping[str, Any]) -> UnmodelledField | None:
    fields = [f for f in HYBRID_FIELDS if _set(raw.get(f))]
    fields += [k for k in raw if k.startswith(STATE_SPACE_PREFIXES) and _set(raw[k])]
    layer_types = raw.get("layer_types")
    if isinstance(layer_types, (list, tuple)) and any(
        t not in LAYER_TYPE_ALIASES for t in layer_types if isinstance(t, str)
    ):
        fields.insert(0, "layer_types")
    if not fields:
        return None
    return UnmodelledField(
        "hybrid-layers",
        tuple(dict.fromkeys(fields)),
        "state-space (Mamba) or linear-attention layers are not modelled: servesim prices every "
        "layer as softmax attention with a growing KV cache",
    )


def _attention_variant(raw: Mapping[str, Any], top: Mapping[str, Any]) -> UnmodelledField | None:
    fields: list[str] = []
    effects: list[str] = []
    sparse = [f for f in SPARSE_ATTENTION_FIELDS if _set(raw.get(f))]
    if sparse:
        fields += sparse
        effects.append(
            "sparse attention (an indexer picks the top-k tokens each query attends to) is "
            "priced as dense attention over the whole context, and the indexer's own cost and "
            "cache are not counted"
        )
    if _set(raw.get("attention_chunk_size")):
        fields.append("attention_chunk_size")
        effects.append(
            "chunked local attention is priced, and its KV cache sized, as full attention over "
            "the whole context"
        )
    if _set(raw.get("use_mla")) and not _set(raw.get("kv_lora_rank")):
        fields.append("use_mla")
        effects.append(
            "use_mla without kv_lora_rank is not understood: attention is priced and its KV "
            "cache sized as standard multi-head attention"
        )
    if not fields:
        return None
    return UnmodelledField("attention-variant", tuple(fields), "; ".join(effects))


def _moe_layout(raw: Mapping[str, Any], top: Mapping[str, Any]) -> UnmodelledField | None:
    fields = []
    step = raw.get("decoder_sparse_step")
    if isinstance(step, int) and not isinstance(step, bool) and step > 1:
        fields.append("decoder_sparse_step")
    if _set(raw.get("mlp_only_layers")):
        fields.append("mlp_only_layers")
    freq = raw.get("moe_layer_freq")
    if freq is not None and freq != 1:
        fields.append("moe_layer_freq")
    if not fields:
        return None
    return UnmodelledField(
        "moe-layout",
        tuple(fields),
        "the layers these fields make dense are counted as mixture-of-experts layers (only "
        "first_k_dense_replace and interleave_moe_layer_step are modelled)",
    )


def _quantization(raw: Mapping[str, Any], top: Mapping[str, Any]) -> UnmodelledField | None:
    qc = raw.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    fields = []
    if _quantized_bytes_per_param(qc) == 0.0:
        method = qc.get("quant_method")
        fields.append(f"quantization_config.quant_method={method}")
    if _set(qc.get("kv_cache_scheme")):
        fields.append("quantization_config.kv_cache_scheme")
    if not fields:
        return None
    return UnmodelledField(
        "quantization",
        tuple(fields),
        "a weight format servesim does not read (weights are counted at the width the model "
        "name implies, else at torch_dtype) or a quantized KV cache (KV bytes are counted at "
        "torch_dtype)",
    )


_CHECKS = (
    _architecture,
    _encoder,
    _multi_token_prediction,
    _hybrid_layers,
    _attention_variant,
    _moe_layout,
    _quantization,
)

WARNED_KINDS = (
    "architecture",
    "encoder",
    "multi-token-prediction",
    "hybrid-layers",
    "attention-variant",
    "moe-layout",
    "quantization",
)
"""Every class of unmodelled field :func:`unmodelled_fields` reports, in report order."""


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


def _number(value: Any) -> float | None:
    """A finite JSON number, or None (absent, null, a bool, a string, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


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
