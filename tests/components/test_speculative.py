"""Speculative decoding: k drafts verified per step at the expected acceptance rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.components.speculative import auto_draft_cost, expected_accepted
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from tests.conftest import run_scenario, scenario_dict

WORKLOAD = dict(
    requests=120,
    rate=20,
    input={"type": "uniform", "min": 16, "max": 64},
    output={"type": "uniform", "min": 20, "max": 80},
    kv_blocks=2000,
    max_num_batched_tokens=4096,
    max_num_seqs=64,
)


def spec(k: int, a: float, **extra):
    return scenario_dict(**WORKLOAD, speculative={"draft_tokens": k, "acceptance_rate": a}, **extra)


def test_expected_accepted_tokens_follow_the_geometric_formula():
    assert expected_accepted(3, 0.5) == pytest.approx((1 - 0.5**4) / 0.5)  # 1.875
    assert expected_accepted(1, 0.1) == pytest.approx(1.1)
    assert expected_accepted(4, 1e-12) == pytest.approx(1.0)
    assert auto_draft_cost(1e-3) < 1e-20 and auto_draft_cost(0.999) > 0.99


@pytest.mark.parametrize("a", [0.0, 1.0, 1.5, -0.1])
def test_acceptance_rate_outside_zero_one_is_rejected(a):
    with pytest.raises(ScenarioError, match="engine.speculative.acceptance_rate"):
        load_scenario(spec(3, a))


def test_draft_tokens_must_be_positive():
    with pytest.raises(ScenarioError, match="engine.speculative.draft_tokens"):
        load_scenario(spec(0, 0.5))


def test_speculation_with_acceptance_near_zero_is_plain_decoding():
    plain = run_scenario(scenario_dict(**WORKLOAD))
    near_zero = run_scenario(spec(3, 1e-6))
    assert plain.violations == [] and near_zero.violations == []
    a, b = plain.requests, near_zero.requests
    for column in ("first_token_us", "completion_us", "output_tokens", "first_scheduled_us"):
        np.testing.assert_array_equal(a[column], b[column], err_msg=column)


def test_good_drafts_cut_time_per_token_and_lengthen_steps():
    plain = run_scenario(scenario_dict(**WORKLOAD))
    fast = run_scenario(spec(3, 0.7, kv_every_step=True))
    assert fast.violations == []
    e = expected_accepted(3, 0.7)
    # every request follows floor((j+1)E) - floor(jE): the mean over all verifications is E,
    # less the truncation of each request's last step
    assert fast.summary["spec_accepted_tokens_per_step"] == pytest.approx(e, rel=0.08)
    assert fast.summary["tpot_mean_ms"] < plain.summary["tpot_mean_ms"] / 1.5
    dt_plain = plain.record.step_logs[0].column("dt_us").mean()
    dt_fast = fast.record.step_logs[0].column("dt_us").mean()
    assert dt_fast > dt_plain
    # every token is delivered: ITL gaps + first tokens account for all output tokens
    assert fast.summary["itl_gaps"] == int(fast.requests["output_tokens"].sum()) - 120
    assert math.isclose(fast.summary["completed_requests"], 120)


def test_speculation_under_kv_pressure_preempts_and_conserves_blocks():
    data = spec(4, 0.8, kv_every_step=True)
    data["engine"]["kv_blocks"] = 60
    data["engine"]["max_model_len"] = 200
    results = run_scenario(data)
    assert results.violations == []
    assert results.summary["preemption_count"] > 0
    assert results.summary["completed_requests"] == 120
