"""Random small scenarios on SGLang engines (``engine.profile: sglang``): the auditor, recounting
every KV token after every step (``audit.kv_every_step``), finds nothing, and fast-forwarded
decode windows give the very same run as stepping one step at a time.

The scenarios are the shared random ones (tests/strategies.py), turned into SGLang ones: one
token per KV slot (the same capacity in tokens), and without what the profile refuses (a CPU
tier, speculative decoding, swapping, vLLM v0's scheduler, a per-request prefill cap).
"""

from __future__ import annotations

from typing import Any

from conftest import scenario_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import scenarios

import servesim.components.instance as instance_module
from servesim.run import simulate
from servesim.scenario import load_scenario

REFUSED = (
    "kv_cpu_blocks",
    "kv_cpu_latency",
    "speculative",
    "preemption_mode",
    "swap_space",
    "prefill_first",
    "long_prefill_token_threshold",
)


@st.composite
def sglang_scenarios(draw) -> dict[str, Any]:
    data = draw(scenarios(max_requests=40, horizon=draw(st.booleans()), kv_every_step=True))
    engine = data["engine"]
    for key in REFUSED:
        engine.pop(key, None)
    engine["kv_blocks"] *= engine["block_size"]  # the same capacity, in tokens
    engine["block_size"] = 1
    engine["profile"] = "sglang"
    engine["schedule_policy"] = draw(st.sampled_from(["fcfs", "lpm"]))
    engine["schedule_conservativeness"] = draw(st.sampled_from([0.05, 0.3, 1.0, 2.0]))
    engine["max_prefill_tokens"] = draw(st.sampled_from([16, 256, 16384]))
    return data


@st.composite
def retracting_scenarios(draw) -> dict[str, Any]:
    """Scenarios built to retract: long outputs on a cache of one or two requests, a low
    reservation ratio (``schedule_conservativeness``) that lets too many requests in."""
    max_model_len = draw(st.integers(32, 256))
    data = scenario_dict(
        requests=draw(st.integers(6, 40)),
        rate=draw(st.sampled_from([200.0, 2000.0])),
        input={"type": "uniform", "min": 1, "max": max_model_len // 4},
        output={"type": "uniform", "min": 1, "max": max_model_len // 2},
        prefix=draw(st.sampled_from([None, {"tokens": max_model_len // 8, "groups": 2}])),
        max_output_tokens=draw(st.sampled_from(["oracle", max_model_len // 2])),
        kv_blocks=int(max_model_len * draw(st.sampled_from([1, 1.5, 2]))),
        block_size=1,
        max_model_len=max_model_len,
        max_num_seqs=draw(st.integers(2, 16)),
        max_num_batched_tokens=draw(st.sampled_from([8, 32, 512])),
        enable_chunked_prefill=draw(st.sampled_from([True, True, False])),
        kv_every_step=True,
        seed=draw(st.integers(0, 2**32 - 1)),
        profile="sglang",
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm"])),
        schedule_conservativeness=draw(st.sampled_from([0.01, 0.05, 0.2])),
    )
    return data


def _run(data: dict[str, Any], exact: bool):
    return simulate(load_scenario({**data, "exact_steps": exact}), raise_on_violation=False)


@settings(
    max_examples=60,
    deadline=None,
    # the window setting is the same for every example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.one_of(sglang_scenarios(), retracting_scenarios()))
def test_random_sglang_runs_audit_clean_and_fast_forward_changes_nothing(monkeypatch, data):
    monkeypatch.setattr(instance_module, "MIN_WINDOW_STEPS", 2)  # windows as often as possible
    exact, fast = _run(data, True), _run(data, False)
    assert exact.violations == [] and fast.violations == []
    assert _columns(exact) == _columns(fast)


def _columns(results) -> dict[str, list]:
    """Every request column and every step-log column of a run, as plain lists."""
    columns = {name: values.tolist() for name, values in results.requests.items()}
    for k, log in enumerate(results.record.step_logs):
        columns.update({f"{k}.{name}": v.tolist() for name, v in log.as_arrays().items()})
    return columns
