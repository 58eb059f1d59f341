"""Random small scenarios with data, expert, pipeline and context parallelism through the whole
simulator: the auditor (KV blocks checked after every step) finds nothing, every request is
accounted for, and a lock-stepped group's ranks step at the same instants."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import scenarios

from servesim.run import simulate
from servesim.scenario import load_scenario

RANDOM = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def parallel_scenarios(draw) -> dict[str, Any]:
    data = draw(scenarios(max_requests=30, horizon=draw(st.booleans()), kv_every_step=True))
    engine = data["engine"]
    engine.pop("speculative", None)  # not modelled with lock-stepped ranks
    data.pop("cluster", None)
    if draw(st.booleans()):
        # an MoE model's data-parallel ranks in lock-step, with or without expert parallelism
        dp = draw(st.sampled_from([2, 3, 4]))
        data["model"] = "qwen3-30b-a3b"
        data["latency"] = {"model": "trained-physics"}
        engine["dp"] = dp
        if 128 % dp == 0 and draw(st.booleans()):
            engine["ep"] = dp
        if draw(st.booleans()):
            data["policies"] = {"routing": {"name": "weighted", "scorers": {"vllm-dp": 1}}}
    else:
        # a dense model: independent data-parallel ranks, pipeline stages, context ranks
        engine["dp"] = draw(st.sampled_from([1, 1, 2]))
        engine["pp"] = draw(st.sampled_from([1, 2, 3, 4]))
        engine["cp"] = draw(st.sampled_from([1, 1, 2]))
        if draw(st.booleans()):
            data["latency"] = {"model": "trained-physics"}
        if engine["pp"] > 1 and draw(st.booleans()):
            engine["gpus_per_node"] = engine["cp"]  # every stage boundary crosses nodes
    return data


@RANDOM
@given(parallel_scenarios())
def test_random_parallel_layouts_pass_the_audit(data):
    results = simulate(load_scenario(data), raise_on_violation=False)
    assert results.violations == [], [str(v) for v in results.violations]
    summary = results.summary
    assert summary["conservation"]["balanced"]
    engine = results.scenario.engine
    assert results.scenario.instances == engine.dp
    if engine.dp > 1 and results.scenario.model.spec.is_moe:
        logs = results.record.step_logs
        for log in logs[1:]:
            np.testing.assert_array_equal(log.column("start_us"), logs[0].column("start_us"))
