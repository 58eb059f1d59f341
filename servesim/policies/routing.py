"""Routing policies: which instance serves a request.

A routing policy never reads a request's oracle output length (INV-9): it sees the request's
prompt length, class and prefix group, and the instances' snapshots (spec §4.3).

The router calls :meth:`RoutingPolicy.bind` once before the run, then for each request
:meth:`RoutingPolicy.route` with the non-empty list of routable instances' snapshots (which may
be a subset of the instances, so use ``snapshot.index``, not the position in the list), then
:meth:`RoutingPolicy.observe` with the instance the request was sent to.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from servesim.policies.base import Policy
from servesim.policies.index import SnapshotGroups
from servesim.policies.scorers import Scorer, index_exceptions, index_fields
from servesim.policies.snapshot import InstanceSnapshot
from servesim.simcore.config import as_float, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext, get, register

__all__ = [
    "RoutingPolicy",
    "RoundRobin",
    "RandomRouting",
    "LeastLoaded",
    "AlwaysBusiest",
    "Weighted",
    "DEFAULT_WEIGHTED_PROFILE",
]

# Spec §4.3: the weighted router's profile when the scenario names no scorers.
DEFAULT_WEIGHTED_PROFILE: dict[str, float] = {
    "precise-prefix-cache": 2.0,
    "queue-depth": 1.0,
    "kv-utilization": 1.0,
}


class RoutingPolicy(Policy):
    """Base class: implement :meth:`route`; ``bind`` and ``observe`` are optional hooks.

    ``self.rng`` (a numpy ``Generator``, the cluster's ``router`` stream) is the only randomness
    a router may use, so that a run is reproducible from its seed.

    Hints for the router process: ``needs_snapshots`` False means :meth:`route` reads only the
    candidates' ``index`` (no load figures), so the snapshots need not be refreshed;
    ``reads_prefix_cache`` True means it queries ``cached_prefix_blocks``.

    ``index`` (built-in policies only; None for a custom one) is a :class:`SnapshotGroups` that
    the router process keeps current, so that :meth:`route` need not scan every snapshot when it
    is given the whole cluster (``index.covers(snapshots)``); the choice must be the scan's.
    """

    needs_snapshots = True
    reads_prefix_cache = False
    num_instances = 0
    index: SnapshotGroups | None = None
    rng: np.random.Generator

    def bind(self, num_instances: int, rng: np.random.Generator | None = None) -> None:
        """Called once before the run. Without ``rng`` a fixed-seed generator is used."""
        self.num_instances = num_instances
        self.rng = rng if rng is not None else np.random.default_rng(0)

    @abstractmethod
    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        """Return the ``index`` of the chosen snapshot (``snapshots`` is never empty)."""

    def observe(self, request: Any, chosen_index: int) -> None:
        """Told that ``request`` was sent to instance ``chosen_index``. Default: nothing."""
        return None


@register("routing", "round-robin")
class RoundRobin(RoutingPolicy):
    """Candidates in turn: ``snapshots[counter mod len(snapshots)]``, counter + 1 per decision."""

    name = "round-robin"
    needs_snapshots = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        n = len(snapshots)
        choice = self._next % n
        self._next = choice + 1
        return snapshots[choice].index


@register("routing", "random")
class RandomRouting(RoutingPolicy):
    """A candidate drawn uniformly at random (router RNG)."""

    name = "random"
    needs_snapshots = False

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        return snapshots[int(self.rng.integers(len(snapshots)))].index


class _ByLoad(RoutingPolicy):
    """A router by effective load: over the whole cluster it reads the instances grouped by
    effective load (its index), each group in instance order, instead of every snapshot."""

    def bind(self, num_instances: int, rng: np.random.Generator | None = None) -> None:
        super().bind(num_instances, rng)
        self.index = SnapshotGroups(attrgetter("effective_load"))

    def by_load(self, snapshots: Sequence[InstanceSnapshot]) -> dict[int, list[int]]:
        """Effective load -> the instances with it, in snapshot order: the index's groups when
        ``snapshots`` is the whole cluster, else counted from ``snapshots``."""
        index = self.index
        if index is not None and index.covers(snapshots):
            return index.groups
        groups: dict[int, list[int]] = {}
        for s in snapshots:
            groups.setdefault(s.queue_depth + s.batch_size + s.in_flight, []).append(s.index)
        return groups

    def extreme(self, snapshots: Sequence[InstanceSnapshot], lowest: bool) -> list[int]:
        """The instances with the lowest (``lowest``) or the highest effective load, in snapshot
        order: read off the index when it covers ``snapshots``, else from the counted groups."""
        groups, index = self.by_load(snapshots), self.index
        if index and groups is index.groups:
            return index.lowest() if lowest else index.highest()
        return groups[min(groups) if lowest else max(groups)]


@register("routing", "least-loaded")
class LeastLoaded(_ByLoad):
    """Minimum effective load (queue + batch + in flight); ties uniformly at random (router RNG)."""

    name = "least-loaded"

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        tied = self.extreme(snapshots, lowest=True)
        if len(tied) == 1:
            return tied[0]
        return tied[int(self.rng.integers(len(tied)))]


@register("routing", "always-busiest")
class AlwaysBusiest(_ByLoad):
    """Maximum effective load, first one on ties (a pathological baseline)."""

    name = "always-busiest"

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        return self.extreme(snapshots, lowest=False)[0]


def _same_group(snapshot: InstanceSnapshot) -> int:
    return 0


@register("routing", "weighted")
class Weighted(RoutingPolicy):
    """Composable scoring (spec §4.3): argmax of ``Σ wᵢ·clamp(scoreᵢ, 0, 1)``.

    Weights are normalised to sum 1. Ties go uniformly at random among the tied (router RNG).
    After choosing, every scorer that keeps state is told the chosen instance.
    Configuration: ``scorers: {queue-depth: 1, prefix-affinity: {weight: 2, capacity: 5000}}``.
    """

    name = "weighted"

    def __init__(self, scorers: Sequence[tuple[Scorer, float]]):
        if not scorers:
            raise ValueError("weighted routing needs at least one (scorer, weight) pair")
        total = sum(w for _, w in scorers)
        if not (math.isfinite(total) and total > 0) or any(
            not (math.isfinite(w) and w > 0) for _, w in scorers
        ):
            raise ValueError(f"scorer weights must be positive and finite, got {scorers!r}")
        self.scorers: list[tuple[Scorer, float]] = [(s, w / total) for s, w in scorers]
        # Only scorers that override observe() are told the choice (the others ignore it).
        self._observers = [s for s, _ in self.scorers if type(s).observe is not Scorer.observe]
        self.reads_prefix_cache = any(s.reads_prefix_cache for s, _ in self.scorers)
        self._exceptions: list[Callable[[Any, Sequence[InstanceSnapshot]], list[int]]] = []
        self._tied: list[int] = []
        self._tied_version = -1

    def bind(self, num_instances: int, rng: np.random.Generator | None = None) -> None:
        """Builds the index when every scorer declares its ``index_fields`` (see
        :mod:`servesim.policies.scorers`): instances grouped by the integer figures the scorers
        read, sorted by KV utilisation inside a group when one of them reads it."""
        super().bind(num_instances, rng)
        fields = [index_fields(scorer) for scorer, _ in self.scorers]
        if any(f is None for f in fields) or type(self).scores is not Weighted.scores:
            return
        read = {name for f in fields for name in f}  # type: ignore[union-attr]
        discrete = sorted(read - {"kv_utilization"})
        key = attrgetter(*discrete) if discrete else _same_group
        self.index = SnapshotGroups(key, by_kv="kv_utilization" in read)
        self._exceptions = [
            found for found in (index_exceptions(scorer) for scorer, _ in self.scorers) if found
        ]

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        index = self.index
        if index is not None and index.covers(snapshots):
            single = sorted({k for find in self._exceptions for k in find(request, snapshots)})
            if single:
                tied = self._tied_indexed(request, snapshots, index, single)
            elif index.version == self._tied_version:
                tied = self._tied  # nothing the scores depend on has changed since
            else:
                tied = self._tied = self._tied_indexed(request, snapshots, index, single)
                self._tied_version = index.version
        else:
            totals = self.scores(request, snapshots)
            best = max(totals)
            tied = [i for i, t in enumerate(totals) if t == best]
        position = tied[0] if len(tied) == 1 else tied[int(self.rng.integers(len(tied)))]
        chosen = snapshots[position].index
        for scorer in self._observers:
            scorer.observe(request, chosen)
        return chosen

    def _tied_indexed(
        self,
        request: Any,
        snapshots: Sequence[InstanceSnapshot],
        index: SnapshotGroups,
        single: list[int],
    ) -> list[int]:
        """The positions the scan would find tied at the best total, from a few candidates.

        Scored: each instance a scorer wants seen on its own (``single``: prefix-cache hits),
        and the first other member of every group. That set has every group's figures, so the
        scorers' min and max over it are those over all instances, and each candidate gets the
        scan's very total. Inside a group the total can only fall as KV utilisation rises, so the
        members tied with a tied head follow it: equal KV ties outright, the next higher KV is
        scored to see. Without ``single`` the scores depend on the indexed figures alone, so the
        result holds until the index changes (``route`` keeps it).
        """
        apart = set(single)
        chosen = list(single)
        heads = []  # (position in chosen, the group's remaining members)
        for key in index.groups:
            members = (k for k in index.members(key) if k not in apart)
            first = next(members, None)
            if first is not None:
                heads.append((len(chosen), members))
                chosen.append(first)
        totals = self.scores(request, [snapshots[k] for k in chosen])
        best = max(totals)
        tied = [k for k, t in zip(chosen, totals) if t == best]
        probes = [(chosen[p], members) for p, members in heads if totals[p] == best]
        if not index.by_kv:  # no scorer reads KV: a group's members all score as its head
            for _, members in probes:
                tied.extend(members)
            probes = []
        while probes:
            nexts = []
            for k, members in probes:
                kv = snapshots[k].kv_utilization
                for other in members:
                    if snapshots[other].kv_utilization != kv:
                        nexts.append((other, members))
                        break
                    tied.append(other)
            if not nexts:
                break
            scored = self.scores(request, [snapshots[k] for k in chosen + [k for k, _ in nexts]])
            probes = []
            for (k, members), total in zip(nexts, scored[len(chosen) :]):
                if total == best:
                    tied.append(k)
                    probes.append((k, members))
        tied.sort()
        return tied

    def scores(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        """The combined score of each candidate (what :meth:`route` maximises); usable for
        decision traces, but note that it calls every scorer's ``score`` again."""
        totals = [0.0] * len(snapshots)
        for scorer, weight in self.scorers:
            for i, value in enumerate(scorer.score(request, snapshots)):
                if value > 0.0:  # clamp to [0, 1]; NaN counts as 0
                    totals[i] += weight if value >= 1.0 else weight * value
        return totals

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> Weighted:
        check_keys(params, ["scorers"], ctx.path)
        where = f"{ctx.path}.scorers"
        if "scorers" in params:
            raw = params["scorers"]
            spec = expect_mapping(raw, where)
            if not spec:
                raise ScenarioError(
                    where,
                    raw,
                    "name at least one scorer with a positive weight, "
                    "e.g. {precise-prefix-cache: 2, queue-depth: 1}",
                )
        else:
            spec = DEFAULT_WEIGHTED_PROFILE
        pairs: list[tuple[Scorer, float]] = []
        for name, value in spec.items():
            field = f"{where}.{name}"
            scorer_cls = get("scorer", name, field)
            if isinstance(value, Mapping):
                options = dict(expect_mapping(value, field))
                weight = as_float(
                    options.pop("weight", 1.0), f"{field}.weight", exclusive_minimum=0
                )
                scorer = scorer_cls.from_config(options, ctx.at(field))
            else:
                weight = as_float(value, field, exclusive_minimum=0)
                scorer = scorer_cls.from_config({}, ctx.at(field))
            pairs.append((scorer, weight))
        if not math.isfinite(sum(w for _, w in pairs)):
            raise ScenarioError(
                where, dict(spec), "the weights' sum must be finite; use smaller weights"
            )
        return cls(pairs)
