"""Shared-prefix groups: Zipf popularity and the target hit-rate knob (servesim.workloads.prefix)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import ScenarioError, load_scenario, simulate
from servesim.simcore.rng import RandomStreams
from servesim.workloads.prefix import PrefixGroups
from servesim.workloads.spec import workload_from_config


def _requests(section: dict, seed: int = 7) -> list:
    return list(workload_from_config(section).requests(RandomStreams(seed)))


def _ideal_hit_rate(requests: list) -> float:
    """Prompt tokens an unbounded prefix cache serves: every request of an already-seen group."""
    seen: set[int] = set()
    hit = 0
    for r in requests:
        if r.prefix_group >= 0 and r.prefix_group in seen:
            hit += r.prefix_tokens
        seen.add(r.prefix_group)
    return hit / sum(r.prompt_tokens for r in requests)


def test_zipf_frequencies_follow_the_law():
    groups = PrefixGroups(tokens=8, groups=5, zipf=1.2)
    rng = np.random.default_rng(3)
    draws = groups.draw(rng, 200_000, groups.cdf())
    freq = np.bincount(draws, minlength=5) / draws.size
    expected = np.arange(1, 6) ** -1.2 / np.sum(np.arange(1, 6) ** -1.2)
    # 200k draws: the standard error of each frequency is below 0.0012
    np.testing.assert_allclose(freq, expected, atol=0.005)
    assert list(np.argsort(-freq)) == [0, 1, 2, 3, 4]


def test_zipf_zero_is_uniform_in_law_and_single_group_is_constant():
    assert np.allclose(PrefixGroups(8, 4, 0.0).probabilities, 0.25)
    rng = np.random.default_rng(0)
    one = PrefixGroups(8, 1, 2.0)
    assert not one.draw(rng, 100, one.cdf()).any()


def test_uniform_groups_draw_as_before():
    """Uniform popularity keeps the stream's historical draws (rng.integers), so existing
    scenarios with a prefix produce the same requests."""
    section = {"rate": 5, "requests": 300, "input": 64, "output": 8}
    got = _requests({**section, "prefix": {"tokens": 32, "groups": 6}})
    rng = RandomStreams(7).fresh("workload/prefix")
    assert [r.prefix_group for r in got] == rng.integers(0, 6, 4096)[:300].tolist()


def test_zipf_popularity_in_a_scenario_skews_the_groups():
    reqs = _requests(
        {
            "rate": 5,
            "requests": 4000,
            "input": 64,
            "output": 8,
            "prefix": {"tokens": 32, "groups": 20, "popularity": {"zipf": 1.5}},
        }
    )
    counts = np.bincount([r.prefix_group for r in reqs], minlength=20)
    assert counts[0] > 0.3 * len(reqs)  # P(group 0) = 1 / H(20, 1.5) ~ 0.43
    assert counts[0] > counts[1] > counts[5]


def test_expected_distinct_matches_monte_carlo():
    groups = PrefixGroups(8, 50, 1.0)
    rng = np.random.default_rng(11)
    cdf = groups.cdf()
    distinct = [len(set(groups.draw(rng, 60, cdf).tolist())) for _ in range(3000)]
    assert groups.expected_distinct(60) == pytest.approx(np.mean(distinct), rel=0.02)
    assert groups.expected_distinct(float("inf")) == 50


@pytest.mark.parametrize(
    "prefix",
    [
        {"hit_rate": 0.5, "groups": 8},
        {"hit_rate": 0.3, "groups": 100},
        {"hit_rate": 0.7, "groups": 40, "popularity": {"zipf": 1.1}},
    ],
)
def test_hit_rate_knob_reaches_its_target(prefix):
    section = {
        "rate": 5,
        "requests": 3000,
        "input": {"type": "uniform", "min": 100, "max": 300},
        "output": 8,
        "prefix": prefix,
    }
    workload = workload_from_config(section)
    assert workload.prefix_tokens > 0
    got = _ideal_hit_rate(list(workload.requests(RandomStreams(5))))
    # sampling noise only: input lengths and group draws over 3000 requests
    assert got == pytest.approx(prefix["hit_rate"], abs=0.02)
    assert workload.describe()["prefix"]["hit_rate_target"] == prefix["hit_rate"]


def test_hit_rate_knob_in_a_workload_spec_uses_the_clients_share():
    section = {
        "rate": 10,
        "requests": 4000,
        "clients": [
            {
                "id": "a",
                "rate_fraction": 3,
                "input": 200,
                "output": 8,
                "prefix": {"hit_rate": 0.6, "groups": 50},
            },
            {"id": "b", "rate_fraction": 1, "input": 200, "output": 8},
        ],
    }
    reqs = [r for r in _requests(section) if r.client == "a"]
    assert _ideal_hit_rate(reqs) == pytest.approx(0.6, abs=0.02)


def test_a_run_reports_a_cached_token_fraction_near_the_target():
    """With a cache big enough to keep every group, the run's achieved hit rate is the ideal one
    less block rounding (a prefix is reused in whole 16-token blocks)."""
    scenario = load_scenario(
        {
            "model": "qwen3-14b",
            "workload": {
                "rate": 4,
                "requests": 400,
                "input": 256,
                "output": 4,
                "prefix": {"hit_rate": 0.5, "groups": 4},
            },
        }
    )
    summary = simulate(scenario).summary
    assert summary["prefix_cached_token_fraction"] == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize(
    ("prefix", "field", "words"),
    [
        ({"groups": 4}, "workload.prefix.tokens", "exactly one of tokens"),
        ({"tokens": 8, "hit_rate": 0.2}, "workload.prefix.tokens", "exactly one of tokens"),
        ({"hit_rate": 1.0}, "workload.prefix.hit_rate", "below 1"),
        ({"hit_rate": -0.1}, "workload.prefix.hit_rate", "at least 0"),
        ({"hit_rate": 0.5, "groups": 90}, "workload.prefix.hit_rate", "unreachable"),
        ({"tokens": 8, "popularity": "hot"}, "workload.prefix.popularity", "zipf"),
        ({"tokens": 8, "popularity": {"zipf": "x"}}, "workload.prefix.popularity.zipf", "number"),
        ({"tokens": 8, "popularity": {"zipfian": 1}}, "workload.prefix.popularity", "zipfian"),
    ],
)
def test_bad_prefix_fields_are_named(prefix, field, words):
    section = {"rate": 1, "requests": 100, "input": 64, "output": 8, "prefix": prefix}
    with pytest.raises(ScenarioError) as err:
        workload_from_config(section)
    assert field in str(err.value)
    assert words in str(err.value)
