"""The holders map (block hash -> instances) that KV caches keep for the router.

A prefix-cache scorer asks only the instances the map names for a prompt's first block, so the
map must name every instance whose cache view could show that block: those whose registry holds
it and, when a router reads the cache with a delay, those whose eviction log still remembers it.
Random allocations, releases, evictions and delayed queries on a few caches sharing one map must
keep it exactly that.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import example, given, settings
from hypothesis import strategies as st

from servesim.components.kvcache import KVCache

HASHES = st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(0, 2), HASHES),
        st.tuples(st.just("release"), st.integers(0, 2), st.integers(0, 7)),
        st.tuples(st.just("query"), st.integers(0, 2), st.integers(0, 6)),
    ),
    max_size=40,
)


def expected_holders(caches: list[KVCache]) -> dict[int, set[int]]:
    held: dict[int, set[int]] = {}
    for k, kv in enumerate(caches):
        for block_hash in list(kv._registry) + list(kv.eviction_log or ()):
            held.setdefault(block_hash, set()).add(k)
    return held


@settings(max_examples=200, deadline=None)
@given(ops=operations, delayed=st.booleans(), late=st.integers(0, 8))
@example(  # a released block evicted by the next allocation, on a live and on a delayed cache
    ops=[("allocate", 0, [0, 1]), ("release", 0, 0), ("allocate", 0, [2, 3]), ("query", 0, 1)],
    delayed=False,
    late=0,
)
@example(
    ops=[("allocate", 0, [0, 1]), ("release", 0, 0), ("allocate", 0, [2, 3])]
    + [("query", 0, 1)] * 4,
    delayed=True,
    late=2,
)
def test_the_holders_map_names_exactly_the_caches_that_hold_or_remember_a_block(ops, delayed, late):
    caches = [KVCache(total_blocks=3, block_size=4) for _ in range(3)]
    owners: list[list[tuple[int, list]]] = [[] for _ in caches]
    holders: dict[int, set[int]] = {}
    for k, kv in enumerate(caches):
        if delayed:
            kv.eviction_log = OrderedDict()
        if k < 2 or late == 0:
            kv.track_holders(holders, k)
    now = 0
    for step, (op, k, arg) in enumerate(ops):
        kv = caches[k]
        now += 1
        kv.now = now
        if op == "allocate" and len(arg) <= kv.free_count:
            kv.pop_blocks(len(arg))
            registered = [b for b in map(kv.register, arg) if b is not None]
            owners[k].append((len(arg) - len(registered), registered))
        elif op == "release" and owners[k]:
            kv.release(*owners[k].pop(arg % len(owners[k])))
        elif op == "query":
            kv.cached_prefix([arg], now - 3 if delayed else None)
        if step + 1 == late:  # the third cache joins a map the others already fill
            caches[2].track_holders(holders, 2)
        tracked = caches if late == 0 or step + 1 >= late else caches[:2]
        assert holders == expected_holders(tracked)
        for j, cache in enumerate(caches):
            assert cache.check(owners[j]) == []


def test_an_evicted_block_leaves_the_map_at_once_live_and_after_the_horizon_when_delayed():
    live, delayed = KVCache(total_blocks=1, block_size=4), KVCache(total_blocks=1, block_size=4)
    delayed.eviction_log = OrderedDict()
    holders: dict[int, set[int]] = {}
    live.track_holders(holders, 0)
    delayed.track_holders(holders, 1)
    for kv in (live, delayed):
        kv.pop_blocks(1)
        kv.release(0, [kv.register(7)])
    assert holders == {7: {0, 1}}
    for kv in (live, delayed):
        kv.now = 10
        kv.pop_blocks(1)  # reuses the free block: 7 is evicted
    assert holders == {7: {1}}  # a query as of before time 10 still sees it on the delayed cache
    assert delayed.cached_prefix([7], 9) == 1
    assert delayed.cached_prefix([7], 10) == 0  # past the eviction: the log forgets it
    assert holders == {}
