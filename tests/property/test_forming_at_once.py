"""Forming the next batch at once after a step end is exact where the cluster allows it.

Disaggregated clusters without a gateway or sessions let an instance skip the later formation
event when no other event shares its step's instant and its own completions cannot touch it
(``Cluster._own_step_touches``). The proof: random disaggregated clusters give the very same
requests, step logs and transfers as with the conservative rule (every instance defers whenever
anything else is scheduled in its step's instant).
"""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from strategies import pd_scenarios

from servesim.components.cluster import Cluster
from servesim.run import simulate
from servesim.scenario import load_scenario


def _always_touched(self, index):
    return lambda: True


def _run(data, *, conservative: bool):
    if conservative:
        with mock.patch.object(Cluster, "_own_step_touches", _always_touched):
            return simulate(load_scenario(data), raise_on_violation=False)
    return simulate(load_scenario(data), raise_on_violation=False)


def _assert_same(a, b) -> None:
    assert a.violations == [] and b.violations == []
    for column, values in a.requests.items():
        np.testing.assert_array_equal(values, b.requests[column], err_msg=column)
    for log_a, log_b in zip(a.record.step_logs, b.record.step_logs, strict=True):
        arrays_b = log_b.as_arrays()
        for column, values in log_a.as_arrays().items():
            np.testing.assert_array_equal(values, arrays_b[column], err_msg=column)
    transfers_b = b.record.transfers.as_arrays()
    for column, values in a.record.transfers.as_arrays().items():
        np.testing.assert_array_equal(values, transfers_b[column], err_msg=column)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(pd_scenarios())
def test_forming_at_once_changes_nothing_on_random_pd_clusters(data):
    _assert_same(_run(data, conservative=False), _run(data, conservative=True))


def test_a_prefill_pool_forms_at_once_and_gives_the_same_run():
    # 2 prefill + 2 decode instances, every request split, a link slow enough that transfers
    # contend: the prefill instances' steps end with their own completions in the same instant
    data = {
        "seed": 7,
        "latency": {"model": "blackbox", "alpha": [0, 0, 0], "beta": [1000, 1, 10]},
        "engine": {"kv_blocks": 256, "block_size": 4, "max_num_seqs": 8},
        "workload": {
            "rate": 400,
            "requests": 120,
            "input": {"type": "uniform", "min": 4, "max": 64},
            "output": {"type": "uniform", "min": 2, "max": 32},
        },
        "policies": {"disaggregation": "always", "routing": "round-robin"},
        "cluster": {
            "pools": {"prefill": {"instances": 2}, "decode": {"instances": 2}},
            "kv_transfer": {"bandwidth": "1GB/s", "topology": "shared"},
        },
    }
    formed_at_once = []
    original = Cluster._own_step_touches

    def counting(self, index):
        touched = original(self, index)

        def check():
            result = touched()
            formed_at_once.append(not result)
            return result

        return check

    with mock.patch.object(Cluster, "_own_step_touches", counting):
        fast = simulate(load_scenario(data), raise_on_violation=False)
    assert sum(formed_at_once) > 50  # the shortcut was taken, many times
    _assert_same(fast, _run(data, conservative=True))
