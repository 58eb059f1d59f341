"""The GPU-to-GPU link a measured run records, priced in its replay.

A GPU's datasheet says what its link can do (an RTX PRO 6000: PCIe 5.0 x16, 64 GB/s each way);
the machine a run was measured on may do less (no peer-to-peer PCIe, so NCCL copies through host
memory). LLMServingSim's cluster config, shipped beside its runs (``config.json``), states the
link of the machine it measured: ``link_bw`` in GiB/s (binary, ASTRA-Sim's unit) and
``link_latency`` in ns per hop; its hardware profiler measures both on that machine. A replay
of a run whose collectives cross that link (tensor, expert, pipeline or context parallelism)
prices them on it, as ``latency.interconnect_gbs`` / ``interconnect_latency_us``, and lists it
among its assumptions; a latency section that names its own interconnect is taken as given.

A reader may record the link itself (``run.extra['link_gbs']``, ``['link_latency_us']`` and
``['link_source']``); otherwise the run's directory is looked at for LLMServingSim's
``config.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from servesim.latency.interconnect import OVERRIDE_KEYS

GIB_IN_GB = 2**30 / 1e9
"""GB per GiB: LLMServingSim's ``link_bw`` is binary, servesim's ``interconnect_gbs`` decimal."""

LINK_MODELS = ("trained-physics", "roofline")
"""Latency models that price collectives on an interconnect (accept its override keys)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def recorded_link(run: Any) -> tuple[float, float, str] | None:
    """(GB/s per direction, µs per collective step, where it was read) of the link ``run``
    records; None when it records none (or not as one number each)."""
    extra = run.extra or {}
    gbs, latency = _number(extra.get("link_gbs")), _number(extra.get("link_latency_us"))
    if gbs is not None and latency is not None:
        return gbs, latency, str(extra.get("link_source", run.source))
    config = Path(str(run.source)) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the reader reports an unreadable config.json itself
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        return None  # not an LLMServingSim cluster config
    bw, ns = _number(data.get("link_bw")), _number(data.get("link_latency"))
    if bw is None or ns is None or bw <= 0 or ns < 0:
        return None
    return bw * GIB_IN_GB, ns / 1000.0, f"{config.name} (link_bw {bw:g} GiB/s, link_latency {ns:g} ns)"


def has_collectives(data: dict[str, Any]) -> bool:
    """Whether the replay's instances talk over the link (tp, dp of an MoE, ep, pp or cp > 1)."""
    engine = data.get("engine") or {}
    if int(data.get("tp") or 1) > 1:
        return True
    return any(int(engine.get(key) or 1) > 1 for key in ("dp", "ep", "pp", "cp"))


def with_recorded_link(run: Any, data: dict[str, Any]) -> str:
    """Price the replay's collectives on the link ``run`` records; returns the note that says
    so ('' when nothing was set)."""
    section = data.get("latency")
    if not isinstance(section, dict) or section.get("model") not in LINK_MODELS:
        return ""
    if any(key in section for key in OVERRIDE_KEYS) or not has_collectives(data):
        return ""
    link = recorded_link(run)
    if link is None:
        return ""
    gbs, latency, source = link
    section["interconnect_gbs"] = round(gbs, 3)
    section["interconnect_latency_us"] = latency
    return (
        f"collectives on the run's own GPU link, {gbs:.1f} GB/s per direction and {latency:g} us "
        f"per step, from {source} (latency.interconnect_gbs / interconnect_latency_us; the GPU's "
        "datasheet link may be faster than the machine measured)"
    )
