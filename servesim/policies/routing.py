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
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from servesim.policies.scorers import Scorer
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


class RoutingPolicy(ABC):
    """Base class: implement :meth:`route`; ``bind`` and ``observe`` are optional hooks.

    ``self.rng`` (a numpy ``Generator``, the cluster's ``router`` stream) is the only randomness
    a router may use, so that a run is reproducible from its seed.

    Hints for the router process: ``needs_snapshots`` False means :meth:`route` reads only the
    candidates' ``index`` (no load figures), so the snapshots need not be refreshed;
    ``reads_prefix_cache`` True means it queries ``cached_prefix_blocks``.
    """

    name = ""
    needs_snapshots = True
    reads_prefix_cache = False
    num_instances = 0
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

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> RoutingPolicy:
        check_keys(params, [], ctx.path)
        return cls()


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


@register("routing", "least-loaded")
class LeastLoaded(RoutingPolicy):
    """Minimum effective load (queue + batch + in flight); ties uniformly at random (router RNG)."""

    name = "least-loaded"

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        best = -1
        tied: list[int] = []
        for s in snapshots:
            load = s.queue_depth + s.batch_size + s.in_flight
            if best < 0 or load < best:
                best = load
                tied = [s.index]
            elif load == best:
                tied.append(s.index)
        if len(tied) == 1:
            return tied[0]
        return tied[int(self.rng.integers(len(tied)))]


@register("routing", "always-busiest")
class AlwaysBusiest(RoutingPolicy):
    """Maximum effective load, first one on ties (a pathological baseline)."""

    name = "always-busiest"

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        best = -1
        choice = snapshots[0].index
        for s in snapshots:
            load = s.queue_depth + s.batch_size + s.in_flight
            if load > best:
                best = load
                choice = s.index
        return choice


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

    def route(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> int:
        totals = self.scores(request, snapshots)
        best = max(totals)
        tied = [i for i, t in enumerate(totals) if t == best]
        position = tied[0] if len(tied) == 1 else tied[int(self.rng.integers(len(tied)))]
        chosen = snapshots[position].index
        for scorer in self._observers:
            scorer.observe(request, chosen)
        return chosen

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
