"""The blackbox latency model: step time linear in the batch's prefill tokens and decode requests.

BLIS's original model (``spec/blis_reference.md`` §3.4), fitted per (model, GPU, TP) on real vLLM
runs::

    step_time_us         = max(1, trunc(β0 + β1·prefill_tokens + β2·decode_requests))
    queueing_time_us     = trunc(α0 + α1·prompt_tokens)
    output_token_time_us = trunc(α2)

It ignores context length, so a steady decode batch takes the same time every step, and
:meth:`BlackboxLatencyModel.decode_steps_us` is a constant array. Coefficients come from the
scenario (``latency: {model: blackbox, alpha: [...], beta: [...]}``), from a coefficients file
written by ``servesim calibrate`` (``latency: {model: blackbox, file: fitted.yaml}``, see
:func:`load_coefficients_file`) or from the bundled table ``data/blackbox_coefficients.yaml``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel
from servesim.latency.bundled import load_bundled
from servesim.simcore.config import (
    as_float,
    as_str,
    check_keys,
    expect_mapping,
    plain_data,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.paths import existing_file
from servesim.simcore.registry import register

COEFFICIENTS_FILE = Path(__file__).parent / "data" / "blackbox_coefficients.yaml"
_COEFFICIENTS_DISPLAY = "servesim/latency/data/blackbox_coefficients.yaml"


@attrs.frozen
class CoefficientEntry:
    """One fitted row of the bundled coefficient table."""

    model: str
    gpu: str
    tp: int
    vllm_version: str
    alpha: tuple[float, float, float]
    beta: tuple[float, float, float]
    fit_loss: float | None
    source_index: int

    @property
    def version_key(self) -> tuple[int, ...]:
        return _version_key(self.vllm_version)


def _version_key(version: str) -> tuple[int, ...]:
    """``"0.10.1.1"`` → ``(0, 10, 1, 1)`` (numeric, so 0.10 sorts after 0.8)."""
    parts = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def normalize_vllm_version(version: str) -> str:
    """Accept ``0.8.4``, ``v0.8.4`` or ``vllm/vllm-openai:v0.8.4``; return ``0.8.4``."""
    text = version.strip().rsplit(":", 1)[-1]
    return text[1:] if text[:1] in ("v", "V") else text


@functools.lru_cache(maxsize=1)
def coefficient_table() -> tuple[Mapping[str, str], tuple[CoefficientEntry, ...]]:
    """The bundled table: (source provenance mapping, entries in file order)."""
    data = load_bundled(COEFFICIENTS_FILE)
    entries = tuple(
        CoefficientEntry(
            model=row["model"],
            gpu=row["gpu"],
            tp=int(row["tp"]),
            vllm_version=str(row["vllm_version"]),
            alpha=tuple(float(x) for x in row["alpha"]),  # type: ignore[arg-type]
            beta=tuple(float(x) for x in row["beta"]),  # type: ignore[arg-type]
            fit_loss=None if row.get("fit_loss") is None else float(row["fit_loss"]),
            source_index=int(row["source_index"]),
        )
        for row in data["entries"]
    )
    return dict(data["source"]), entries


def select_coefficients(
    entries: Sequence[CoefficientEntry],
    model: str,
    gpu: str,
    tp: int,
    vllm_version: str | None = None,
    path: str = "latency",
) -> CoefficientEntry:
    """The entry for (model, gpu, tp), matching case-insensitively.

    Several entries for one combination (different vLLM versions, or repeated fits): the newest
    vLLM version wins unless ``vllm_version`` names one, then the lowest fit loss, then file order.
    Raises a ScenarioError that lists what is available when nothing matches.
    """
    model_key, gpu_key = model.lower(), gpu.lower()
    combination = f"{model} on {gpu} with tp={tp}"
    for_model = [e for e in entries if e.model.lower() == model_key]
    if not for_model:
        import difflib  # only an unknown model needs suggestions

        known = sorted({e.model for e in entries})
        suffixes = {e.model.split("/")[-1].lower(): e.model for e in entries}
        close = difflib.get_close_matches(model_key, [k.lower() for k in known], n=4, cutoff=0.6)
        close += [
            suffixes[s]
            for s in difflib.get_close_matches(
                model_key.split("/")[-1], list(suffixes), n=4, cutoff=0.6
            )
        ]
        close = sorted({c for c in close})
        listing = (
            f"close matches: {', '.join(close)}"
            if close
            else f"models with coefficients: {', '.join(known)}"
        )
        raise ScenarioError(
            path,
            combination,
            f"no bundled blackbox coefficients for model {model}; {listing}; "
            "or give latency.alpha and latency.beta",
        )
    matches = [e for e in for_model if e.gpu.lower() == gpu_key and e.tp == tp]
    if not matches:
        available = sorted({(e.gpu, e.tp) for e in for_model})
        listing = ", ".join(f"{g} tp={t}" for g, t in available)
        raise ScenarioError(
            path,
            combination,
            f"no bundled blackbox coefficients for {combination}; available for {model}: {listing}; "
            "or give latency.alpha and latency.beta",
        )
    if vllm_version is not None:
        wanted = normalize_vllm_version(vllm_version)
        versioned = [e for e in matches if e.vllm_version == wanted]
        if not versioned:
            versions = ", ".join(sorted({e.vllm_version for e in matches}, key=_version_key))
            raise ScenarioError(
                f"{path}.vllm_version",
                vllm_version,
                f"no coefficients for {combination} fitted on vLLM {wanted}; available: {versions}",
            )
        matches = versioned
    newest = max(e.version_key for e in matches)
    matches = [e for e in matches if e.version_key == newest]
    # min() keeps the first of equal keys, so ties fall back to file order.
    return min(matches, key=lambda e: float("inf") if e.fit_loss is None else e.fit_loss)


def _coefficients(value: Any, path: str) -> tuple[float, float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ScenarioError(
            path, value, "expected a list of 3 non-negative numbers, e.g. [1000, 2.5, 0]"
        )
    if len(value) != 3:
        raise ScenarioError(path, value, f"expected exactly 3 numbers, got {len(value)}")
    a, b, c = (as_float(v, f"{path}[{i}]", minimum=0) for i, v in enumerate(value))
    return a, b, c


COEFFICIENTS_FILE_FORMAT = "servesim-latency-coefficients/1"
"""The ``format`` a coefficients file written by :mod:`servesim.fidelity.calibrate` declares."""

PROVENANCE_KEYS = ("fitted_on", "objective", "errors", "servesim_version", "created", "notes")
"""What a fit file (coefficients or overheads) says about where its numbers come from."""
_FILE_KEYS = ("format", "model", "alpha", "beta", "units", *PROVENANCE_KEYS, "scenario")


def resolve_coefficients_file(value: Any, path: str, base_dir: str | Path | None = None) -> Path:
    """The file a ``latency.file`` names: ``~`` expanded; a relative path is resolved against
    ``base_dir`` when given, else against the current working directory."""
    if isinstance(value, Path):
        value = str(value)
    text = as_str(value, path)
    if not text.strip():
        raise ScenarioError(path, value, "expected the path of a coefficients YAML file")
    return existing_file(
        text,
        path,
        base_dir,
        shown=value,
        hint="; write one with `servesim calibrate ... --out FILE`",
    )


def file_param(
    params: Mapping[str, Any],
    exclusive: Sequence[str],
    gives: str,
    context: Any,
    path: str,
) -> Path | None:
    """The resolved ``<path>.file`` of a latency section (None when absent); an error naming the
    first of ``exclusive`` also given, since the file ``gives`` those values."""
    if "file" not in params:
        return None
    clashing = [k for k in exclusive if k in params]
    if clashing:
        raise ScenarioError(
            f"{path}.{clashing[0]}",
            params[clashing[0]],
            f"{path}.file gives {gives}; remove {' and '.join(clashing)} or the file",
        )
    return resolve_coefficients_file(
        params["file"], f"{path}.file", getattr(context, "base_dir", None)
    )


def read_fit_file(
    file: str | Path, allowed: Sequence[str], what: str, expects: str
) -> tuple[str, Mapping[str, Any]]:
    """(the file's name, its mapping) for a YAML written by ``servesim calibrate``: unreadable
    files, bad YAML, a non-mapping and unknown fields are errors named ``<file>[: <field>]``."""
    from servesim.simcore.config import load_yaml

    where = str(file)
    try:
        data = load_yaml(Path(file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(where, None, f"cannot read the {what} file ({exc})") from None
    except Exception as exc:  # yaml.YAMLError and the duplicate-key ConstructorError
        raise ScenarioError(where, None, f"not valid YAML ({exc})") from None
    if not isinstance(data, Mapping):
        raise ScenarioError(
            where, data, f"expected a mapping with {expects} (written by servesim calibrate)"
        )
    for key in data:
        if key not in allowed:
            raise ScenarioError(
                f"{where}: {key}", data[key], f"unknown field; allowed fields: {', '.join(allowed)}"
            )
    return where, data


def load_coefficients_file(
    file: str | Path,
) -> tuple[tuple[float, float, float], tuple[float, float, float], dict[str, Any]]:
    """(alpha, beta, provenance) from a coefficients YAML written by ``servesim calibrate``.

    Required: ``alpha`` and ``beta`` (3 non-negative numbers each). Optional: ``format`` (must be
    ``servesim-latency-coefficients/1``), ``model`` (must be ``blackbox``) and the provenance keys
    ``fitted_on``, ``objective``, ``errors``, ``servesim_version``, ``created``, ``notes``, which
    are kept in :meth:`BlackboxLatencyModel.describe`. Errors are named ``<file>: <field>``.
    """
    where, data = read_fit_file(file, _FILE_KEYS, "coefficients", "alpha and beta")
    fmt = data.get("format", COEFFICIENTS_FILE_FORMAT)
    if fmt != COEFFICIENTS_FILE_FORMAT:
        raise ScenarioError(f"{where}: format", fmt, f"expected {COEFFICIENTS_FILE_FORMAT}")
    kind = data.get("model", "blackbox")
    if kind != "blackbox":
        raise ScenarioError(
            f"{where}: model",
            kind,
            "this file holds coefficients of another latency model; the blackbox model reads "
            "only files with model: blackbox (use the file's 'scenario' mapping as the latency "
            "section instead)",
        )
    for key in ("alpha", "beta"):
        if key not in data:
            raise ScenarioError(f"{where}: {key}", None, "missing; expected a list of 3 numbers")
    alpha = _coefficients(data["alpha"], f"{where}: alpha")
    beta = _coefficients(data["beta"], f"{where}: beta")
    provenance: dict[str, Any] = {"source": "file", "file": where}
    for key in PROVENANCE_KEYS:
        if data.get(key) is not None:
            provenance[key] = _plain(data[key])
    return alpha, beta, provenance


def _plain(value: Any) -> Any:
    """JSON-ready copy of a YAML value (dates and other scalars become strings)."""
    return plain_data(value, _json_scalar)


def _json_scalar(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


@register("latency", "blackbox")
class BlackboxLatencyModel(LatencyModel):
    """Step time linear in prefill tokens and decode requests, with per-(model, GPU, TP) fits."""

    name = "blackbox"

    def __init__(
        self,
        alpha: Sequence[float],
        beta: Sequence[float],
        provenance: Mapping[str, Any] | None = None,
    ):
        a0, a1, a2 = (float(x) for x in alpha)
        b0, b1, b2 = (float(x) for x in beta)
        self.alpha = (a0, a1, a2)
        self.beta = (b0, b1, b2)
        self.provenance: dict[str, Any] = dict(provenance) if provenance else {"source": "explicit"}
        # Hot-path copies: plain attribute reads only.
        self._a0, self._a1 = a0, a1
        self._b0, self._b1, self._b2 = b0, b1, b2
        self.output_token_time_us = int(a2)
        self.post_decode_overhead_us = 0

    def step_time_us(self, batch: BatchSummary) -> int:
        t = int(self._b0 + self._b1 * batch.prefill_tokens + self._b2 * batch.decode_requests)
        return t if t > 1 else 1

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return int(self._a0 + self._a1 * prompt_tokens)

    def decode_steps_us(self, decode_requests: int, decode_context: int, k: int) -> np.ndarray:
        """Context-blind, so all ``k`` steps of a steady decode batch take the same time."""
        t = int(self._b0 + self._b1 * 0 + self._b2 * decode_requests)  # same expression as a step
        return np.full(k, t if t > 1 else 1, dtype=np.int64)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: LatencyContext) -> BlackboxLatencyModel:
        """Explicit ``alpha`` + ``beta``, a ``file`` written by ``servesim calibrate``, or the
        bundled fit for (context.model, gpu, tp).

        ``file`` is exclusive with ``alpha``, ``beta`` and ``vllm_version``. A relative ``file``
        is resolved against the context's ``base_dir`` when the context carries one; the
        :class:`LatencyContext` the scenario builds carries none, so it is resolved against the
        current working directory (as a ``distserve-profile`` profile path is).
        """
        path = ctx.path
        params = expect_mapping(params, path)
        check_keys(params, ("alpha", "beta", "vllm_version", "file"), path)
        file = file_param(params, ("alpha", "beta", "vllm_version"), "alpha and beta", ctx, path)
        if file is not None:
            alpha, beta, provenance = load_coefficients_file(file)
            return cls(alpha, beta, provenance)
        has_alpha, has_beta = "alpha" in params, "beta" in params
        if has_alpha or has_beta:
            if not (has_alpha and has_beta):
                missing = "beta" if has_alpha else "alpha"
                raise ScenarioError(
                    f"{path}.{missing}",
                    None,
                    "give both latency.alpha and latency.beta, or neither to use the bundled "
                    "coefficients for the model, GPU and tp",
                )
            if "vllm_version" in params:
                raise ScenarioError(
                    f"{path}.vllm_version",
                    params["vllm_version"],
                    "selects bundled coefficients; remove it when giving alpha and beta",
                )
            alpha = _coefficients(params["alpha"], f"{path}.alpha")
            beta = _coefficients(params["beta"], f"{path}.beta")
            return cls(alpha, beta, {"source": "scenario"})

        version = params.get("vllm_version")
        if version is not None:
            version = as_str(
                str(version) if isinstance(version, (int, float)) else version,
                f"{path}.vllm_version",
            )
        model_id, gpu = _table_keys(ctx)
        source, entries = coefficient_table()
        entry = select_coefficients(entries, model_id, gpu, ctx.tp, version, path)
        provenance = {
            "source": "bundled",
            "file": _COEFFICIENTS_DISPLAY,
            "entry": entry.source_index,
            "model": entry.model,
            "gpu": entry.gpu,
            "tp": entry.tp,
            "vllm_version": entry.vllm_version,
            "fit_loss": entry.fit_loss,
            "upstream": f"{source['repo']}@{source['commit']}:{source['file']}",
        }
        return cls(entry.alpha, entry.beta, provenance)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "alpha": list(self.alpha),
            "beta": list(self.beta),
            "provenance": dict(self.provenance),
        }

    def __repr__(self) -> str:
        return f"BlackboxLatencyModel(alpha={list(self.alpha)}, beta={list(self.beta)})"


def _table_keys(context: LatencyContext) -> tuple[str, str]:
    """Coefficient-table keys for the context: the model's lowercase HF id and the GPU's
    canonical name (aliases such as A100-SXM map to A100-80). Unknown names pass through, so the
    lookup error can list what is available."""
    from servesim.latency.hardware import resolve_gpu
    from servesim.latency.modelindex import resolve_model

    model_id = str(context.model).strip().lower()
    with contextlib.suppress(ScenarioError):  # unknown: keep the raw name for the error message
        info = resolve_model(context.model)
        model_id = info.hf_id or info.name
    gpu = str(context.gpu).strip()
    with contextlib.suppress(ScenarioError):
        gpu = resolve_gpu(context.gpu).name
    return model_id, gpu
