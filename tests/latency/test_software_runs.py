"""Runs with the software costs on: audited, exact under fast-forward, slower than without."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_scenario, scenario_dict, with_changes

SOFTWARE_LATENCIES = {
    "roofline": {"model": "roofline", "software": True},
    "roofline eager": {"model": "roofline", "software": {"cuda_graphs": False}},
    "overheads over trained-physics": {
        "model": "overheads",
        "base": "trained-physics",
        "software": True,
    },
}


def scenario(latency):
    """12 requests of 8-200 prompt and 1-60 output tokens on one instance of up to 16 sequences."""
    data = scenario_dict(requests=12, rate=40.0, kv_blocks=400, block_size=16, max_num_seqs=16)
    data["workload"]["input"] = {"type": "uniform", "min": 8, "max": 200}
    data["workload"]["output"] = {"type": "uniform", "min": 1, "max": 60}
    return with_changes(data, latency=latency)


@pytest.mark.parametrize("name", sorted(SOFTWARE_LATENCIES))
def test_fast_forward_stays_exact_with_the_software_costs(name, small_windows):
    data = scenario(SOFTWARE_LATENCIES[name])
    exact = run_scenario(with_changes(data, exact_steps=True))
    fast = run_scenario(with_changes(data, exact_steps=False))
    assert exact.violations == [] and fast.violations == []
    assert fast.summary["fast_forward_windows"] > 0
    for column in exact.requests:
        np.testing.assert_array_equal(exact.requests[column], fast.requests[column], column)
    for a, b in zip(exact.record.step_logs, fast.record.step_logs, strict=True):
        for column, values in a.as_arrays().items():
            np.testing.assert_array_equal(values, b.as_arrays()[column], column)


def test_the_software_costs_lengthen_every_request_and_are_described():
    plain = run_scenario(scenario({"model": "roofline"}))
    soft = run_scenario(scenario(SOFTWARE_LATENCIES["roofline"]))
    assert soft.summary["audit"]["passed"]
    e2e = lambda r: r.requests["completion_us"] - r.requests["arrival_us"]  # noqa: E731
    assert np.all(e2e(soft) > e2e(plain))
    described = soft.summary["scenario"]["latency"]
    assert described["software"]["cuda_graphs"] is True, described
