"""The physics latency models drive whole simulations: fast-forward equals step-by-step."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import requests_of, run_scenario, scenario_dict, step_logs

MODELS = [
    {"model": "roofline"},
    {"model": "trained-physics"},
    {
        "model": "interference",
        "base": "trained-physics",
        "prefill_factor": 0.5,
        "decode_factor": 0.2,
    },
]


@pytest.mark.parametrize("latency", MODELS, ids=lambda m: m["model"])
def test_fast_forward_matches_exact_steps(latency, small_windows):
    data = scenario_dict(
        requests=40,
        rate=20.0,
        input=64,
        output=48,
        kv_blocks=2000,
        block_size=16,
        max_num_seqs=16,
        max_num_batched_tokens=512,
    )
    data["latency"] = dict(latency)
    data["model"] = "llama-3.1-8b"
    data["gpu"] = "H100"
    fast = run_scenario(data)
    exact = run_scenario({**data, "exact_steps": True})
    assert fast.violations == [] and exact.violations == []
    assert fast.summary["fast_forward_windows"] > 0
    for a, b in zip(step_logs(fast), step_logs(exact), strict=True):
        for key in a:
            assert np.array_equal(a[key], b[key]), key
    ra, rb = requests_of(fast), requests_of(exact)
    for key in ra:
        assert np.array_equal(ra[key], rb[key]), key
