"""What control-plane policies see: instance snapshots and the cluster state, as plain data.

Policies never touch an instance or SimPy. The router builds one :class:`InstanceSnapshot` per
instance for each decision, with the freshness rules of INV-7: ``in_flight`` is synchronous;
queue depth, batch size, KV figures and preemptions are refreshed every ``snapshot_interval``
(0 = live); the prefix-cache view lags by ``cache_signal_delay``.

A request is shown to policies as the simulator's request object, of which a policy may read
``id``, ``arrival_us``, ``prompt_tokens``, ``prefix_group``, ``prefix_tokens``, ``slo_class``,
``priority`` (cluster priority, higher = more important), ``tenant`` and
``prompt_block_ids()`` (the ids of its full prompt blocks that another request could share; equal
ids mean equal content). Reading its output length is forbidden (INV-9; a structural test
enforces it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

REQUEST_FIELDS = (
    "id",
    "arrival_us",
    "prompt_tokens",
    "max_output_tokens",
    "prefix_group",
    "prefix_tokens",
    "slo_class",
    "client",
    "tenant",
    "priority",
    "block_size",
)
"""The attributes every request object shown to a policy carries: the simulator's own request and
the probe request of :mod:`servesim.testing` both build their slots from this one list (the
output length, ``oracle_output_tokens``, is never among them)."""


@attrs.define(eq=False, repr=False)
class InstanceSnapshot:
    """One instance as the router sees it at a decision (a plain slotted record; the router
    process reuses one per instance and rewrites its figures)."""

    index: int
    queue_depth: int = 0
    batch_size: int = 0
    kv_utilization: float = 0.0
    free_kv_blocks: int = 0
    total_kv_blocks: int = 0
    in_flight: int = 0
    preemptions: int = 0
    _cached_prefix: Callable[[Sequence[int]], int] | None = None

    @property
    def effective_load(self) -> int:
        """Queue depth + batch size + requests routed here and not finished (spec §4.3)."""
        return self.queue_depth + self.batch_size + self.in_flight

    def cached_prefix_blocks(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` (a prompt's leading full blocks), from the first, this
        instance holds in its KV cache, as of the cache signal delay. 0 without a cache view."""
        if self._cached_prefix is None or not block_ids:
            return 0
        return self._cached_prefix(block_ids)

    def __repr__(self) -> str:
        return (
            f"InstanceSnapshot(index={self.index}, queue_depth={self.queue_depth}, "
            f"batch_size={self.batch_size}, kv_utilization={self.kv_utilization:.3f}, "
            f"in_flight={self.in_flight})"
        )


class SnapshotList(list):
    """The snapshots of a whole cluster, snapshot ``k`` at position ``k`` (what the router process
    hands a policy when every instance is a candidate), with ``holders``: for a block id, the
    instances whose cache may hold it (a superset of those whose cache view shows it), or None
    when not tracked. A prefix-cache scorer then asks a few instances instead of all of them; a
    subset of the cluster is a plain list and has no such map."""

    __slots__ = ("holders",)

    def __init__(self, snapshots: Sequence[InstanceSnapshot] = (), holders=None):
        super().__init__(snapshots)
        self.holders: Mapping[int, Collection[int]] | None = holders


def prefix_holders(snapshots: Sequence[InstanceSnapshot], block_ids: Sequence[int]):
    """The snapshots that may hold ``block_ids[0]`` when ``snapshots`` tracks holders (see
    :class:`SnapshotList`), else all of them: the candidates whose cache view to ask."""
    holders = getattr(snapshots, "holders", None)
    if holders is None:
        return snapshots
    return [snapshots[k] for k in holders.get(block_ids[0], ())]


class ClusterState:
    """What an admission policy or saturation detector sees: the time and every instance."""

    __slots__ = ("now_us", "snapshots", "max_num_seqs")

    def __init__(self, now_us: int, snapshots: Sequence[InstanceSnapshot], max_num_seqs: int = 256):
        self.now_us = now_us
        self.snapshots = snapshots
        self.max_num_seqs = max_num_seqs

    @property
    def max_effective_load(self) -> int:
        return max((s.effective_load for s in self.snapshots), default=0)


# Cluster priorities of SLO classes (GAIE convention; spec §4.5): higher = more important,
# negative = sheddable. Unknown or empty classes are "standard".
DEFAULT_SLO_PRIORITIES: dict[str, int] = {
    "critical": 4,
    "standard": 3,
    "batch": -1,
    "sheddable": -2,
    "background": -3,
}


def slo_priority(slo_class: str, table: dict[str, int] | None = None) -> int:
    return (table or DEFAULT_SLO_PRIORITIES).get(slo_class, 3)


def is_sheddable(priority: int) -> bool:
    return priority < 0


Request = Any  # the simulator's request object (see the module docstring for what may be read)
