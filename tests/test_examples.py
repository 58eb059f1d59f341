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

import pytest

import servesim
from servesim.simcore import registry

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCENARIO_FILES = sorted(EXAMPLES.glob("*.yaml"))
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
SHORT = ["workload.requests=300"]

# What each example's comments promise, checked on the shortened run.
CLAIMS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "kv-pressure": lambda s: s["preemption_count"] > 0 and s["kv_utilization_peak"] == 1.0,
    "shared-prefix": lambda s: (
        s["cache_hit_rate"] > 0.5 and s["prefix_cached_token_fraction"] > 0.5
    ),
    "low-load-long-outputs": lambda s: s["fast_forward_windows"] > 0 and s["ttft_p99_ms"] < 100,
    "default": lambda s: s["completed_requests"] == 300 and s["preemption_count"] == 0,
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
        "custom_latency_model.py",
    }


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_example_scenario_runs_and_passes_its_audit(path):
    summary = run(path)
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
def test_example_script_runs(path, tmp_path, restored_registries, capsys):
    cwd = os.getcwd()
    os.chdir(tmp_path)  # scripts must not depend on the working directory
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.strip(), f"{path.name} printed nothing"
    assert list(tmp_path.iterdir()) == [], f"{path.name} wrote files"
