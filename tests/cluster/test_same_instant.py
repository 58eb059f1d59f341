"""The same-instant rule (DESIGN §3): a request enqueued exactly at a step boundary joins the batch
formed at that instant — also when the enqueue is caused by that step's own completions."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tests.conftest import requests_of, run_scenario, scenario_dict

SAME = (
    "arrival_us",
    "enqueue_us",
    "first_scheduled_us",
    "first_token_us",
    "completion_us",
    "cached_tokens",
    "output_tokens",
    "preemptions",
    "instance",
    "status",
)


def _sessions_without_think_time(**kw):
    data = scenario_dict(requests=30, rate=50, kv_blocks=512, max_num_seqs=4, **kw)
    data["workload"]["sessions"] = {"rounds": 3, "think_time": 0}
    return data


def _gateway_released_by_completions(**kw):
    data = scenario_dict(requests=40, rate=400, kv_blocks=512, max_num_seqs=8, **kw)
    data["policies"] = {"flow_control": {"detector": {"name": "concurrency", "max_concurrency": 3}}}
    return data


@pytest.mark.parametrize("exact", [False, True], ids=["fast-forward", "exact-steps"])
def test_a_round_without_think_time_joins_the_batch_formed_when_its_predecessor_finished(exact):
    # alpha = 0: no queueing delay and no output overhead, so a round arrives, is routed and is
    # enqueued at the very step boundary where the previous round finished
    table = requests_of(run_scenario(_sessions_without_think_time(exact_steps=exact)))
    follow_up = table["round_index"] > 0
    arrival = table["arrival_us"][follow_up]
    assert np.array_equal(table["enqueue_us"][follow_up], arrival)
    joined = table["first_scheduled_us"][follow_up] == arrival
    # every round joins at once, except the few that find all max_num_seqs slots taken
    assert joined.sum() >= len(arrival) - 3, (joined.sum(), len(arrival))


@pytest.mark.parametrize("exact", [False, True], ids=["fast-forward", "exact-steps"])
def test_a_request_the_gateway_releases_on_a_completion_joins_the_batch_formed_then(exact):
    # at most 3 in flight, 8 sequence slots: every release finds a free slot, and with alpha = 0
    # it is enqueued at the step boundary where the completion that released it happened
    table = requests_of(run_scenario(_gateway_released_by_completions(exact_steps=exact)))
    released = table["gateway_wait_us"] > 0
    assert released.sum() > 20
    assert np.array_equal(table["first_scheduled_us"][released], table["enqueue_us"][released])


@pytest.mark.parametrize("instances", [1, 2])
def test_replaying_a_runs_own_workload_gives_the_same_requests(tmp_path, instances):
    data = _sessions_without_think_time(instances=instances)
    data["output"] = {"workload_trace": True}
    first = run_scenario(data)
    assert first.violations == []
    replay = copy.deepcopy(data)
    replay["workload"] = {"trace": str(first.write(tmp_path / "run") / "workload.csv.gz")}
    replay["output"] = {}
    second = run_scenario(replay)
    assert second.violations == []
    a, b = first.requests, second.requests
    for column in SAME:
        np.testing.assert_array_equal(a[column], b[column], err_msg=column)
