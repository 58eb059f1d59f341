"""``engine.kv_tiers``: the KV offload tiers below the GPU (CPU memory, local disk, a remote
store), each with a capacity, a bandwidth and a latency; how they behave is in
:mod:`servesim.components.kvtiers`."""

from __future__ import annotations

from typing import Any

import attrs

from servesim.simcore.config import (
    as_int,
    check_keys,
    expect_mapping,
    parse_bytes,
    parse_duration_us,
    parse_rate_bytes,
)
from servesim.simcore.errors import ScenarioError

TIER_KEYS = ("name", "capacity", "bandwidth", "latency")
EXAMPLE = (
    "e.g. kv_tiers: [{name: cpu, capacity: 64GiB, bandwidth: 25GB/s, latency: 10us}, "
    "{name: disk, capacity: 1TB, bandwidth: 5GB/s, latency: 100us}]"
)


@attrs.frozen
class TierConfig:
    """One offload tier: its name, capacity in KV blocks, bandwidth into GPU memory (bytes/s) and
    fixed cost per reload (µs)."""

    name: str
    capacity_blocks: int
    bandwidth_bytes_s: float
    latency_us: int

    def limits(self, block_bytes: int) -> tuple[str, int, int, float, int]:
        """The tier as an engine takes it: (name, blocks, latency µs, µs per block, block bytes)."""
        us_per_block = block_bytes / self.bandwidth_bytes_s * 1e6 if block_bytes else 0.0
        return (self.name, self.capacity_blocks, self.latency_us, us_per_block, block_bytes)


def parse_kv_tiers(
    value: Any, path: str, kv_block_bytes: int, kv_cpu_blocks: int
) -> tuple[TierConfig, ...]:
    """``engine.kv_tiers``, validated: a list of tiers, fastest first (absent or empty = none)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ScenarioError(path, value, f"expected a list of tiers, fastest first; {EXAMPLE}")
    if not value:
        return ()
    if kv_cpu_blocks:
        raise ScenarioError(
            path,
            value,
            "engine.kv_cpu_blocks already configures a CPU tier: give the CPU tier as the first "
            "entry of engine.kv_tiers and remove kv_cpu_blocks, or remove kv_tiers",
        )
    if not kv_block_bytes:
        raise ScenarioError(
            path,
            value,
            "the tiers need the model's KV bytes per block to price reloads; use a model with an "
            "architecture config (model: path/to/config.json)",
        )
    tiers: list[TierConfig] = []
    for i, entry in enumerate(value):
        tier = _tier(entry, f"{path}[{i}]", kv_block_bytes)
        if any(t.name == tier.name for t in tiers):
            raise ScenarioError(
                f"{path}[{i}].name", tier.name, "another tier has this name; give each a new one"
            )
        tiers.append(tier)
    return tuple(tiers)


def _tier(entry: Any, path: str, kv_block_bytes: int) -> TierConfig:
    section = expect_mapping(entry, path)
    check_keys(section, TIER_KEYS, path)
    for key in ("name", "capacity", "bandwidth"):
        if key not in section:
            raise ScenarioError(f"{path}.{key}", None, f"missing; {EXAMPLE}")
    name = section["name"]
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(f"{path}.name", name, "expected a name such as cpu, disk or remote")
    capacity = section["capacity"]
    if isinstance(capacity, str) and not capacity.strip().isdigit():
        blocks = int(parse_bytes(capacity, f"{path}.capacity") // kv_block_bytes)
    else:
        blocks = as_int(capacity, f"{path}.capacity")  # a bare number: blocks
    if blocks < 1:
        raise ScenarioError(
            f"{path}.capacity",
            capacity,
            f"holds no KV block (one block is {kv_block_bytes} bytes); give a larger size or a "
            "block count of at least 1",
        )
    bandwidth = parse_rate_bytes(section["bandwidth"], f"{path}.bandwidth")
    if bandwidth <= 0:
        raise ScenarioError(
            f"{path}.bandwidth", section["bandwidth"], "must be positive, e.g. 25GB/s"
        )
    latency = parse_duration_us(section.get("latency", 0), f"{path}.latency")
    return TierConfig(name.strip(), blocks, bandwidth, latency)
