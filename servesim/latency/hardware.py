"""GPU specs: :class:`HardwareSpec`, the bundled hardware table, :func:`resolve_gpu` and
user GPU files (spec §3.5)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from servesim.latency.bundled import bundled_section, name_lookup
from servesim.latency.modelspec import _DATA_DISPLAY
from servesim.simcore.config import as_float
from servesim.simcore.errors import ScenarioError

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
    """(canonical name -> spec, lowercase name or alias -> canonical name) from ``hardware.yaml``."""
    specs = {
        name: HardwareSpec.from_mapping(name, values, f"{_DATA_DISPLAY}/hardware.yaml:gpus.{name}")
        for name, values in bundled_section("hardware.yaml", "gpus").items()
    }
    return specs, name_lookup(specs, lambda spec: spec.aliases, "hardware.yaml")


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
