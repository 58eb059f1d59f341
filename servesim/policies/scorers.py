"""Scorers for the ``weighted`` router: each rates every candidate instance in [0, 1], higher better.

The weighted router (``servesim.policies.routing.Weighted``) combines scorers with normalised
weights, takes the argmax, and then tells every scorer which instance it chose (:meth:`observe`),
so stateful scorers such as ``prefix-affinity`` can learn. Formulas follow spec §4.3; the router
clamps every score to [0, 1], so a custom scorer that strays outside is still safe.

A scorer is called once per routing decision with the non-empty list of candidate snapshots;
``score`` returns one float per snapshot, in the same order. Candidates are identified by
``snapshot.index`` (the instance index), which need not equal their position in the list.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from servesim.policies.snapshot import InstanceSnapshot, prefix_holders
from servesim.simcore.config import as_int, check_keys
from servesim.simcore.registry import PluginContext, register

__all__ = [
    "Scorer",
    "QueueDepth",
    "KVUtilization",
    "LoadBalance",
    "ActiveRequests",
    "RunningRequests",
    "LoadAware",
    "VllmDP",
    "PrecisePrefixCache",
    "PrefixAffinity",
    "NoHitLRU",
]


class Scorer(ABC):
    """Base class: implement :meth:`score`; override :meth:`observe` if the scorer keeps state.
    ``reads_prefix_cache`` True tells the router that it queries ``cached_prefix_blocks``.

    ``index_fields`` (optional, for speed on large clusters) names the snapshot figures the score
    depends on, as a promise: a candidate's score is a function of its own figures and of the
    set of distinct values of the integer ones among the candidates (their min or max, say), and
    of nothing else (not the request, not the scorer's state, unless through the exceptions
    below); ``kv_utilization``, if named, is read for the candidate alone and never raises its
    score.
    The weighted router then scores one instance per group of equal figures (see
    :mod:`servesim.policies.index`). None (the default) means: score every candidate. The
    promise holds for the class that declares it: a subclass that overrides :meth:`score` must
    declare its own. ``index_exceptions(request, snapshots)``, beside it, may name instances whose
    score also depends on something else (a prefix-cache hit): those are scored one by one.
    """

    name = ""
    reads_prefix_cache = False
    index_fields: tuple[str, ...] | None = None

    @abstractmethod
    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        """One score per snapshot, in order, each in [0, 1] (higher = better candidate)."""

    def observe(self, request: Any, chosen_index: int) -> None:
        """Told after each decision which instance (``snapshot.index``) got ``request``."""
        return None

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> Scorer:
        check_keys(params, [], ctx.path)
        return cls()


def _declaring(scorer: Scorer, name: str) -> int:
    """Position in the scorer's class hierarchy of the first class that defines ``name``."""
    for position, cls in enumerate(type(scorer).__mro__):
        if name in vars(cls):
            return position
    return len(type(scorer).__mro__)


def _promised(scorer: Scorer, name: str) -> bool:
    """Whether the class that declares ``name`` also wrote, or inherited knowingly, ``score``:
    it is the class that defines ``score``, or a subclass of it."""
    return _declaring(scorer, name) <= _declaring(scorer, "score")


def index_fields(scorer: Scorer) -> tuple[str, ...] | None:
    """The scorer's ``index_fields``, unless a subclass rewrote ``score`` without its own."""
    return scorer.index_fields if _promised(scorer, "index_fields") else None


def index_exceptions(
    scorer: Scorer,
) -> Callable[[Any, Sequence[InstanceSnapshot]], list[int]] | None:
    """The scorer's bound ``index_exceptions``, on the same condition as :func:`index_fields`."""
    found = getattr(scorer, "index_exceptions", None)
    return found if found is not None and _promised(scorer, "index_exceptions") else None


def _min_max(raw: list[float], higher_better: bool = False) -> list[float]:
    """``(max - x) / (max - min)``, or ``(x - min) / (max - min)`` when higher is better; all
    equal -> 1 everywhere."""
    hi, lo = max(raw), min(raw)
    if hi == lo:
        return [1.0] * len(raw)
    span = hi - lo
    if higher_better:
        return [(x - lo) / span for x in raw]
    return [(hi - x) / span for x in raw]


class _LowerLoadBetter(Scorer):
    """Min-max over the candidates of one load figure (``figure``), lower better, equal -> 1."""

    figure: Callable[[InstanceSnapshot], int]

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        figure = self.figure
        return _min_max([figure(s) for s in snapshots])


class _EachOnItsOwn(Scorer):
    """A score that reads the candidate alone (``value``), not the other candidates."""

    value: Callable[[InstanceSnapshot], float]

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        value = self.value
        return [value(s) for s in snapshots]


@register("scorer", "queue-depth")
class QueueDepth(_LowerLoadBetter):
    """Shorter wait queue is better: min-max over queue depths, all equal -> 1."""

    name = "queue-depth"
    index_fields = ("queue_depth",)
    figure = staticmethod(attrgetter("queue_depth"))


@register("scorer", "running-requests")
class RunningRequests(_LowerLoadBetter):
    """Smaller running batch is better: min-max over batch sizes, all equal -> 1."""

    name = "running-requests"
    index_fields = ("batch_size",)
    figure = staticmethod(attrgetter("batch_size"))


def _vllm_dp_load(s: InstanceSnapshot) -> int:
    return 4 * s.queue_depth + s.batch_size


@register("scorer", "vllm-dp")
class VllmDP(_LowerLoadBetter):
    """vLLM's data-parallel balancer: raw ``4·QD + batch_size``, min-max inverted, equal -> 1."""

    name = "vllm-dp"
    index_fields = ("queue_depth", "batch_size")
    figure = staticmethod(_vllm_dp_load)


def _free_kv(s: InstanceSnapshot) -> float:
    return 1.0 - s.kv_utilization


def _inverse_load(s: InstanceSnapshot) -> float:
    return 1.0 / (1 + s.queue_depth + s.batch_size + s.in_flight)


def _llm_d_load(s: InstanceSnapshot) -> float:
    return 0.5 if s.queue_depth <= 0 else 0.5 * (1.0 - min(s.queue_depth, 128) / 128.0)


@register("scorer", "kv-utilization")
class KVUtilization(_EachOnItsOwn):
    """Emptier KV cache is better: ``1 - kv_utilization``."""

    name = "kv-utilization"
    index_fields = ("kv_utilization",)
    value = staticmethod(_free_kv)


@register("scorer", "load-balance")
class LoadBalance(_EachOnItsOwn):
    """Lower effective load is better: ``1 / (1 + queue_depth + batch_size + in_flight)``."""

    name = "load-balance"
    index_fields = ("effective_load",)
    value = staticmethod(_inverse_load)


@register("scorer", "active-requests")
class ActiveRequests(Scorer):
    """Fewer requests in flight is better: ``(maxIF - IF_i) / maxIF``; ``IF_i = 0`` -> 1."""

    name = "active-requests"
    index_fields = ("in_flight",)

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        top = max(s.in_flight for s in snapshots)
        if top <= 0:
            return [1.0] * len(snapshots)
        return [1.0 if s.in_flight <= 0 else (top - s.in_flight) / top for s in snapshots]


@register("scorer", "load-aware")
class LoadAware(_EachOnItsOwn):
    """llm-d's load-aware scorer: empty queue -> 0.5, else ``0.5·(1 − min(QD, 128)/128)``."""

    name = "load-aware"
    index_fields = ("queue_depth",)
    value = staticmethod(_llm_d_load)


class _BlockIdsCache:
    """The request's prompt block ids, computed once per request (score and observe share it)."""

    __slots__ = ("request", "ids")

    def __init__(self) -> None:
        self.request: Any = None
        self.ids: Sequence[int] = ()

    def get(self, request: Any) -> Sequence[int]:
        if request is not self.request:
            self.ids = request.prompt_block_ids()
            self.request = request
        return self.ids


@register("scorer", "precise-prefix-cache")
class PrecisePrefixCache(Scorer):
    """More of the prompt's leading blocks already cached is better.

    Raw score = consecutive cached full blocks of the prompt, read from the instance's cache view
    (which lags by the cache signal delay); min-max normalised, all equal (all zero too) -> 1.
    """

    name = "precise-prefix-cache"
    reads_prefix_cache = True
    index_fields = ()  # an instance that holds none of the prompt scores by the others alone

    def __init__(self) -> None:
        self._ids = _BlockIdsCache()

    def index_exceptions(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[int]:
        """The instances that hold the prompt's first block: one cache lookup per instance that
        may hold it (the cluster's holders map), or per instance without that map."""
        ids = self._ids.get(request)
        if not ids:
            return []
        return [s.index for s in prefix_holders(snapshots, ids) if s.cached_prefix_blocks(ids) > 0]

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        ids = self._ids.get(request)
        if not ids:
            return [1.0] * len(snapshots)
        return _min_max([s.cached_prefix_blocks(ids) for s in snapshots], higher_better=True)


def _full_prompt_blocks(request: Any, fallback: int) -> int:
    """Full blocks of the whole prompt (spec §4.3 denominator); ``fallback`` without a block size."""
    block_size = getattr(request, "block_size", 0)
    if block_size and block_size > 0:
        return max(request.prompt_tokens // block_size, fallback)
    return fallback


@register("scorer", "prefix-affinity")
class PrefixAffinity(Scorer):
    """Router-side estimate of prefix reuse, without reading any cache (always synchronous).

    Per instance an LRU of the block ids the router sent there (``capacity`` ids, default 10,000).
    Score = leading prompt blocks found in the instance's LRU / full blocks of the prompt (0 when
    the prompt has no full block). :meth:`observe` records the prompt's block ids on the chosen
    instance. Only shareable blocks have ids (a request's private blocks can never match another
    request), so the LRU holds only those.
    """

    name = "prefix-affinity"
    index_fields = ()  # an instance whose LRU lacks the prompt's first block scores 0

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._lru: dict[int, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[int]] = {}  # block id -> instances whose LRU has it
        self._ids = _BlockIdsCache()

    def index_exceptions(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[int]:
        """The instances whose LRU holds the prompt's first block (the only non-zero scores)."""
        ids = self._ids.get(request)
        if not ids or _full_prompt_blocks(request, len(ids)) <= 0:
            return []
        return list(self._holders.get(ids[0], ()))

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        ids = self._ids.get(request)
        total = _full_prompt_blocks(request, len(ids))
        if total <= 0 or not ids:
            return [0.0] * len(snapshots)
        lru = self._lru
        out = []
        for s in snapshots:
            seen = lru.get(s.index)
            matched = 0
            if seen:
                for block in ids:
                    if block not in seen:
                        break
                    matched += 1
            out.append(matched / total)
        return out

    def observe(self, request: Any, chosen_index: int) -> None:
        ids = self._ids.get(request)
        if not ids:
            return
        seen = self._lru.get(chosen_index)
        if seen is None:
            seen = self._lru[chosen_index] = OrderedDict()
        move = seen.move_to_end
        holders = self._holders
        for block in ids:
            if block in seen:
                move(block)
            else:
                seen[block] = None
                holders.setdefault(block, set()).add(chosen_index)
        while len(seen) > self.capacity:
            block, _ = seen.popitem(last=False)
            left = holders[block]
            left.discard(chosen_index)
            if not left:
                del holders[block]

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> PrefixAffinity:
        check_keys(params, ["capacity"], ctx.path)
        capacity = as_int(params.get("capacity", 10_000), f"{ctx.path}.capacity", minimum=1)
        return cls(capacity)


@register("scorer", "no-hit-lru")
class NoHitLRU(Scorer):
    """Spreads cache-cold requests over the least recently used instances.

    Warm request (some candidate holds at least one of its leading blocks): 0.5 everywhere.
    Cold request: candidates never chosen for a cold request rank first (in snapshot order), then
    the others from least to most recently chosen; score ``1 − rank/(n − 1)`` (one candidate -> 1).
    :meth:`observe` makes the chosen instance the most recently used, for cold requests only.
    """

    name = "no-hit-lru"
    reads_prefix_cache = True

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()  # least recently chosen first
        self._ids = _BlockIdsCache()
        self._cold_request: Any = None

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        n = len(snapshots)
        ids = self._ids.get(request)
        if ids:
            for s in prefix_holders(snapshots, ids):
                if s.cached_prefix_blocks(ids) > 0:
                    self._cold_request = None
                    return [0.5] * n
        self._cold_request = request
        if n == 1:
            return [1.0]
        order = self._order
        position = {s.index: p for p, s in enumerate(snapshots)}
        ranks = [0] * n
        rank = 0
        for p, s in enumerate(snapshots):
            if s.index not in order:
                ranks[p] = rank
                rank += 1
        for index in order:
            at = position.get(index)
            if at is not None:
                ranks[at] = rank
                rank += 1
        scale = n - 1
        return [1.0 - r / scale for r in ranks]

    def observe(self, request: Any, chosen_index: int) -> None:
        if request is not self._cold_request:
            return
        self._cold_request = None
        order = self._order
        if chosen_index in order:
            order.move_to_end(chosen_index)
        else:
            order[chosen_index] = None


# ---------------------------------------------------------------- LoRA adapters (additive block)
@register("scorer", "adapter-affinity")
class AdapterAffinity(Scorer):
    """Prefers instances that hold the request's LoRA adapter: 1 when it is in a GPU slot (no
    load), ``cpu_score`` when it is in CPU memory (a PCIe copy), ``free_slot_score`` when a GPU
    slot is free (a load, but no eviction), else 0. A request without an adapter, or a run
    without adapters, scores 1 everywhere (the scorer then changes nothing).

    Like vLLM's ``lora_requests_info`` metric the gateway reads, it sees each instance's current
    adapter sets (bound by the cluster: :meth:`bind_adapters`), not a delayed copy."""

    name = "adapter-affinity"

    def __init__(self, cpu_score: float = 0.5, free_slot_score: float = 0.25):
        self.cpu_score = cpu_score
        self.free_slot_score = free_slot_score
        self.states: Sequence[Any] = ()

    def bind_adapters(self, states: Sequence[Any]) -> None:
        """Each instance's adapter state (``gpu``/``cpu`` name collections, ``max_loras``;
        None for an instance without adapters), by instance index."""
        self.states = list(states)

    def score(self, request: Any, snapshots: Sequence[InstanceSnapshot]) -> list[float]:
        adapter = getattr(request, "adapter", "")
        states = self.states
        if not adapter or not states:
            return [1.0] * len(snapshots)
        out = []
        for s in snapshots:
            state = states[s.index]
            if state is None:
                out.append(0.0)
            elif adapter in state.gpu:
                out.append(1.0)
            elif adapter in state.cpu:
                out.append(self.cpu_score)
            elif len(state.gpu) < state.max_loras:
                out.append(self.free_slot_score)
            else:
                out.append(0.0)
        return out

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> AdapterAffinity:
        from servesim.simcore.config import as_float

        check_keys(params, ["cpu_score", "free_slot_score"], ctx.path)
        values = {
            key: as_float(params.get(key, default), f"{ctx.path}.{key}", minimum=0.0, maximum=1.0)
            for key, default in (("cpu_score", 0.5), ("free_slot_score", 0.25))
        }
        return cls(**values)
