"""servesim plan's recipe search: grids over pp, ep, max_num_batched_tokens, routing and PD splits
end to end, a reason on every rejected candidate (table and plan.json), ranking by several
metrics and by any summary field, a golden ordering, the bound on the search space, and the
serial, process-pool and (faked) Ray backends giving the same answer. Tiny scenarios: each plan
simulates a few dozen requests."""

from __future__ import annotations

import csv
import json
import sys
import types
from typing import Any

import attrs
import pytest

import servesim
from servesim import cli
from servesim.simcore.errors import ScenarioError
from servesim.studies.plan import format_plan, load_plan, rank_results, run_plan, write_plan

SLO = {"standard": {"ttft": "1s", "itl": "50ms"}}


def plan_data(
    search: dict[str, Any], model: str = "llama-3.1-8b-instruct", rate: float = 2, **extra: Any
) -> dict[str, Any]:
    """A plan over ``search`` (one H100 at tp 1, 1-2 instances unless it says otherwise) serving
    ``rate`` req/s of chatbot traffic, 40 requests each run."""
    return {
        "name": "t",
        "scenario": {"seed": 5, "model": model, "workload": {"preset": "chatbot", "rate": rate}},
        "slo": SLO,
        "search": {"gpu": ["H100"], "tp": [1], "instances": {"min": 1, "max": 2}, **search},
        "requests": 40,
        **extra,
    }


def tiny(search: dict[str, Any], model: str = "llama-3.1-8b-instruct", rate: float = 2, **extra):
    return load_plan(plan_data(search, model, rate, **extra))


@pytest.fixture
def simulated(monkeypatch):
    """Every scenario the planner simulates, in order."""
    seen: list[Any] = []
    real = servesim.run.simulate
    monkeypatch.setattr(servesim.run, "simulate", lambda s, **kw: seen.append(s) or real(s, **kw))
    return seen


def by_label(result) -> dict[str, Any]:
    return {c.label: c for c in result.candidates}


# ------------------------------------------------------------------------ each new dimension


def test_a_pp_grid_runs_each_stage_count_and_counts_its_gpus(simulated):
    result = run_plan(tiny({"pp": [1, 2]}))
    c = by_label(result)
    one, two = c["H100 tp1 pp1 seqs256 round-robin"], c["H100 tp1 pp2 seqs256 round-robin"]
    assert one.feasible and two.feasible
    assert {s.engine.pp for s in simulated} == {1, 2}
    # an instance of pp 2 holds two GPUs: they are counted and paid for
    assert two.gpus == 2 * two.instances and one.gpus == one.instances
    assert two.cost_per_hour == pytest.approx(2 * one.cost_per_hour * two.instances / one.instances)
    header = next(line for line in format_plan(result).splitlines() if line.startswith("rank "))
    assert header.split()[:4] == ["rank", "gpu", "tp", "pp"]
    assert result.to_dict()["search"]["pp"] == [1, 2]


def test_an_ep_grid_simulates_expert_parallelism_and_rejects_what_vllm_refuses(simulated):
    """ep must span the data-parallel group (dp × tp): with dp 1, ep 2 needs tp 2."""
    result = run_plan(tiny({"tp": [1, 2], "ep": [1, 2]}, model="deepseek-v2-lite"))
    c = by_label(result)
    assert c["H100 tp2 ep2 seqs256 round-robin"].feasible
    assert c["H100 tp2 ep1 seqs256 round-robin"].feasible
    bad = c["H100 tp1 ep2 seqs256 round-robin"]
    assert bad.rejected_by == "parallelism" and "dp × tp = 1 × 1 = 1" in bad.reason
    assert {(s.tp, s.engine.ep) for s in simulated} == {(1, 1), (2, 1), (2, 2)}


def test_a_token_budget_grid_reaches_the_engine(simulated):
    result = run_plan(tiny({"max_num_batched_tokens": [512, 4096]}))
    assert {s.engine.max_num_batched_tokens for s in simulated} == {512, 4096}
    labels = [c.label for c in result.candidates]
    assert "H100 tp1 seqs256 mbt512 round-robin" in labels
    assert all(c.max_num_batched_tokens in (512, 4096) for c in result.candidates)


def test_a_routing_grid_tries_each_policy_once_there_is_more_than_one_instance(simulated):
    plan = tiny({"routing": ["round-robin", "least-loaded"], "instances": 2})
    result = run_plan(plan)
    assert [s.routing.name for s in simulated] == ["round-robin", "least-loaded"]
    assert {c.routing for c in result.ranked} == {"round-robin", "least-loaded"}


def test_a_pd_grid_builds_pools_in_whole_units(simulated):
    """pd 1:2 grows by units of three instances (one prefill, two decode); with at most 3
    instances it is searched at 3 only, and 2:2 (units of 4) does not fit the range at all."""
    plan = tiny({"pd": ["none", "1:1", "1:2", "2:2"], "instances": {"min": 1, "max": 3}})
    result = run_plan(plan)
    c = by_label(result)
    roles = [[i.role for i in s.instance_specs] for s in simulated]
    pools = {(r.count("prefill"), r.count("decode")) for r in roles if "prefill" in r}
    assert pools == {(1, 1), (1, 2)}  # one unit of each split that fits 3 instances
    split = c["H100 tp1 seqs256 round-robin pd1:2"]
    assert split.feasible and split.instances == 3 and split.pd == "1:2"
    assert c["H100 tp1 seqs256 round-robin pdnone"].feasible
    too_big = c["H100 tp1 seqs256 round-robin pd2:2"]
    assert too_big.rejected_by == "pd" and "raise search.instances.max to at least 4" in (
        too_big.reason
    )


# ------------------------------------------------------------------------ rejection reasons


def test_every_rejected_candidate_says_why_in_the_table_csv_and_json(tmp_path, monkeypatch):
    """One plan that rejects in four ways at least: memory (a 70B model on one GPU),
    parallelism (ep on a dense model), pd (a unit of 6 instances in a range of at most 4) and
    budget (one tp-8 H100 instance costs $32/hour, over the $20 budget)."""
    search = {"gpu": ["H100", "RTX-4090"], "tp": [1, 4, 8], "ep": [1, 4], "pd": ["none", "3:3"]}
    search["instances"] = {"min": 1, "max": 4}
    plan = tiny(search, model="llama-3.1-70b-instruct", rate=40, budget=20)
    result = run_plan(plan)
    reasons = {c.rejected_by for c in result.rejected}
    assert {"memory", "parallelism", "pd", "budget"} <= reasons
    for c in result.rejected:
        assert c.rejected_by and c.reason, c.label
    write_plan(result, tmp_path)
    data = json.loads((tmp_path / "plan.json").read_text())
    assert len(data["rejected"]) == len(result.rejected)
    assert all(r["rejected_by"] and r["reason"] for r in data["rejected"])
    rows = list(csv.DictReader((tmp_path / "plan.csv").open()))
    rejected_rows = [r for r in rows if r["status"] == "rejected"]
    assert rejected_rows and all(r["rejected_by"] and r["reason"] for r in rejected_rows)
    text = format_plan(result)
    for c in result.rejected:
        assert c.reason in text


def test_a_fleet_that_needs_more_than_the_budget_buys_is_rejected_as_over_budget():
    """H100 at $4/hour with a $5 budget: one instance is affordable, two are not. One request
    at a time (max_num_seqs 1) at 10 req/s misses the SLO, so the search stops at one instance,
    over budget (not `slo`: the plan allows 8)."""
    plan = tiny({"instances": {"min": 1, "max": 8}, "max_num_seqs": [1]}, rate=10, budget=5)
    plan = attrs.evolve(plan, prune_margin=None)
    (c,) = run_plan(plan).candidates
    assert c.rejected_by == "budget"
    assert c.reason.startswith("over budget: SLO not met at 1 instance(s), the most the budget")
    assert [n for n, _, _ in c.evaluated] == [1]


def test_min_confidence_and_the_projection_reject_with_their_reasons():
    plan = tiny({"gpu": ["L40S"]}, rate=2)
    result = run_plan(attrs.evolve(plan, min_confidence="measured"))
    (c,) = result.candidates
    assert c.rejected_by == "confidence" and "< required measured" in c.reason
    overloaded = tiny({"instances": 1}, rate=400)
    (c,) = run_plan(overloaded).candidates
    assert c.rejected_by == "projection" and "projected max rate" in c.reason


# ------------------------------------------------------------------------ ranking


@pytest.fixture(scope="module")
def light_result():
    """Eight fleets at 1 req/s, each served by one instance."""
    plan = tiny({"gpu": ["H100", "L40S"], "tp": [1, 2], "pp": [1, 2]}, rate=1)
    return run_plan(plan)


def test_golden_ordering_by_cost(light_result):
    """Ranking by cost, derived by hand: at 1 req/s every fleet meets the SLO with one
    instance (checked below), so a fleet's cost per hour is its GPUs per instance (tp × pp) ×
    the table's price (H100 $4.00, L40S $1.50):

    L40S tp1 pp1 = 1.50; L40S tp1 pp2 = L40S tp2 pp1 = 3.00; H100 tp1 pp1 = 4.00;
    L40S tp2 pp2 = 6.00; H100 tp1 pp2 = H100 tp2 pp1 = 8.00; H100 tp2 pp2 = 16.00.

    Equal costs are broken by goodput (all serve every request within SLO, so equal), then
    fewer GPUs (equal), then the label in string order: "L40S tp1 pp2" before "L40S tp2 pp1"
    and "H100 tp1 pp2" before "H100 tp2 pp1"."""
    assert all(c.instances == 1 and c.attainment == 1.0 for c in light_result.ranked)
    expected = [
        "L40S tp1 pp1",
        "L40S tp1 pp2",
        "L40S tp2 pp1",
        "H100 tp1 pp1",
        "L40S tp2 pp2",
        "H100 tp1 pp2",
        "H100 tp2 pp1",
        "H100 tp2 pp2",
    ]
    assert [c.label.removesuffix(" seqs256 round-robin") for c in light_result.ranked] == expected
    assert [c.cost_per_hour for c in light_result.ranked] == [1.5, 3, 3, 4, 6, 8, 8, 16]


LOWEST_FIRST = {
    "ttft_p99_ms": True,
    "tpot_p99_ms": True,
    "throughput_per_gpu": False,
    "cost_per_million_tokens": True,
}


@pytest.mark.parametrize("objective", sorted(LOWEST_FIRST))
def test_ranking_by_several_metrics(light_result, objective):
    lowest = LOWEST_FIRST[objective]
    ranked = rank_results(light_result.candidates, objective)
    values = [getattr(c, objective) for c in ranked]
    assert values == sorted(values, reverse=not lowest)
    assert len(set(values)) > 1, "the metric must separate the fleets for the test to mean much"


def test_ranking_by_any_summary_field():
    """``ttft_p50_ms`` is no named objective: it ranks lowest first from each fleet's summary;
    ``max:`` turns the direction round."""
    plan = tiny({"gpu": ["H100", "L40S"], "tp": [1, 2]}, objective="ttft_p50_ms")
    assert plan.metric == ("ttft_p50_ms", "lowest")
    result = run_plan(plan)
    values = [c.objective_value for c in result.ranked]
    assert None not in values and values == sorted(values)
    assert "ranked by ttft_p50_ms (summary field ttft_p50_ms, lowest first)" in format_plan(result)
    flipped = tiny({"tp": [1]}, objective="max:ttft_p50_ms")
    assert flipped.metric == ("ttft_p50_ms", "highest")


# ------------------------------------------------------------------------ bounds and validation


def test_a_search_over_the_bound_is_refused_naming_the_longest_list():
    with pytest.raises(ScenarioError) as err:
        tiny({"tp": [1, 2, 4, 8], "max_num_seqs": list(range(1, 200)), "pp": [1, 2]})
    assert err.value.path == "search"
    assert err.value.value == 4 * 199 * 2
    assert "search.max_num_seqs has 199 values: at most 62 keep the others" in err.value.fix
    assert "split the search into several plans" in err.value.fix


@pytest.mark.parametrize(
    "search, extra, path",
    [
        ({"pd": ["1-2"]}, {}, "search.pd[0]"),
        ({"pd": ["none", "off"]}, {}, "search.pd[1]"),
        ({"pp": [0]}, {}, "search.pp[0]"),
        ({"max_num_batched_tokens": []}, {}, "search.max_num_batched_tokens"),
        ({}, {"budget": 0}, "budget"),
        ({}, {"objective": "ttft_p99"}, "objective"),
    ],
)
def test_bad_search_fields_name_the_field(search, extra, path):
    with pytest.raises(ScenarioError) as err:
        tiny(search, **extra)
    assert err.value.path == path


# ------------------------------------------------------------------------ backends


def answer(result) -> list[tuple]:
    """What a plan answers, without the search's counts (which depend on the caches)."""
    return [
        (c.label, c.status, c.rejected_by, c.instances, c.cost_per_hour, c.goodput_rps, c.rank)
        for c in result.candidates
    ]


@pytest.fixture(scope="module")
def grid_plan():
    return tiny({"gpu": ["H100", "L40S"], "pd": ["none", "1:1"]}, rate=4)


def test_the_process_pool_gives_the_serial_answer(grid_plan):
    serial = run_plan(grid_plan)
    pooled = run_plan(grid_plan, backend="process", workers=2)
    assert answer(pooled) == answer(serial)
    assert pooled.simulated_requests >= serial.simulated_requests > 0


class FakeRay(types.ModuleType):
    """The slice of Ray's API the plan runner calls, running each task when it is waited on.
    It checks the runner's dispatch (remote tasks, at most ``workers`` in flight, the plan put
    once), not Ray itself: Ray is not installed here."""

    def __init__(self):
        super().__init__("ray")
        self.initialised = False
        self.in_flight = 0
        self.most_in_flight = 0
        self.tasks = 0
        self.puts = 0

    def is_initialized(self):
        return self.initialised

    def init(self, **options):
        self.initialised = True

    def shutdown(self):
        self.initialised = False

    def cluster_resources(self):
        return {"CPU": 8}

    def put(self, value):
        self.puts += 1
        return ("ref", value)

    def remote(self, num_cpus=1):
        ray = self

        def wrap(fn):
            class Task:
                def remote(self, plan_ref, candidate):
                    ray.tasks += 1
                    ray.in_flight += 1
                    ray.most_in_flight = max(ray.most_in_flight, ray.in_flight)
                    return lambda: fn(plan_ref[1], candidate)

            return Task()

        return wrap

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        self.in_flight -= 1
        return ref()


def test_the_ray_backend_dispatches_every_candidate_as_a_task(grid_plan, monkeypatch):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    result = run_plan(grid_plan, backend="ray", workers=2)
    assert answer(result) == answer(run_plan(grid_plan))
    assert fake.tasks == len(result.candidates) and fake.puts == 1
    assert fake.most_in_flight == 2 and not fake.initialised  # started, then shut down


def test_without_ray_the_ray_backend_says_how_to_install_it(grid_plan, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ScenarioError) as err:
        run_plan(grid_plan, backend="ray")
    assert err.value.path == "--backend" and "pip install 'servesim[ray]'" in err.value.fix


def test_the_command_line_runs_a_recipe_search_on_the_pool(tmp_path, capsys):
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text(json.dumps(plan_data({"pp": [1, 2]})))
    out = tmp_path / "out"
    argv = ["plan", str(plan_file), "--out", str(out), "--backend", "process", "--workers", "2"]
    assert cli.main([*argv, "--budget", "5"]) == 0
    text = capsys.readouterr().out
    assert "budget $5.00/hour" in text
    data = json.loads((out / "plan.json").read_text())
    assert data["budget_usd_per_hour"] == 5
    # one pp-2 instance holds two $4 GPUs: over the $5 budget
    assert [(r["label"], r["rejected_by"]) for r in data["rejected"]] == [
        ("H100 tp1 pp2 seqs256 round-robin", "budget")
    ]
    assert cli.main([*argv, "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


# ------------------------------------------------------------------------ energy


def test_ranking_by_energy_needs_each_gpus_power():
    with pytest.raises(ScenarioError) as err:
        tiny({"gpu": ["H100", "L40S"]}, objective="energy_per_million_tokens", power={"H100": 700})
    assert err.value.path == "search.gpu[1]" and "--power L40S=W" in err.value.fix
    with pytest.raises(ScenarioError) as err:
        tiny({}, power={"A100-80": 400})
    assert err.value.path == "power.A100-80" and "not a searched GPU" in err.value.fix
    with pytest.raises(ScenarioError) as err:
        load_plan(tiny_dict(), power=["H100:700"])
    assert err.value.path == "--power"


def tiny_dict() -> dict[str, Any]:
    return plan_data({"gpu": ["H100", "L40S"], "instances": 1}, rate=1)


def test_energy_per_million_tokens_is_gpu_watts_over_token_rate():
    """At 1 req/s one instance serves the demand on either GPU, and both emit the same output
    tokens per second (the offered load), so the energy per token orders as the watts: L40S
    (350 W, the figure given here) before H100 (700 W). Each value is GPUs × W / (tokens/s),
    in kWh per million tokens (× 10^6 / 3.6·10^6)."""
    plan = load_plan(
        tiny_dict(), objective="energy_per_million_tokens", power=["H100=700", "L40S=350"]
    )
    result = run_plan(plan)
    assert [c.gpu for c in result.ranked] == ["L40S", "H100"]
    for c in result.ranked:
        expected = c.gpus * c.watts_per_gpu / c.tokens_per_sec * 1e6 / 3.6e6
        assert c.energy_per_million_tokens == pytest.approx(expected)
    text = format_plan(result)
    assert "power per GPU (W, the plan's): H100 700, L40S 350" in text
    assert "kWh/M tok" in text
    assert result.to_dict()["candidates"][0]["energy_per_million_tokens"] > 0


def test_fitness_weights_on_the_command_line_rank_by_fitness_over_the_plans_objective():
    plan = load_plan({**tiny_dict(), "objective": "ttft_p50_ms"}, fitness="cost_per_hour:1")
    assert plan.objective == "fitness" and plan.metric is None


def test_a_pd_search_keeps_the_bases_link_and_decider_for_the_split_candidates(simulated):
    """The base's kv_transfer and disaggregation decider need pools: the split candidates run
    with them, the co-located ones without."""
    data = plan_data({"pd": ["none", "1:1"]})
    data["scenario"]["cluster"] = {"kv_transfer": {"bandwidth": "5GB/s"}}
    data["scenario"]["policies"] = {"disaggregation": {"decider": "prefix-threshold"}}
    result = run_plan(load_plan(data))
    assert all(c.feasible for c in result.candidates), [c.reason for c in result.candidates]
    split = [s for s in simulated if s.pd is not None]
    assert split and all(s.pd.decider.name == "prefix-threshold" for s in split)
    assert all(s.pd.transfer.bandwidth_bytes_s == 5e9 for s in split)
    assert len(split) < len(simulated), "the co-located candidate ran too"
    with pytest.raises(ScenarioError) as err:
        data["scenario"]["cluster"] = {"pools": {"prefill": {}, "decode": {}}}
        load_plan(data)
    assert err.value.path == "scenario.cluster.pools" and "search.pd" in err.value.fix
