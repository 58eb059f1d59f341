"""An opt-in index of the instances' snapshots, so that built-in routers need not scan them all.

A routing decision over N instances costs O(N) when the policy reads every snapshot. Most load
scores, though, depend on a few small integers (queue depth, effective load, ...) that many
instances share, plus at most one continuous figure, the KV utilisation, that they prefer low. A
:class:`SnapshotGroups` index keeps the instances grouped by those integers (the group *key*)
and, inside each group, sorted by ``(kv_utilization, index)``; the router process updates it
whenever a snapshot changes (a refresh, a request routed or finished). A policy then looks at
one or a few instances per group instead of all of them.

The index is a hint, never a second source of truth: a policy that uses it must choose exactly
what its linear scan over the snapshots would choose, ties and random draws included (the tests
compare both on random cluster states). A custom policy ignores it and sees the plain list.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from servesim.policies.snapshot import InstanceSnapshot

__all__ = ["SnapshotGroups"]


class SnapshotGroups:
    """The instances grouped by ``key(snapshot)``; each group sorted by ``(kv, index)`` when
    ``by_kv``, else by index. Attached to the full snapshot list of a cluster (snapshot ``k``
    at position ``k``), it answers only for that list: ``covers(snapshots)``."""

    __slots__ = ("key", "by_kv", "groups", "keys", "snapshots", "version", "_where")

    def __init__(self, key: Callable[[InstanceSnapshot], Hashable], by_kv: bool = False):
        self.key = key
        self.by_kv = by_kv
        self.groups: dict[Hashable, list[Any]] = {}
        # the groups' keys in increasing order (keys must be comparable): the lowest and the
        # highest group in O(1), a key added or dropped in O(log G) plus a move
        self.keys: list[Any] = []
        self.snapshots: Sequence[InstanceSnapshot] | None = None
        self.version = 0  # + 1 whenever an instance changes group or place in it
        self._where: list[tuple[Hashable, Any]] = []  # per instance: (its group key, its entry)

    def attach(self, snapshots: Sequence[InstanceSnapshot]) -> None:
        """Index ``snapshots`` (snapshot ``k`` must have ``index == k``); forget anything else."""
        if any(s.index != k for k, s in enumerate(snapshots)):
            raise ValueError("the indexed snapshots must be the cluster's, in instance order")
        self.snapshots = snapshots
        self.groups = {}
        self._where = []
        for snap in snapshots:
            key, entry = self._place(snap)
            self._where.append((key, entry))
            self.groups.setdefault(key, []).append(entry)
        for group in self.groups.values():
            group.sort()
        self.keys = sorted(self.groups)
        self.version += 1

    def covers(self, snapshots: Sequence[InstanceSnapshot]) -> bool:
        """Whether ``snapshots`` is the very list this index follows (not a subset or a copy)."""
        return snapshots is self.snapshots

    def _place(self, snap: InstanceSnapshot) -> tuple[Hashable, Any]:
        entry = (snap.kv_utilization, snap.index) if self.by_kv else snap.index
        return self.key(snap), entry

    def update(self, snap: InstanceSnapshot) -> None:
        """Re-file one instance after its snapshot changed (O(log n) search, O(group) move; the
        same for its key when it empties a group or starts one)."""
        k = snap.index
        old = self._where[k]
        new = self._place(snap)
        if new == old:
            return
        old_key, old_entry = old
        group = self.groups[old_key]
        del group[bisect_left(group, old_entry)]
        if not group:
            del self.groups[old_key]
            keys = self.keys
            del keys[bisect_left(keys, old_key)]
        key, entry = new
        self._where[k] = new
        self.version += 1
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = [entry]
            insort(self.keys, key)
        else:
            insort(group, entry)

    def lowest(self) -> list[Any]:
        """The group with the lowest key (the index must hold at least one instance)."""
        return self.groups[self.keys[0]]

    def highest(self) -> list[Any]:
        """The group with the highest key."""
        return self.groups[self.keys[-1]]

    def members(self, key: Hashable) -> Iterator[int]:
        """The instance indexes of one group, in its order (KV utilisation, then index)."""
        if self.by_kv:
            return (k for _, k in self.groups[key])
        return iter(self.groups[key])
