"""servesim plan: memory rejections, the instance-count search, costs, ranking, the Pareto front,
validation, the example plan and the command line (small scenarios: the module runs in seconds)."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

import servesim
from servesim.latency.hardware import HardwareSpec, resolve_gpu
from servesim.simcore.errors import ScenarioError
from servesim.studies.plan import (
    CSV_COLUMNS,
    OBJECTIVES,
    CandidateResult,
    add_plan_parser,
    cmd_plan,
    format_plan,
    load_plan,
    pareto_front,
    rank_results,
    run_plan,
    write_plan,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "plan-chatbot.yaml"

SLO = {"standard": {"ttft": "1s", "itl": "50ms"}}


def plan_dict(**overrides: Any) -> dict[str, Any]:
    """A small plan: qwen3-14b chatbot, one H100 at tp 1, 1-4 instances, 200 requests."""
    data: dict[str, Any] = {
        "name": "t",
        "scenario": {
            "seed": 7,
            "model": "qwen3-14b",
            "workload": {"preset": "chatbot", "rate": 10, "requests": 200},
        },
        "slo": SLO,
        "attainment": 0.95,
        "search": {"gpu": ["H100"], "tp": [1], "instances": {"min": 1, "max": 4}},
        "requests": 200,
    }
    for key, value in overrides.items():
        data[key] = value
    return data


def attainment_at(plan: Any, gpu: str, tp: int, seqs: int, routing: str, count: int) -> float:
    """The worst per-class SLO attainment of one directly simulated fleet (not via the planner)."""
    raw = json.loads(json.dumps(plan.base))
    raw.update(gpu=gpu, tp=tp, latency={"model": "blackbox"})
    raw["cluster"] = {"instances": count}
    raw["engine"] = {"max_num_seqs": seqs}
    raw["policies"] = {"routing": routing}
    summary = servesim.simulate(servesim.load_scenario(raw)).summary
    return min(g["slo_attainment"] for g in summary["goodput"].values() if g["count"])


# ------------------------------------------------------------------------------ memory


def test_memory_infeasible_candidates_are_rejected_with_the_reason(monkeypatch):
    calls = []
    real = servesim.run.simulate
    monkeypatch.setattr(
        servesim.run, "simulate", lambda s, **kw: calls.append((s.gpu.name, s.tp)) or real(s, **kw)
    )
    plan = load_plan(
        plan_dict(
            search={"gpu": ["RTX-4090"], "tp": [1, 2, 3], "instances": {"min": 1, "max": 2}},
            requests=60,
        )
    )
    result = run_plan(plan)
    by_tp = {c.tp: c for c in result.candidates}
    tp1 = by_tp[1]
    assert tp1.status == "rejected" and tp1.rejected_by == "memory"
    # weights and reserves against what one 24 GB card gives, and the way out
    assert "needs 28.0 GiB per instance (weights 27.5 + activation peak and reserves 0.5)" in (
        tp1.reason
    )
    assert "1 × RTX-4090 (24 GiB each) give 21.6 GiB" in tp1.reason
    assert "at least 2 GPUs" in tp1.reason
    assert tp1.evaluated == () and tp1.instances is None
    assert by_tp[3].rejected_by == "tp" and "does not divide" in by_tp[3].reason
    assert by_tp[2].feasible and by_tp[2].kv_blocks > 0
    assert all(tp == 2 for _, tp in calls), "rejected candidates must not be simulated"


# ------------------------------------------------------------------------ count search


@pytest.fixture(scope="module")
def busy_plan():
    """100 req/s of chatbot traffic on H100s: three instances (1, 2 fail, 4 meets, then 3)."""
    return load_plan(
        plan_dict(
            scenario={
                "seed": 7,
                "model": "qwen3-14b",
                "workload": {"preset": "chatbot", "rate": 100, "requests": 1500},
            },
            search={
                "gpu": ["H100"],
                "tp": [1],
                "instances": {"min": 1, "max": 8},
                "routing": ["round-robin", "least-loaded"],
            },
            requests=1500,
        )
    )


@pytest.fixture(scope="module")
def busy_result(busy_plan):
    return run_plan(busy_plan)


def test_search_finds_the_minimum_instance_count(busy_plan, busy_result):
    rr = next(c for c in busy_result.candidates if c.routing == "round-robin")
    assert rr.feasible and rr.latency_model == "blackbox"
    n = rr.instances
    assert n is not None and n >= 2, "the case must need more than one instance"
    # checked independently of the planner: n meets the requirement, n - 1 does not
    assert attainment_at(busy_plan, "H100", 1, 256, "round-robin", n) >= 0.95
    assert attainment_at(busy_plan, "H100", 1, 256, "round-robin", n - 1) < 0.95
    evaluated = {count: (a, ok) for count, a, ok in rr.evaluated}
    assert evaluated[n][1] and not evaluated[n - 1][1]
    assert any(ok for count, (_, ok) in evaluated.items() if count > n), "bisection walked down"
    assert rr.attainment == pytest.approx(evaluated[n][0])
    assert rr.gpus == n and rr.cost_per_hour == pytest.approx(n * rr.usd_per_gpu_hour)
    assert rr.throughput_per_gpu == pytest.approx(rr.tokens_per_sec / n)


def test_simulations_are_cached_and_never_rerun(busy_plan, monkeypatch):
    seen: list[tuple] = []
    real = servesim.run.simulate

    def counting(s, **kw):
        seen.append((s.gpu.name, s.tp, s.engine.max_num_seqs, s.routing.name, s.instances))
        return real(s, **kw)

    monkeypatch.setattr(servesim.run, "simulate", counting)
    result = run_plan(busy_plan)
    assert len(seen) == len(set(seen)) == result.simulations
    # at one instance the two routings share one simulation
    assert sum(1 for key in seen if key[-1] == 1) == 1
    assert result.cache_hits >= 1


def test_slo_not_met_even_at_the_maximum_is_rejected_with_the_attainment_reached():
    plan = load_plan(
        plan_dict(
            slo={"standard": {"itl": "1ms"}},
            search={"gpu": ["H100"], "tp": [1], "instances": {"min": 1, "max": 2}},
            requests=60,
        )
    )
    (c,) = run_plan(plan).candidates
    assert c.rejected_by == "slo" and not c.feasible
    assert "SLO not met even at 2 instance(s)" in c.reason
    assert f"attainment {c.attainment:.1%}" in c.reason and "met per target: ITL 2%" in c.reason
    assert [n for n, _, _ in c.evaluated] == [1, 2]


def test_one_instance_is_shared_by_every_routing(monkeypatch):
    plan = load_plan(
        plan_dict(
            search={
                "gpu": ["H100"],
                "tp": [1],
                "instances": 1,
                "routing": ["round-robin", "least-loaded", "random"],
            },
            requests=60,
        )
    )
    result = run_plan(plan)
    assert result.simulations == 1 and result.cache_hits == 2
    assert len({(c.goodput_rps, c.ttft_p99_ms) for c in result.candidates}) == 1


# ------------------------------------------------------------------------------- costs


def test_costs_come_from_the_table_then_the_overrides(tmp_path):
    table = resolve_gpu("H100").cost_per_hour
    assert table is not None and table > 0
    assert all(resolve_gpu(g).cost_per_hour for g in ("A100-80", "L40S", "RTX-4090"))

    def price(**kw: Any) -> tuple[float, str]:
        (gpu,) = load_plan(plan_dict(**kw.pop("plan", {})), **kw).gpus
        return gpu.usd_per_gpu_hour, gpu.cost_source

    assert price() == (table, "hardware table")
    assert price(plan={"costs": {"H100": 3.0}}) == (3.0, "plan costs")
    prices = tmp_path / "prices.yaml"
    prices.write_text("h100-sxm: 2.5\nL40S: 1.0\n", encoding="utf-8")
    assert price(plan={"costs": {"H100": 3.0}}, cost_files=[prices]) == (
        2.5,
        f"--costs {prices}",
    )
    assert price(cost_files=[prices], costs=["H100=2.0"]) == (2.0, "--cost")
    assert price(costs=["H100=2.0", "H100-SXM=1.25"]) == (1.25, "--cost")


def test_a_gpu_file_carries_its_price_or_the_plan_asks_for_one(tmp_path):
    values = {
        "tflops_bf16": 500,
        "tflops_fp8": 1000,
        "bandwidth_tbs": 2.0,
        "memory_gib": 96,
        "mfu_prefill": 0.4,
        "mfu_decode": 0.2,
    }
    assert (
        HardwareSpec.from_mapping("g", {**values, "cost_per_hour": 1.75}, "gpu").cost_per_hour
        == 1.75
    )
    with pytest.raises(ScenarioError) as err:
        HardwareSpec.from_mapping("g", {**values, "cost_per_hour": -1}, "gpu")
    assert err.value.path == "gpu.cost_per_hour"
    unpriced = tmp_path / "mygpu.yaml"
    unpriced.write_text(json.dumps(values), encoding="utf-8")
    search = {"gpu": [str(unpriced)], "tp": [1], "instances": 1}
    with pytest.raises(ScenarioError) as err:
        load_plan(plan_dict(search=search))
    assert err.value.path == "search.gpu[0]" and "--cost mygpu=USD" in err.value.fix
    (gpu,) = load_plan(plan_dict(search=search), costs=["mygpu=0.9"]).gpus
    assert (gpu.usd_per_gpu_hour, gpu.cost_source) == (0.9, "--cost")
    priced = tmp_path / "priced.yaml"
    priced.write_text(json.dumps({**values, "cost_per_hour": 1.1}), encoding="utf-8")
    (gpu,) = load_plan(plan_dict(search={**search, "gpu": ["priced.yaml"]}), base_dir=tmp_path).gpus
    assert (gpu.usd_per_gpu_hour, gpu.cost_source) == (1.1, "GPU file")


# -------------------------------------------------------------------- ranking and Pareto


def result(label: str, cost: float, goodput: float, tput: float, **kw: Any) -> CandidateResult:
    gpu, tp = label.split("/")
    return CandidateResult(
        gpu=gpu,
        tp=int(tp),
        max_num_seqs=256,
        routing="round-robin",
        instances=1,
        gpus=int(tp),
        cost_per_hour=cost,
        goodput_rps=goodput,
        throughput_per_gpu=tput,
        **kw,
    )


HAND_MADE = [
    result("A/1", cost=4.0, goodput=9.0, tput=900),
    result("B/1", cost=3.0, goodput=8.0, tput=1100),
    result("C/1", cost=5.0, goodput=9.5, tput=800),
    result("D/1", cost=5.0, goodput=9.0, tput=1000),  # dominated by A (cheaper, same goodput)
    result("E/1", cost=3.0, goodput=8.0, tput=700),  # ties B on both: kept with it
    result("F/1", cost=6.0, goodput=9.5, tput=950),  # dominated by C
    result("G/1", cost=1.0, goodput=99.0, tput=9999, status="rejected", rejected_by="slo"),
]


def test_pareto_front_over_cost_and_goodput():
    front = pareto_front(HAND_MADE)
    assert [r.gpu for r in front] == ["B", "E", "A", "C"]
    assert pareto_front([]) == []
    assert pareto_front([HAND_MADE[0]]) == [HAND_MADE[0]]


@pytest.mark.parametrize(
    ("objective", "order"),
    [
        ("cost", ["B", "E", "A", "C", "D", "F"]),  # C: as dear as D, more goodput
        ("throughput_per_gpu", ["B", "D", "F", "A", "C", "E"]),
        ("goodput", ["C", "F", "A", "D", "B", "E"]),
    ],
)
def test_ranking_by_each_objective(objective, order):
    ranked = rank_results(HAND_MADE, objective)
    assert [r.gpu for r in ranked] == order  # the rejected G is never ranked
    assert [r.rank for r in ranked] == list(range(1, len(order) + 1))


def test_ranking_by_a_latency_percentile_and_cost_per_million_tokens():
    fast = [
        attrs.evolve(r, ttft_p99_ms=t, tokens_per_sec=tok)
        for r, t, tok in zip(HAND_MADE[:3], (300.0, 100.0, 200.0), (1000.0, 500.0, 4000.0))
    ]
    assert [r.gpu for r in rank_results(fast, "ttft_p99_ms")] == ["B", "C", "A"]
    # USD per million output tokens: A 4/3.6 = 1.11, B 3/1.8 = 1.67, C 5/14.4 = 0.35
    assert [r.gpu for r in rank_results(fast, "cost_per_million_tokens")] == ["C", "A", "B"]
    assert fast[2].cost_per_million_tokens == pytest.approx(5.0 / 14.4)


def test_ranking_by_fitness_scores_every_candidate():
    from servesim.analysis.verdict import parse_fitness

    objectives = parse_fitness("cost_per_hour:1")
    ranked = rank_results(HAND_MADE, "fitness", objectives)
    assert [r.gpu for r in ranked][:2] in (["B", "E"], ["E", "B"])  # cheapest first
    assert ranked[0].fitness == pytest.approx(10 / (10 + 3.0))  # cost ref 10 USD/hour
    both = rank_results(HAND_MADE, "fitness", parse_fitness("cost_per_hour:1,goodput_rps:3"))
    # (10 / (10 + cost) + 3 · goodput / (goodput + 10)) / 4:
    # A 0.5338, C 0.5321, B = E 0.5256 (ties: the label), D 0.5219, F 0.5216
    assert [r.gpu for r in both] == ["A", "C", "B", "E", "D", "F"]


def test_fitness_weights_need_the_fitness_objective():
    with pytest.raises(ScenarioError, match="rank only with objective: fitness"):
        load_plan(plan_dict(objective="cost", fitness={"cost_per_hour": 1}))
    with pytest.raises(ScenarioError, match="objective fitness needs weights"):
        load_plan(plan_dict(objective="fitness"))
    plan = load_plan(plan_dict(fitness={"cost_per_hour": 1, "ttft_p99_ms": 2}))
    assert plan.objective == "fitness" and len(plan.fitness) == 2


def test_the_objective_orders_a_real_plan():
    plan = load_plan(
        plan_dict(
            search={"gpu": ["H100", "L40S"], "tp": [1, 2], "instances": {"min": 1, "max": 4}},
            requests=100,
        ),
        costs=["L40S=0.5"],
    )
    from servesim.analysis.verdict import parse_fitness

    for objective in OBJECTIVES:
        weights = parse_fitness("cost_per_hour:1,ttft_p99_ms:1") if objective == "fitness" else ()
        res = run_plan(attrs.evolve(plan, objective=objective, fitness=weights))
        assert [c.label for c in res.ranked] == [
            c.label for c in rank_results(res.candidates, objective, weights)
        ]
    cheapest = run_plan(plan).best
    assert cheapest is not None and cheapest.gpu == "L40S"  # at $0.50 per GPU-hour


# -------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"bogus": 1}, "bogus"),
        ({"scenario": None}, "scenario"),
        ({"scenario": "no-such-file.yaml"}, "scenario"),
        ({"scenario": {"model": "qwen3-14b", "workload": {"preset": "chatbot", "rate": -1}}}, "scenario.workload.rate"),
        ({"scenario": {"model": "qwen3-14b", "workload": "chatbot", "cluster": {"groups": [{"count": 2}]}}}, "scenario.cluster.groups"),
        ({"slo": {}}, "slo"),
        ({"slo": {"gold": {"ttft": "1s"}}}, "slo.gold"),
        ({"slo": {"standard": {"ttft": "soon"}}}, "slo.standard.ttft"),
        ({"attainment": 1.5}, "attainment"),
        ({"objective": "speed"}, "objective"),
        ({"requests": 0}, "requests"),
        ({"latency": "magic"}, "latency"),
        ({"costs": {"NOPE": 1}}, "costs.NOPE"),
        ({"costs": {"H100": -1}}, "costs.H100"),
        ({"search": {"zz": 1}}, "search.zz"),
        ({"search": {"gpu": ["H100", "NOPE"]}}, "search.gpu[1]"),
        ({"search": {"tp": [1, 0]}}, "search.tp[1]"),
        ({"search": {"tp": [2, 2]}}, "search.tp[1]"),
        ({"search": {"max_num_seqs": ["many"]}}, "search.max_num_seqs[0]"),
        ({"search": {"routing": ["nope"]}}, "search.routing[0]"),
        ({"search": {"instances": {"min": 4, "max": 2}}}, "search.instances.max"),
        ({"search": {"instances": {"mx": 2}}}, "search.instances.mx"),
        ({"search": {"gpu": ["H100", "L40S"], "tp": list(range(1, 101)), "max_num_seqs": [1, 2, 3]}}, "search"),
    ],
)  # fmt: skip
def test_validation_errors_name_the_field(change, path):
    data = plan_dict()
    for key, value in change.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    with pytest.raises(ScenarioError) as err:
        load_plan(data)
    assert err.value.path == path, str(err.value)


@pytest.mark.parametrize("option", ["H100", "H100=cheap", "NOPE=1"])
def test_bad_cost_options_name_the_flag(option):
    with pytest.raises(ScenarioError) as err:
        load_plan(plan_dict(), costs=[option])
    assert err.value.path.startswith("--cost")


def test_the_base_scenarios_own_gpu_need_not_fit():
    # a 70B model with the default gpu (one H100) does not fit, but plan searches gpu and tp
    plan = load_plan(
        plan_dict(
            scenario={
                "model": "llama-3.1-70b-instruct",
                "workload": {"preset": "chatbot", "rate": 2, "requests": 40},
            },
            search={"gpu": ["H100"], "tp": [1, 4], "instances": 1},
        )
    )
    by_tp = {c.tp: c for c in run_plan(plan).candidates}
    assert by_tp[1].rejected_by == "memory" and "at least 2 GPUs" in by_tp[1].reason
    assert by_tp[4].status == "feasible" and by_tp[4].latency_model == "trained-physics"
    assert "no bundled blackbox coefficients" in by_tp[4].latency_note


# ------------------------------------------------------------------ example, files, CLI


def test_the_example_plan_runs(tmp_path):
    plan = load_plan(EXAMPLE, requests=300)
    assert plan.candidate_count == 24
    res = run_plan(plan)
    assert res.ranked and res.pareto
    by_reason = {(c.gpu, c.tp, c.rejected_by) for c in res.rejected}
    assert by_reason == {("L40S", 1, "memory"), ("L40S", 2, "slo")}
    assert {c.latency_model for c in res.ranked} == {"blackbox", "trained-physics"}
    assert {c.latency_model for c in res.ranked if c.gpu == "H100" and c.tp == 1} == {"blackbox"}
    files = write_plan(res, tmp_path / "out")
    assert [f.name for f in files] == ["plan.json", "plan.csv"]
    data = json.loads(files[0].read_text(encoding="utf-8"))
    assert data["best"] == res.best.label and len(data["candidates"]) == 24
    assert data["pareto_front"] == [c.label for c in res.pareto]
    with files[1].open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 24
    assert rows[0]["rank"] == "1" and rows[-1]["status"] == "rejected"
    assert not list((tmp_path / "out").glob(".*")), "no temporary file left behind"
    text = format_plan(res)
    for part in ("ranked by cost", "Pareto front", "rejected:", "best by cost"):
        assert part in text


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="servesim")
    add_plan_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_the_command_line(tmp_path, capsys):
    plan_file = tmp_path / "p.yaml"
    data = plan_dict(search={"gpu": ["H100", "L40S"], "tp": [1], "instances": {"min": 1, "max": 2}})
    plan_file.write_text(json.dumps(data), encoding="utf-8")
    prices = tmp_path / "prices.yaml"
    prices.write_text("L40S: 0.25\n", encoding="utf-8")
    args = parse(
        ["plan", str(plan_file), "--out", str(tmp_path / "o"), "--objective", "goodput",
         "--cost", "H100=1", "--costs", str(prices), "--requests", "50"]
    )  # fmt: skip
    assert args.handler is cmd_plan
    assert cmd_plan(args) == 0
    out = capsys.readouterr().out
    assert "ranked by goodput" in out and "H100 1.00 (--cost)" in out
    assert f"L40S 0.25 (--costs {prices})" in out and "50 requests per simulation" in out
    saved = json.loads((tmp_path / "o" / "plan.json").read_text(encoding="utf-8"))
    assert saved["objective"] == "goodput" and saved["requests_per_candidate"] == 50
    # nothing feasible: exit code 1, every candidate listed with its reason
    data["slo"] = {"standard": {"itl": "1ms"}}
    plan_file.write_text(json.dumps(data), encoding="utf-8")
    assert cmd_plan(parse(["plan", str(plan_file), "--out", str(tmp_path / "o2")])) == 1
    out = capsys.readouterr().out
    assert "no candidate meets the SLO" in out and out.count("SLO not met even at 2") == 2
    with pytest.raises(ScenarioError) as err:
        cmd_plan(parse(["plan", str(plan_file), "--requests", "0"]))
    assert err.value.path == "--requests"
