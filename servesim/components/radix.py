"""SGLang's radix-tree prefix cache (``engine.profile: sglang``): token granularity, LRU leaves.

Modelled on ``RadixCache`` in sgl-project/sglang, ``python/sglang/srt/mem_cache/radix_cache.py``
(v0.4-v0.5, default ``page_size`` 1), and the token pool it sits on: every KV slot holds one token.

* The tree's edges are token runs. A lookup walks from the root as far as the request's tokens
  match, at token granularity: a prompt sharing 100 tokens with a cached one reuses 100 tokens,
  where vLLM's paged cache reuses only the 6 whole 16-token blocks. A walk that stops inside an
  edge splits it, as SGLang's ``_split_node`` does, so every match ends on a node.
* A request holds (locks) the path from the root to the deepest node of its cached prefix; a
  locked node cannot be evicted (SGLang's ``inc_lock_ref``/``dec_lock_ref``). A finished request
  inserts all its computed tokens (prompt and output), which then stay cached, unlocked.
* When an allocation needs more slots than are free, unlocked leaves are evicted in least
  recently used order (a leaf's parent becomes a candidate once its last child is gone), whole
  nodes at a time, as ``RadixCache.evict`` does. Eviction is lazy: free slots are used first.

Tokens are named by content *runs* ``(segment, start, end)`` rather than token ids (see
:mod:`servesim.components.request`): equal runs at equal positions are equal tokens.

Accounting in tokens (the engine calls them blocks of one token): ``free`` slots are unused;
``evictable`` tokens sit in unlocked nodes; ``protected`` tokens in locked ones; every other slot
belongs to a running request outside the tree ("anonymous"). ``free_count`` (free + evictable) is
what an allocation can get. :meth:`RadixCache.check` recounts all of it for the auditor (INV-4).

The interface is the one the engine uses of :class:`~servesim.components.kvcache.KVCache`; a
request's ``blocks`` is the deepest node it locks (``len`` = tokens locked) or an empty list.
"""

from __future__ import annotations

import heapq

from servesim.simcore.errors import ScenarioError

Run = tuple[int, int, int]  # (segment, first token, end) of a piece of a token sequence


class RadixNode:
    """One edge of the tree and the node below it: ``key`` holds its tokens as runs."""

    __slots__ = ("parent", "children", "key", "length", "depth", "lock", "stamp")

    def __init__(self, parent: RadixNode | None, key: tuple[Run, ...], length: int, depth: int):
        self.parent = parent
        self.children: dict[tuple[int, int], RadixNode] = {}  # by (segment, start) of the first run
        self.key = key
        self.length = length  # tokens on this edge
        self.depth = depth  # tokens from the root to the end of this edge
        self.lock = 0  # requests whose held path passes through this node
        self.stamp = 0  # last access (a counter: only the order matters)

    def __len__(self) -> int:
        """Tokens a request holding this node holds in the tree (the engine's ``len(r.blocks)``)."""
        return self.depth

    def __repr__(self) -> str:
        return f"RadixNode(depth={self.depth}, length={self.length}, lock={self.lock})"


def token_runs(r, n: int) -> list[Run]:
    """The first ``n`` tokens of request ``r`` as runs: its prompt segments, then its output
    (segment ``2 * id + 1``)."""
    runs: list[Run] = []
    left = n
    for segment, length in r.segments:
        if left <= 0:
            return runs
        if length > 0:
            take = length if length < left else left
            runs.append((segment, 0, take))
            left -= take
    if left > 0:
        runs.append((2 * r.id + 1, 0, left))
    return runs


def _cut(key: tuple[Run, ...], n: int) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """``key`` split after its first ``n`` tokens (0 < n < its length)."""
    head: list[Run] = []
    for k, (segment, lo, hi) in enumerate(key):
        if hi - lo < n:
            head.append((segment, lo, hi))
            n -= hi - lo
        elif hi - lo == n:
            head.append((segment, lo, hi))
            return tuple(head), key[k + 1 :]
        else:
            head.append((segment, lo, lo + n))
            return tuple(head), ((segment, lo + n, hi), *key[k + 1 :])
    raise ValueError("cut beyond the key")


class _Cursor:
    """A position in a run list: run ``i``, token ``pos`` of its segment."""

    __slots__ = ("runs", "i", "pos")

    def __init__(self, runs: list[Run]):
        self.runs = runs
        self.i = 0
        self.pos = runs[0][1] if runs else 0

    def advance(self, m: int) -> None:
        self.pos += m
        if self.pos == self.runs[self.i][2]:
            self.i += 1
            if self.i < len(self.runs):
                self.pos = self.runs[self.i][1]

    def rest(self, n: int) -> tuple[Run, ...]:
        """The next ``n`` tokens as runs (without moving)."""
        out = []
        i, pos = self.i, self.pos
        while n > 0:
            segment, _, hi = self.runs[i]
            take = min(hi - pos, n)
            out.append((segment, pos, pos + take))
            n -= take
            i += 1
            if i < len(self.runs):
                pos = self.runs[i][1]
        return tuple(out)


def _common(key: tuple[Run, ...], cursor: _Cursor, cap: int) -> int:
    """Tokens, at most ``cap``, that ``key`` shares with the cursor's runs; moves the cursor."""
    n = 0
    runs = cursor.runs
    for segment, lo, hi in key:
        at = lo
        while at < hi:
            if n >= cap or cursor.i >= len(runs):
                return n
            rseg, _, rhi = runs[cursor.i]
            if rseg != segment or cursor.pos != at:
                return n
            m = min(hi - at, rhi - at, cap - n)
            n += m
            at += m
            cursor.advance(m)
    return n


class RadixCache:
    """The token pool of one instance and the radix tree of its cached prefixes."""

    __slots__ = (
        "total_blocks",
        "block_size",
        "free",
        "evictable",
        "protected",
        "root",
        "_heap",
        "_clock",
        "_seq",
        "hit_blocks",
        "miss_blocks",
        "evictions",
        "cpu",
        "now",
        "eviction_log",
        "holders",
    )

    def __init__(self, total_tokens: int):
        if total_tokens < 1:
            raise ValueError("the token pool must hold at least one token")
        self.total_blocks = total_tokens
        self.block_size = 1
        self.free = total_tokens
        self.evictable = 0
        self.protected = 0
        self.root = RadixNode(None, (), 0, 0)
        self._heap: list[tuple[int, int, RadixNode]] = []  # candidate leaves (stamp, seq, node)
        self._clock = 0
        self._seq = 0
        self.hit_blocks = 0  # tokens reused from the tree by admissions
        self.miss_blocks = 0  # tokens allocated
        self.evictions = 0  # tokens evicted
        self.cpu = None  # no CPU tier under this profile
        self.now = 0
        self.eviction_log = None
        self.holders = None

    # ------------------------------------------------------------------ queries
    @property
    def free_count(self) -> int:
        """Tokens an allocation can get: free slots plus evictable cached tokens."""
        return self.free + self.evictable

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free - self.evictable

    @property
    def hit_rate(self) -> float:
        looked = self.hit_blocks + self.miss_blocks
        return self.hit_blocks / looked if looked else 0.0

    def tier_stats(self) -> list[dict]:
        """Offload tiers' counters, as the vLLM cache reports them: none (the SGLang profile
        refuses engine.kv_tiers)."""
        return []

    # ------------------------------------------------------------------ the tree
    def _touch(self, node: RadixNode) -> None:
        self._clock += 1
        node.stamp = self._clock

    def _push(self, node: RadixNode) -> None:
        """``node`` may now be evicted (an unlocked leaf)."""
        self._seq += 1
        heapq.heappush(self._heap, (node.stamp, self._seq, node))

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Put a node for the first ``n`` tokens of ``child``'s edge above it; return it."""
        parent = child.parent
        head, tail = _cut(child.key, n)
        mid = RadixNode(parent, head, n, child.depth - child.length + n)
        mid.lock = child.lock
        mid.stamp = child.stamp
        parent.children[(head[0][0], head[0][1])] = mid  # type: ignore[union-attr]
        child.key = tail
        child.length -= n
        child.parent = mid
        mid.children[(tail[0][0], tail[0][1])] = child
        return mid

    def _walk(self, runs: list[Run], limit: int) -> tuple[RadixNode, int, _Cursor]:
        """Follow ``runs`` from the root for at most ``limit`` tokens; every node on the way is
        touched. Returns the node where the walk ends (split so that it ends there exactly), the
        tokens matched and the cursor after them."""
        node = self.root
        cursor = _Cursor(runs)
        matched = 0
        while matched < limit and cursor.i < len(runs):
            child = node.children.get((runs[cursor.i][0], cursor.pos))
            if child is None:
                break
            n = _common(child.key, cursor, limit - matched)
            partial = n < child.length
            if partial:
                child = self._split(child, n)
            matched += n
            node = child
            self._touch(node)
            if partial:
                break
        return node, matched, cursor

    def match(self, runs: list[Run], limit: int) -> tuple[RadixNode, int]:
        """The deepest node matching the first tokens of ``runs`` (at most ``limit``) and the
        number of tokens matched (SGLang's ``match_prefix``, which also touches the path)."""
        node, matched, _ = self._walk(runs, limit)
        return node, matched

    def insert(self, runs: list[Run], n: int) -> tuple[RadixNode, int]:
        """Make the first ``n`` tokens of ``runs`` a path of the tree (SGLang's ``insert``).

        Returns the node ending at token ``n`` and how many of the ``n`` tokens were already
        cached; the caller owned the slots of the others, which now belong to the tree (a new
        unlocked leaf: evictable). The caller frees its slots of the already-cached ones."""
        node, matched, cursor = self._walk(runs, n)
        if matched < n:
            leaf = RadixNode(node, cursor.rest(n - matched), n - matched, n)
            node.children[(leaf.key[0][0], leaf.key[0][1])] = leaf
            self._touch(leaf)
            self.evictable += leaf.length
            self._push(leaf)
            node = leaf
        return node, matched

    def lock(self, node: RadixNode) -> None:
        """A request holds the path from the root to ``node``: none of it can be evicted."""
        while node.parent is not None:
            if node.lock == 0:
                self.evictable -= node.length
                self.protected += node.length
            node.lock += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node.parent is not None:
            node.lock -= 1
            if node.lock == 0:
                self.protected -= node.length
                self.evictable += node.length
                if not node.children:
                    self._push(node)
            node = node.parent

    def evict(self, tokens: int) -> None:
        """Free at least ``tokens`` slots (if that many are evictable) by removing unlocked
        leaves, least recently used first."""
        heap = self._heap
        done = 0
        while done < tokens and heap:
            stamp, _, node = heapq.heappop(heap)
            parent = node.parent
            if parent is None or node.children or node.lock:
                continue  # evicted already, or no longer an unlocked leaf
            if stamp != node.stamp:
                self._push(node)  # used since: back in the queue at its new place
                continue
            del parent.children[(node.key[0][0], node.key[0][1])]
            node.parent = None
            done += node.length
            self.evictable -= node.length
            self.free += node.length
            self.evictions += node.length
            if parent.parent is not None and not parent.children and parent.lock == 0:
                self._push(parent)

    # ------------------------------------------------------------------ the pool
    def pop_blocks(self, n: int) -> None:
        """Allocate ``n`` slots (the caller checked ``n <= free_count``), evicting if needed."""
        if n <= 0:
            return
        if self.free < n:
            self.evict(n - self.free)
        self.free -= n
        self.miss_blocks += n

    def free_slots(self, n: int) -> None:
        """A request gives back ``n`` slots of its own (outside the tree)."""
        self.free += n

    def release(self, anonymous: int, held) -> None:
        """A request leaves: its ``anonymous`` slots are freed and its path unlocked (a finished
        request has inserted its tokens first, see ``SGLangEngine._finish``)."""
        self.free += anonymous
        if isinstance(held, RadixNode):
            self.unlock(held)

    # ------------------------------------------------------------------ routers
    def track_holders(self, holders, index: int) -> None:
        raise _no_cache_routing()

    def cached_prefix(self, block_ids, as_of: int | None = None) -> int:
        raise _no_cache_routing()

    # ------------------------------------------------------------------ audit support
    def check(self, owners: list) -> list[str]:
        """Independent recount of every token (INV-4 for this cache): locks match the requests
        holding each path, the tree is well formed, and free + evictable + protected + the
        requests' own slots == total. ``owners``: (own slots, held node or []) per request."""
        problems: list[str] = []
        expected: dict[int, int] = {}
        anonymous = 0
        for own, held in owners:
            if own < 0:
                problems.append(f"a request owns {own} tokens outside the tree")
            anonymous += own
            if isinstance(held, RadixNode):
                if held.parent is None and held is not self.root:
                    problems.append(f"a request holds an evicted node {held!r}")
                node = held
                while node.parent is not None:
                    expected[id(node)] = expected.get(id(node), 0) + 1
                    node = node.parent
        evictable = protected = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                stack.append(child)
                if child.parent is not node:
                    problems.append(f"{child!r} does not point back to its parent")
                if child.length < 1 or first != (child.key[0][0], child.key[0][1]):
                    problems.append(f"{child!r} is filed under {first} with key {child.key}")
                if sum(hi - lo for _, lo, hi in child.key) != child.length:
                    problems.append(f"{child!r}: its key holds another number of tokens")
                if child.depth != node.depth + child.length:
                    problems.append(f"{child!r}: depth is not its parent's plus its length")
                if child.lock != expected.get(id(child), 0):
                    problems.append(
                        f"{child!r} has lock {child.lock} but "
                        f"{expected.get(id(child), 0)} requests hold it"
                    )
                if child.lock:
                    protected += child.length
                else:
                    evictable += child.length
        if (evictable, protected) != (self.evictable, self.protected):
            problems.append(
                f"tree holds {evictable} evictable and {protected} locked tokens, the counts say "
                f"{self.evictable} and {self.protected}"
            )
        if self.free < 0:
            problems.append(f"{self.free} free tokens")
        if self.free + evictable + protected + anonymous != self.total_blocks:
            problems.append(
                f"KV conservation broken: free {self.free} + cached {evictable} + locked "
                f"{protected} + requests' own {anonymous} != total {self.total_blocks}"
            )
        return problems


def _no_cache_routing() -> ScenarioError:
    return ScenarioError(
        "policies.routing",
        "a prefix-cache-aware router",
        "routers read vLLM's block hashes, which engine.profile: sglang (a token radix tree) "
        "does not keep; use a router that does not read the prefix cache, or engine.profile: vllm",
    )
