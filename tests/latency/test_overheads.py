"""The ``overheads`` wrapper: a base latency model plus a first-token and a per-step overhead."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_scenario, scenario_dict

from servesim.latency.base import BatchSummary, LatencyContext
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.latency.overheads import OverheadsLatencyModel
from servesim.simcore.errors import ScenarioError

CONTEXT = LatencyContext("llama-3.1-8b", "H100", 1)
BASE = {"model": "blackbox", "alpha": [100, 2, 0], "beta": [1000, 1, 10]}


def build(**params):
    return OverheadsLatencyModel.from_config({"base": BASE, **params}, CONTEXT)


def test_the_overheads_add_to_the_base_step_and_queueing_times():
    model = build(first_token="3ms", step="250us")
    base = BlackboxLatencyModel((100, 2, 0), (1000, 1, 10))
    batch = BatchSummary(64, [(0, 64, 64)], 5, 500)
    assert model.step_time_us(batch) == base.step_time_us(batch) + 250
    assert model.queueing_time_us(40) == base.queueing_time_us(40) + 3000
    assert (model.first_token_us, model.step_us) == (3000, 250)


def test_a_decode_window_equals_the_steps_one_by_one():
    model = OverheadsLatencyModel.from_config(
        {"base": "trained-physics", "step": 400},
        CONTEXT,
    )
    window = model.decode_steps_us(12, 3000, 7)
    one_by_one = [model.step_time_us(BatchSummary(0, (), 12, 3000 + 12 * i)) for i in range(7)]
    assert window.dtype == np.int64 and window.tolist() == one_by_one


def test_no_overheads_is_the_base_model():
    model = build()
    base = BlackboxLatencyModel((100, 2, 0), (1000, 1, 10))
    batch = BatchSummary(0, (), 3, 90)
    assert model.step_time_us(batch) == base.step_time_us(batch)
    assert model.describe()["base"]["model"] == "blackbox"


def test_a_run_with_a_step_overhead_is_slower_by_exactly_that_per_step():
    data = scenario_dict(requests=1, rate=1.0, input={"type": "constant", "value": 8})
    data["workload"]["output"] = {"type": "constant", "value": 5}
    plain = run_scenario(data)
    data["latency"] = {
        "model": "overheads",
        "base": data["latency"],
        "step": 300,
        "first_token": 50,
    }
    slow = run_scenario(data)
    assert slow.summary["audit"]["passed"]
    e2e = lambda r: int(r.requests["completion_us"][0] - r.requests["arrival_us"][0])  # noqa: E731
    # 5 output tokens: one prefill step and 4 decode steps, each 300 µs longer; 50 µs before queueing
    assert e2e(slow) - e2e(plain) == 5 * 300 + 50


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"step": -5}, "latency.step"),
        ({"first_token": "soon"}, "latency.first_token"),
        ({"step": float("nan")}, "latency.step"),
        ({"bogus": 1}, "latency.bogus"),
        ({"file": "x.yaml", "step": 3}, "latency.step"),
    ],
)
def test_bad_parameters_are_named(params, field):
    with pytest.raises(ScenarioError) as info:
        build(**params)
    assert info.value.path == field


def test_the_base_is_required():
    with pytest.raises(ScenarioError) as info:
        OverheadsLatencyModel.from_config({"step": 10}, CONTEXT)
    assert info.value.path == "latency.base"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("first_token_us: 10\n", "step_us"),
        ("first_token_us: -1\nstep_us: 3\n", "first_token_us"),
        ("model: blackbox\nfirst_token_us: 1\nstep_us: 3\n", "model"),
        ("first_token_us: 1\nstep_us: 3\nextra: 1\n", "extra"),
        ("[1, 2]\n", None),
    ],
)
def test_a_malformed_overheads_file_is_named_with_the_field(tmp_path, text, field):
    file = tmp_path / "overheads.yaml"
    file.write_text(text)
    with pytest.raises(ScenarioError) as info:
        build(file=str(file))
    expected = str(file) if field is None else f"{file}: {field}"
    assert info.value.path == expected


def test_an_overheads_file_gives_the_values_and_its_provenance(tmp_path):
    file = tmp_path / "overheads.yaml"
    file.write_text("format: servesim-overheads/1\nfirst_token_us: 1200\nstep_us: 80.4\n")
    model = build(file=str(file))
    assert (model.first_token_us, model.step_us) == (1200, 80)
    assert model.describe()["provenance"] == {"source": "file", "file": str(file)}


def test_zero_overheads_reproduce_the_base_models_run_exactly():
    data = scenario_dict(requests=200, rate=300.0, kv_blocks=40, max_num_batched_tokens=64)
    plain = run_scenario(data)
    data["latency"] = {"model": "overheads", "base": data["latency"]}
    wrapped = run_scenario(data)
    for column in ("first_token_us", "completion_us", "itl_sum_us", "preemptions"):
        assert np.array_equal(plain.requests[column], wrapped.requests[column]), column
