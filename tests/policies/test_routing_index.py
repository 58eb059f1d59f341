"""Indexed routing gives the same decisions as the linear scan (issue: routing at scale).

Each built-in router that keeps a :class:`SnapshotGroups` index is run twice on the same random
cluster states, with generators of the same seed: once on the indexed snapshot list (its fast
path) and once on a copy of it (the scan). Every decision, and so every random tie draw, must
agree; the states change between decisions through the index's ``update``, as the router
process changes them. Ties are made likely on purpose: few distinct figures, KV utilisations
drawn from a handful of fractions, prefix hits on a few instances.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.policies.index import SnapshotGroups
from servesim.policies.routing import AlwaysBusiest, LeastLoaded, Weighted
from servesim.policies.scorers import (
    ActiveRequests,
    KVUtilization,
    LoadAware,
    LoadBalance,
    NoHitLRU,
    PrecisePrefixCache,
    PrefixAffinity,
    QueueDepth,
    RunningRequests,
    VllmDP,
)
from servesim.policies.snapshot import InstanceSnapshot, SnapshotList
from servesim.testing import ProbeRequest

INDEXABLE = [
    QueueDepth,
    KVUtilization,
    LoadBalance,
    ActiveRequests,
    RunningRequests,
    LoadAware,
    VllmDP,
    PrecisePrefixCache,
    PrefixAffinity,
    partial(PrefixAffinity, 2),  # a small LRU: evictions must leave the holders right
]
BLOCK_IDS = (101, 102, 103)
OTHER_IDS = (201, 102)  # another first block: prefix-affinity's holders must tell them apart

# one instance's figures: queue depth, batch size, in flight, KV used out of 8 or 12 blocks, and
# how many of the prompt's blocks it caches
figures = st.tuples(
    st.integers(0, 2),
    st.integers(0, 2),
    st.integers(0, 2),
    st.sampled_from([(0, 8), (2, 8), (3, 12), (4, 8), (6, 12), (8, 8), (1, 3)]),
    st.sampled_from([0, 0, 0, 1, 3]),
)


def make_snapshot(index: int, f: tuple, cached: list[int]) -> InstanceSnapshot:
    snap = InstanceSnapshot(index, cached_prefix=lambda ids, k=index: min(cached[k], len(ids)))
    set_figures(snap, f, cached)
    return snap


def set_figures(snap: InstanceSnapshot, f: tuple, cached: list[int]) -> None:
    queue, batch, in_flight, (used, total), hits = f
    snap.queue_depth = queue
    snap.batch_size = batch
    snap.in_flight = in_flight
    snap.kv_utilization = used / total
    cached[snap.index] = hits


def holders_of(cached: list[int], spurious: frozenset[int]) -> dict[int, set[int]]:
    """A cluster's holders map for these tests' two first blocks: the instances that cache the
    prompt (``cached`` above 0), plus ``spurious`` ones that do not (the map may say too much,
    as after an eviction a delayed cache view still remembers, never too little)."""
    held = {k for k, hits in enumerate(cached) if hits > 0} | {
        k for k in spurious if k < len(cached)
    }
    return {BLOCK_IDS[0]: set(held), OTHER_IDS[0]: set(held)}


def replay(make_router, states, changes, requests, seed=3, spurious=None) -> None:
    """Route each request on the indexed list and on a copy; apply a batch of changes between.
    With ``spurious`` (a set of instances) the indexed list also carries a holders map, as the
    router process's does, naming the cached instances and those spurious ones."""
    fast, scan = make_router(), make_router()
    n = len(states)
    fast.bind(n, np.random.default_rng(seed))
    scan.bind(n, np.random.default_rng(seed))
    assert fast.index is not None
    cached = [0] * n
    snapshots = SnapshotList([make_snapshot(k, f, cached) for k, f in enumerate(states)])
    fast.index.attach(snapshots)
    for batch, req in zip(changes, requests):
        for k, f in batch:
            set_figures(snapshots[k % n], f, cached)
            fast.index.update(snapshots[k % n])
        if spurious is not None:
            snapshots.holders = holders_of(cached, spurious)
        chosen = fast.route(req, snapshots)
        assert chosen == scan.route(req, list(snapshots)), (batch, req.prompt_block_ids())
        fast.observe(req, chosen)
        scan.observe(req, chosen)


decisions = st.tuples(
    st.lists(figures, min_size=1, max_size=24),
    st.lists(st.lists(st.tuples(st.integers(0, 23), figures), max_size=3), min_size=1, max_size=8),
    st.lists(st.booleans(), min_size=8, max_size=8),
)


# a weighted profile: up to four indexable scorers with their weights
profiles = st.lists(
    st.tuples(st.sampled_from(INDEXABLE), st.sampled_from([1.0, 1.0, 2.0, 0.5])),
    min_size=1,
    max_size=4,
    unique_by=lambda p: p[0],
)


def requests_for(warm: list[bool]) -> list[ProbeRequest]:
    return [
        ProbeRequest(
            i, prompt_tokens=64, block_ids=(BLOCK_IDS if i % 2 else OTHER_IDS) if hot else ()
        )
        for i, hot in enumerate(warm)
    ]


@settings(max_examples=150, deadline=None)
@given(case=decisions, profile=profiles)
def test_indexed_weighted_routing_gives_the_scans_decisions(case, profile):
    states, changes, warm = case
    replay(
        lambda: Weighted([(cls(), w) for cls, w in profile]), states, changes, requests_for(warm)
    )


@settings(max_examples=150, deadline=None)
@given(case=decisions, profile=profiles, spurious=st.frozensets(st.integers(0, 23), max_size=6))
def test_a_holders_map_that_says_too_much_still_gives_the_scans_decisions(case, profile, spurious):
    # precise-prefix-cache asks only the instances the holders map names: every decision must
    # still be the scan's, which asks every instance
    states, changes, warm = case
    profile = [(PrecisePrefixCache, 2.0)] + [p for p in profile if p[0] is not PrecisePrefixCache]
    replay(
        lambda: Weighted([(cls(), w) for cls, w in profile]),
        states,
        changes,
        requests_for(warm),
        spurious=spurious,
    )


@settings(max_examples=100, deadline=None)
@given(case=decisions, router=st.sampled_from([LeastLoaded, AlwaysBusiest]))
def test_indexed_load_routers_give_the_scans_decisions(case, router):
    states, changes, warm = case
    replay(router, states, changes, requests_for(warm))


def test_the_default_profile_over_a_large_idle_cluster_ties_everywhere_as_the_scan_does():
    # all 300 instances idle: one group, every instance tied; draws must match the scan's
    def make():
        return Weighted([(PrecisePrefixCache(), 2.0), (QueueDepth(), 1.0), (KVUtilization(), 1.0)])

    states = [(0, 0, 0, (0, 8), 0)] * 300
    changes = [[(k * 7, (k % 2, 1, 0, (2, 8), 0))] for k in range(20)]
    replay(make, states, changes, requests_for([False] * 20))


def test_groups_tied_out_of_instance_order_give_the_scans_draws():
    # queue depth and batch size weigh the same: (1, 0) and (0, 1) tie; instance 0 moves to a
    # group made after instance 1's, so the groups come out of the index in the other order
    def make():
        return Weighted([(QueueDepth(), 1.0), (RunningRequests(), 1.0)])

    states = [(1, 0, 0, (0, 8), 0), (0, 1, 0, (0, 8), 0), (2, 2, 0, (0, 8), 0)]
    changes = [[(0, (1, 0, 0, (2, 8), 0))], [(0, (1, 0, 0, (0, 8), 0))]] + [[]] * 20
    for seed in range(8):
        replay(make, states, changes, requests_for([False] * 22), seed)


def test_kv_utilisations_one_rounding_apart_tie_as_in_the_scan():
    # 1 - a == 1 - b for these two distinct utilisations: the scan ties them, so must the index
    a = 0.3
    b = math.nextafter(a, 1.0)
    assert a != b and 1.0 - a == 1.0 - b
    snaps = [InstanceSnapshot(k, kv_utilization=kv) for k, kv in enumerate([0.9, a, b, 0.5])]
    picks = set()
    for seed in range(16):
        fast, scan = Weighted([(KVUtilization(), 1.0)]), Weighted([(KVUtilization(), 1.0)])
        fast.bind(4, np.random.default_rng(seed))
        scan.bind(4, np.random.default_rng(seed))
        fast.index.attach(snaps)
        chosen = fast.route(ProbeRequest(0), snaps)
        assert chosen == scan.route(ProbeRequest(0), list(snaps))
        picks.add(chosen)
    assert picks == {1, 2}


def test_a_scorer_without_index_fields_keeps_the_scan():
    router = Weighted([(QueueDepth(), 1.0), (NoHitLRU(), 1.0)])
    router.bind(4)
    assert router.index is None


def test_a_subclass_that_rewrites_score_must_declare_its_own_index_fields():
    class Busier(QueueDepth):
        def score(self, request, snapshots):  # reads the batch too: the parent's promise is void
            return [1.0 / (1 + s.queue_depth + s.batch_size) for s in snapshots]

    router = Weighted([(Busier(), 1.0)])
    router.bind(4)
    assert router.index is None


def test_the_index_refuses_a_list_out_of_instance_order():
    groups = SnapshotGroups(lambda s: s.queue_depth)
    with pytest.raises(ValueError, match="instance order"):
        groups.attach([InstanceSnapshot(1), InstanceSnapshot(0)])


def test_the_index_follows_updates_and_counts_only_real_changes():
    snaps = [InstanceSnapshot(k, queue_depth=k % 2) for k in range(4)]
    groups = SnapshotGroups(lambda s: s.queue_depth)
    groups.attach(snaps)
    assert groups.groups == {0: [0, 2], 1: [1, 3]}
    version = groups.version
    snaps[2].in_flight = 5  # not a figure of the key: nothing moves
    groups.update(snaps[2])
    assert groups.version == version
    snaps[0].queue_depth = 1
    groups.update(snaps[0])
    assert groups.groups == {0: [2], 1: [0, 1, 3]}
    assert groups.version == version + 1


@pytest.mark.parametrize(
    "routing",
    [
        "least-loaded",
        "{name: weighted, scorers: {precise-prefix-cache: 2, queue-depth: 1, kv-utilization: 1}}",
        "{name: weighted, scorers: {load-balance: 1, kv-utilization: 1}}",
    ],
)
def test_a_whole_run_is_the_same_with_and_without_the_index(routing, monkeypatch):
    import servesim
    from servesim.components.router import SnapshotProvider

    overrides = [
        "cluster.instances=12",
        "workload.rate=300",
        "workload.requests=600",
        "workload.prefix={groups: 3, tokens: 256}",
        f"policies.routing={routing}",
    ]
    indexed = servesim.simulate(servesim.load_scenario(None, overrides)).summary
    monkeypatch.setattr(SnapshotProvider, "attach", lambda self, index: None)
    scanned = servesim.simulate(servesim.load_scenario(None, overrides)).summary
    for key in ("wall_time_s", "sim_speed"):
        indexed.pop(key, None)
        scanned.pop(key, None)
    assert indexed == scanned


def test_prefix_affinity_names_as_exceptions_exactly_the_instances_whose_lru_has_the_first_block():
    scorer = PrefixAffinity(capacity=2)
    first = ProbeRequest(0, prompt_tokens=64, block_ids=(1, 2))
    scorer.observe(first, 3)
    scorer.observe(ProbeRequest(1, prompt_tokens=64, block_ids=(1,)), 5)
    assert sorted(scorer.index_exceptions(first, [])) == [3, 5]
    scorer.observe(ProbeRequest(2, prompt_tokens=64, block_ids=(7, 8)), 3)  # evicts 1 and 2 on 3
    assert scorer.index_exceptions(first, []) == [5]
    assert scorer.index_exceptions(ProbeRequest(3, prompt_tokens=64), []) == []


def test_the_index_keeps_its_group_keys_sorted_as_groups_come_and_go():
    snaps = [InstanceSnapshot(k, queue_depth=q) for k, q in enumerate([3, 1, 3, 5])]
    groups = SnapshotGroups(lambda s: s.queue_depth)
    groups.attach(snaps)
    assert groups.keys == [1, 3, 5]
    assert (groups.lowest(), groups.highest()) == ([1], [3])
    snaps[1].queue_depth = 4  # group 1 empties, group 4 starts
    groups.update(snaps[1])
    snaps[3].queue_depth = 0
    groups.update(snaps[3])
    assert groups.keys == sorted(groups.groups) == [0, 3, 4]
    assert (groups.lowest(), groups.highest()) == ([3], [1])
