"""The bundled model index and model-name resolution: :func:`resolve_model` turns a scenario's
``model:`` (a bundled name, a HF id in the local cache, a path) into a :class:`ModelInfo`."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import attrs

from servesim.latency.bundled import bundled_section, name_lookup
from servesim.latency.hardware import HardwareSpec, resolve_gpu
from servesim.latency.hfconfig import (
    CONFIG_FILE,
    UnmodelledField,
    cache_miss_hint,
    find_in_hf_cache,
    looks_like_repo_id,
    unmodelled_fields,
)
from servesim.latency.modelspec import _DATA_DIR, _DATA_DISPLAY, ModelSpec
from servesim.simcore.errors import ScenarioError

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
    entries = {
        name: _IndexEntry(
            name=name,
            hf_id=fields.get("hf_id"),
            hf_repo=fields.get("hf_repo"),
            config=fields.get("config"),
            aliases=tuple(fields.get("aliases") or ()),
        )
        for name, fields in bundled_section("models.yaml", "models").items()
    }
    return entries, name_lookup(
        entries, lambda entry: (entry.hf_id, entry.hf_repo, *entry.aliases), "models.yaml"
    )


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

    import difflib  # only an unknown name needs suggestions

    close = difflib.get_close_matches(text.lower(), list(lookup), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(sorted({lookup[c] for c in close}))}? " if close else ""
    raise ScenarioError(
        path,
        name,
        f"unknown model; {hint}{cache_hint}bundled models: {', '.join(bundled_models())}. "
        "For another model give the path to its HuggingFace config.json or model directory "
        "(model: path/to/config.json), or its HuggingFace id once it is in the local HF cache",
    )


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
