"""SGLang's radix-tree prefix cache (``engine.profile: sglang``): token-granular matches, splits,
locks, LRU leaf eviction and the token recount the auditor runs.

Token content is given as runs ``(segment, start, end)``; two runs name the same tokens when
segment and positions agree (see servesim/components/request.py).
"""

from __future__ import annotations

import pytest

from servesim.components.kvcache import KVCache
from servesim.components.radix import RadixCache, RadixNode, token_runs
from servesim.components.request import Request, prefix_segment

SHARED = 7  # a segment several sequences share


def seq(*runs):
    return [tuple(r) for r in runs]


def cached(cache: RadixCache, runs, n: int) -> RadixNode:
    """Store the first ``n`` tokens of ``runs`` as a finished request would: the slots are
    allocated, inserted, and the duplicates freed."""
    cache.pop_blocks(n)
    node, existing = cache.insert(runs, n)
    cache.free_slots(existing)
    return node


def test_a_partial_block_prefix_is_matched_to_the_token():
    # 20 shared tokens: vLLM's 16-token blocks reuse 16 of them, the radix tree all 20
    cache = RadixCache(1000)
    cached(cache, seq((SHARED, 0, 20), (100, 0, 30)), 50)
    node, matched = cache.match(seq((SHARED, 0, 20), (200, 0, 30)), 49)
    assert matched == 20
    assert node.depth == 20  # the match ends on a node: the stored edge was split there
    assert cache.check([]) == []


def test_the_same_prompts_in_vllms_block_cache_reuse_only_whole_blocks():
    """The paged cache's view of the case above: only the first full block is shared."""
    r1 = Request(0, 0, 50, 5, prefix_group=0, prefix_tokens=20, block_size=16)
    r2 = Request(1, 0, 50, 5, prefix_group=0, prefix_tokens=20, block_size=16)
    assert r1.shareable_blocks == r2.shareable_blocks == 1  # 20 // 16
    kv = KVCache(100, 16)
    # Engine._register_full stores only shareable blocks; the second request's lookup stops there
    from servesim.components.kvcache import ContentIds

    ids = ContentIds()
    kv.pop_blocks(4)
    assert kv.register(r1.block_hash(0, 16, ids)) is not None
    assert kv.lookup(r2.block_hash(0, 16, ids)) is not None
    assert kv.lookup(r2.block_hash(1, 16, ids)) is None  # tokens 16..19 are shared but not found


def test_a_match_stops_at_its_limit_inside_an_edge():
    cache = RadixCache(1000)
    cached(cache, seq((SHARED, 0, 40)), 40)
    node, matched = cache.match(seq((SHARED, 0, 40)), 39)  # the last token is recomputed
    assert (matched, node.depth) == (39, 39)


def test_token_runs_follow_prompt_segments_then_the_output():
    r = Request(3, 0, 30, 10, prefix_group=2, prefix_tokens=12, block_size=1)
    r.num_generated = 4
    assert token_runs(r, 30) == [(prefix_segment(2), 0, 12), (6, 0, 18)]
    assert token_runs(r, 33) == [(prefix_segment(2), 0, 12), (6, 0, 18), (7, 0, 3)]
    assert token_runs(r, 5) == [(prefix_segment(2), 0, 5)]


def test_an_insert_counts_the_tokens_already_cached():
    cache = RadixCache(1000)
    cached(cache, seq((SHARED, 0, 20), (100, 0, 10)), 30)
    cache.pop_blocks(35)
    node, existing = cache.insert(seq((SHARED, 0, 20), (101, 0, 15)), 35)
    assert existing == 20
    assert node.depth == 35 and node.length == 15
    cache.free_slots(existing)
    assert cache.evictable == 20 + 10 + 15
    assert cache.free == 1000 - 45
    assert cache.check([]) == []


def test_lru_leaves_are_evicted_first_and_a_parent_only_after_its_children():
    cache = RadixCache(100)
    a = cached(cache, seq((SHARED, 0, 20), (1, 0, 10)), 30)  # shared 20 + leaf a
    b = cached(cache, seq((SHARED, 0, 20), (2, 0, 10)), 40 - 10)  # leaf b
    cache.match(seq((SHARED, 0, 20), (1, 0, 10)), 30)  # a used again: b is now the oldest
    assert cache.free == 60 and cache.evictable == 40
    cache.pop_blocks(65)  # 5 more than free: one leaf goes, the oldest
    assert b.parent is None and a.parent is not None
    assert cache.evictions == 10
    more = cache.free + 25
    cache.pop_blocks(more)  # needs a and then the shared node (now a leaf)
    assert a.parent is None
    assert cache.root.children == {}
    assert cache.evictions == 40
    assert cache.check([(65 + more, [])]) == []


def test_eviction_frees_whole_nodes():
    cache = RadixCache(50)
    cached(cache, seq((1, 0, 30)), 30)
    cache.pop_blocks(21)  # one token more than free: the whole 30-token node goes
    assert cache.free == 50 - 30 - 21 + 30
    assert cache.evictable == 0


def test_a_locked_path_is_never_evicted():
    cache = RadixCache(60)
    held = cached(cache, seq((SHARED, 0, 20), (1, 0, 10)), 30)
    cached(cache, seq((SHARED, 0, 20), (2, 0, 10)), 30)
    cache.lock(held)  # a running request holds shared + a
    assert cache.protected == 30 and cache.evictable == 10
    assert cache.free_count == 20 + 10
    cache.pop_blocks(30)  # everything that can go: the unlocked leaf only
    assert held.parent is not None and held.parent.parent is cache.root
    assert cache.free == 0 and cache.free_count == 0
    assert cache.check([(30, []), (0, held)]) == []


def test_unlocking_makes_a_path_evictable_again():
    cache = RadixCache(40)
    held = cached(cache, seq((1, 0, 30)), 30)
    cache.lock(held)
    cache.lock(held)  # two requests hold it
    cache.unlock(held)
    assert cache.protected == 30
    cache.unlock(held)
    assert (cache.protected, cache.evictable) == (0, 30)
    cache.pop_blocks(40)
    assert held.parent is None


def test_a_split_keeps_the_locks_of_the_node_it_splits():
    cache = RadixCache(100)
    held = cached(cache, seq((1, 0, 30)), 30)
    cache.lock(held)
    node, matched = cache.match(seq((1, 0, 10), (5, 0, 4)), 13)
    assert matched == 10 and node.lock == 1  # the new upper part is held through ``held``
    assert cache.check([(0, held)]) == []


def test_a_node_touched_after_becoming_a_leaf_keeps_its_newer_place():
    cache = RadixCache(40)
    old = cached(cache, seq((1, 0, 10)), 10)
    new = cached(cache, seq((2, 0, 10)), 10)
    cache.match(seq((1, 0, 10)), 10)  # old is the most recently used now
    cache.pop_blocks(25)  # 5 more than free
    assert new.parent is None and old.parent is not None


@pytest.mark.parametrize(
    "owners, problem",
    [
        ([], "lock 1 but 0 requests hold it"),
        ([(-1, None)], "owns -1 tokens"),
    ],
)
def test_the_recount_finds_what_does_not_add_up(owners, problem):
    cache = RadixCache(100)
    held = cached(cache, seq((1, 0, 30)), 30)
    cache.lock(held)
    problems = cache.check([(o, h if h is not None else held) for o, h in owners])
    assert any(problem in p for p in problems), problems


def test_the_recount_finds_a_slot_that_is_nobodys():
    cache = RadixCache(100)
    cache.pop_blocks(10)  # taken by nobody the owners list names
    assert any("KV conservation broken" in p for p in cache.check([]))
    assert cache.check([(10, [])]) == []
