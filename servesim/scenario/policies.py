"""Parsers of the plugin-choosing sections: a plugin name or ``{name, params}``, flow control, SLO
targets, the PD decider and the KV-transfer links."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servesim.scenario.schema import (
    FLOW_CONTROL_FIELDS,
    KV_TRANSFER_FIELDS,
    KV_TRANSFER_SHARING,
    KV_TRANSFER_TOPOLOGIES,
    SLO_TARGET_FIELDS,
    FlowControl,
    InstanceSpec,
    KVTransferConfig,
    PolicyChoice,
    SLOTarget,
)
from servesim.simcore import registry
from servesim.simcore.config import (
    as_bool,
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    parse_duration_us,
    parse_rate_bytes,
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
    from servesim.components.gateway import ORDERS

    return FlowControl(
        detector=detector,
        order=as_str(section.get("order", "priority"), f"{path}.order", choices=ORDERS),
        max_queue=as_int(section.get("max_queue", 0), f"{path}.max_queue", minimum=0),
        per_band_capacity=as_int(
            section.get("per_band_capacity", 0), f"{path}.per_band_capacity", minimum=0
        ),
        shedding=as_bool(section.get("shedding", False), f"{path}.shedding"),
        ttl_us=parse_duration_us(section.get("ttl", 0), f"{path}.ttl"),
        tick_us=parse_duration_us(section.get("tick", "1ms"), f"{path}.tick", minimum=1),
    )


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
        values = {
            key: parse_duration_us(targets[key], f"{where}.{key}", minimum=1)
            if key in targets
            else 0
            for key in SLO_TARGET_FIELDS
        }
        out[str(cls)] = SLOTarget(
            ttft_us=values["ttft"], itl_us=values["itl"], e2e_us=values["e2e"]
        )
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
    bandwidth = parse_rate_bytes(section.get("bandwidth", "25GB/s"), f"{path}.bandwidth")
    if not bandwidth > 0:
        raise ScenarioError(
            f"{path}.bandwidth",
            section.get("bandwidth"),
            "must be positive, e.g. 25GB/s or 200Gbps",
        )
    return KVTransferConfig(
        bandwidth_bytes_s=bandwidth,
        base_latency_us=parse_duration_us(
            section.get("base_latency", "50us"), f"{path}.base_latency"
        ),
        topology=as_str(
            section.get("topology", "shared"), f"{path}.topology", choices=KV_TRANSFER_TOPOLOGIES
        ),
        sharing=as_str(
            section.get("sharing", "processor-sharing"),
            f"{path}.sharing",
            choices=KV_TRANSFER_SHARING,
        ),
        decode_full=as_str(
            section.get("decode_full", "wait"),
            f"{path}.decode_full",
            choices=("wait", "backpressure", "drop"),
        ),
        decode_queue_limit=as_float(
            section.get("decode_queue_limit", 0),
            f"{path}.decode_queue_limit",
            minimum=0.0,
            maximum=1.0,
        ),
        blocking=as_bool(section.get("blocking", False), f"{path}.blocking"),
    )
