"""Several models and LoRA adapters in one fleet: load-time errors, model-aware routing checked
by the auditor, per-model and per-adapter metrics, the adapter-affinity scorer, INV-LORA-*."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.audit.adapters import check_lora_books
from servesim.policies.scorers import AdapterAffinity
from servesim.policies.snapshot import InstanceSnapshot
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from tests.conftest import run_scenario, scenario_dict


def lora_scenario(requests: int = 40, **lora) -> dict:
    data = scenario_dict(requests=requests, rate=50.0, input=32, output=8, kv_blocks=400)
    data["model"] = "llama-3.1-8b"
    data["engine"]["lora"] = {"max_loras": 2, "adapters": ["sql", "chat", "docs"], **lora}
    data["workload"]["adapters"] = {
        "names": ["sql", "chat", "docs"],
        "popularity": {"zipf": 1.1},
        "base_fraction": 0.25,
    }
    return data


def two_models(weights: dict, counts=(2, 1), routing="least-loaded") -> dict:
    data = scenario_dict(requests=60, rate=80.0, input=32, output=8, kv_blocks=400)
    data["model"] = "llama-3.1-8b"
    data["cluster"] = {
        "groups": [
            {"count": counts[0], "model": "llama-3.1-8b"},
            {"count": counts[1], "model": "qwen3-14b"},
        ]
    }
    data["policies"] = {"routing": {"name": routing}}
    data["latency"] = {"model": "roofline"}  # each group priced from its own model
    data["workload"]["models"] = weights
    return data


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d["engine"]["lora"].update(max_loras=0), "engine.lora.max_loras"),
        (lambda d: d["engine"]["lora"].update(max_cpu_loras=1), "engine.lora.max_cpu_loras"),
        (
            lambda d: d["engine"]["lora"].update(adapters={"sql": 32, "chat": 8, "docs": 8}),
            "engine.lora.adapters.sql",
        ),
        (lambda d: d["engine"]["lora"].update(max_lora_rank=12), "engine.lora.max_lora_rank"),
        (lambda d: d["engine"]["lora"].update(target_modules="mlp"), "engine.lora.target_modules"),
        (lambda d: d["engine"]["lora"].update(bogus=1), "engine.lora.bogus"),
        (lambda d: d["workload"]["adapters"].update(names=["sql", "nope"]), "workload.adapters"),
        (lambda d: d["engine"].update(preemption_mode="swap"), "engine.lora"),
        (
            lambda d: d["workload"]["adapters"].update(base_fraction=1),
            "workload.adapters.base_fraction",
        ),
    ],
)
def test_bad_lora_input_names_the_field(change, field):
    data = lora_scenario()
    change(data)
    with pytest.raises(ScenarioError) as err:
        load_scenario(data)
    assert err.value.path == field


def test_a_model_no_instance_serves_is_refused_at_load_naming_what_is_served():
    with pytest.raises(ScenarioError) as err:
        load_scenario(two_models({"llama-3.1-8b": 1, "phi-4": 1}))
    assert err.value.path == "workload.models" and err.value.value == "phi-4"
    assert "llama-3.1-8b-instruct" in err.value.fix and "qwen3-14b" in err.value.fix


def test_requests_naming_no_model_go_to_the_one_model_served_else_need_models():
    data = two_models({"qwen3-14b": 1})
    del data["workload"]["models"]
    data["cluster"]["groups"][0]["model"] = "qwen3-14b"
    assert run_scenario(data).summary["completed_requests"] == 60  # qwen3-14b: the only one
    data["cluster"]["groups"][0]["model"] = "qwen2.5-7b-instruct"
    with pytest.raises(ScenarioError) as err:
        load_scenario(data)
    assert err.value.path == "workload.models"


@settings(max_examples=8, deadline=None)
@given(
    weight=st.floats(0.05, 0.95),
    counts=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    routing=st.sampled_from(["round-robin", "least-loaded", "random", "weighted"]),
    seed=st.integers(0, 1000),
)
def test_model_aware_routing_never_sends_to_a_wrong_model_instance(weight, counts, routing, seed):
    data = two_models({"llama-3.1-8b": weight, "qwen3-14b": 1 - weight}, counts, routing)
    data["seed"] = seed
    results = run_scenario(data)
    assert results.summary["audit"]["passed"], results.summary["audit"]
    books = results.record.lora
    req = results.requests
    served = np.array([books["models"].index(m) for m in books["served"]])
    ids, where = req["id"], req["instance"]
    assert (served[where] == books["model_code"][ids]).all()


def test_per_model_metrics_count_every_request_once():
    results = run_scenario(two_models({"llama-3.1-8b": 3, "qwen3-14b": 1}))
    by_model = results.summary["by_model"]
    assert set(by_model) == {"llama-3.1-8b-instruct", "qwen3-14b"}
    assert sum(row["requests"] for row in by_model.values()) == 60
    assert (
        sum(row["completed"] for row in by_model.values()) == results.summary["completed_requests"]
    )
    # the larger model decodes slower on the same GPU
    assert by_model["qwen3-14b"]["itl_mean_ms"] >= by_model["llama-3.1-8b-instruct"]["itl_mean_ms"]


def test_per_adapter_metrics_and_load_counters():
    results = run_scenario(lora_scenario())
    s = results.summary
    assert s["audit"]["passed"]
    assert set(s["by_adapter"]) <= {"base", "sql", "chat", "docs"}
    assert sum(r["requests"] for r in s["by_adapter"].values()) == 40
    assert s["adapters"]["loads"] >= len(set(s["by_adapter"]) - {"base"})
    assert s["adapters"]["per_instance"][0]["adapter_peak_resident"] <= 2


def test_a_run_without_models_or_adapters_keeps_its_summary():
    s = run_scenario(scenario_dict()).summary
    assert not {"by_model", "by_adapter", "adapters"} & set(s)
    assert run_scenario(scenario_dict()).record.lora is None


class _State:
    def __init__(self, gpu, cpu, max_loras=2):
        self.gpu, self.cpu, self.max_loras = gpu, cpu, max_loras


class _Req:
    adapter = "sql"


def test_adapter_affinity_prefers_gpu_then_cpu_then_a_free_slot():
    scorer = AdapterAffinity()
    scorer.bind_adapters(
        [
            _State({"sql": None}, {"sql": None}),
            _State({"chat": None}, {"chat": None, "sql": None}),
            _State({"chat": None}, {"chat": None}),
            _State({"chat": None, "docs": None}, {"chat": None}),
            None,
        ]
    )
    snaps = [InstanceSnapshot(k) for k in range(5)]
    assert scorer.score(_Req(), snaps) == [1.0, 0.5, 0.25, 0.0, 0.0]
    base = _Req()
    base.adapter = ""
    assert scorer.score(base, snaps) == [1.0] * 5


def test_adapter_affinity_routes_to_the_instance_holding_the_adapter():
    data = lora_scenario(requests=60)
    data["cluster"] = {"instances": 3}
    data["engine"]["lora"]["max_loras"] = 1
    data["policies"] = {
        "routing": {"name": "weighted", "scorers": {"adapter-affinity": 3, "queue-depth": 1}}
    }
    with_affinity = run_scenario(data).summary["adapters"]["loads"]
    data["policies"] = {"routing": {"name": "weighted", "scorers": {"queue-depth": 1}}}
    without = run_scenario(data).summary["adapters"]["loads"]
    assert with_affinity < without


def books(**changes) -> dict:
    base = {
        "models": ["m"],
        "adapters": ["", "a"],
        "model_code": np.array([0, 0]),
        "adapter_code": np.array([1, 0]),
        "served": ["m"],
        "catalogs": [["a"]],
        "instances": [{"max_loras": 1}],
        "loads": [[(0, "a", 500, 1)]],
    }
    base.update(copy.deepcopy(changes))
    return base


REQUESTS = {"id": np.array([0, 1]), "instance": np.array([0, 0])}
STEPS = [{"start_us": np.array([0, 700]), "dt_us": np.array([700, 100])}]


def _invariants(b, steps=STEPS) -> list[str]:
    return [v.invariant for v in check_lora_books(b, REQUESTS, steps)]


def test_the_auditor_accepts_sound_books_and_catches_each_seeded_fault():
    assert _invariants(books()) == []
    assert _invariants(books(loads=[[(0, "a", 500, 2)]])) == ["INV-LORA-1"]
    assert _invariants(books(served=["other"])) == ["INV-LORA-2", "INV-LORA-2"]
    assert _invariants(books(catalogs=[[]])) == ["INV-LORA-2"]
    short = [{"start_us": np.array([0, 300]), "dt_us": np.array([300, 100])}]
    assert _invariants(books(), short) == ["INV-LORA-3"]
    assert _invariants(books(loads=[[(50, "a", 500, 1)]])) == ["INV-LORA-3"]


@pytest.mark.parametrize("max_loras", [1, 2])
def test_fast_forward_gives_the_exact_steps_timelines_with_adapters(max_loras):
    """Decode windows pay the same kernel time as single steps; loads only happen at admissions,
    which end windows: both paths give the same per-request timelines."""
    data = lora_scenario(requests=40)
    data["workload"].update(output=300, rate=5.0)
    data["engine"]["lora"]["max_loras"] = max_loras
    exact = copy.deepcopy(data)
    exact["exact_steps"] = True
    a, b = run_scenario(exact), run_scenario(data)
    assert b.summary["fast_forward_windows"] > 0
    for column in ("first_token_us", "completion_us", "instance"):
        assert np.array_equal(a.requests[column], b.requests[column]), column


def test_a_group_model_is_checked_against_its_own_tp():
    """qwen3-14b has 40 heads and 8 KV heads: tp 8 splits them, tp 3 does not; the group's own
    model is the one checked (and the scenario's top-level tp applies to it when not given)."""
    data = two_models({"llama-3.1-8b": 1, "qwen3-14b": 1})
    data["cluster"]["groups"][1]["tp"] = 8
    load_scenario(data)
    data["cluster"]["groups"][1]["tp"] = 3
    with pytest.raises(ScenarioError) as err:
        load_scenario(data)
    assert err.value.path == "cluster.groups[1].tp"


def test_requests_csv_gains_model_and_adapter_columns_only_when_used():
    from servesim.analysis.tables import requests_csv

    header, first = requests_csv(run_scenario(lora_scenario()).record).splitlines()[:2]
    assert header.endswith(",model,adapter")
    assert first.split(",")[-2] == "llama-3.1-8b-instruct"
    assert "adapter" not in requests_csv(run_scenario(scenario_dict()).record).splitlines()[0]
