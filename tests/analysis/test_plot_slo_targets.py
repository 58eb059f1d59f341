"""The SLO targets a latency figure draws come from the scenario's one SLO parser."""

from __future__ import annotations

from pathlib import Path

from servesim.analysis.plots.data import ResultsData


def data(scenario_yaml: str) -> ResultsData:
    return ResultsData(Path("."), {}, {}, {}, None, None, scenario_yaml=scenario_yaml)


def test_targets_are_read_in_ms_with_the_scenario_parsers_units():
    text = "slo:\n  critical: {ttft: 200ms, e2e: 2s}\n  batch: {itl: 50000us}\n"
    assert data(text).slo_targets_ms() == {
        "critical": {"ttft": 200.0, "e2e": 2000.0},
        "batch": {"itl": 50.0},
    }


def test_a_section_the_scenario_parser_refuses_draws_no_target():
    assert data("slo:\n  gold: {ttft: 200ms}\n").slo_targets_ms() == {}  # unknown class
    assert data("slo:\n  critical: {ttft: soon}\n").slo_targets_ms() == {}
    assert data("name: x\n").slo_targets_ms() == {}
