"""Scorers of the weighted router (spec §4.3): each formula on hand-built snapshots, the stateful
ones' learning (prefix-affinity's LRU, no-hit-lru's recency), and ``check_scorer`` on each."""

from __future__ import annotations

import pytest

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
    Scorer,
    VllmDP,
)
from servesim.policies.snapshot import InstanceSnapshot
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext
from servesim.testing import ProbeRequest, check_scorer


def snap(index, queue_depth=0, batch_size=0, in_flight=0, kv=0.0, cache=None):
    cached = None
    if cache is not None:
        held = set(cache)

        def cached(ids):
            n = 0
            for block in ids:
                if block not in held:
                    break
                n += 1
            return n

    return InstanceSnapshot(
        index,
        queue_depth=queue_depth,
        batch_size=batch_size,
        kv_utilization=kv,
        in_flight=in_flight,
        cached_prefix=cached,
    )


def req(i=0, prompt_tokens=64, block_ids=(), **kw):
    return ProbeRequest(i, prompt_tokens=prompt_tokens, block_ids=block_ids, **kw)


# ------------------------------------------------------------------ load scorers


def test_queue_depth_is_min_max_inverted():
    scores = QueueDepth().score(req(), [snap(0, 2), snap(1, 6), snap(2, 4)])
    assert scores == [1.0, 0.0, 0.5]


def test_queue_depth_all_equal_scores_one():
    assert QueueDepth().score(req(), [snap(0, 3), snap(1, 3)]) == [1.0, 1.0]


def test_kv_utilization_is_one_minus_the_utilization():
    assert KVUtilization().score(req(), [snap(0, kv=0.25), snap(1, kv=1.0)]) == [0.75, 0.0]


def test_load_balance_is_one_over_one_plus_effective_load():
    scores = LoadBalance().score(req(), [snap(0), snap(1, 1, 1, 1), snap(2, 0, 0, 4)])
    assert scores == [1.0, 0.25, 0.2]


def test_active_requests_compares_in_flight_counts_with_the_maximum():
    scores = ActiveRequests().score(
        req(), [snap(0, in_flight=0), snap(1, in_flight=4), snap(2, in_flight=1)]
    )
    assert scores == [1.0, 0.0, 0.75]
    assert ActiveRequests().score(req(), [snap(0), snap(1)]) == [1.0, 1.0]


def test_running_requests_is_min_max_inverted_on_batch_size():
    assert RunningRequests().score(req(), [snap(0, batch_size=8), snap(1, batch_size=0)]) == [
        0.0,
        1.0,
    ]
    assert RunningRequests().score(req(), [snap(0, batch_size=2)]) == [1.0]


def test_load_aware_halves_the_free_queue_fraction():
    scores = LoadAware().score(req(), [snap(0, 0), snap(1, 64), snap(2, 500)])
    assert scores == [0.5, 0.25, 0.0]


def test_vllm_dp_weighs_queued_requests_four_times():
    # raw 4·QD + BS = 4, 8, 2 -> (8 - raw) / 6
    scores = VllmDP().score(req(), [snap(0, 1, 0), snap(1, 1, 4), snap(2, 0, 2)])
    assert scores == pytest.approx([4 / 6, 0.0, 1.0])


# ------------------------------------------------------------------ precise-prefix-cache


def test_precise_prefix_cache_normalises_leading_cached_blocks():
    ids = [10, 11, 12, 13]
    snaps = [snap(0, cache=[10, 11]), snap(1, cache=[10, 11, 12, 13]), snap(2, cache=[11, 12])]
    # raw 2, 4, 0 (only a leading run counts)
    assert PrecisePrefixCache().score(req(block_ids=ids), snaps) == [0.5, 1.0, 0.0]


def test_precise_prefix_cache_all_equal_or_no_blocks_scores_one():
    scorer = PrecisePrefixCache()
    assert scorer.score(req(block_ids=[1, 2]), [snap(0, cache=[]), snap(1, cache=[5])]) == [
        1.0,
        1.0,
    ]
    assert scorer.score(req(1, block_ids=[]), [snap(0, cache=[1])]) == [1.0]
    assert scorer.score(req(2, block_ids=[1]), [snap(0), snap(1)]) == [1.0, 1.0]  # no cache view


# ------------------------------------------------------------------ prefix-affinity


def test_prefix_affinity_scores_matched_leading_blocks_over_the_prompts_full_blocks():
    scorer = PrefixAffinity()
    snaps = [snap(0), snap(1)]
    first = req(0, prompt_tokens=64, block_ids=[1, 2, 3])  # 4 full blocks, 3 shareable
    assert scorer.score(first, snaps) == [0.0, 0.0]
    scorer.observe(first, 1)
    second = req(1, prompt_tokens=100, block_ids=[1, 2, 7])  # 6 full blocks; 1, 2 were sent to 1
    assert scorer.score(second, snaps) == [0.0, 2 / 6]
    third = req(2, prompt_tokens=100, block_ids=[9, 2])  # 2 is known but not in the lead
    assert scorer.score(third, snaps) == [0.0, 0.0]


def test_prefix_affinity_scores_zero_without_a_full_block():
    scorer = PrefixAffinity()
    scorer.observe(req(0, prompt_tokens=64, block_ids=[1]), 0)
    assert scorer.score(req(1, prompt_tokens=15, block_ids=[]), [snap(0)]) == [0.0]


def test_prefix_affinity_forgets_the_least_recently_sent_blocks_beyond_capacity():
    scorer = PrefixAffinity(capacity=3)
    scorer.observe(req(0, prompt_tokens=32, block_ids=[1, 2]), 0)
    scorer.observe(req(1, prompt_tokens=32, block_ids=[5, 6]), 0)  # 1 is evicted; 2, 5, 6 remain
    snaps = [snap(0)]
    assert scorer.score(req(2, prompt_tokens=32, block_ids=[1, 2]), snaps) == [0.0]
    assert scorer.score(req(3, prompt_tokens=32, block_ids=[5, 6]), snaps) == [1.0]
    scorer.observe(req(4, prompt_tokens=16, block_ids=[2]), 0)  # refresh 2, then 7 evicts 5
    scorer.observe(req(5, prompt_tokens=16, block_ids=[7]), 0)
    assert scorer.score(req(6, prompt_tokens=16, block_ids=[2]), snaps) == [1.0]
    assert scorer.score(req(7, prompt_tokens=16, block_ids=[5]), snaps) == [0.0]


def test_prefix_affinity_capacity_is_validated():
    assert PrefixAffinity.from_config({}, PluginContext("s")).capacity == 10_000
    assert PrefixAffinity.from_config({"capacity": 7}, PluginContext("s")).capacity == 7
    for bad in (0, -1, 2.5, "many"):
        with pytest.raises(ScenarioError) as info:
            PrefixAffinity.from_config({"capacity": bad}, PluginContext("s"))
        assert info.value.path == "s.capacity"


# ------------------------------------------------------------------ no-hit-lru


def test_no_hit_lru_scores_a_warm_request_one_half_everywhere():
    scorer = NoHitLRU()
    snaps = [snap(0, cache=[]), snap(1, cache=[4]), snap(2, cache=[])]
    warm = req(0, block_ids=[4, 5])
    assert scorer.score(warm, snaps) == [0.5, 0.5, 0.5]
    scorer.observe(warm, 1)  # warm: the recency order does not change
    assert scorer.score(req(1), snaps) == [1.0, 0.5, 0.0]


def test_no_hit_lru_ranks_unused_instances_first_then_least_recently_chosen():
    scorer = NoHitLRU()
    snaps = [snap(0), snap(1), snap(2)]
    assert scorer.score(req(0), snaps) == [1.0, 0.5, 0.0]
    scorer.observe(req(0), 0)  # not the request just scored: ignored
    r = req(1)
    scorer.score(r, snaps)
    scorer.observe(r, 0)
    assert scorer.score(req(2), snaps) == [0.0, 1.0, 0.5]  # 1, 2 never used; then 0
    for i, chosen in ((3, 2), (4, 1)):
        r = req(i)
        scorer.score(r, snaps)
        scorer.observe(r, chosen)
    # least recently chosen: 0, then 2, then 1
    assert scorer.score(req(5), snaps) == [1.0, 0.0, 0.5]
    # a subset ranks only its members
    assert scorer.score(req(6), [snap(1), snap(2)]) == [0.0, 1.0]


def test_no_hit_lru_with_one_candidate_scores_one():
    assert NoHitLRU().score(req(), [snap(3)]) == [1.0]


# ------------------------------------------------------------------ registry and contract


def test_the_spec_scorers_are_registered_under_their_names():
    names = set(registry.registry("scorer").names())
    assert {
        "queue-depth",
        "kv-utilization",
        "load-balance",
        "active-requests",
        "running-requests",
        "precise-prefix-cache",
        "prefix-affinity",
        "no-hit-lru",
    } <= names


@pytest.mark.parametrize("name", registry.registry("scorer").names())
def test_every_builtin_scorer_passes_check_scorer(name):
    check_scorer(registry.get("scorer", name).from_config({}, PluginContext("s")))


@pytest.mark.parametrize(
    "name", sorted(set(registry.registry("scorer").names()) - {"prefix-affinity"})
)
def test_parameterless_scorers_reject_parameters(name):
    with pytest.raises(ScenarioError):
        registry.get("scorer", name).from_config({"weight": 1}, PluginContext("s"))


class TooHigh(Scorer):
    def score(self, request, snapshots):
        return [1.5] * len(snapshots)


class OneShort(Scorer):
    def score(self, request, snapshots):
        return [1.0] * (len(snapshots) - 1)


class ReadsTheOracle(Scorer):
    def score(self, request, snapshots):
        return [min(1.0, request.finish_step / 100)] * len(snapshots)


@pytest.mark.parametrize(
    "scorer,prop",
    [
        (TooHigh, "in \\[0, 1\\]"),
        (OneShort, "one score per snapshot"),
        (ReadsTheOracle, "output length"),
    ],
)
def test_check_scorer_names_the_broken_property(scorer, prop):
    with pytest.raises(AssertionError, match=prop):
        check_scorer(scorer())
