"""The projector held against the simulator on stable scenarios (issue 18 item 1).

Each scenario is simulated at 30-70% of its projected maximum rate with arrivals over ten
projected E2E latencies (1,000 to a few thousand requests, well under a second each);
the simulator's figures are taken over its steady window (requests that arrived from two
projected E2E latencies after the first arrival to one before the last, so the ramp-up and the
drain are left out — the projector describes the steady state only). Required: mean TPOT and
output throughput within 10%, mean TTFT within 20%. Outputs are kept short (mean 96 tokens) so
the runs reach a steady state quickly.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim.components.record import STATUS_COMPLETED
from servesim.projection import project
from servesim.run import simulate
from servesim.scenario import load_scenario

WORKLOAD = {
    "input": {"type": "gaussian", "mean": 512, "std_dev": 100, "min": 16, "max": 1024},
    "output": {"type": "gaussian", "mean": 96, "std_dev": 30, "min": 8, "max": 256},
}

CASES = {
    "qwen3-14b blackbox H100": {"model": "qwen3-14b", "gpu": "H100", "latency": "blackbox"},
    "llama-8b trained-physics H100": {
        "model": "llama-3.1-8b-instruct",
        "gpu": "H100",
        "latency": "trained-physics",
    },
    "qwen3-30b-a3b (MoE) trained-physics H100 tp2": {
        "model": "qwen3-30b-a3b",
        "gpu": "H100",
        "tp": 2,
        "latency": "trained-physics",
    },
    "qwen3-14b blackbox 2 instances, 64 seqs": {
        "model": "qwen3-14b",
        "gpu": "H100",
        "latency": "blackbox",
        "cluster": {"instances": 2},
        "engine": {"max_num_seqs": 64},
    },
}


def _scenario(case: dict, rate: float, requests: int):
    raw = {k: v for k, v in case.items() if k != "latency"}
    raw["latency"] = {"model": case["latency"]}
    raw["workload"] = {**WORKLOAD, "rate": rate, "requests": requests}
    raw["seed"] = 7
    return load_scenario(raw)


def _steady_window(results, e2e_us: float) -> tuple[float, float, float]:
    """(mean TPOT µs, output tokens/s, mean TTFT µs) of the simulated run's steady window."""
    req = results.requests
    arrival = req["arrival_us"]
    lo, hi = arrival.min() + 2 * e2e_us, arrival.max() - e2e_us
    assert hi - lo > 5 * e2e_us, "the run is too short to have a steady window"
    done = req["status"] == STATUS_COMPLETED
    out = req["output_tokens"]
    chosen = done & (arrival >= lo) & (arrival <= hi) & (out > 1)
    tpot = float(np.mean(req["itl_sum_us"][chosen] / (out[chosen] - 1)))
    completion = req["completion_us"]
    finished = done & (completion >= lo) & (completion <= hi)
    tokens_per_s = float(out[finished].sum()) / ((hi - lo) / 1e6)
    ttft = float(np.mean((req["first_token_us"] - arrival)[chosen]))
    return tpot, tokens_per_s, ttft


@pytest.mark.parametrize("load", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("name", list(CASES))
def test_tpot_and_throughput_are_within_ten_percent_of_the_simulator(name, load):
    _check_against_the_simulator(CASES[name], load)


def _check_against_the_simulator(case: dict, load: float) -> None:
    name = f"{case['model']} {case['latency']} at {load:.0%} load"
    max_rate = project(_scenario(case, 1.0, 10)).max_rate
    rate = load * max_rate
    e2e_s = project(_scenario(case, rate, 10)).to_dict()["e2e_mean_ms"] / 1000
    # arrivals over ten E2E latencies (at least 1000 requests: the output throughput of a window is a Poisson count, ±3% at that size): a steady window of seven
    scenario = _scenario(case, rate, requests=max(1000, int(rate * 10 * e2e_s)))
    p = project(scenario)
    assert p.sustainable
    d = p.to_dict()
    tpot_us, tokens_per_s, ttft_us = _steady_window(simulate(scenario), d["e2e_mean_ms"] * 1000)
    assert d["tpot_mean_ms"] * 1000 == pytest.approx(tpot_us, rel=0.10), name
    assert d["tokens_per_sec"] == pytest.approx(tokens_per_s, rel=0.10), name
    # TTFT sums more approximations (docs/explanation/projection.md): 20% is its bound here
    assert d["ttft_mean_ms"] * 1000 == pytest.approx(ttft_us, rel=0.20), name


ROOFLINE = {"model": "llama-3.1-70b-instruct", "gpu": "H100", "tp": 4, "latency": "roofline"}


@pytest.mark.parametrize("load", [0.3, 0.5])
def test_roofline_tpot_is_within_ten_percent_up_to_half_load(load):
    """Roofline steps that carry a prefill are several times longer than decode-only ones; the
    simulated TPOT (a per-request mean, so weighted by the decoders in each step) then exceeds
    the mean step time the projector solves for: by 5% at half load here, 12% at 70%
    (docs/explanation/projection.md, where it may not be trusted)."""
    _check_against_the_simulator(ROOFLINE, load)


def _ttft_growth(scenario) -> float:
    """Mean TTFT of the last quarter of arrivals over that of the second quarter: about 1 when
    the instance keeps up; when a backlog grows linearly from the start it is about
    0.875 / 0.375 ≈ 2.3."""
    req = simulate(scenario).requests
    order = np.argsort(req["arrival_us"], kind="stable")
    ttft = (req["first_token_us"] - req["arrival_us"])[order]
    q = len(ttft) // 4
    return float(ttft[3 * q :].mean() / ttft[q : 2 * q].mean())


@pytest.mark.parametrize(
    "case",
    [
        CASES["qwen3-14b blackbox 2 instances, 64 seqs"],  # max_num_seqs binds
        {**CASES["llama-8b trained-physics H100"], "engine": {"max_num_batched_tokens": 256}},
    ],
    ids=["max_num_seqs", "token budget"],
)
def test_the_max_sustainable_rate_brackets_the_simulators_saturation(case):
    p = project(_scenario(case, 1.0, 10))
    requests = 1200
    below = _scenario(case, 0.85 * p.max_rate, requests)
    above = _scenario(case, 1.2 * p.max_rate, requests)
    assert _ttft_growth(below) < 1.3, p.limit
    assert _ttft_growth(above) > 1.8, p.limit
