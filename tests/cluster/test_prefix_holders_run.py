"""A whole run gives the same results whether prefix-aware scorers ask only the instances the
KV caches' holders map names, or every instance (the scan): the map is a speed-up, never a
second source of truth. Live and delayed cache views, prefix-heavy workloads."""

from __future__ import annotations

import pytest

import servesim
from servesim.policies import scorers


def summary(overrides: list[str]) -> dict:
    result = servesim.simulate(servesim.load_scenario(None, overrides)).summary
    for key in ("wall_time_s", "sim_speed"):
        result.pop(key, None)
    return result


@pytest.mark.parametrize("delay", ["0", "20ms"])
@pytest.mark.parametrize(
    "routing",
    [
        "{name: weighted, scorers: {precise-prefix-cache: 2, queue-depth: 1, kv-utilization: 1}}",
        "{name: weighted, scorers: {no-hit-lru: 1, precise-prefix-cache: 1, load-balance: 1}}",
    ],
)
def test_a_run_is_the_same_with_and_without_the_holders_map(routing, delay, monkeypatch):
    overrides = [
        "cluster.instances=10",
        "workload.rate=250",
        "workload.requests=500",
        "workload.prefix={groups: 4, tokens: 256}",
        f"cluster.cache_signal_delay={delay}",
        "cluster.snapshot_interval=0",
        f"policies.routing={routing}",
    ]
    asked: list[int] = []
    real = scorers.prefix_holders

    def counted(snapshots, block_ids):
        found = real(snapshots, block_ids)
        asked.append(len(found))
        return found

    monkeypatch.setattr(scorers, "prefix_holders", counted)
    with_map = summary(overrides)
    assert asked and min(asked) < 10  # the map was used, and named fewer than all instances
    monkeypatch.setattr(scorers, "prefix_holders", lambda snapshots, block_ids: snapshots)
    assert with_map == summary(overrides)
