"""Metrics and result files (DESIGN §7): percentiles, summary fields, atomic and deterministic writes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import servesim
from servesim.analysis import metrics, tables, writing
from servesim.analysis.metrics import percentile, weighted_percentile
from servesim.analysis.summary import summarize
from servesim.analysis.writing import write_results
from servesim.components.record import STATUS_COMPLETED
from servesim.simcore.errors import ScenarioError

SMALL = {
    "seed": 7,
    "engine": {"kv_blocks": 3000},
    "workload": {"preset": "chatbot", "rate": 15, "requests": 120},
}


@pytest.fixture(scope="module")
def run() -> servesim.Results:
    return servesim.simulate(servesim.load_scenario(SMALL))


# ------------------------------------------------------------------ percentiles

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
percentiles = st.floats(min_value=0.0, max_value=100.0)


@given(st.lists(finite, min_size=1, max_size=200), percentiles)
def test_percentile_matches_numpy_linear(values, p):
    data = np.sort(np.array(values))
    expected = float(np.percentile(data, p, method="linear"))
    assert percentile(data, p) == pytest.approx(expected, rel=1e-12, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_percentile_matches_numpy_on_random_latency_arrays(seed):
    rng = np.random.default_rng(seed)
    data = np.sort(rng.lognormal(3.0, 1.0, size=int(rng.integers(1, 5000))))
    for p in (0, 1, 50, 90, 95, 99, 99.9, 100):
        assert percentile(data, p) == pytest.approx(
            np.percentile(data, p, method="linear"), rel=1e-12
        )


def test_percentile_edge_cases():
    assert percentile(np.array([]), 50) == 0.0
    assert percentile(np.array([4.0]), 99) == 4.0
    data = np.array([1.0, 2.0, 3.0, 4.0])
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 4.0
    assert percentile(data, 50) == 2.5


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=6)),
        min_size=1,
        max_size=40,
    ),
    percentiles,
)
def test_weighted_percentile_equals_percentile_of_the_expanded_multiset(pairs, p):
    values = np.array([v for v, _ in pairs], dtype=np.int64)
    weights = np.array([w for _, w in pairs], dtype=np.int64)
    expanded = np.sort(np.repeat(values, weights).astype(np.float64))
    expected = percentile(expanded, p)
    assert weighted_percentile(values, weights, p) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_weighted_percentile_with_no_weight_is_zero():
    assert weighted_percentile(np.array([5, 6]), np.array([0, 0]), 50) == 0.0


# ------------------------------------------------------------------ summary

SUMMARY_FIELDS = [
    f"{metric}_{stat}_ms"
    for metric in ("ttft", "itl", "e2e", "scheduling_delay")
    for stat in ("mean", "p50", "p90", "p95", "p99")
] + [
    "responses_per_sec",
    "tokens_per_sec",
    "preemption_count",
    "cache_hit_rate",
    "kv_utilization_mean",
    "conservation",
    "audit",
]


def test_summary_has_the_documented_fields(run):
    missing = [k for k in SUMMARY_FIELDS if k not in run.summary]
    assert not missing, missing
    assert run.summary["audit"]["checked"] and run.summary["audit"]["passed"]
    c = run.summary["conservation"]
    assert c["balanced"] and c["injected"] == c["completed"] == 120


def test_summary_is_json_serialisable_without_nan(run):
    text = writing.dumps_summary(run.summary)
    assert json.loads(text)["injected_requests"] == 120


def test_summary_latency_percentiles_agree_with_the_per_request_table(run):
    req = run.requests
    done = req["status"] == 0
    ttft_ms = (req["first_token_us"] - req["arrival_us"])[done] / 1000.0
    e2e_ms = (req["completion_us"] - req["arrival_us"])[done] / 1000.0
    for p in (50, 90, 95, 99):
        assert run.summary[f"ttft_p{p}_ms"] == pytest.approx(np.percentile(ttft_ms, p))
        assert run.summary[f"e2e_p{p}_ms"] == pytest.approx(np.percentile(e2e_ms, p))
    assert run.summary["ttft_mean_ms"] == pytest.approx(ttft_ms.mean())


PREEMPTING = {
    "seed": 3,
    "engine": {"kv_blocks": 150, "max_model_len": 2048},
    "workload": {"preset": "chatbot", "rate": 30, "requests": 150},
}


@pytest.mark.parametrize("config", [SMALL, PREEMPTING], ids=["steady", "preempting"])
def test_itl_from_the_step_log_agrees_with_per_request_gap_sums(config, run):
    """Every completed request with n tokens has n-1 inter-token gaps; their total duration is
    the same whether counted from the step log (ITL) or per request (itl_sum_us), including
    gaps that span a preemption."""
    if config is not SMALL:
        run = servesim.simulate(servesim.load_scenario(config))
        assert run.summary["preemption_count"] > 0
    req = run.requests
    done = req["status"] == 0
    gaps = int((req["output_tokens"][done] - 1).sum())
    assert run.summary["itl_gaps"] == gaps
    total_ms = req["itl_sum_us"][done].sum() / 1000.0
    assert run.summary["itl_mean_ms"] * gaps == pytest.approx(total_ms, rel=1e-9)


def test_throughput_is_completions_over_simulated_time(run):
    s = run.summary
    assert s["responses_per_sec"] == pytest.approx(s["completed_requests"] / s["sim_duration_s"])
    assert s["tokens_per_sec"] == pytest.approx(s["total_output_tokens"] / s["sim_duration_s"])


# ------------------------------------------------------------------ writing


def entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_write_results_writes_every_file(run, tmp_path):
    out = run.write(tmp_path / "r")
    assert entries(out) == sorted(
        ["requests.csv", "scenario.yaml", "steps.npz", "summary.json", "timeseries.csv"]
    )
    assert entries(tmp_path) == ["r"]  # no temp dirs left behind
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) == 1 + 120


def test_written_scenario_yaml_loads_back_to_the_same_scenario(run, tmp_path):
    out = run.write(tmp_path / "r")
    again = servesim.load_scenario(out / "scenario.yaml")
    assert again.to_yaml() == run.scenario.to_yaml()
    assert again.engine == run.scenario.engine


def test_rewriting_replaces_the_target_directory_wholly(run, tmp_path):
    out = tmp_path / "r"
    run.write(out)
    (out / "stale.txt").write_text("from an older run", encoding="utf-8")
    run.write(out)
    assert "stale.txt" not in entries(out)
    assert entries(tmp_path) == ["r"]


def test_a_failure_while_writing_leaves_the_previous_results_intact(run, tmp_path, monkeypatch):
    out = tmp_path / "r"
    run.write(out)
    before = {name: (out / name).read_bytes() for name in entries(out)}

    def broken(fh, record):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(writing, "write_requests_csv", broken)
    with pytest.raises(ScenarioError, match="disk full"):
        write_results(out, run.summary, run.record, run.scenario)
    assert {name: (out / name).read_bytes() for name in entries(out)} == before
    assert entries(tmp_path) == ["r"], "temporary directories were left behind"


def test_a_failure_on_the_first_write_leaves_nothing_behind(run, tmp_path, monkeypatch):
    monkeypatch.setattr(writing, "write_requests_csv", lambda fh, record: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        write_results(tmp_path / "r", run.summary, run.record, run.scenario)
    assert entries(tmp_path) == []


def _dead_pid() -> int:
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # exited and reaped: no process has this pid now (pids are not reused at once)


def test_summary_json_is_written_last(run, tmp_path, monkeypatch):
    # A run killed mid-write must not leave a complete-looking summary.json beside missing files.
    order: list[str] = []
    real = Path.write_text

    def recording(self, *args, **kwargs):
        order.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", recording)
    run.write(tmp_path / "r")
    assert order[-1] == "summary.json" and order.count("summary.json") == 1


def test_the_leftovers_of_a_killed_writer_are_removed_by_the_next_write(run, tmp_path):
    dead = _dead_pid()
    partial = tmp_path / f".r.partial-{dead}-abc123"
    partial.mkdir()
    (partial / "summary.json").write_text("{}", encoding="utf-8")
    alive = tmp_path / f".r.partial-{os.getppid()}-def456"  # another writer, still running
    alive.mkdir()
    run.write(tmp_path / "r")
    assert not partial.exists() and alive.exists()


def test_a_kill_between_the_two_renames_loses_no_result(run, tmp_path, monkeypatch):
    out = tmp_path / "r"
    run.write(out)
    before = (out / "summary.json").read_bytes()
    real_replace = os.replace
    calls = []

    def killed_at_the_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here, before `out` is back
        return real_replace(src, dst)

    monkeypatch.setattr(writing.os, "replace", killed_at_the_second_rename)
    with pytest.raises(KeyboardInterrupt):
        write_results(out, run.summary, run.record, run.scenario)
    monkeypatch.setattr(writing.os, "replace", real_replace)
    assert not out.exists()
    # The killed writer's `old` directory holds the previous result; rename it to a dead pid,
    # as a real kill would leave it, and the next look puts the result back.
    (old,) = tmp_path.glob(".r.old-*")
    old.rename(tmp_path / f".r.old-{_dead_pid()}-xyz")
    loaded = servesim.load_results(out)  # reading the results puts them back first
    assert (out / "summary.json").read_bytes() == before
    assert loaded.summary["completed_requests"] == run.summary["completed_requests"]
    assert entries(tmp_path) == ["r"]


def test_same_scenario_and_seed_write_byte_identical_summaries(tmp_path):
    scenario = servesim.load_scenario(SMALL)
    first = servesim.simulate(scenario).write(tmp_path / "a")
    second = servesim.simulate(servesim.load_scenario(SMALL)).write(tmp_path / "b")
    for name in ("summary.json", "requests.csv", "timeseries.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_different_seed_changes_the_results():
    a = servesim.simulate(servesim.load_scenario(SMALL)).summary
    b = servesim.simulate(servesim.load_scenario({**SMALL, "seed": 8})).summary
    assert a["ttft_p50_ms"] != b["ttft_p50_ms"]


def test_summarize_without_a_scenario_or_audit_still_has_the_fields(run):
    summary = summarize(run.record)
    assert summary["audit"] == {"checked": False}
    assert "scenario" not in summary
    for key in SUMMARY_FIELDS[:-1]:
        assert key in summary


def test_a_run_spanning_years_gets_a_bounded_time_series():
    # Three requests a month apart: sampled every second, the series would hold ~5 million
    # rows per instance; it is widened to the size guard instead.
    scenario = servesim.load_scenario(
        {"workload": {"preset": "chatbot", "rate": 3.8e-7, "requests": 3, "arrival": "constant"}}
    )
    result = servesim.simulate(scenario)
    assert result.record.end_us > 2 * tables.MAX_TIMESERIES_SAMPLES * 1_000_000
    series = tables.timeseries(result.record, 1_000_000)
    assert 0 < len(series["time_s"]) <= tables.MAX_TIMESERIES_SAMPLES + 1


def test_vllm_benchmark_names_follow_vllm_definitions(run):
    s = run.summary
    req = metrics.request_arrays(run.record)
    done = req["status"] == STATUS_COMPLETED
    arrival = req["arrival_us"][done]
    ttft_ms = (req["first_token_us"][done] - arrival) / 1000.0
    out = req["output_tokens"][done]
    e2e_ms = (req["completion_us"][done] - arrival) / 1000.0
    many = out > 1
    tpot_ms = (e2e_ms - ttft_ms)[many] / (out[many] - 1)
    assert s["request_throughput"] == pytest.approx(done.sum() / s["sim_duration_s"])
    assert s["output_throughput"] == pytest.approx(out.sum() / s["sim_duration_s"])
    assert s["total_token_throughput"] == pytest.approx(
        (out.sum() + req["prompt_tokens"][done].sum()) / s["sim_duration_s"]
    )
    assert s["mean_ttft_ms"] == pytest.approx(ttft_ms.mean())
    assert s["median_ttft_ms"] == pytest.approx(np.median(ttft_ms))
    assert s["std_ttft_ms"] == pytest.approx(ttft_ms.std())
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile(ttft_ms, 99))
    assert s["mean_e2el_ms"] == pytest.approx(e2e_ms.mean())
    # TPOT as vLLM: (E2E - TTFT)/(output - 1), only requests with more than one token;
    # E2E includes the latency model's post-decode overhead, which is 0 for this model.
    assert s["mean_tpot_ms"] == pytest.approx(tpot_ms.mean(), rel=1e-9)
    # ITL: every gap, the same statistic as the itl_* fields
    assert s["mean_itl_ms"] == s["itl_mean_ms"] and s["p99_itl_ms"] == s["itl_p99_ms"]
    gaps, weights = metrics.itl_gaps(run.record)
    expanded = np.repeat(gaps, weights) / 1000.0
    assert s["std_itl_ms"] == pytest.approx(expanded.std())
    assert s["median_itl_ms"] == pytest.approx(np.median(expanded))


def test_every_table_of_a_run_as_a_dataframe_in_memory_and_loaded(tmp_path):
    pd = pytest.importorskip("pandas")
    scenario = servesim.load_scenario(
        {
            **SMALL,
            "workload": {**SMALL["workload"], "requests": 40},
            "output": {"trace": "decisions"},
        }
    )
    result = servesim.simulate(scenario)
    loaded = servesim.load_results(result.write(tmp_path / "r"))
    for table in ("timeseries", "instances", "steps", "decisions"):
        memory, disk = result.to_pandas(table), loaded.to_pandas(table)
        assert len(memory) > 0
        pd.testing.assert_frame_equal(memory, disk)
    steps = loaded.to_pandas("steps")
    assert len(steps) == loaded.summary["steps"] and set(steps["instance"]) == {0}
    requests = loaded.to_pandas("requests")
    assert len(requests) == 40 and requests.index.name == "id"
    # a request that never completed has pd.NA, not a sentinel, where it got no further
    cut = servesim.load_scenario({**SMALL, "horizon": "2s"})
    unfinished = servesim.simulate(cut).write(tmp_path / "h")
    table = servesim.load_results(unfinished).to_pandas("requests")
    assert table["completion_s"].isna().any()
    with pytest.raises(ScenarioError, match="not disaggregated"):
        loaded.to_pandas("transfers")
    with pytest.raises(ScenarioError, match="must be one of"):
        loaded.to_pandas("nope")


def test_per_class_itl_mean_is_the_top_level_itl_mean_for_a_single_class(run):
    s = run.summary
    assert s["completed_requests"] == s["injected_requests"]  # every gap belongs to a request
    (only,) = s["per_class"].values()
    assert only["itl_mean_ms"] == pytest.approx(s["itl_mean_ms"], rel=1e-9)
    assert only["tpot_mean_ms"] == pytest.approx(s["mean_tpot_ms"], rel=1e-9)
