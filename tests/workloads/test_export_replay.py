"""INV-13: a run's exported workload replays to identical per-request results."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tests.conftest import run_scenario, scenario_dict

SAME = (
    "arrival_us",
    "enqueue_us",
    "first_scheduled_us",
    "first_token_us",
    "completion_us",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "preemptions",
    "instance",
    "status",
)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"sessions": {"rounds": 3, "think_time": "50ms"}},
        {"prefix": {"tokens": 24, "groups": 3}, "slo_class": {"critical": 1, "standard": 2}},
        {"sessions": {"users": 4, "think_time": "10ms"}},
    ],
    ids=["plain", "sessions", "prefix-classes", "closed-loop"],
)
def test_export_then_replay_gives_identical_requests(tmp_path, extra):
    data = scenario_dict(
        requests=40,
        rate=40,
        input={"type": "uniform", "min": 8, "max": 60},
        output={"type": "uniform", "min": 2, "max": 30},
        kv_blocks=120,
        instances=2,
    )
    data["workload"].update(copy.deepcopy(extra))
    if "users" in extra.get("sessions", {}):
        data["workload"].pop("rate")
        data["workload"].pop("arrival")
    data["output"] = {"workload_trace": True}
    first = run_scenario(data)
    assert first.violations == []
    out = first.write(tmp_path / "run")
    replay = copy.deepcopy(data)
    replay["workload"] = {"trace": str(out / "workload.csv.gz")}
    replay["output"] = {}
    second = run_scenario(replay)
    assert second.violations == []
    a, b = first.requests, second.requests
    for column in SAME:
        np.testing.assert_array_equal(a[column], b[column], err_msg=column)
