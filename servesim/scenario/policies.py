"""Parsers of the plugin-choosing sections: a plugin name or ``{name, params}``, flow control, SLO
targets, the PD decider and the KV-transfer links."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servesim.scenario.schema import (
    FLOW_CONTROL_FIELDS,
    KV_TRANSFER_FIELDS,
    SLO_TARGET_FIELDS,
    FlowControl,
    InstanceSpec,
    KVTransferConfig,
    PolicyChoice,
    SLOTarget,
    read_section,
)
from servesim.simcore import registry
from servesim.simcore.config import (
    check_keys,
    expect_mapping,
)
from servesim.simcore.errors import ScenarioError


def _plugin(value: Any, kind: str, path: str, default: str) -> PolicyChoice:
    """``name`` or ``{name: ..., params...}`` → a PolicyChoice whose name is registered."""
    if value is None:
        value = default
    if isinstance(value, str):
        name, params = value, {}
    else:
        section = expect_mapping(value, path)
        if "name" not in section:
            raise ScenarioError(
                f"{path}.name", None, f"missing; name the {kind} plugin (see `servesim list`)"
            )
        name = section["name"]
        params = {k: v for k, v in section.items() if k != "name"}
    registry.get(kind, name, f"{path}.name" if not isinstance(value, str) else path)
    return PolicyChoice(name=name, params=params)


def _latency_choice(value: Any, path: str) -> PolicyChoice:
    """A ``latency`` section, ``model-name`` or ``{model: ..., params...}`` → a PolicyChoice whose
    model is registered (the scenario's own and each group's or pool's)."""
    section = expect_mapping({"model": value} if isinstance(value, str) else value, path)
    if "model" not in section:
        raise ScenarioError(
            f"{path}.model", None, "missing; name a latency model (see `servesim list`)"
        )
    name = section["model"]
    registry.get("latency", name, f"{path}.model")
    return PolicyChoice(name=name, params={k: v for k, v in section.items() if k != "model"})


def _flow_control(value: Any, notes: list) -> FlowControl | None:
    """``policies.flow_control`` (absent or false = off): a gateway queue gated by a detector."""
    path = "policies.flow_control"
    if value is None or value is False:
        return None
    section = expect_mapping(value, path)
    check_keys(section, FLOW_CONTROL_FIELDS, path)
    if "detector" not in section:
        raise ScenarioError(
            f"{path}.detector",
            None,
            "missing; name a saturation detector, e.g. detector: utilization",
        )
    detector = _plugin(section["detector"], "saturation", f"{path}.detector", "never")
    built = registry.get("saturation", detector.name).from_config(
        detector.params, registry.PluginContext(f"{path}.detector")
    )
    if getattr(built, "never_saturates", False):
        notes.append(
            (
                "flow control is on but its detector never saturates: the gateway queue will "
                "release every request at once",
                {"detector": detector.name, "fix": "use detector: utilization or concurrency"},
            )
        )
    return read_section(FlowControl, section, path, detector=detector)


def parse_slo_targets(value: Any, path: str = "slo") -> dict[str, SLOTarget]:
    """``slo: {class: {ttft: 200ms, itl: 50ms, e2e: 10s}}`` — goodput targets per SLO class
    (the one parser of this format; ``servesim plan`` reads its ``slo:`` with it too)."""
    section = expect_mapping(value, path)
    out: dict[str, SLOTarget] = {}
    from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES

    for cls, targets in section.items():
        where = f"{path}.{cls}"
        if cls not in DEFAULT_SLO_PRIORITIES:
            raise ScenarioError(
                where, cls, f"unknown SLO class; use one of {', '.join(DEFAULT_SLO_PRIORITIES)}"
            )
        targets = expect_mapping(targets, where)
        check_keys(targets, SLO_TARGET_FIELDS, where)
        if not targets:
            raise ScenarioError(where, {}, "give at least one of ttft, itl, e2e (e.g. ttft: 500ms)")
        out[str(cls)] = read_section(SLOTarget, targets, where)
    return out


def _decider(value: Any, specs: Sequence[InstanceSpec]) -> PolicyChoice:
    """``policies.disaggregation``: a decider name or ``{decider: name, params...}``. With pools
    and no decider every request is split (``always``)."""
    path = "policies.disaggregation"
    if isinstance(value, Mapping) and "decider" in value:
        value = {("name" if k == "decider" else k): v for k, v in value.items()}
    default = "always" if any(s.role in ("prefill",) for s in specs) else "never"
    choice = _plugin(value, "disaggregation", path, default)
    registry.get("disaggregation", choice.name).from_config(
        choice.params, registry.PluginContext(path)
    )
    return choice


def _kv_transfer(value: Any) -> KVTransferConfig:
    path = "cluster.kv_transfer"
    section = expect_mapping(value, path)
    check_keys(section, KV_TRANSFER_FIELDS, path)
    return read_section(KVTransferConfig, section, path)
