"""``servesim plan`` asks the projector first: candidates that cannot reach the target rate even
at the most instances, and (on request) candidates below a confidence rung, are rejected without
a simulation, with the reason; ``--no-prune`` simulates them."""

from __future__ import annotations

import json

import pytest

import servesim
from servesim.simcore.errors import ScenarioError
from servesim.studies.plan import cmd_plan, load_plan, run_plan
from tests.test_plan import parse, plan_dict


def _overloaded_plan() -> dict:
    """qwen3-14b chatbot at 100 req/s on at most 2 × H100 at tp 1: the projector puts one
    instance's max rate near 33 req/s (max_num_seqs binds), so two reach about 66 < 0.8 · 100."""
    data = plan_dict(search={"gpu": ["H100"], "tp": [1], "instances": {"min": 1, "max": 2}})
    data["scenario"]["workload"]["rate"] = 100
    data["requests"] = 60
    return data


def test_a_candidate_below_the_target_rate_is_rejected_without_simulating(monkeypatch):
    calls = []
    real = servesim.run.simulate
    monkeypatch.setattr(servesim.run, "simulate", lambda s, **kw: calls.append(s) or real(s, **kw))
    result = run_plan(load_plan(_overloaded_plan()))
    (candidate,) = result.candidates
    assert candidate.rejected_by == "projection"
    assert candidate.reason.startswith("projected max rate ")
    assert "< target 100.00 req/s at 2 instance(s)" in candidate.reason
    assert calls == [] and result.simulations == 0


def test_no_prune_simulates_it(tmp_path, capsys):
    """Simulated, the 60-request runs end before the backlog shows (the search may even call the
    fleet feasible): the projection's verdict on the steady state is what pruning adds."""
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text(json.dumps(_overloaded_plan()), encoding="utf-8")
    argv = ["plan", str(plan_file), "--out", str(tmp_path / "o"), "--json"]
    cmd_plan(parse([*argv, "--no-prune"]))
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulations"] > 0 and "projected max rate" not in json.dumps(doc)
    assert cmd_plan(parse(argv)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulations"] == 0 and doc["rejected"][0]["rejected_by"] == "projection"


def test_a_feasible_candidate_is_not_pruned():
    data = plan_dict(search={"gpu": ["H100"], "tp": [1], "instances": {"min": 1, "max": 2}})
    data["requests"] = 60
    (candidate,) = run_plan(load_plan(data)).candidates
    assert candidate.rejected_by != "projection"


def test_min_confidence_rejects_candidates_priced_by_a_lower_rung(tmp_path, capsys):
    data = plan_dict(search={"gpu": ["H100"], "tp": [1, 2], "instances": {"min": 1, "max": 2}})
    data["requests"] = 60
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text(json.dumps(data), encoding="utf-8")
    argv = ["plan", str(plan_file), "--out", str(tmp_path / "o"), "--json"]
    assert cmd_plan(parse([*argv, "--min-confidence", "measured"])) == 0
    doc = json.loads(capsys.readouterr().out)
    rejected = {c["label"]: c for c in doc["rejected"]}
    # qwen3-14b has bundled blackbox coefficients on H100 at tp 1 only: tp 2 is trained-physics
    (tp2,) = [c for label, c in rejected.items() if "tp2" in label]
    assert tp2["rejected_by"] == "confidence"
    assert tp2["reason"].startswith("confidence fitted < required measured")


@pytest.mark.parametrize("margin", ["1", "-0.1"])
def test_a_margin_outside_zero_to_one_is_refused_by_name(tmp_path, margin):
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text(json.dumps(_overloaded_plan()), encoding="utf-8")
    with pytest.raises(ScenarioError) as err:
        cmd_plan(parse(["plan", str(plan_file), "--prune-margin", margin]))
    assert err.value.path == "--prune-margin"
