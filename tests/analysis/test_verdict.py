"""Run verdicts (STABLE / BACKLOGGED / OVERLOADED) and fitness scores (servesim.analysis.verdict)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import ScenarioError, load_scenario, simulate
from servesim.analysis.verdict import (
    BACKLOGGED,
    OVERLOADED,
    STABLE,
    Objective,
    classify_run,
    fitness,
    parse_fitness,
)


def _fifo(arrival_s: np.ndarray, service_s: float) -> np.ndarray:
    """Departure times (µs) of a single FIFO server with a constant service time."""
    out = np.empty_like(arrival_s)
    free = 0.0
    for i, a in enumerate(arrival_s):
        free = max(free, a) + service_s
        out[i] = free
    return (out * 1e6).astype(np.int64)


ARRIVALS = np.arange(1000) / 10.0  # 10 req/s for 100 s


@pytest.mark.parametrize(
    ("service_s", "expected", "growth"),
    [
        (0.05, STABLE, 0.0),  # 50% utilisation: no queue
        (0.099, STABLE, 0.0),  # 99%: deterministic arrivals never queue
        (0.104, BACKLOGGED, 1 - 1 / 1.04),  # the server falls behind by ~3.8%
        (0.2, OVERLOADED, 0.5),  # half the load piles up
    ],
)
def test_a_fifo_queue_is_classed_by_how_fast_its_backlog_grows(service_s, expected, growth):
    verdict = classify_run((ARRIVALS * 1e6).astype(np.int64), _fifo(ARRIVALS, service_s))
    assert verdict.verdict == expected
    assert verdict.relative_growth == pytest.approx(growth, abs=0.01)


def test_a_late_spike_leaves_a_backlog():
    """Stable for 90 s, then 200 requests at once: the trend is flat but the end is not."""
    arrival = np.concatenate([ARRIVALS[:900], np.full(200, 90.0)])
    left = np.concatenate([((ARRIVALS[:900] + 0.05) * 1e6).astype(np.int64), np.full(200, -1)])
    verdict = classify_run((arrival * 1e6).astype(np.int64), left)
    assert verdict.verdict in (BACKLOGGED, OVERLOADED)
    assert verdict.backlog_at_last_arrival >= 200


def test_few_arrivals_and_refusals_are_said():
    few = classify_run(np.arange(5) * 1_000_000, np.arange(5) * 1_000_000 + 10)
    assert few.verdict == STABLE and "too few" in few.reason
    arrival = (ARRIVALS * 1e6).astype(np.int64)
    shedding = classify_run(arrival, arrival + 1000, refused=300)
    assert shedding.verdict == STABLE and "refused 300 of 1000" in shedding.reason
    cut = classify_run(arrival, arrival + 1000, unfinished_at_horizon=4)
    assert cut.verdict == BACKLOGGED and "4 request(s) unfinished" in cut.reason


@pytest.mark.parametrize(("rate", "expected"), [(4, STABLE), (80, OVERLOADED)])
def test_simulated_runs_get_their_verdict_in_the_summary(rate, expected):
    scenario = load_scenario(
        {"workload": {"rate": rate, "requests": 400, "input": 512, "output": 128}}
    )
    summary = simulate(scenario).summary
    assert summary["run_verdict"] == expected
    assert summary["run_verdict_reason"].startswith("backlog grows")


def test_fitness_scores_and_weights():
    summary = {"ttft_p99_ms": 500.0, "tokens_per_sec": 3000.0, "slo_attainment": 0.9}
    objectives = parse_fitness("ttft_p99_ms:3, tokens_per_sec:1")
    # 3 * 1000 / (1000 + 500) + 1 * 3000 / (3000 + 1000), over 4
    assert fitness(summary, objectives) == pytest.approx((3 * 2 / 3 + 0.75) / 4)
    own_ref = parse_fitness({"ttft_p99_ms": {"weight": 1, "ref": 500}})
    assert fitness(summary, own_ref) == pytest.approx(0.5)
    assert fitness(summary, parse_fitness({"slo_attainment": 2})) == pytest.approx(0.9)
    better = {**summary, "ttft_p99_ms": 100.0}
    assert fitness(better, objectives) > fitness(summary, objectives)
    assert Objective("tokens_per_sec", 1).direction() == "higher"
    assert Objective("e2e_p50_ms", 1).direction() == "lower"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("ttft_p99_ms", "expected metric:weight"),
        ({}, "expected {metric: weight"),
        ({"ttft_p99_ms": 0}, "at least one positive weight"),
        ({"ttft_p99_ms": -1}, "at least 0"),
        ({"ttft_p99_ms": {"weight": 1, "ref": 0}}, "greater than 0"),
        ({"ttft_p99_ms": {"wieght": 1}}, "weight"),
    ],
)
def test_bad_fitness_weights_are_named(value, words):
    with pytest.raises(ScenarioError) as err:
        parse_fitness(value)
    assert words in str(err.value)


def test_an_unknown_fitness_metric_lists_the_known_ones():
    with pytest.raises(ScenarioError) as err:
        fitness({"ttft_p99_ms": 1.0, "name": "x"}, parse_fitness({"ttft_p999_ms": 1}))
    assert "ttft_p999_ms" in str(err.value) and "ttft_p99_ms" in str(err.value)


def test_scenario_fitness_weights_score_the_run_into_its_summary():
    weights = {"ttft_p99_ms": {"weight": 3, "ref": 200}, "tokens_per_sec": 1}
    scenario = load_scenario(
        {"workload": {"rate": 4, "requests": 100, "input": 256, "output": 32}, "fitness": weights}
    )
    summary = simulate(scenario).summary
    assert summary["fitness"] == pytest.approx(fitness(summary, parse_fitness(weights)))
    plain = simulate(scenario.replace(fitness=None)).summary
    assert "fitness" not in plain


def test_a_scenario_fitness_metric_that_is_not_in_the_summary_is_named_not_fatal():
    """A misnamed metric is found only once the run is done: the run keeps its results and the
    summary says why it has no score."""
    scenario = load_scenario(
        {"workload": {"rate": 4, "requests": 20, "input": 64, "output": 8}, "fitness": {"ttft": 1}}
    )
    summary = simulate(scenario).summary
    assert summary["fitness"] is None and summary["completed_requests"] == 20
    assert "fitness: invalid value 'ttft': not a numeric summary metric" in summary["fitness_error"]
