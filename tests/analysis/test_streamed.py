"""The summary's per-request figures are built from slices of the request table
(``servesim.analysis.streamed``): with slices of a few rows they equal one slice of everything,
and they equal the whole-column functions they replace in the summary (``per_class_latency``,
``goodput``, ``latency_stats_ms``, ``vllm_benchmark_metrics``, ``verdict_of_run``)."""

from __future__ import annotations

import numpy as np
import pytest

import servesim
from servesim.analysis.metrics import itl_gaps, latency_stats_ms, vllm_benchmark_metrics
from servesim.analysis.summary import summarize
from servesim.analysis.verdict import verdict_of_run
from servesim.audit import chunks as chunks_module
from servesim.policies.metrics import goodput, per_class_latency
from tests.test_spill import SCENARIOS


def _simulate(name: str) -> servesim.Results:
    source, overrides = SCENARIOS[name]
    return servesim.simulate(servesim.load_scenario(source, overrides))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("size", [1, 3])
def test_the_summary_read_in_small_slices_equals_the_summary_read_whole(name, size, monkeypatch):
    results = _simulate(name)
    monkeypatch.setattr(chunks_module, "CHUNK_ROWS", size)
    again = summarize(results.record, results.scenario, results.summary["audit"])
    assert again == results.summary
    assert list(again) == list(results.summary)  # the same fields in the same order


@pytest.fixture(scope="module")
def with_classes() -> servesim.Results:
    """A run with SLO classes, targets and refusals (the flow-control example, long enough to
    overload the cluster so that some requests miss their targets)."""
    source, _ = SCENARIOS["flow-control"]
    return servesim.simulate(servesim.load_scenario(source, ["workload.requests=1200"]))


def _whole_columns(results: servesim.Results):
    r = results.requests
    done = r["status"] == 0
    out = r["output_tokens"]
    ttft = (r["first_token_us"] - r["arrival_us"]) / 1000.0
    itl = np.where(out > 1, r["itl_sum_us"] / np.maximum(out - 1, 1) / 1000.0, np.nan)
    e2e = (r["completion_us"] - r["arrival_us"]) / 1000.0
    return r, done, ttft, itl, e2e


def test_per_class_figures_equal_the_whole_column_functions(with_classes, monkeypatch):
    monkeypatch.setattr(chunks_module, "CHUNK_ROWS", 5)
    s = summarize(with_classes.record, with_classes.scenario)
    r, done, ttft, itl, e2e = _whole_columns(with_classes)
    classes = with_classes.record.requests.labels("slo_class")
    gaps = np.maximum(r["output_tokens"] - 1, 0)
    expected = per_class_latency(ttft, itl, e2e, done, r["slo_class"], classes, gaps=gaps)
    assert len(expected) > 1 and s["per_class"] == expected
    slo = with_classes.scenario.slo
    targets = {
        c: {
            "ttft_ms": t.ttft_us / 1000.0 if t.ttft_us else None,
            "itl_ms": t.itl_us / 1000.0 if t.itl_us else None,
            "e2e_ms": t.e2e_us / 1000.0 if t.e2e_us else None,
        }
        for c, t in slo.items()
    }
    injected = {name: int((r["slo_class"] == code).sum()) for code, name in enumerate(classes)}
    g = goodput(
        ttft, itl, e2e, done, r["slo_class"], targets, injected, s["sim_duration_s"], classes
    )
    assert g["good"] < g["injected"]  # some requests missed: the counts are not trivially full
    assert s["goodput"] == g["per_class"]
    assert (s["slo_attainment"], s["goodput_rps"]) == (g["slo_attainment"], g["goodput_rps"])


def test_latency_figures_equal_the_whole_column_functions(with_classes, monkeypatch):
    monkeypatch.setattr(chunks_module, "CHUNK_ROWS", 5)
    s = summarize(with_classes.record, with_classes.scenario)
    r, done, *_ = _whole_columns(with_classes)
    arrival, out = r["arrival_us"][done], r["output_tokens"][done]
    ttft = r["first_token_us"][done] - arrival
    e2e = r["completion_us"][done] - arrival
    tpot = np.where(out > 1, r["itl_sum_us"][done] / np.maximum(out - 1, 1), 0.0)
    expected = {
        **latency_stats_ms(ttft, "ttft"),
        **latency_stats_ms(tpot, "tpot"),
        **latency_stats_ms(e2e, "e2e"),
        **latency_stats_ms(r["first_scheduled_us"][done] - arrival, "scheduling_delay"),
    }
    gaps, weights = itl_gaps(with_classes.record)
    expected.update(
        vllm_benchmark_metrics(
            ttft=ttft,
            tpot=tpot[out > 1],
            e2e=e2e,
            gaps=gaps,
            gap_weights=weights,
            input_tokens=int(r["prompt_tokens"][done].sum()),
            output_tokens=int(out.sum()),
            completed=int(done.sum()),
            duration_s=s["sim_duration_s"],
        )
    )
    unfinished = s["anomalies"]["unfinished_at_horizon"]
    expected.update(verdict_of_run(r, unfinished).as_summary())
    assert {k: s[k] for k in expected} == expected
