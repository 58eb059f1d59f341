"""Every example runs, passes its audit, and shows what its comments say it shows.

Scenario files run with a reduced request count (an override, as `--set` would apply it) so the
whole module stays fast; scripts run as they are, with `runpy`, from a foreign working directory.
"""

from __future__ import annotations

import os
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import servesim
from servesim.simcore import registry

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# plan-*.yaml and sweep-*.yaml are inputs of `servesim plan` / `servesim sweep`, not scenarios
SCENARIO_FILES = sorted(
    p for p in EXAMPLES.glob("*.yaml") if not p.stem.startswith(("plan-", "sweep-"))
)
SCRIPTS = sorted(EXAMPLES.glob("*.py")) + sorted(EXAMPLES.glob("course/*.py"))
SHORT = ["workload.requests=300"]
# Examples whose effect needs a longer run to build up (a backlog, cache contention).
LONGER: dict[str, list[str]] = {
    "cluster-weighted": ["workload.requests=1000"],
    "flow-control-overload": ["workload.requests=1500"],
    "multi-client": [],  # the whole 2-minute run: the spike is at 60-80 s
    "autoscale-spike": [],  # the whole 4-minute run: the spike is at 60-120 s
}

# What each example's comments promise, checked on the shortened run.
CLAIMS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "kv-pressure": lambda s: s["preemption_count"] > 0 and s["kv_utilization_peak"] == 1.0,
    # the colocated encoder's steps stretch the decode tokens they carry; the encode pool's do not
    "multimodal": lambda s: s["itl_p99_ms"] > 50 and s["completed_requests"] == 300,
    "multimodal-epd": lambda s: s["itl_p99_ms"] < 20 and s["pd"]["split_requests"] == 300,
    "pd-disaggregation": lambda s: (
        s["pd"]["split_requests"] == 300
        and s["pd"]["transfers_completed"] == 300
        and s["itl_p99_ms"] < 20
        and 30 < s["pd"]["transfer_p50_ms"] < 70
        and s["pd"]["peak_concurrent_transfers"] >= 2
    ),
    "shared-prefix": lambda s: (
        s["cache_hit_rate"] > 0.5 and s["prefix_cached_token_fraction"] > 0.5
    ),
    "low-load-long-outputs": lambda s: s["fast_forward_windows"] > 0 and s["ttft_p99_ms"] < 100,
    "kv-tiers": lambda s: (
        s["kv_tier_hits"]["cpu"]["hits"] > 0
        and s["kv_tier_hits"]["disk"]["hits"] > 0
        and s["kv_tier_hits"]["disk"]["evicted_blocks"] == 0
    ),
    "default": lambda s: s["completed_requests"] == 300 and s["preemption_count"] == 0,
    # adapter-affinity keeps each instance's adapters resident; every request on its model
    "lora-adapters": lambda s: s["adapters"]["evictions"] == 0 and s["ttft_p99_ms"] < 100,
    "two-models": lambda s: sum(m["completed"] for m in s["by_model"].values()) == 300,
    "autoscale-spike": lambda s: (
        s["autoscaling"]["scale_ups"] == 4
        and s["autoscaling"]["peak_ready"] == 6
        and s["autoscaling"]["per_instance"][5]["state_at_end"] == "stopped"
    ),
    "cluster-weighted": lambda s: (
        s["completed_requests"] == 1000
        and s["preemption_count"] == 0
        and s["cache_hit_rate"] > 0.75
        and s["scenario"]["policies"]["routing"] == "weighted"
    ),
    "mooncake-replay": lambda s: (
        s["completed_requests"] == 300
        and s["cache_hit_rate"] > 0
        and s["prefix_cached_token_fraction"] > 0
        and s["scenario"]["workload"]["kind"] == "trace"
        and s["scenario"]["policies"]["routing"] == "weighted"
    ),
    "multi-client": lambda s: (
        s["scenario"]["workload"]["kind"] == "spec"
        and [c["id"] for c in s["scenario"]["workload"]["clients"]] == ["chat", "summarize"]
        and s["completed_requests"] == s["injected_requests"]
        and s["preemption_count"] > 0
        and s["per_class"]["critical"]["ttft_p99_ms"] < 500  # chat stays within its target
        and s["goodput"]["critical"]["slo_attainment"] == 1.0
        and s["per_class"]["batch"]["ttft_p50_ms"] > s["per_class"]["critical"]["ttft_p50_ms"]
    ),
    "sessions": lambda s: (
        s["sessions"]["count"] == s["sessions"]["completed"] == 300
        and s["completed_requests"] == 1200
        and s["cache_hit_rate"] > 0.5
        and s["prefix_cached_token_fraction"] > 0.5
        # later rounds' prompts are ~5x longer on average but start about as fast
        and s["sessions"]["ttft_warm_mean_ms"] < 1.1 * s["sessions"]["ttft_cold_mean_ms"]
    ),
    "flow-control-overload": lambda s: (
        s["rejected_requests"] > 0
        and s["shed_requests"] > 0
        and s["expired_requests"] > 0
        and s["completed_requests"]
        + s["rejected_requests"]
        + s["shed_requests"]
        + s["expired_requests"]
        == 1500
        and s["per_class"]["critical"]["ttft_p99_ms"]
        < s["per_class"]["standard"]["ttft_p99_ms"]
        < s["per_class"]["sheddable"]["ttft_p99_ms"]
        and set(s["goodput"]) == {"critical", "standard", "sheddable"}
        and 0 < s["slo_attainment"] < 1
        and s["goodput_rps"] > 0
    ),
}


def run(path: Path, overrides: list[str] = SHORT) -> dict[str, Any]:
    return servesim.simulate(servesim.load_scenario(path, overrides=overrides)).summary


def without(summary: dict[str, Any], *keys: str) -> dict[str, Any]:
    out = {k: v for k, v in summary.items() if k not in keys}
    out["scenario"] = {k: v for k, v in summary["scenario"].items() if k not in keys}
    return out


def test_there_are_examples():
    assert {p.stem for p in SCENARIO_FILES} >= set(CLAIMS)
    assert {p.name for p in SCRIPTS} >= {
        "api_quickstart.py",
        "custom_policy.py",
        "custom_router.py",
        "custom_latency_model.py",
        "compare_routers.py",
    }


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_example_scenario_runs_and_passes_its_audit(path):
    summary = run(path, LONGER.get(path.stem, SHORT))
    assert summary["audit"] == {"checked": True, "passed": True, "violations": []}
    assert summary["conservation"]["balanced"]
    assert summary["completed_requests"] > 0
    claim = CLAIMS.get(path.stem)
    assert claim is not None, f"add the claims of {path.name} to CLAIMS"
    assert claim(summary), f"{path.name} no longer shows what its comments say"


def test_default_yaml_is_the_default_scenario():
    spelled_out = run(EXAMPLES / "default.yaml")
    builtin = servesim.simulate(servesim.load_scenario(None, overrides=SHORT)).summary
    assert without(spelled_out, "name") == without(builtin, "name")


def test_default_yaml_spells_out_every_field():
    import yaml

    from servesim.scenario import (
        AUDIT_FIELDS,
        ENGINE_FIELDS,
        OUTPUT_FIELDS,
        POLICY_FIELDS,
        TOP_LEVEL_FIELDS,
    )
    from servesim.workloads.synthetic import SyntheticWorkload

    data = yaml.safe_load((EXAMPLES / "default.yaml").read_text(encoding="utf-8"))
    missing = [f for f in TOP_LEVEL_FIELDS if f not in data]
    for section, fields in (
        ("engine", ENGINE_FIELDS),
        ("policies", POLICY_FIELDS),
        ("output", OUTPUT_FIELDS),
        ("audit", AUDIT_FIELDS),
        ("workload", set(SyntheticWorkload.fields) - {"input", "output"}),  # from the preset
    ):
        missing += [f"{section}.{f}" for f in fields if f not in data.get(section, {})]
    assert not missing, f"examples/default.yaml does not spell out {missing}"


def test_shared_prefix_hits_disappear_without_prefix_caching():
    off = run(EXAMPLES / "shared-prefix.yaml", SHORT + ["engine.enable_prefix_caching=false"])
    on = run(EXAMPLES / "shared-prefix.yaml")
    assert off["cache_hit_rate"] == 0.0
    assert on["ttft_p50_ms"] < off["ttft_p50_ms"]


def test_kv_pressure_eases_with_a_larger_cache():
    small = run(EXAMPLES / "kv-pressure.yaml")
    large = run(EXAMPLES / "kv-pressure.yaml", SHORT + ["engine.kv_blocks=2400"])
    assert large["preemption_count"] < small["preemption_count"]


def test_low_load_example_gives_the_same_results_step_by_step():
    fast = run(EXAMPLES / "low-load-long-outputs.yaml")
    exact = run(EXAMPLES / "low-load-long-outputs.yaml", SHORT + ["exact_steps=true"])
    assert exact["fast_forward_windows"] == 0
    assert without(fast, "exact_steps", "fast_forward_windows") == without(
        exact, "exact_steps", "fast_forward_windows"
    )


def test_prefix_aware_routing_beats_round_robin():
    short = LONGER["cluster-weighted"]
    weighted = run(EXAMPLES / "cluster-weighted.yaml", short)
    rr = run(EXAMPLES / "cluster-weighted.yaml", short + ["policies.routing=round-robin"])
    assert rr["preemption_count"] > weighted["preemption_count"] == 0
    assert weighted["ttft_p99_ms"] < rr["ttft_p99_ms"]
    assert weighted["cache_hit_rate"] > rr["cache_hit_rate"]
    assert weighted["load_imbalance"] > rr["load_imbalance"] == 1.0


def test_flow_control_bounds_the_wait_by_refusing_work():
    short = LONGER["flow-control-overload"]
    on = run(EXAMPLES / "flow-control-overload.yaml", short)
    off = run(EXAMPLES / "flow-control-overload.yaml", short + ["policies.flow_control=false"])
    assert off["completed_requests"] == 1500 and off["shed_requests"] == 0
    assert on["completed_requests"] < 1500
    sheddable = "sheddable"
    assert on["per_class"][sheddable]["ttft_p99_ms"] < off["per_class"][sheddable]["ttft_p99_ms"]


def test_multi_client_shares_and_spike_are_in_the_arrivals():
    results = servesim.simulate(servesim.load_scenario(EXAMPLES / "multi-client.yaml"))
    r = results.requests
    clients = results.record.requests.labels("client")
    chat = int((r["client"] == clients.index("chat")).sum())
    summarize = int((r["client"] == clients.index("summarize")).sum())
    assert 2.6 < chat / summarize < 3.4  # rate_fraction 3 : 1
    t = r["arrival_us"] / 1e6
    before = ((t >= 0) & (t < 60)).sum() / 60
    during = ((t >= 60) & (t < 80)).sum() / 20
    after = ((t >= 80) & (t < 120)).sum() / 40
    assert 2.5 < during / before < 3.5 and 2.5 < during / after < 3.5  # multiplier 3
    assert t.max() <= 120  # duration: 2min
    spike = (t >= 60) & (t < 80)
    ttft = r["first_token_us"] - r["arrival_us"]
    mine = r["client"] == clients.index("summarize")
    # the spike overloads the instances: the low-priority summaries wait (7.6x at the KV capacity
    # vLLM's profiling leaves an H100; the old flat activation reserve made it 33x)
    assert np.median(ttft[spike & mine]) > 5 * np.median(ttft[(t < 60) & mine])


def test_sessions_without_a_prefix_cache_pay_for_the_whole_conversation():
    off = run(EXAMPLES / "sessions.yaml", SHORT + ["engine.enable_prefix_caching=false"])
    on = run(EXAMPLES / "sessions.yaml")
    assert off["cache_hit_rate"] == 0.0
    assert off["sessions"]["ttft_warm_mean_ms"] > 1.5 * off["sessions"]["ttft_cold_mean_ms"]
    assert on["sessions"]["ttft_warm_mean_ms"] < off["sessions"]["ttft_warm_mean_ms"]
    none = run(EXAMPLES / "sessions.yaml", SHORT + ["workload.sessions.context=none"])
    assert none["cache_hit_rate"] == 0.0  # chatbot turns share no prefix


@pytest.fixture
def restored_registries():
    """Scripts register plugins; undo that so a script (or another test) can run again."""
    registry.describe()  # import the built-ins first
    saved = {kind: dict(reg._items) for kind, reg in registry.REGISTRIES.items()}
    yield
    for kind, reg in registry.REGISTRIES.items():
        reg._items.clear()
        reg._items.update(saved[kind])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_example_script_runs(path, tmp_path, restored_registries, capsys, monkeypatch):
    monkeypatch.setenv("SERVESIM_EXAMPLE_REQUESTS", "600")  # compare_routers.py: a smaller run
    monkeypatch.setattr("sys.argv", [str(path)])  # a script sees its own (empty) command line
    cwd = os.getcwd()
    os.chdir(tmp_path)  # scripts must not depend on the working directory
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.strip(), f"{path.name} printed nothing"
    assert list(tmp_path.iterdir()) == [], f"{path.name} wrote files"
