"""Routing policies (spec §4.3): each decision against hand-built snapshots, tie-breaking with the
router's seeded generator, the weighted router's validation, and the plugin-author contract check
(``servesim.testing.check_router``) on every built-in."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from servesim.policies.routing import (
    DEFAULT_WEIGHTED_PROFILE,
    AlwaysBusiest,
    LeastLoaded,
    RandomRouting,
    RoundRobin,
    RoutingPolicy,
    Weighted,
)
from servesim.policies.scorers import KVUtilization, PrefixAffinity, QueueDepth, Scorer
from servesim.policies.snapshot import InstanceSnapshot
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError, UnknownPluginError
from servesim.simcore.registry import PluginContext
from servesim.testing import ProbeRequest, check_router

PATH = "policies.routing"


def snap(index, queue_depth=0, batch_size=0, in_flight=0, kv=0.0, cached=None):
    return InstanceSnapshot(
        index,
        queue_depth=queue_depth,
        batch_size=batch_size,
        kv_utilization=kv,
        in_flight=in_flight,
        cached_prefix=cached,
    )


def bound(policy: RoutingPolicy, n: int = 4, seed: int = 7) -> RoutingPolicy:
    policy.bind(n, np.random.default_rng(seed))
    return policy


def request(i=0, **kw):
    return ProbeRequest(i, **kw)


# ------------------------------------------------------------------ round-robin, random


def test_round_robin_takes_the_candidates_in_turn_and_needs_no_rng():
    rr = RoundRobin()
    rr.bind(3)  # the old one-argument signature still works
    snaps = [snap(0), snap(1), snap(2)]
    assert [rr.route(request(i), snaps) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_round_robin_returns_instance_indices_not_positions_for_a_subset():
    rr = bound(RoundRobin(), 5)
    subset = [snap(1), snap(3), snap(4)]
    assert [rr.route(request(i), subset) for i in range(4)] == [1, 3, 4, 1]


def test_random_routing_is_uniform_over_the_candidates_and_seeded():
    subset = [snap(0), snap(2), snap(5)]
    a = bound(RandomRouting(), 6, seed=3)
    b = bound(RandomRouting(), 6, seed=3)
    picks_a = [a.route(request(i), subset) for i in range(3000)]
    picks_b = [b.route(request(i), subset) for i in range(3000)]
    assert picks_a == picks_b
    counts = {i: picks_a.count(i) for i in (0, 2, 5)}
    assert set(picks_a) == {0, 2, 5}
    assert all(900 < c < 1100 for c in counts.values()), counts


# ------------------------------------------------------------------ least-loaded, always-busiest


def test_least_loaded_picks_the_minimum_effective_load():
    ll = bound(LeastLoaded())
    snaps = [snap(0, 3, 1, 0), snap(1, 0, 2, 1), snap(2, 1, 0, 0), snap(3, 0, 0, 5)]
    # effective loads 4, 3, 1, 5
    assert ll.route(request(), snaps) == 2


def test_least_loaded_breaks_ties_uniformly_among_the_tied_only():
    snaps = [snap(0, 2), snap(1, 1), snap(2, 9), snap(3, 0, 1)]  # 1 and 3 tie at load 1
    ll = bound(LeastLoaded(), seed=11)
    picks = [ll.route(request(i), snaps) for i in range(2000)]
    assert set(picks) == {1, 3}
    assert 900 < picks.count(1) < 1100


def test_least_loaded_ties_are_reproducible_from_the_seed():
    snaps = [snap(i) for i in range(4)]
    one = bound(LeastLoaded(), seed=5)
    two = bound(LeastLoaded(), seed=5)
    other = bound(LeastLoaded(), seed=6)
    a = [one.route(request(i), snaps) for i in range(50)]
    assert a == [two.route(request(i), snaps) for i in range(50)]
    assert a != [other.route(request(i), snaps) for i in range(50)]


def test_least_loaded_draws_no_random_number_without_a_tie():
    rng = np.random.default_rng(1)
    ll = LeastLoaded()
    ll.bind(2, rng)
    state = rng.bit_generator.state
    assert ll.route(request(), [snap(0, 1), snap(1, 0)]) == 1
    assert rng.bit_generator.state == state


def test_always_busiest_picks_the_maximum_load_and_the_first_on_ties():
    ab = bound(AlwaysBusiest())
    assert ab.route(request(), [snap(0, 1), snap(1, 3), snap(2, 0, 3), snap(3, 2)]) == 1
    assert ab.route(request(), [snap(4), snap(6), snap(7)]) == 4


# ------------------------------------------------------------------ weighted


class Fixed(Scorer):
    """A scorer returning preset scores (for the arithmetic of the weighted sum)."""

    name = "fixed-test"

    def __init__(self, scores):
        self.scores = scores

    def score(self, request, snapshots):
        return list(self.scores)


class Recorder(Scorer):
    name = "recorder-test"

    def __init__(self):
        self.seen = []

    def score(self, request, snapshots):
        return [0.5] * len(snapshots)

    def observe(self, request, chosen_index):
        self.seen.append((request.id, chosen_index))


def test_weights_are_normalised_to_sum_one():
    w = Weighted([(Fixed([1]), 2.0), (Fixed([1]), 1.0), (Fixed([1]), 1.0)])
    assert [weight for _, weight in w.scorers] == [0.5, 0.25, 0.25]


def test_weighted_takes_the_argmax_of_the_weighted_sum():
    # totals: 0.75·[1, 0, 0.5] + 0.25·[0, 1, 0.9] = [0.75, 0.25, 0.6]
    w = bound(Weighted([(Fixed([1, 0, 0.5]), 3), (Fixed([0, 1, 0.9]), 1)]), 3)
    snaps = [snap(0), snap(1), snap(2)]
    assert w.scores(request(), snaps) == pytest.approx([0.75, 0.25, 0.6])
    assert w.route(request(), snaps) == 0


def test_weighted_clamps_every_score_to_the_unit_interval():
    # Without clamping the first candidate would win (5 > 1); clamped, 0.5·1 + 0.5·0 < 0.5·1 + 0.5·1.
    w = bound(Weighted([(Fixed([5.0, 1.0, -3.0]), 1), (Fixed([0.0, 1.0, math.nan]), 1)]), 3)
    snaps = [snap(0), snap(1), snap(2)]
    assert w.scores(request(), snaps) == [0.5, 1.0, 0.0]
    assert w.route(request(), snaps) == 1


def test_weighted_breaks_ties_at_random_among_the_tied_with_the_router_rng():
    snaps = [snap(3), snap(5), snap(8)]
    make = lambda seed: bound(Weighted([(Fixed([1, 0.2, 1]), 1)]), 9, seed)  # noqa: E731
    a, b = make(4), make(4)
    picks = [a.route(request(i), snaps) for i in range(400)]
    assert picks == [b.route(request(i), snaps) for i in range(400)]
    assert set(picks) == {3, 8}


def test_weighted_tells_stateful_scorers_the_chosen_instance_index():
    rec = Recorder()
    w = bound(Weighted([(rec, 1), (Fixed([0, 1]), 1)]), 6)
    w.route(request(17), [snap(2), snap(5)])
    assert rec.seen == [(17, 5)]
    assert w._observers == [rec]  # scorers without state are not called


def test_weighted_prefix_affinity_sends_a_shared_prefix_back_where_it_went():
    w = Weighted.from_config(
        {"scorers": {"prefix-affinity": 1, "queue-depth": 1}}, PluginContext(PATH)
    )
    bound(w, 3)
    snaps = [snap(0), snap(1), snap(2)]
    first = w.route(request(0, prompt_tokens=64, block_ids=[1, 2, 3, 4]), snaps)
    again = [snap(i, queue_depth=0) for i in range(3)]
    assert w.route(request(1, prompt_tokens=64, block_ids=[1, 2, 3, 4]), again) == first


def test_weighted_from_config_builds_named_scorers_in_order():
    w = Weighted.from_config(
        {"scorers": {"queue-depth": 1, "prefix-affinity": {"weight": 3, "capacity": 50}}},
        PluginContext(PATH),
    )
    (q, wq), (p, wp) = w.scorers
    assert isinstance(q, QueueDepth) and isinstance(p, PrefixAffinity)
    assert (wq, wp) == (0.25, 0.75) and p.capacity == 50


def test_weighted_without_scorers_uses_the_default_profile():
    w = Weighted.from_config({}, PluginContext(PATH))
    assert [s.name for s, _ in w.scorers] == list(DEFAULT_WEIGHTED_PROFILE)
    assert [weight for _, weight in w.scorers] == [0.5, 0.25, 0.25]
    assert isinstance(w.scorers[2][0], KVUtilization)


def test_an_unknown_scorer_is_an_error_listing_the_known_ones():
    with pytest.raises(UnknownPluginError) as info:
        Weighted.from_config(
            {"scorers": {"queue-depth": 1, "prefix-cache": 1}}, PluginContext(PATH)
        )
    err = info.value
    assert err.path == f"{PATH}.scorers.prefix-cache"
    assert err.known == registry.registry("scorer").names()
    assert "precise-prefix-cache" in str(err) and "queue-depth" in str(err)


@pytest.mark.parametrize("weight", [0, -1, -0.5, math.nan, math.inf, "heavy", True, None])
def test_a_scorer_weight_must_be_positive_and_finite(weight):
    with pytest.raises(ScenarioError) as info:
        Weighted.from_config(
            {"scorers": {"queue-depth": 1, "kv-utilization": weight}}, PluginContext(PATH)
        )
    assert info.value.path == f"{PATH}.scorers.kv-utilization"


def test_a_weight_in_the_mapping_form_is_validated_too():
    with pytest.raises(ScenarioError) as info:
        Weighted.from_config(
            {"scorers": {"prefix-affinity": {"weight": math.nan}}}, PluginContext(PATH)
        )
    assert info.value.path == f"{PATH}.scorers.prefix-affinity.weight"
    with pytest.raises(ScenarioError) as info:
        Weighted.from_config({"scorers": {"prefix-affinity": {"capacity": 0}}}, PluginContext(PATH))
    assert info.value.path == f"{PATH}.scorers.prefix-affinity.capacity"
    with pytest.raises(ScenarioError) as info:
        Weighted.from_config(
            {"scorers": {"queue-depth": {"weight": 1, "depth": 2}}}, PluginContext(PATH)
        )
    assert info.value.path == f"{PATH}.scorers.queue-depth.depth"


@pytest.mark.parametrize("scorers", [{}, None, [], "queue-depth"])
def test_an_empty_or_malformed_scorer_list_is_an_error(scorers):
    with pytest.raises(ScenarioError) as info:
        Weighted.from_config({"scorers": scorers}, PluginContext(PATH))
    assert info.value.path == f"{PATH}.scorers"


def test_weights_whose_sum_overflows_are_rejected():
    with pytest.raises(ScenarioError, match="sum"):
        Weighted.from_config(
            {"scorers": {"queue-depth": 1e308, "kv-utilization": 1e308}}, PluginContext(PATH)
        )


def test_weighted_rejects_unknown_fields():
    with pytest.raises(ScenarioError) as info:
        Weighted.from_config({"scorer": {"queue-depth": 1}}, PluginContext(PATH))
    assert info.value.path == f"{PATH}.scorer" and "scorers" in str(info.value)


@pytest.mark.parametrize("name", ["round-robin", "random", "least-loaded", "always-busiest"])
def test_parameterless_routers_reject_parameters(name):
    with pytest.raises(ScenarioError):
        registry.get("routing", name).from_config({"scorers": {}}, PluginContext(PATH))


# ------------------------------------------------------------------ the contract check


@pytest.mark.parametrize("name", registry.registry("routing").names())
def test_every_builtin_router_passes_check_router(name):
    cls = registry.get("routing", name)
    check_router(lambda: cls.from_config({}, PluginContext(PATH)))


@pytest.mark.parametrize("scorer", registry.registry("scorer").names())
def test_the_weighted_router_passes_check_router_with_each_scorer(scorer):
    check_router(lambda: Weighted.from_config({"scorers": {scorer: 1}}, PluginContext(PATH)))


def test_the_weighted_router_passes_check_router_with_every_scorer_at_once():
    names = registry.registry("scorer").names()
    check_router(
        lambda: Weighted.from_config(
            {"scorers": {n: i + 1 for i, n in enumerate(names)}}, PluginContext(PATH)
        )
    )


class ReadsTheOracle(RoundRobin):
    def route(self, request, snapshots):
        if request.oracle_output_tokens > 100:
            return snapshots[0].index
        return super().route(request, snapshots)


class ReadsTheOracleSafely(RoundRobin):
    """getattr with a default must not hide the read."""

    def route(self, request, snapshots):
        getattr(request, "target_output", 0)
        return snapshots[0].index


class ReturnsPositions(RoundRobin):
    def route(self, request, snapshots):
        return len(snapshots) - 1


class UsesGlobalRandomness(RoundRobin):
    def route(self, request, snapshots):
        return random.choice(snapshots).index


class ReturnsASnapshot(RoundRobin):
    def route(self, request, snapshots):
        return snapshots[0]


class MutatesSnapshots(RoundRobin):
    def route(self, request, snapshots):
        snapshots[0].in_flight += 1
        return snapshots[0].index


@pytest.mark.parametrize(
    "router,prop",
    [
        (ReadsTheOracle, "never reads a request's output length"),
        (ReadsTheOracleSafely, "never reads a request's output length"),
        (ReturnsPositions, "index of a given snapshot"),
        (UsesGlobalRandomness, "deterministic"),
        (ReturnsASnapshot, "returns an int"),
        (MutatesSnapshots, "leaves the snapshots unchanged"),
    ],
)
def test_check_router_names_the_broken_property(router, prop):
    with pytest.raises(AssertionError, match=prop) as info:
        check_router(router)
    assert router.__name__ in str(info.value)


def test_a_user_router_needs_only_route():
    class FirstCandidate(RoutingPolicy):
        name = "first-candidate"

        def route(self, request, snapshots):
            return snapshots[0].index

    check_router(FirstCandidate)
    r = FirstCandidate()
    r.bind(2)
    assert isinstance(r.rng, np.random.Generator)
    assert r.observe(request(), 0) is None


def test_routers_say_whether_they_read_loads_and_prefix_caches():
    assert not RoundRobin.needs_snapshots and not RandomRouting.needs_snapshots
    assert LeastLoaded.needs_snapshots and Weighted.needs_snapshots
    assert not LeastLoaded.reads_prefix_cache
    assert Weighted.from_config(
        {}, PluginContext(PATH)
    ).reads_prefix_cache  # the default profile does
    assert Weighted.from_config(
        {"scorers": {"no-hit-lru": 1}}, PluginContext(PATH)
    ).reads_prefix_cache
    assert not Weighted.from_config(
        {"scorers": {"prefix-affinity": 1}}, PluginContext(PATH)
    ).reads_prefix_cache
