"""KV offload tiers below the GPU (CPU memory, local disk, a remote store), LMCache-like.

Each tier is an LRU set of block content ids with its own capacity and its own reload price,
``latency + blocks x block_bytes / bandwidth``. The tiers are ordered fastest first and behave
as LMCache's storage manager does:

* **write-through**: every block that gets a content hash on the GPU is stored in every tier
  (LMCache's ``batched_put`` submits each chunk to all of its backends), so an eviction moves
  no data: a block dropped by one tier's LRU is still found in the next tier that kept it;
* **lookup**: after the GPU's prefix ends, the prefix continues block by block in the fastest
  tier that holds each block; the blocks found are reloaded instead of recomputed;
* **write-back on a hit**: a block reloaded from a slower tier is stored again in every faster
  tier (LMCache writes what it fetched from disk or a remote store back into CPU memory);
* **parallel loads**: the tiers of one reload fetch their blocks at the same time (LMCache's
  prefetch issues one load per tier and waits for all of them), so a reload costs the slowest
  tier's time, ``max over tiers of (latency + n_tier x block_bytes / bandwidth)``.

With one tier this is exactly the CPU tier of ``engine.kv_cpu_blocks``.
"""

from __future__ import annotations

from collections import OrderedDict


class KVTier:
    """One offload tier: an LRU set of block content ids of bounded size, and its reload price.

    ``us_per_block`` is ``block_bytes / bandwidth`` in µs. Counters: ``stores`` (blocks newly
    stored), ``evictions`` (blocks its LRU dropped), ``reloads`` (blocks copied back to the GPU
    from here), ``hits`` (reloads that took at least one block from here), ``reload_us`` (the
    time this tier's share of those reloads took, overlapping the other tiers').
    """

    __slots__ = (
        "capacity",
        "name",
        "latency_us",
        "us_per_block",
        "block_bytes",
        "_lru",
        "stores",
        "evictions",
        "reloads",
        "hits",
        "reload_us",
    )

    def __init__(
        self,
        capacity: int,
        name: str = "cpu",
        latency_us: float = 0.0,
        us_per_block: float = 0.0,
        block_bytes: int = 0,
    ):
        if capacity < 1:
            raise ValueError(f"KV tier {name!r}: capacity must be positive, not {capacity}")
        self.capacity = capacity
        self.name = name
        self.latency_us = latency_us
        self.us_per_block = us_per_block
        self.block_bytes = block_bytes
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.stores = 0
        self.evictions = 0
        self.reloads = 0
        self.hits = 0
        self.reload_us = 0.0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def store(self, block_hash: int) -> None:
        """Hold ``block_hash`` (most recently used); a full tier drops its least recently used."""
        lru = self._lru
        if block_hash in lru:
            lru.move_to_end(block_hash)
            return
        if len(lru) >= self.capacity:
            lru.popitem(last=False)
            self.evictions += 1
        lru[block_hash] = None
        self.stores += 1

    def touch(self, block_hash: int) -> None:
        if block_hash in self._lru:
            self._lru.move_to_end(block_hash)

    def cost_us(self, blocks: int) -> float:
        """Time to copy ``blocks`` blocks from this tier into GPU memory."""
        return self.latency_us + blocks * self.us_per_block

    def stats(self) -> dict[str, float]:
        """This tier's counters, for the run record."""
        return {
            "capacity_blocks": self.capacity,
            "hits": self.hits,
            "reloaded_blocks": self.reloads,
            "reloaded_bytes": self.reloads * self.block_bytes,
            "reload_us": self.reload_us,
            "stored_blocks": self.stores,
            "evicted_blocks": self.evictions,
        }

    def check(self) -> list[str]:
        """This tier's books (INV-4): within capacity, and stored - evicted = held."""
        problems = []
        held = len(self._lru)
        if held > self.capacity:
            problems.append(
                f"KV tier {self.name} holds {held} blocks, over its capacity {self.capacity}"
            )
        if self.stores - self.evictions != held:
            problems.append(
                f"KV tier {self.name} conservation broken: {self.stores} stored - "
                f"{self.evictions} evicted != {held} held"
            )
        if self.hits > self.reloads:
            problems.append(
                f"KV tier {self.name} counts {self.hits} reloads but only {self.reloads} blocks"
            )
        return problems


CPUTier = KVTier
"""The single CPU tier of ``engine.kv_cpu_blocks``: a tier named ``cpu``."""


def tiers_for(limits) -> list[KVTier] | None:
    """The offload tiers an engine's limits describe (None: no tier, the GPU only).

    ``limits.kv_tiers`` lists ``(name, blocks, latency_us, us_per_block, block_bytes)`` fastest
    first; without it, ``kv_cpu_blocks > 0`` is the one-tier case priced by
    ``cpu_reload_base_us`` and ``cpu_reload_us_per_block``.
    """
    if limits.kv_tiers:
        return [
            KVTier(blocks, name, latency_us, us_per_block, block_bytes)
            for name, blocks, latency_us, us_per_block, block_bytes in limits.kv_tiers
        ]
    if limits.kv_cpu_blocks > 0:
        return [
            KVTier(
                limits.kv_cpu_blocks,
                "cpu",
                limits.cpu_reload_base_us,
                limits.cpu_reload_us_per_block,
            )
        ]
    return None


def reload_from(tiers: list[KVTier], hashes: list[int]) -> float:
    """Account a reload of ``hashes`` (each held by some tier) and return its time in µs.

    Each block comes from the fastest tier holding it, is marked used there, and is written back
    to every faster tier. The tiers load in parallel: the reload takes the slowest tier's time.
    """
    if len(tiers) == 1:  # the CPU tier alone (the common case): no search, no write-back
        tier = tiers[0]
        for block_hash in hashes:
            tier.touch(block_hash)
        return _charge(tier, len(hashes))
    # where each block comes from, decided before any write-back can evict one of them
    sources = []
    for block_hash in hashes:
        for k, tier in enumerate(tiers):
            if block_hash in tier:
                sources.append(k)
                break
    taken = [0] * len(tiers)
    for block_hash, k in zip(hashes, sources):
        tiers[k].touch(block_hash)
        taken[k] += 1
        for faster in tiers[:k]:
            faster.store(block_hash)
    slowest = 0.0
    for tier, n in zip(tiers, taken):
        if n:
            slowest = max(slowest, _charge(tier, n))
    return slowest


def _charge(tier: KVTier, blocks: int) -> float:
    """Count one reload of ``blocks`` blocks from ``tier``; return the time it takes."""
    cost = tier.cost_us(blocks)
    tier.hits += 1
    tier.reloads += blocks
    tier.reload_us += cost
    return cost


def tier_totals(instances: list[dict]) -> dict[str, dict[str, float]]:
    """``summary.json``'s ``kv_tier_hits``: each tier's counters summed over the instances (by
    tier name, in order of first appearance), reload time in ms; empty without tiers."""
    totals: dict[str, dict[str, float]] = {}
    for instance in instances:
        for tier in instance.get("kv_tiers", ()):
            into = totals.setdefault(tier["name"], dict.fromkeys(_TOTALS, 0))
            for key in _TOTALS:
                into[key] += tier[key]
    for into in totals.values():
        into["reload_ms"] = into.pop("reload_us") / 1000.0
    return totals


_TOTALS = (
    "hits",
    "reloaded_blocks",
    "reloaded_bytes",
    "reload_us",
    "stored_blocks",
    "evicted_blocks",
    "capacity_blocks",
)
