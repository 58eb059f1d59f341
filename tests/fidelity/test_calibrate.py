"""servesim calibrate: fits that recover known coefficients, k-fold reports, the coefficients file."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import attrs
import numpy as np
import pytest
import yaml

from servesim.fidelity import (
    CalibrationReport,
    MeasuredRun,
    fit_blackbox_to_runs,
    fit_blackbox_to_steps,
    fit_overheads_to_runs,
    fit_trained_physics_to_steps,
    initial_guess,
    read_splitwise,
    read_step_table,
    write_coefficients,
)
from servesim.fidelity.calibrate import add_calibrate_parser
from servesim.fidelity.replay import simulate_run, simulated_metrics
from servesim.latency.base import BatchSummary, LatencyContext
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.latency.hardware import resolve_gpu
from servesim.latency.modelindex import resolve_model
from servesim.latency.trained import TrainedPhysicsLatencyModel
from servesim.simcore.errors import ScenarioError

pytest.importorskip("scipy")

DATA = Path(__file__).parent / "data" / "calibrate"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
SPLITWISE = SHARED / "kernels" / "splitwise_perf_model" / "perf_model.csv"
LLMSERVINGSIM_PERF = (
    SHARED
    / "measured/llmservingsim_vllm/profiles/profiler/perf/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16"
)
LLMSERVINGSIM_V0 = (
    SHARED / "measured/llmservingsim_vllm/profiles/profiler/v0/perf_models/H100/meta-llama"
    "/Llama-3.1-8B/tp1/layers.csv"
)
AICONFIGURATOR_GEMM = (
    SHARED
    / "kernels/aiconfigurator_h100_sxm/csv_sample__gemm__vllm__0.24.0__gemm_perf.head2000.csv"
)

TRUE_ALPHA = (3000.0, 0.0, 0.0)
TRUE_BETA = (5000.0, 3.0, 250.0)
SERVER = {"model": "opt-13b", "gpu": "A100-80", "tp": 1, "kv_blocks": 4000}


# ====================================================================== synthetic measured runs


def _skeleton(name: str, arrival_us, inputs, outputs) -> MeasuredRun:
    n = len(arrival_us)
    unknown = np.full(n, -1.0)
    return MeasuredRun(
        name=name,
        source="synthetic",
        system="servesim",
        arrival_us=arrival_us,
        input_tokens=inputs,
        output_tokens=outputs,
        ttft_us=unknown,
        e2e_us=unknown,
        tpot_us=unknown,
        **SERVER,
    )


def measured_by_simulation(skeleton: MeasuredRun, alpha, beta) -> MeasuredRun:
    """The run servesim itself 'measures' with known blackbox coefficients."""
    latency = {"model": "blackbox", "alpha": list(alpha), "beta": list(beta)}
    results, _ = simulate_run(skeleton, overrides={"latency": latency})
    r = results.requests
    order = np.lexsort((r["id"], r["arrival_us"]))
    assert np.array_equal(r["prompt_tokens"][order], skeleton.input_tokens)
    out = r["output_tokens"][order]
    ttft = (r["first_token_us"] - r["arrival_us"])[order].astype(float)
    e2e = (r["completion_us"] - r["arrival_us"])[order].astype(float)
    tpot = np.where(out > 1, r["itl_sum_us"][order] / np.maximum(out - 1, 1), -1.0)
    return MeasuredRun(
        name=skeleton.name,
        source="synthetic",
        system="servesim",
        arrival_us=skeleton.arrival_us,
        input_tokens=skeleton.input_tokens,
        output_tokens=out,
        ttft_us=ttft,
        e2e_us=e2e,
        tpot_us=tpot,
        **SERVER,
    )


def burst_run(name: str, sizes: list[int], seed: int) -> MeasuredRun:
    """Isolated bursts (3 s apart) of ``k`` simultaneous requests: each burst's prompts share one
    prefill step and decode together, so TTFT pins α0 + β0 + β1·(burst tokens) and TPOT pins
    β0 + β2·k; varying k and the prompt lengths makes every coefficient identifiable."""
    rng = np.random.default_rng(seed)
    arrival, inputs, outputs = [], [], []
    for j, k in enumerate(sizes):
        prompt = int(rng.integers(32, 2048 // k))
        for _ in range(k):
            arrival.append(j * 3_000_000)
            inputs.append(int(prompt * rng.uniform(0.5, 1.0)))
            outputs.append(int(rng.integers(16, 64)))
    skeleton = _skeleton(name, np.array(arrival), np.array(inputs), np.array(outputs))
    return measured_by_simulation(skeleton, TRUE_ALPHA, TRUE_BETA)


@pytest.fixture(scope="module")
def burst_runs() -> list[MeasuredRun]:
    return [
        burst_run("bursts-a", [1, 2, 4, 8, 1, 3, 6, 2], seed=1),
        burst_run("bursts-b", [8, 4, 2, 1, 5, 7, 1, 3], seed=2),
    ]


def test_a_replay_with_the_true_coefficients_matches_the_synthetic_measurement(burst_runs):
    run = burst_runs[0]
    latency = {"model": "blackbox", "alpha": list(TRUE_ALPHA), "beta": list(TRUE_BETA)}
    results, _ = simulate_run(run, overrides={"latency": latency})
    simulated = simulated_metrics(results)
    for metric, stats in run.metrics().items():
        for stat in ("mean", "p90"):
            assert simulated[metric][stat] == pytest.approx(stats[stat], rel=1e-9)


def test_the_run_fit_recovers_known_coefficients_within_2_percent(burst_runs):
    start = [x * f for x, f in zip(TRUE_ALPHA + TRUE_BETA, (1.1, 1, 1, 0.9, 1.1, 1.1))]
    report = fit_blackbox_to_runs(
        burst_runs, start=start, max_evals=100, free="alpha0,beta0,beta1,beta2"
    )
    assert report.beta == pytest.approx(TRUE_BETA, rel=0.02)
    assert report.alpha[0] == pytest.approx(TRUE_ALPHA[0], rel=0.02)
    assert report.alpha[1:] == (0.0, 0.0)  # held at the start (not fitted)
    assert report.kind == "runs" and report.latency_model == "blackbox"
    assert report.free == ("alpha0", "beta0", "beta1", "beta2")
    assert max(report.train_error.values()) < 0.01
    assert report.heldout_error is None and "folds" in report.heldout_note
    assert report.evaluations <= 100


def test_the_initial_guess_reads_the_step_terms_off_the_measurements(burst_runs):
    alpha, beta = initial_guess(burst_runs)
    assert beta[0] == pytest.approx(TRUE_BETA[0], rel=0.05)  # TPOT intercept
    assert beta[2] == pytest.approx(TRUE_BETA[2], rel=0.05)  # TPOT per co-decoding request
    assert alpha[1:] == (0.0, 0.0)
    assert min(alpha + beta) >= 0


def test_k_fold_reports_training_and_held_out_errors_separately(burst_runs):
    report = fit_blackbox_to_runs(
        burst_runs,
        folds=2,
        start=TRUE_ALPHA + TRUE_BETA,
        max_evals=12,
        free="beta0,beta1,beta2",
    )
    assert len(report.folds) == 2
    for fold in report.folds:
        assert set(fold.train).isdisjoint(fold.heldout)
        assert sorted(fold.train + fold.heldout) == ["bursts-a", "bursts-b"]
        assert set(fold.train_error) == set(fold.heldout_error) == set(report.train_error)
    assert [f.heldout for f in report.folds] == [["bursts-a"], ["bursts-b"]]
    assert report.heldout_error is not None
    assert set(report.heldout_error) == {
        f"{m}.{s}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for s in ("mean", "p90")
    }
    errors = report.to_dict()["errors"]
    assert set(errors) >= {"train", "heldout", "folds"}
    assert errors["folds"][0]["heldout"] == ["bursts-a"]


def test_one_run_has_no_held_out_error_and_says_so(burst_runs):
    report = fit_blackbox_to_runs(
        burst_runs[:1], folds=3, start=TRUE_ALPHA + TRUE_BETA, max_evals=8, free="beta0"
    )
    assert report.heldout_error is None
    assert report.folds == []
    assert "unavailable" in report.heldout_note and "one run" in report.heldout_note
    assert report.train_error  # the training error is still reported


def test_run_fit_inputs_are_checked(burst_runs):
    with pytest.raises(ScenarioError, match="objective"):
        fit_blackbox_to_runs(burst_runs, objective="ttft,itl")
    with pytest.raises(ScenarioError, match="free"):
        fit_blackbox_to_runs(burst_runs, free="gamma0")
    with pytest.raises(ScenarioError, match="start"):
        fit_blackbox_to_runs(burst_runs, start=(1, 2, 3))
    other = measured_by_simulation(
        _skeleton("tp2", np.array([0, 10]), np.array([10, 20]), np.array([3, 4])),
        TRUE_ALPHA,
        TRUE_BETA,
    )
    other.tp = 2
    with pytest.raises(ScenarioError, match=r"per \(model, GPU, TP\)"):
        fit_blackbox_to_runs([burst_runs[0], other])


# ====================================================================== step tables


def write_splitwise(path: Path, rows: list[tuple]) -> Path:
    header = (
        "model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,"
        "prompt_time,token_time,e2e_time,tensor_parallel"
    )
    with path.open("w", newline="") as fh:
        fh.write(header + "\n")
        writer = csv.writer(fh)
        for model, hw, p, b, t, prompt_ms, token_ms, tp in rows:
            e2e = prompt_ms + (t - 1) * token_ms
            writer.writerow([model, hw, p, b, t, 1.0, 0.7, prompt_ms, token_ms, e2e, tp])
    return path


SWEEP = [(p, 1, 128) for p in (128, 256, 512, 1024, 2048)] + [(512, b, 128) for b in (2, 4, 8, 16)]


def test_the_step_fit_recovers_known_blackbox_betas_within_2_percent(tmp_path):
    b0, b1, b2 = 12000.0, 35.0, 180.0
    rows = []
    for i, (p, b, t) in enumerate(SWEEP):
        for wobble in (0.995, 1.0, 1.005):  # three repeats with ±0.5 % measurement noise
            jitter = wobble if i % 2 else 2 - wobble
            prompt_ms = (b0 + b1 * b * p) / 1000 * jitter
            token_ms = (b0 + b2 * b) / 1000 * (2 - jitter)
            rows.append(("toy-7b", "gpu-x", p, b, t, prompt_ms, token_ms, 1))
    table = read_splitwise(write_splitwise(tmp_path / "perf.csv", rows))
    assert table.describe()["rows"] == {"prefill": 27, "decode": 27}
    report = fit_blackbox_to_steps(table, folds=3)
    assert report.beta == pytest.approx((b0, b1, b2), rel=0.02)
    assert report.alpha == (0.0, 0.0, 0.0)
    assert report.train_error["all_steps.median"] < 0.01
    assert report.heldout_error["all_steps.median"] < 0.01
    assert len(report.folds) == 3
    assert {tuple(f.heldout) for f in report.folds} == {("6 points",)}


def test_the_step_fit_recovers_known_trained_physics_betas_within_2_percent(tmp_path):
    spec = resolve_model("llama-3.1-8b-instruct").require_spec("model", "test")
    gpu = resolve_gpu("H100")
    beta = [0.8, 1.1, 1.36252915, 0.752037, 32.09546717, 60.0, 4000.0, 481.8613888, 0.0, 1.9]
    beta.append(0.752037)
    model = TrainedPhysicsLatencyModel(spec, gpu, 1, alpha=(0, 0, 0), beta=beta)
    rows = []
    for p, b, t in SWEEP + [(512, 1, 2048), (512, 1, 8192), (512, 32, 1024)]:
        prefill = model.step_time_us(BatchSummary(b * p, ((0, p, p),) * b, 0, 0))
        decode = model.step_time_us(BatchSummary(0, (), b, b * (p + t // 2)))
        rows.append(("toy-8b", "h100", p, b, t, prefill / 1000, decode / 1000, 1))
    table = read_splitwise(write_splitwise(tmp_path / "perf.csv", rows))
    report = fit_trained_physics_to_steps(table, llm="llama-3.1-8b-instruct", gpu="H100", folds=0)
    fitted = dict(zip(("b1a", "b2a", "b6", "b7", "b10"), (report.beta[i] for i in (0, 1, 5, 6, 9))))
    assert fitted == pytest.approx(
        {"b1a": 0.8, "b2a": 1.1, "b6": 60.0, "b7": 4000.0, "b10": 1.9}, rel=0.02
    )
    assert report.beta[2] == beta[2]  # held at the bundled value
    assert report.latency_model == "trained-physics" and len(report.beta) == 11
    assert report.heldout_error is None and "folds >= 2" in report.heldout_note


def test_a_splitwise_table_must_name_one_model_and_hardware(tmp_path):
    rows = [
        ("m-a", "gpu-1", 128, 1, 128, 10.0, 5.0, 1),
        ("m-b", "gpu-1", 128, 1, 128, 10.0, 5.0, 1),
    ]
    path = write_splitwise(tmp_path / "perf.csv", rows)
    with pytest.raises(ScenarioError, match="m-a, m-b"):
        read_splitwise(path)
    with pytest.raises(ScenarioError, match="available: m-a, m-b"):
        read_splitwise(path, model="m-c")
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text().replace("10.0", "-1", 1))
    with pytest.raises(ScenarioError, match=r"bad.csv:2.*prompt_time"):
        read_splitwise(bad, model="m-a")


@pytest.mark.skipif(not SPLITWISE.is_file(), reason="shared Splitwise data not available")
def test_the_real_splitwise_table_gives_positive_betas_and_a_held_out_error():
    table = read_step_table(SPLITWISE, model="llama2-70b", hardware="a100-80gb", tp=4)
    report = fit_blackbox_to_steps(table, folds=5)
    assert all(b > 0 for b in report.beta)
    assert report.heldout_error is not None and len(report.folds) == 5
    assert report.heldout_error["decode_step.median"] < 0.1
    trained = fit_trained_physics_to_steps(table, folds=5)
    assert trained.heldout_error is not None
    assert trained.beta[0] > 0  # the prefill compute correction
    assert any("llama-3.1-70b-instruct" in note for note in trained.notes)


@pytest.mark.skipif(
    not LLMSERVINGSIM_PERF.is_dir(), reason="shared LLMServingSim data not available"
)
def test_an_llmservingsim_profile_is_composed_into_steps_and_fitted():
    table = read_step_table(LLMSERVINGSIM_PERF, max_context=2048)
    assert table.format == "llmservingsim-profile" and table.tps == (1,)
    assert set(np.unique(table.kind)) == {"prefill", "decode", "mixed"}
    report = fit_blackbox_to_steps(table, folds=2)
    assert all(b > 0 for b in report.beta) and report.heldout_error is not None
    with pytest.raises(ScenarioError, match="all-reduce"):
        read_step_table(LLMSERVINGSIM_PERF, tp=2)


@pytest.mark.skipif(
    not (LLMSERVINGSIM_V0.is_file() and AICONFIGURATOR_GEMM.is_file()),
    reason="shared kernel tables not available",
)
def test_tables_that_cannot_give_step_times_are_refused_with_the_reason():
    with pytest.raises(ScenarioError, match="empty KV cache"):
        read_step_table(LLMSERVINGSIM_V0)
    with pytest.raises(ScenarioError, match="database folder"):
        read_step_table(AICONFIGURATOR_GEMM)


# ====================================================================== the coefficients file


def _report() -> CalibrationReport:
    return CalibrationReport(
        latency_model="blackbox",
        alpha=(1500.0, 0.25, 12.0),
        beta=(6000.0, 2.5, 90.0),
        kind="runs",
        fitted_on={"kind": "runs", "runs": [{"name": "r1", "source": "r1.csv", "requests": 10}]},
        objective="ttft,tpot,e2e",
        train_error={"ttft_ms.mean": 0.01},
        heldout_error={"ttft_ms.mean": 0.05},
    )


def test_the_written_file_loads_as_the_blackbox_latency_of_a_scenario(tmp_path, burst_runs):
    path = write_coefficients(_report(), tmp_path / "fit" / "coefficients.yaml")
    assert not list(path.parent.glob(".*.tmp"))  # the temporary file was renamed
    data = yaml.safe_load(path.read_text())
    assert data["alpha"] == [1500.0, 0.25, 12.0] and data["beta"] == [6000.0, 2.5, 90.0]
    assert data["errors"]["train"] == {"ttft_ms.mean": 0.01}
    assert data["errors"]["heldout"] == {"ttft_ms.mean": 0.05}
    assert data["servesim_version"] and data["created"]

    context = LatencyContext("opt-13b", "A100-80", 1)
    model = BlackboxLatencyModel.from_config({"file": str(path)}, context)
    assert model.alpha == (1500.0, 0.25, 12.0) and model.beta == (6000.0, 2.5, 90.0)
    described = model.describe()["provenance"]
    assert described["source"] == "file" and described["file"] == str(path)
    assert described["errors"]["heldout"] == {"ttft_ms.mean": 0.05}

    by_file, _ = simulate_run(
        burst_runs[0], overrides={"latency": {"model": "blackbox", "file": str(path)}}
    )
    inline, _ = simulate_run(
        burst_runs[0],
        overrides={
            "latency": {"model": "blackbox", "alpha": [1500, 0.25, 12], "beta": [6000, 2.5, 90]}
        },
    )
    assert np.array_equal(by_file.requests["completion_us"], inline.requests["completion_us"])
    assert by_file.summary["scenario"]["latency"]["provenance"]["file"] == str(path)


def test_a_relative_file_is_resolved_against_the_working_directory(tmp_path, monkeypatch):
    write_coefficients(_report(), tmp_path / "c.yaml")
    monkeypatch.chdir(tmp_path)
    context = LatencyContext("opt-13b", "A100-80", 1)
    model = BlackboxLatencyModel.from_config({"file": "c.yaml"}, context)
    assert model.beta == (6000.0, 2.5, 90.0)


@pytest.mark.parametrize(
    ("edit", "field", "message"),
    [
        (lambda d: d.pop("beta"), "beta", "missing"),
        (lambda d: d.update(alpha=[1, 2]), "alpha", "exactly 3"),
        (lambda d: d.update(beta=[1, -2, 3]), r"beta\[1\]", "at least 0"),
        (lambda d: d.update(model="trained-physics"), "model", "another latency model"),
        (lambda d: d.update(format="v9"), "format", "servesim-latency-coefficients/1"),
        (lambda d: d.update(betas=[1, 2, 3]), "betas", "unknown field"),
    ],
)
def test_a_malformed_file_is_named_with_the_field(tmp_path, edit, field, message):
    path = write_coefficients(_report(), tmp_path / "c.yaml")
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))
    context = LatencyContext("opt-13b", "A100-80", 1)
    with pytest.raises(ScenarioError, match=rf"{path}: {field}.*{message}"):
        BlackboxLatencyModel.from_config({"file": str(path)}, context)


def test_file_is_exclusive_with_alpha_beta_and_vllm_version(tmp_path):
    path = write_coefficients(_report(), tmp_path / "c.yaml")
    context = LatencyContext("opt-13b", "A100-80", 1)
    for key, value in (("alpha", [1, 2, 3]), ("beta", [1, 2, 3]), ("vllm_version", "0.8.4")):
        with pytest.raises(ScenarioError, match=rf"latency\.{key}.*remove {key} or the file"):
            BlackboxLatencyModel.from_config({"file": str(path), key: value}, context)
    with pytest.raises(ScenarioError, match=r"latency\.file.*no such file"):
        BlackboxLatencyModel.from_config({"file": "missing.yaml"}, context)


def test_the_example_fixture_is_a_loadable_coefficients_file():
    context = LatencyContext("llama-3.1-70b-instruct", "A100-80", 4)
    model = BlackboxLatencyModel.from_config(
        {"file": str(DATA / "splitwise_llama2-70b_a100_tp4.yaml")},
        context,
    )
    assert all(b > 0 for b in model.beta)
    assert model.provenance["errors"]["heldout"]


# ====================================================================== the command


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="servesim")
    sub = parser.add_subparsers(dest="command")
    add_calibrate_parser(sub)
    return parser.parse_args(argv)


def test_the_command_prints_train_and_held_out_errors_and_writes_the_file(tmp_path, capsys):
    rows = [
        ("toy-7b", "gpu-x", p, b, t, (9000 + 30 * b * p) / 1000, (9000 + 150 * b) / 1000, 1)
        for p, b, t in SWEEP
    ]
    table = write_splitwise(tmp_path / "perf.csv", rows)
    out = tmp_path / "fit.yaml"
    args = parse(["calibrate", "--steps", str(table), "--folds", "3", "--out", str(out)])
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "held-out" in printed and "decode_step.median" in printed
    assert f"wrote {out}" in printed
    assert yaml.safe_load(out.read_text())["beta"] == pytest.approx([9000, 30, 150], rel=1e-6)


def test_the_command_needs_runs_or_a_step_table():
    args = parse(["calibrate"])
    with pytest.raises(ScenarioError, match="--steps"):
        args.handler(args)


# ====================================================================== overheads


TRUE_OVERHEADS = (3300.0, 620.0)  # first-token µs, per-step µs: off the fit's coarse grid
BLACKBOX_BASE = {
    "latency": {"model": "blackbox", "alpha": list(TRUE_ALPHA), "beta": list(TRUE_BETA)}
}
SMALL_GRID = ((0.0, 5000.0), (0.0, 1000.0))  # the default grid has 78 points; tests need few


@pytest.fixture(scope="module")
def overhead_runs(burst_runs) -> list[MeasuredRun]:
    """The burst runs 'measured' on a server with known overheads over the blackbox base."""
    out = []
    for run in burst_runs:
        results, _ = simulate_run(run, overrides=BLACKBOX_BASE, overheads=TRUE_OVERHEADS)
        r = results.requests
        order = np.lexsort((r["id"], r["arrival_us"]))
        out_tokens = r["output_tokens"][order]
        out.append(
            MeasuredRun(
                name=run.name,
                source="synthetic",
                system="servesim",
                arrival_us=run.arrival_us,
                input_tokens=run.input_tokens,
                output_tokens=out_tokens,
                ttft_us=(r["first_token_us"] - r["arrival_us"])[order].astype(float),
                e2e_us=(r["completion_us"] - r["arrival_us"])[order].astype(float),
                tpot_us=np.where(
                    out_tokens > 1, r["itl_sum_us"][order] / np.maximum(out_tokens - 1, 1), -1.0
                ),
                **SERVER,
            )
        )
    return out


def test_the_overheads_fit_recovers_known_overheads_within_2_percent(overhead_runs):
    report = fit_overheads_to_runs(
        overhead_runs, overrides=BLACKBOX_BASE, max_evals=60, grid=SMALL_GRID
    )
    assert report.latency_model == "overheads"
    assert report.alpha[0] == pytest.approx(TRUE_OVERHEADS[0], rel=0.02)
    assert report.beta[0] == pytest.approx(TRUE_OVERHEADS[1], rel=0.02)
    assert max(report.train_error.values()) < 0.01
    assert report.heldout_error is None and "folds" in report.heldout_note


def test_the_overheads_fit_reports_held_out_errors_per_fold(overhead_runs):
    report = fit_overheads_to_runs(
        overhead_runs, overrides=BLACKBOX_BASE, folds=2, max_evals=0, grid=SMALL_GRID
    )
    assert [f.heldout for f in report.folds] == [["bursts-a"], ["bursts-b"]]
    for fold in report.folds:
        assert not set(fold.heldout) & set(fold.train)
    assert set(report.heldout_error) == set(report.train_error)


def test_an_overheads_file_round_trips_into_a_scenario(tmp_path, overhead_runs):
    report = fit_overheads_to_runs(
        overhead_runs, overrides=BLACKBOX_BASE, max_evals=0, grid=SMALL_GRID
    )
    file = write_coefficients(report, tmp_path / "overheads.yaml")
    data = yaml.safe_load(file.read_text())
    assert data["format"] == "servesim-overheads/1" and data["model"] == "overheads"
    results, _ = simulate_run(overhead_runs[0], overrides=BLACKBOX_BASE, overheads=file)
    latency = results.summary["scenario"]["latency"]
    assert latency["model"] == "overheads" and latency["provenance"]["file"] == str(file)
    assert (latency["first_token_us"], latency["step_us"]) == (
        round(report.alpha[0]),
        round(report.beta[0]),
    )


def test_the_command_fits_overheads_and_refuses_free(tmp_path, capsys, overhead_runs):
    paths = []
    for run in overhead_runs:
        path = tmp_path / f"{run.name}.csv"
        rows = ["arrival_s,input_tokens,output_tokens,ttft_s,e2e_s"]  # no server settings
        for i in range(run.n):
            rows.append(
                f"{run.arrival_us[i] / 1e6},{run.input_tokens[i]},{run.output_tokens[i]},"
                f"{run.ttft_us[i] / 1e6},{run.e2e_us[i] / 1e6}"
            )
        path.write_text("\n".join(rows) + "\n")
        paths.append(str(path))
    out = tmp_path / "fit.yaml"
    # the CSVs do not record the server: without these the replay could not size the KV cache
    server = [
        "--set=model=opt-13b",
        "--set=gpu=A100-80",
        "--set=tp=1",
        "--set=engine.kv_blocks=4000",
    ]
    args = parse(
        [
            "calibrate",
            *paths,
            *server,
            "--latency",
            "overheads",
            "--max-evals",
            "0",
            "--out",
            str(out),
        ]
    )
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert "first-token overhead" in printed and "per-step overhead" in printed
    assert out.is_file()
    with pytest.raises(ScenarioError, match="--free"):
        bad = parse(["calibrate", *paths, "--latency", "overheads", "--free", "beta0"])
        bad.handler(bad)
    with pytest.raises(ScenarioError, match="step tables cannot show"):
        steps = parse(["calibrate", "--steps", paths[0], "--latency", "overheads"])
        steps.handler(steps)


# ====================================================================== AIConfigurator


AICONFIGURATOR_DB = SHARED / "kernels/aiconfigurator_h100_sxm/aiconfigurator_core"


def _gemm_rows(points: dict[tuple[int, int, int], float]) -> dict[str, np.ndarray]:
    keys = list(points)
    return {
        "gemm_dtype": np.array(["bfloat16"] * len(keys), dtype=object),
        "m": np.array([k[0] for k in keys]),
        "n": np.array([k[1] for k in keys]),
        "k": np.array([k[2] for k in keys]),
        "latency": np.array([points[k] for k in keys]),  # ms
    }


def test_gemm_lookup_is_exact_on_the_grid_and_linear_between():
    from servesim.fidelity.steptables.aiconfigurator import _Gemm

    points = {}
    for m in (1, 64):
        for n in (128, 256):
            for k in (128, 512):
                points[(m, n, k)] = (m * n * k) / 1e6  # ms, proportional to the work
    gemm = _Gemm(_gemm_rows(points))
    assert gemm(64, 256, 512) == pytest.approx(64 * 256 * 512 / 1e3)  # µs, on the grid
    assert gemm(32.5, 256, 512) == pytest.approx(32.5 * 256 * 512 / 1e3)  # linear in m
    assert gemm(64, 192, 320) == pytest.approx(64 * 192 * 320 / 1e3)  # bilinear in n, k
    # wider than the grid: priced as GEMMs of the widest measured n
    assert gemm(64, 640, 512) == pytest.approx(2 * gemm(64, 256, 512) + gemm(64, 128, 512))
    with pytest.raises(ValueError):
        gemm(64, 256, 1024)  # k beyond the grid is not extrapolated


@pytest.mark.skipif(not AICONFIGURATOR_DB.is_dir(), reason="shared AIConfigurator data absent")
def test_an_aiconfigurator_database_is_composed_into_steps_and_fitted():
    table = read_step_table(AICONFIGURATOR_DB, llm="llama-3.1-8b")
    assert table.format == "aiconfigurator" and table.hardware == "h100_sxm"
    decode = table.kind == "decode"
    prefill = table.kind == "prefill"
    assert decode.sum() > 20 and prefill.sum() >= 6
    # one decoder at short context reads the weights once: ~16 GB at 3.35 TB/s is 4.8 ms
    lone = decode & (table.decode_requests == 1) & (table.decode_context == 128)
    assert 4800 < float(table.time_us[lone][0]) < 8000
    assert np.all(np.diff(table.time_us[prefill]) > 0)  # longer prompts take longer
    report = fit_blackbox_to_steps(table, folds=5)
    assert all(b > 0 for b in report.beta)
    assert report.heldout_error is not None
    assert report.heldout_error["decode_step.median"] < 0.15
    trained = fit_trained_physics_to_steps(table, llm="llama-3.1-8b", gpu="H100", folds=5)
    assert trained.heldout_error["decode_step.median"] < 0.15


@pytest.mark.skipif(not AICONFIGURATOR_DB.is_dir(), reason="shared AIConfigurator data absent")
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({}, "--llm"), ({"llm": "llama-3.1-8b", "tp": 2}, "--tp"), ({"llm": "mixtral-8x7b"}, "--llm")],
)
def test_aiconfigurator_steps_that_cannot_be_composed_are_refused(kwargs, field):
    with pytest.raises(ScenarioError) as info:
        read_step_table(AICONFIGURATOR_DB, **kwargs)
    assert info.value.path == field


# ====================================================================== trained-physics from runs


LLAMA_SERVER = {"model": "llama-3.1-8b", "gpu": "H100", "tp": 1, "kv_blocks": 4000}


def _llama_bursts(name: str, sizes: list[int], seed: int, beta: list[float]) -> MeasuredRun:
    """Bursts (as above) 'measured' on a Llama-3.1-8B server priced by trained-physics ``beta``."""
    from servesim.fidelity.fits.trained_runs import _trained_options

    rng = np.random.default_rng(seed)
    arrival, inputs, outputs = [], [], []
    for j, k in enumerate(sizes):
        prompt = int(rng.integers(64, 4096 // k))
        for _ in range(k):
            arrival.append(j * 3_000_000)
            inputs.append(int(prompt * rng.uniform(0.5, 1.0)))
            outputs.append(int(rng.integers(16, 64)))
    n = len(arrival)
    unknown = np.full(n, -1.0)
    skeleton = MeasuredRun(
        name=name, source="synthetic", system="servesim", arrival_us=np.array(arrival),
        input_tokens=np.array(inputs), output_tokens=np.array(outputs),
        ttft_us=unknown, e2e_us=unknown, tpot_us=unknown, **LLAMA_SERVER,
    )  # fmt: skip
    results, _ = simulate_run(skeleton, **_trained_options(tuple(beta)))
    r = results.requests
    order = np.lexsort((r["id"], r["arrival_us"]))
    out = r["output_tokens"][order]
    return MeasuredRun(
        name=name, source="synthetic", system="servesim", arrival_us=skeleton.arrival_us,
        input_tokens=skeleton.input_tokens, output_tokens=out,
        ttft_us=(r["first_token_us"] - r["arrival_us"])[order].astype(float),
        e2e_us=(r["completion_us"] - r["arrival_us"])[order].astype(float),
        tpot_us=np.where(out > 1, r["itl_sum_us"][order] / np.maximum(out - 1, 1), -1.0),
        **LLAMA_SERVER,
    )  # fmt: skip


def test_the_trained_physics_run_fit_recovers_known_corrections():
    from servesim.fidelity import TRAINED_BETA_NAMES, fit_trained_physics_to_runs
    from servesim.latency.trained import default_coefficients

    _, bundled, _ = default_coefficients()
    truth = list(bundled)
    for name, factor in (("b1a", 1.3), ("b3", 0.85)):
        truth[TRAINED_BETA_NAMES.index(name)] *= factor
    runs = [
        _llama_bursts("llama-a", [1, 2, 4, 8, 1, 3, 6, 2], 1, truth),
        _llama_bursts("llama-b", [8, 4, 2, 1, 5, 7, 1, 3], 2, truth),
    ]
    report = fit_trained_physics_to_runs(runs, max_evals=120)
    for name in ("b1a", "b3"):
        i = TRAINED_BETA_NAMES.index(name)
        assert report.beta[i] == pytest.approx(truth[i], rel=0.02), name
    held = [i for i, n in enumerate(TRAINED_BETA_NAMES) if n not in ("b1a", "b3")]
    assert all(report.beta[i] == bundled[i] for i in held)
    assert max(report.train_error.values()) < 0.01
    folds = fit_trained_physics_to_runs(runs, folds=2, max_evals=10)
    assert [f.heldout for f in folds.folds] == [["llama-a"], ["llama-b"]]


def test_the_trained_physics_run_fit_refuses_disaggregated_runs(burst_runs):
    from servesim.fidelity import fit_trained_physics_to_runs

    run = burst_runs[0]
    split = MeasuredRun(**{**attrs.asdict(run, recurse=False), "prefill_tp": 2, "decode_tp": 1})
    if not split.disaggregated:
        pytest.skip("MeasuredRun decides disaggregation another way")
    with pytest.raises(ScenarioError, match="disaggregated"):
        fit_trained_physics_to_runs([split])
