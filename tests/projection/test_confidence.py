"""The confidence ladder: the rung each latency-model path gets, in summary.json, on the run's
console line and in the HTML report (issue 18 item 4)."""

from __future__ import annotations

import yaml

import servesim
from servesim.latency.base import LatencyContext, LatencyModel
from servesim.latency.expert_parallel import instance_latency
from servesim.projection import project
from servesim.projection.confidence import RUNGS, confidence_of, run_confidence
from servesim.scenario import latency_context, load_scenario
from tests.conftest import scenario_dict


def rung(model: str, params: dict | None = None, name: str = "qwen3-14b", gpu: str = "H100") -> str:
    s = load_scenario(None, [f"model={name}", f"gpu={gpu}"])
    latency = instance_latency(
        model, params or {}, latency_context(s.model, s.gpu, s.tp), "latency"
    )
    return confidence_of(latency).level


def test_bundled_blackbox_coefficients_are_measured():
    assert rung("blackbox") == "measured"


def test_blackbox_coefficients_of_unknown_origin_are_fitted(tmp_path):
    assert rung("blackbox", {"alpha": [0, 0, 0], "beta": [1000, 1, 10]}) == "fitted"
    file = tmp_path / "fit.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "format": "servesim-latency-coefficients/1",
                "alpha": [0, 0, 0],
                "beta": [1000, 1, 10],
            }
        ),
        encoding="utf-8",
    )
    assert rung("blackbox", {"file": str(file)}) == "fitted"


def test_trained_physics_is_fitted_and_roofline_is_physics():
    assert rung("trained-physics") == "fitted"
    assert rung("roofline") == "physics"


def test_a_wrapper_takes_its_base_models_rung():
    assert rung("overheads", {"base": "roofline", "step": "100us"}) == "physics"
    assert rung("interference", {"base": "blackbox", "prefill_factor": 0.5}) == "measured"


def test_a_measured_step_time_profile_is_measured():
    context = LatencyContext("facebook/opt-13b", "A100-80", 1)
    latency = instance_latency("distserve-profile", {}, context, "latency")
    assert confidence_of(latency).level == "measured"


def test_a_plugin_model_that_states_nothing_is_unknown():
    class Constant(LatencyModel):
        name = "constant-for-test"

        def step_time_us(self, batch):
            return 1000

    assert confidence_of(Constant()).level == "unknown"


def test_a_run_reports_its_rung_in_summary_json_the_console_and_the_report():
    from servesim.analysis.report import _run_facts
    from servesim.cli import format_summary

    data = scenario_dict(requests=20)  # blackbox with coefficients given in the scenario
    results = servesim.simulate(servesim.load_scenario(data))
    assert results.summary["confidence"] == {
        "level": "fitted",
        "rank": RUNGS["fitted"],
        "detail": "blackbox coefficients given in the scenario",
    }
    assert "latency blackbox (fitted)," in format_summary(results.summary).splitlines()[0]
    assert "fitted: blackbox coefficients given in the scenario" in _run_facts(results.summary)


def test_several_instance_groups_report_the_weakest_rung():
    bundled = {"model": "blackbox", "provenance": {"source": "bundled"}}
    assert run_confidence([bundled, {"model": "roofline"}])["level"] == "physics"
    assert run_confidence([bundled])["level"] == "measured"


def test_the_projection_states_the_rung_of_each_group():
    p = project(load_scenario(None, ["latency.model=roofline", "workload.rate=5"]))
    assert p.confidence.level == "physics"
    assert p.to_dict()["groups"][0]["confidence"]["level"] == "physics"


def test_an_anchor_carried_to_another_configuration_is_transported():
    far = rung("anchored", {"anchor": {"tp": 1}}, name="llama-3.1-8b-instruct", gpu="H100")
    assert far == "measured"  # anchor = target (the scenario is at tp 1): the anchor's own rung
    s = load_scenario(None, ["model=llama-3.1-8b-instruct", "gpu=H100", "tp=2"])
    latency = instance_latency(
        "anchored", {"anchor": {"tp": 1}}, latency_context(s.model, s.gpu, s.tp), "latency"
    )
    c = confidence_of(latency)
    assert c.level == "transported" and "tp" in c.detail
