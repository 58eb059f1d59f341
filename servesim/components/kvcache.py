"""Paged KV-cache block manager with prefix caching (vLLM v1 semantics), costed per block change.

Physical blocks hold ``block_size`` tokens. A block whose content can be matched by a later request
(a full block of a shared prefix, or of a preempted request that will come back) is *registered*
under its chained content hash; every other block is anonymous. Only registered blocks need an
identity, so anonymous blocks are kept as counts, and a decode step that needs ``n`` new blocks
costs one call, not ``n`` object updates.

Free list (vLLM's ``FreeKVCacheBlockQueue``): an LRU queue. Allocation pops the head; a released
request returns its blocks to the tail in reverse order (last block first), so a prompt's early,
most reusable blocks are evicted last. A registered block on the free list keeps its hash until it
is popped for reuse (lazy eviction), so it still produces prefix-cache hits. Runs of anonymous free
blocks are stored as one entry with a count.

Invariant (INV-4): ``used + free == total`` where ``used`` = blocks owned by requests (anonymous
plus registered blocks with a reference count above zero).
"""

from __future__ import annotations

from collections import OrderedDict

from servesim.components.kvtiers import CPUTier, KVTier, reload_from

__all__ = ["CPUTier", "CachedBlock", "ContentIds", "KVCache", "KVTier"]


class CachedBlock:
    """A registered physical block: its content id ("hash") and how many requests reference it."""

    __slots__ = ("hash", "ref", "born")

    def __init__(self, block_hash: int, born: int = 0):
        self.hash = block_hash
        self.ref = 1
        self.born = born  # when its content became cached (for delayed cache signals)

    def __repr__(self) -> str:
        return f"CachedBlock(hash={self.hash}, ref={self.ref})"


class ContentIds:
    """Exact identities for block contents, standing in for vLLM's chained block hashes.

    ``chain(previous, content)`` returns the same integer for the same (previous block, content)
    and a different one otherwise: equal ids mean equal token prefixes, with no chance of a hash
    collision. Ids are non-negative, in order of first use, so runs are deterministic. One table
    per instance, alongside the memoised ids of every shared-prefix group's blocks.
    """

    __slots__ = ("_ids", "groups")

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self.groups: dict[int, list[int]] = {}

    def chain(self, previous: int, content: tuple) -> int:
        key = (previous, content)
        ident = self._ids.get(key)
        if ident is None:
            ident = self._ids[key] = len(self._ids)
        return ident

    def __len__(self) -> int:
        return len(self._ids)


class KVCache:
    """Block accounting, the LRU free list, the hash registry and hit counters of one instance."""

    __slots__ = (
        "total_blocks",
        "block_size",
        "free_count",
        "_free",
        "_registry",
        "_next_run_key",
        "hit_blocks",
        "miss_blocks",
        "evictions",
        "cpu",
        "tiers",
        "tier_reloads",
        "now",
        "eviction_log",
        "holders",
        "index",
    )

    def __init__(
        self,
        total_blocks: int,
        block_size: int,
        cpu_blocks: int = 0,
        tiers: list[KVTier] | None = None,
    ):
        if total_blocks < 1 or block_size < 1:
            raise ValueError("total_blocks and block_size must be positive")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.free_count = total_blocks
        # key < 0: a run of anonymous free blocks (value = count); key >= 0: a registered free block (by content id).
        self._free: OrderedDict[int, object] = OrderedDict()
        self._free[-1] = total_blocks
        self._next_run_key = -2
        self._registry: dict[int, CachedBlock] = {}
        self.hit_blocks = 0
        self.miss_blocks = 0
        self.evictions = 0
        # offload tiers below the GPU, fastest first (None: none); ``cpu`` is the fastest one,
        # the CPU tier of engine.kv_cpu_blocks when it is the only one (kvtiers.py)
        if not tiers and cpu_blocks > 0:
            tiers = [CPUTier(cpu_blocks)]
        self.tiers: list[KVTier] | None = tiers or None
        self.cpu: KVTier | None = tiers[0] if tiers else None
        self.tier_reloads = 0  # blocks reloaded from any tier (recounted against the tiers')
        self.now = 0  # the engine sets it at each step, to time-stamp registrations and evictions
        # hash -> (born, evicted_at) of recently evicted blocks, kept only when a router reads the
        # cache with a delay (None = not tracked)
        self.eviction_log: OrderedDict[int, tuple[int, int]] | None = None
        # hash -> the instances that may hold it, shared by a cluster's caches when a router
        # reads them (None = not tracked); see track_holders
        self.holders: dict[int, set[int]] | None = None
        self.index = 0

    def track_holders(self, holders: dict[int, set[int]], index: int) -> None:
        """Keep ``holders`` (shared by the cluster's caches) in step with this cache, instance
        ``index``: a block's hash maps to every instance whose registry holds it, plus, with an
        ``eviction_log``, those whose log still remembers it (a delayed query may still see it).
        A router then asks only those instances instead of all of them (a superset: it still
        asks each one's exact answer)."""
        self.holders = holders
        self.index = index
        for block_hash in self._registry:
            holders.setdefault(block_hash, set()).add(index)
        for block_hash in self.eviction_log or ():
            holders.setdefault(block_hash, set()).add(index)

    def _hold(self, block_hash: int) -> None:
        """This instance now holds ``block_hash`` (for the shared holders map)."""
        held = self.holders.get(block_hash)  # type: ignore[union-attr]
        if held is None:
            self.holders[block_hash] = {self.index}  # type: ignore[index]
        else:
            held.add(self.index)

    def _forget(self, block_hash: int) -> None:
        """This instance no longer holds ``block_hash``, and no delayed query can see it."""
        held = self.holders[block_hash]  # type: ignore[index]
        held.discard(self.index)
        if not held:
            del self.holders[block_hash]  # type: ignore[union-attr]

    # ------------------------------------------------------------------ queries
    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_count

    def lookup(self, block_hash: int) -> CachedBlock | None:
        return self._registry.get(block_hash)

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._registry

    # ------------------------------------------------------------------ allocation
    def pop_blocks(self, n: int) -> None:
        """Take ``n`` blocks from the head of the free list (caller checked ``n <= free_count``).

        A registered block popped here loses its hash: that is the moment its content is evicted.
        """
        if n <= 0:
            return
        self.free_count -= n
        self.miss_blocks += n
        free = self._free
        while n:
            key = next(iter(free))
            if key < 0:
                run = free[key]
                if run > n:
                    free[key] = run - n
                    return
                del free[key]
                n -= run
            else:
                block = free.pop(key)
                del self._registry[key]
                self.evictions += 1
                if self.eviction_log is not None:
                    self.eviction_log.pop(key, None)
                    self.eviction_log[key] = (block.born, self.now)
                elif self.holders is not None:
                    self._forget(key)
                n -= 1

    def claim(self, blocks: list[CachedBlock]) -> None:
        """Reference cached blocks found by a prefix lookup (prefix-cache hits)."""
        free = self._free
        for block in blocks:
            if block.ref == 0:
                del free[block.hash]
                self.free_count -= 1
            block.ref += 1
        self.hit_blocks += len(blocks)
        tiers = self.tiers
        if tiers is not None:
            for tier in tiers:
                for block in blocks:
                    tier.touch(block.hash)

    def offloaded(self, block_hash: int) -> bool:
        """Whether some offload tier holds ``block_hash`` (the caller checked there is a tier)."""
        for tier in self.tiers:  # type: ignore[union-attr]
            if block_hash in tier:
                return True
        return False

    def reload(self, hashes: list[int]) -> tuple[list[CachedBlock], float]:
        """Copy blocks back from the offload tiers into free GPU blocks, referenced by the caller;
        return them and the copy's time in µs (the tiers' rule: kvtiers.reload_from).

        The caller checked that ``len(hashes) <= free_count`` and that every hash is in some
        tier and not on the GPU. Reloaded blocks count as prefix-cache hits, not misses.
        """
        n = len(hashes)
        self.pop_blocks(n)
        self.miss_blocks -= n
        self.hit_blocks += n
        registry = self._registry
        blocks = []
        for block_hash in hashes:
            block = CachedBlock(block_hash, self.now)
            registry[block_hash] = block
            blocks.append(block)
            if self.holders is not None:
                self._hold(block_hash)
        self.tier_reloads += n
        return blocks, reload_from(self.tiers, hashes)  # type: ignore[arg-type]

    def register(self, block_hash: int) -> CachedBlock | None:
        """Give one block the caller already owns (anonymous) the identity ``block_hash``.

        Returns ``None`` when another block already holds that content; the caller's block then
        stays anonymous (a duplicate that will not be shared).
        """
        registry = self._registry
        if block_hash in registry:
            return None
        block = CachedBlock(block_hash, self.now)
        registry[block_hash] = block
        if self.tiers is not None:
            for tier in self.tiers:  # write-through: every tier keeps a copy
                tier.store(block_hash)
        if self.holders is not None:
            self._hold(block_hash)
        return block

    def cached_prefix(self, block_ids, as_of: int | None = None) -> int:
        """How many of ``block_ids``, from the first, the cache holds (a router's prefix query).

        With ``as_of`` (needs ``eviction_log``), the answer is the cache as it was at that time:
        blocks registered later are not seen, blocks evicted since still are.
        """
        registry = self._registry
        n = 0
        if as_of is None:
            for block_id in block_ids:
                if block_id not in registry:
                    break
                n += 1
            return n
        log = self.eviction_log
        while log and next(iter(log.values()))[1] <= as_of:
            # evicted before the horizon of every future query
            gone, _ = log.popitem(last=False)
            if self.holders is not None and gone not in registry:
                self._forget(gone)
        for block_id in block_ids:
            block = registry.get(block_id)
            if block is not None and block.born <= as_of:
                n += 1
                continue
            past = log.get(block_id) if log else None
            if past is not None and past[0] <= as_of < past[1]:
                n += 1
                continue
            break
        return n

    # ------------------------------------------------------------------ release
    def release(self, anonymous: int, registered: list[CachedBlock]) -> None:
        """Return a request's blocks in reverse order.

        A request's registered blocks always precede its anonymous ones, so reverse order is: the
        anonymous run first, then the registered blocks last-to-first.
        """
        free = self._free
        if anonymous > 0:
            free[self._next_run_key] = anonymous
            self._next_run_key -= 1
            self.free_count += anonymous
        tiers = self.tiers
        for block in reversed(registered):
            block.ref -= 1
            if block.ref == 0:
                free[block.hash] = block
                self.free_count += 1
            if tiers is not None:
                for tier in tiers:
                    tier.touch(block.hash)

    # ------------------------------------------------------------------ audit support
    def check(self, owners: list[tuple[int, list[CachedBlock]]]) -> list[str]:
        """Independent recount of every block (INV-4). ``owners``: (anonymous, registered) per holder.

        Returns a list of problems (empty when the books balance).
        """
        problems: list[str] = []
        free_walk = 0
        for key, value in self._free.items():
            if key < 0:
                if not isinstance(value, int) or value <= 0:
                    problems.append(f"free run {key} has invalid size {value!r}")
                    continue
                free_walk += value
            else:
                if not isinstance(value, CachedBlock) or value.ref != 0:
                    problems.append(
                        f"free registered block {key:#x} has ref {getattr(value, 'ref', None)}"
                    )
                free_walk += 1
        if free_walk != self.free_count:
            problems.append(
                f"free list holds {free_walk} blocks but free_count is {self.free_count}"
            )
        refs: dict[int, int] = {}
        anonymous_owned = 0
        for anonymous, registered in owners:
            if anonymous < 0:
                problems.append(f"a request owns {anonymous} anonymous blocks")
            anonymous_owned += anonymous
            for block in registered:
                refs[block.hash] = refs.get(block.hash, 0) + 1
        in_use = 0
        for block_hash, block in self._registry.items():
            expected = refs.get(block_hash, 0)
            if block.ref != expected:
                problems.append(f"block {block_hash:#x} has ref {block.ref} but {expected} holders")
            if block.ref > 0:
                in_use += 1
        for block_hash in refs:
            if block_hash not in self._registry:
                problems.append(f"a request holds unregistered block {block_hash:#x}")
        problems.extend(self._check_tiers())
        used = anonymous_owned + in_use
        if used + self.free_count != self.total_blocks:
            problems.append(
                f"KV conservation broken: used {used} + free {self.free_count} != total {self.total_blocks}"
            )
        return problems

    def tier_stats(self) -> list[dict]:
        """Each offload tier's name and counters, fastest first (empty: no tier)."""
        return [{"name": tier.name, **tier.stats()} for tier in self.tiers or ()]

    def _check_tiers(self) -> list[str]:
        """Every offload tier's books, and its reloads adding up to the blocks reloaded."""
        if self.tiers is None:
            return []
        problems = []
        for tier in self.tiers:
            problems.extend(tier.check())
        from_tiers = sum(tier.reloads for tier in self.tiers)
        if from_tiers != self.tier_reloads:
            problems.append(
                f"KV tiers reloaded {from_tiers} blocks but the cache took {self.tier_reloads}"
            )
        return problems

    @property
    def hit_rate(self) -> float:
        looked = self.hit_blocks + self.miss_blocks
        return self.hit_blocks / looked if looked else 0.0
