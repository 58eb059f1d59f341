"""The ``distserve-profile`` latency model: DistServe's fitted step times (simdistserve).

DistServe's simulator prices each step with per-(engine, TP) curves fitted on OPT models measured
on A100-80GB GPUs. servesim re-implements the formulas and reads the coefficients from a profile
YAML (default: the bundled ``data/distserve_opt13b_a100.yaml``, converted from simdistserve's
``profiler-a100-80g.{vllm,distserve}.json``). With ``t`` the new prompt tokens of each prefill item,
``K`` the known tokens of each prefill item (``prompt + generated``), ``n`` the decode requests and
``S`` their total context before the step (``BatchSummary.decode_context``), in µs::

    prefill = (a_p + b_p·Σt + c_p·Σt²) / pp + o_pp·pp
    decode  = (a_d + b_d·(S + n) + c_d·n) / pp
              (a_d, b_d, c_d) = small-batch fit if n < threshold, else large-batch fit
              (threshold 95 upstream)
    overhead(C) = o_0 + o_1·C       per step, C = Σ context of the step's requests

    step_time_us = max(1, trunc(x)) with x =
        prefill-only step:  prefill + overhead(ΣK)
        decode-only step:   decode  + overhead(S)
        mixed step:         prefill + overhead(ΣK + S)           (mixed: simdistserve, default)
                            prefill + decode + overhead(ΣK + S)  (mixed: sum)
        empty step:         1

``Σ(context + 1)`` over decoders is ``S + n``: simdistserve feeds the decode fit each request's
context including the token being generated. Its chunked-prefill worker prices a mixed step with
the prefill fit over the prefill chunks alone, so decode requests riding along cost only their
share of the per-step overhead; ``mixed: sum`` adds the decode fit instead. As upstream, the prefill
fit ignores the context a chunk attends to (earlier chunks or prefix-cache hits); the per-step
overhead is simdistserve's Ray overhead (2 ms + 0.0001 ms per context token) and the prefill
constant its pipeline constant (1 ms per stage); ``overheads: false`` drops both. The switch
between the small- and large-batch decode fits is a discontinuity of the fitted model itself.

Scenario parameters (``latency: {model: distserve-profile, ...}``): ``profile`` (bundled name or
YAML path), ``engine`` (``vllm`` | ``distserve``: which fit, default ``vllm``), ``tp`` (default: the
scenario's), ``pp`` (default 1), ``mixed``, ``overheads``, ``strict`` (default true: the scenario's
model and GPU must match the profile's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from servesim.latency.base import BatchSummary, ClosedFormDecodeModel, LatencyContext
from servesim.simcore.config import (
    as_bool,
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    load_yaml,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_PROFILE = "distserve_opt13b_a100"
BUNDLED_PROFILES = (DEFAULT_PROFILE,)
"""Profiles shipped in ``servesim/latency/data/`` (``<name>.yaml``), usable by name."""

PROFILE_FORMAT = "servesim-latency-profile/distserve-v1"
MIXED_MODES = ("simdistserve", "sum")
_TIME_UNITS_US = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}
_PROFILE_KEYS = (
    "format",
    "model",
    "gpu",
    "time_unit",
    "architecture",
    "source",
    "overheads",
    "max_num_tokens",
    "engines",
)
_FIT_KEYS = ("prefill", "decode_small_batch", "decode_large_batch", "large_batch_threshold")
_OVERHEAD_KEYS = ("prefill_per_pp_stage", "step_base", "step_per_context_token")
_ARCHITECTURE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "vocab_size")

Triple = tuple[float, float, float]


@attrs.frozen
class ProfileFit:
    """One engine's fit at one TP, in µs."""

    prefill: Triple
    decode_small_batch: Triple
    decode_large_batch: Triple
    large_batch_threshold: int


@attrs.frozen
class Overheads:
    """Constants added outside the fits, in µs (zero when the profile has none)."""

    prefill_per_pp_stage: float = 0.0
    step_base: float = 0.0
    step_per_context_token: float = 0.0


@attrs.frozen
class LatencyProfile:
    """A parsed profile file: fits per engine and TP, converted to µs."""

    file: str
    model: str
    gpu: str
    engines: Mapping[str, Mapping[int, ProfileFit]]
    overheads: Overheads
    architecture: Mapping[str, int]
    max_num_tokens: Mapping[int, int]
    source: Mapping[str, Any]

    def fit(self, engine: str, tp: int, path: str) -> ProfileFit:
        """The fit for ``engine`` at ``tp``; a ScenarioError lists the available TPs otherwise."""
        fits = self.engines[engine]
        if tp not in fits:
            available = ", ".join(str(t) for t in sorted(fits))
            raise ScenarioError(
                path,
                tp,
                f"the profile {self.file} has no {engine} fit for tp={tp}; available tp: "
                f"{available}",
            )
        return fits[tp]


def resolve_profile(value: Any, path: str) -> tuple[Path, str]:
    """(file, display name) of a bundled profile name or a YAML path."""
    text = as_str(value, path)
    if "/" not in text and "\\" not in text and not text.endswith((".yaml", ".yml")):
        if text in BUNDLED_PROFILES:
            return DATA_DIR / f"{text}.yaml", f"servesim/latency/data/{text}.yaml"
        raise ScenarioError(
            path,
            value,
            f"unknown bundled profile; bundled: {', '.join(BUNDLED_PROFILES)}, "
            "or give the path of a profile YAML file",
        )
    file = Path(text).expanduser()
    if not file.is_file():
        raise ScenarioError(
            path,
            value,
            f"no such file; bundled profiles: {', '.join(BUNDLED_PROFILES)}, "
            "or give the path of an existing profile YAML file",
        )
    return file, str(file)


def load_profile(value: Any = DEFAULT_PROFILE, path: str = "latency.profile") -> LatencyProfile:
    """Read and validate a profile (bundled name or path); errors name the file and the key."""
    file, display = resolve_profile(value, path)
    try:
        data = load_yaml(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(path, value, f"cannot read the profile ({exc})") from None
    except Exception as exc:  # yaml.YAMLError and the duplicate-key ConstructorError
        raise ScenarioError(display, None, f"not valid YAML ({exc})") from None
    where = display
    data = expect_mapping(data, where)
    check_keys(data, _PROFILE_KEYS, where)
    for key in ("model", "gpu", "engines"):
        if key not in data:
            raise ScenarioError(f"{where}: {key}", None, f"a profile needs {key}")
    fmt = data.get("format", PROFILE_FORMAT)
    if fmt != PROFILE_FORMAT:
        raise ScenarioError(f"{where}: format", fmt, f"expected {PROFILE_FORMAT}")
    unit = as_str(data.get("time_unit", "us"), f"{where}: time_unit", choices=list(_TIME_UNITS_US))
    scale = _TIME_UNITS_US[unit]

    engines_raw = expect_mapping(data["engines"], f"{where}: engines")
    if not engines_raw:
        raise ScenarioError(f"{where}: engines", {}, "give at least one engine (vllm, distserve)")
    engines: dict[str, dict[int, ProfileFit]] = {}
    for engine, per_tp in engines_raw.items():
        p = f"{where}: engines.{engine}"
        if not isinstance(per_tp, Mapping) or not per_tp:
            raise ScenarioError(p, per_tp, "expected a mapping tp -> fit, e.g. {1: {prefill: ...}}")
        fits: dict[int, ProfileFit] = {}
        for tp_key, fit in per_tp.items():
            tp = as_int(tp_key, f"{p}.{tp_key}", minimum=1)
            fits[tp] = _fit(fit, f"{p}.{tp_key}", scale)
        engines[str(engine)] = fits

    overheads = Overheads()
    if data.get("overheads") is not None:
        raw = expect_mapping(data["overheads"], f"{where}: overheads")
        check_keys(raw, _OVERHEAD_KEYS, f"{where}: overheads")
        overheads = Overheads(
            **{
                k: as_float(raw.get(k, 0.0), f"{where}: overheads.{k}", minimum=0) * scale
                for k in _OVERHEAD_KEYS
            }
        )
    architecture: dict[str, int] = {}
    if data.get("architecture") is not None:
        raw = expect_mapping(data["architecture"], f"{where}: architecture")
        check_keys(raw, _ARCHITECTURE_KEYS, f"{where}: architecture")
        architecture = {
            k: as_int(v, f"{where}: architecture.{k}", minimum=1) for k, v in raw.items()
        }
    capacity: dict[int, int] = {}
    if data.get("max_num_tokens") is not None:
        raw = data["max_num_tokens"]
        if not isinstance(raw, Mapping):
            raise ScenarioError(f"{where}: max_num_tokens", raw, "expected a mapping tp -> tokens")
        capacity = {
            as_int(k, f"{where}: max_num_tokens.{k}", minimum=1): as_int(
                v, f"{where}: max_num_tokens.{k}", minimum=1
            )
            for k, v in raw.items()
        }
    source = data.get("source") or {}
    if not isinstance(source, Mapping):
        raise ScenarioError(f"{where}: source", source, "expected a mapping")
    return LatencyProfile(
        file=display,
        model=as_str(data["model"], f"{where}: model"),
        gpu=as_str(data["gpu"], f"{where}: gpu"),
        engines=engines,
        overheads=overheads,
        architecture=architecture,
        max_num_tokens=capacity,
        source=dict(source),
    )


def _fit(value: Any, path: str, scale: float) -> ProfileFit:
    raw = expect_mapping(value, path)
    check_keys(raw, _FIT_KEYS, path)
    missing = [k for k in _FIT_KEYS if k not in raw]
    if missing:
        raise ScenarioError(path, dict(raw), f"missing {', '.join(missing)}")
    return ProfileFit(
        prefill=_triple(raw["prefill"], f"{path}.prefill", scale),
        decode_small_batch=_triple(raw["decode_small_batch"], f"{path}.decode_small_batch", scale),
        decode_large_batch=_triple(raw["decode_large_batch"], f"{path}.decode_large_batch", scale),
        large_batch_threshold=as_int(
            raw["large_batch_threshold"], f"{path}.large_batch_threshold", minimum=1
        ),
    )


def _triple(value: Any, path: str, scale: float) -> Triple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3:
        raise ScenarioError(path, value, "expected a list of 3 numbers [a, b, c]")
    a, b, c = (as_float(v, f"{path}[{i}]") * scale for i, v in enumerate(value))
    return a, b, c


@register("latency", "distserve-profile")
class DistServeProfileLatencyModel(ClosedFormDecodeModel):
    """simdistserve's fitted prefill/decode step times for one engine at one TP (module doc)."""

    name = "distserve-profile"

    def __init__(
        self,
        profile: LatencyProfile,
        engine: str = "vllm",
        tp: int = 1,
        pp: int = 1,
        mixed: str = "simdistserve",
        overheads: bool = True,
    ):
        if engine not in profile.engines:
            raise ScenarioError(
                "latency.engine", engine, f"must be one of: {', '.join(sorted(profile.engines))}"
            )
        if mixed not in MIXED_MODES:
            raise ScenarioError("latency.mixed", mixed, f"must be one of: {', '.join(MIXED_MODES)}")
        if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
            raise ScenarioError("latency.pp", pp, "must be a positive integer")
        self.profile = profile
        self.engine = engine
        self.tp = tp
        self.pp = pp
        self.mixed = mixed
        self.overheads = overheads
        self.fit = profile.fit(engine, tp, "latency.tp")
        self.kv_capacity_tokens: int | None = profile.max_num_tokens.get(tp) if pp == 1 else None
        # Hot-path copies (plain attribute reads).
        self._pa, self._pb, self._pc = self.fit.prefill
        self._small = self.fit.decode_small_batch
        self._large = self.fit.decode_large_batch
        self._threshold = self.fit.large_batch_threshold
        self._inv_pp = 1 / pp
        o = profile.overheads if overheads else Overheads()
        self._pp_const = o.prefill_per_pp_stage * pp
        self._o0 = o.step_base
        self._o1 = o.step_per_context_token
        self._sum = mixed == "sum"

    def _decode_part(self, n: int, context: int) -> float:
        a, b, c = self._small if n < self._threshold else self._large
        return (a + b * (context + n) + c * n) * self._inv_pp

    def step_time_us(self, batch: BatchSummary) -> int:
        n = batch.decode_requests
        items = batch.prefill_items
        if items:
            tokens = 0
            squares = 0
            known = 0
            for _, t, k in items:
                tokens += t
                squares += t * t
                known += k
            x = (self._pa + self._pb * tokens + self._pc * squares) * self._inv_pp + self._pp_const
            if n:
                if self._sum:
                    x = x + self._decode_part(n, batch.decode_context)
                known += batch.decode_context
            x = x + self._o0 + self._o1 * known
        elif n:
            context = batch.decode_context
            x = self._decode_part(n, context) + self._o0 + self._o1 * context
        else:
            return 1
        t = int(x)
        return t if t > 1 else 1

    def decode_steps_at(self, n: int, context: np.ndarray) -> np.ndarray:
        """Vectorised decode-only :meth:`step_time_us` (same float operations, same order)."""
        a, b, c = self._small if n < self._threshold else self._large
        x = (a + b * (context + n).astype(np.float64) + c * n) * self._inv_pp
        x = x + self._o0 + self._o1 * context.astype(np.float64)
        return np.maximum(x.astype(np.int64), 1)

    @classmethod
    def from_config(
        cls, params: Mapping[str, Any], ctx: LatencyContext
    ) -> DistServeProfileLatencyModel:
        path = ctx.path
        params = expect_mapping(params, path)
        check_keys(params, ("profile", "engine", "tp", "pp", "mixed", "overheads", "strict"), path)
        profile = load_profile(params.get("profile", DEFAULT_PROFILE), f"{path}.profile")
        engine = as_str(
            params.get("engine", "vllm"), f"{path}.engine", choices=sorted(profile.engines)
        )
        tp = as_int(params.get("tp", ctx.tp), f"{path}.tp", minimum=1)
        profile.fit(engine, tp, f"{path}.tp")
        pp = as_int(params.get("pp", 1), f"{path}.pp", minimum=1)
        mixed = as_str(params.get("mixed", "simdistserve"), f"{path}.mixed", choices=MIXED_MODES)
        overheads = as_bool(params.get("overheads", True), f"{path}.overheads")
        if as_bool(params.get("strict", True), f"{path}.strict"):
            check_context(profile, ctx, path)
        return cls(profile, engine, tp, pp, mixed, overheads)

    def describe(self) -> dict[str, Any]:
        o = self.profile.overheads if self.overheads else Overheads()
        return {
            "model": self.name,
            "profile": self.profile.file,
            "profile_model": self.profile.model,
            "profile_gpu": self.profile.gpu,
            "engine": self.engine,
            "tp": self.tp,
            "pp": self.pp,
            "mixed": self.mixed,
            "prefill_us": list(self.fit.prefill),
            "decode_small_batch_us": list(self.fit.decode_small_batch),
            "decode_large_batch_us": list(self.fit.decode_large_batch),
            "large_batch_threshold": self.fit.large_batch_threshold,
            "overheads_us": attrs.asdict(o),
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "source": {k: v for k, v in self.profile.source.items() if _jsonable(v)},
        }

    def __repr__(self) -> str:
        return (
            f"DistServeProfileLatencyModel(profile={self.profile.file!r}, engine={self.engine!r}, "
            f"tp={self.tp}, pp={self.pp}, mixed={self.mixed!r}, overheads={self.overheads})"
        )


def _jsonable(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    return False


def check_context(profile: LatencyProfile, context: LatencyContext, path: str) -> None:
    """The scenario's model and GPU must be the ones the profile was measured on.

    The model is compared by architecture when the context carries a spec (so a local
    ``config.json`` of the same model passes), else by name; the GPU by canonical name.
    """
    fix_tail = f"or set {path}.strict: false to use the profile anyway"
    spec = getattr(context, "model_spec", None)
    arch = profile.architecture
    if spec is not None and arch and all(hasattr(spec, k) for k in arch):
        theirs = {k: getattr(spec, k) for k in arch}
        if theirs != dict(arch):
            raise ScenarioError(
                f"{path}.profile",
                context.model,
                f"the profile {profile.file} was fitted for {profile.model} ({_arch(arch)}); the "
                f"scenario's model has {_arch(theirs)}; use a profile fitted for this model, "
                + fix_tail,
            )
    elif _model_key(str(context.model)) != _model_key(profile.model):
        raise ScenarioError(
            f"{path}.profile",
            context.model,
            f"the profile {profile.file} was fitted for {profile.model}; set model to it (or to "
            f"its config.json), use a profile fitted for {context.model}, " + fix_tail,
        )
    if _gpu_key(str(context.gpu)) != _gpu_key(profile.gpu):
        raise ScenarioError(
            f"{path}.profile",
            context.gpu,
            f"the profile {profile.file} was measured on {profile.gpu}; set gpu: {profile.gpu}, "
            "use a profile measured on this GPU, " + fix_tail,
        )


def _arch(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _model_key(name: str) -> str:
    """``facebook/OPT-13B`` and ``opt-13b`` compare equal (organisation prefix dropped)."""
    return name.strip().lower().rstrip("/").rsplit("/", 1)[-1]


def _gpu_key(name: str) -> str:
    from servesim.latency.hardware import resolve_gpu

    with contextlib.suppress(ScenarioError):
        return resolve_gpu(name).name.lower()
    return name.strip().lower()


__all__ = [
    "BUNDLED_PROFILES",
    "DEFAULT_PROFILE",
    "DistServeProfileLatencyModel",
    "LatencyProfile",
    "Overheads",
    "ProfileFit",
    "check_context",
    "load_profile",
    "resolve_profile",
]
