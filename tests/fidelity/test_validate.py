"""`servesim validate`: a measured run replayed end to end, its report and files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.fidelity import read_measured
from servesim.fidelity.replay import replay_scenario
from servesim.fidelity.validate import validate
from servesim.simcore.errors import ScenarioError

DATA = Path(__file__).parent / "data"
TINY = DATA / "validate-tiny.csv"


def test_validate_replays_the_run_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "val"
    assert main(["validate", str(TINY), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "validate-tiny (vllm, 6 requests): simulated vs measured" in text
    assert "latency model blackbox (source bundled" in text  # says which coefficients
    report = json.loads((out / "validation.json").read_text())
    assert report["requests"] == 6 and report["simulated_completed"] == 6
    ttft = report["comparison"]["ttft_ms"]["mean"]
    assert ttft["measured"] == pytest.approx((30 + 25 + 60 + 20 + 110 + 28) / 6)
    assert ttft["error"] == pytest.approx(ttft["simulated"] / ttft["measured"] - 1)
    assert (out / "validation.png").stat().st_size > 0


def test_the_replay_uses_the_runs_own_arrivals_lengths_and_limits():
    run = read_measured(TINY)
    data, assumed = replay_scenario(run, "trace.csv")
    assert data["model"] == "llama-3.1-8b-instruct" and data["gpu"] == "H100"
    assert data["engine"]["max_num_seqs"] == 64
    assert data["engine"]["max_num_batched_tokens"] == 2048
    assert any("block_size 16" in a for a in assumed)
    report = validate(run)
    sim = report["_cdf"]["simulated"]
    assert len(sim["ttft"]) == 6


def test_flags_override_the_runs_settings(tmp_path, capsys):
    out = tmp_path / "val"
    assert main(["validate", str(TINY), "--max-num-seqs", "1", "--kv-blocks", "300",
                 "--latency-model", "roofline", "--json", "--out", str(out)]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    engine = report["scenario"]["engine"]
    assert engine["max_num_seqs"] == 1 and engine["kv_blocks"] == 300
    assert report["latency_model"]["model"] == "roofline"


def test_a_model_the_memory_model_cannot_size_names_the_flag(tmp_path, capsys):
    # OPT-13B's KV capacity needs to be given (its MLP is not gated): a one-line error
    assert main(["validate", str(DATA / "generic.csv"), "--out", str(tmp_path / "v")]) == 2
    assert "set engine.kv_blocks" in capsys.readouterr().err
    assert (
        main(
            [
                "validate",
                str(DATA / "generic.csv"),
                "--kv-blocks",
                "4000",
                "--out",
                str(tmp_path / "v"),
            ]
        )
        == 0
    )


def test_overheads_from_a_calibration_file_are_added_and_named(tmp_path, capsys):
    file = tmp_path / "overheads.yaml"
    file.write_text(
        "format: servesim-overheads/1\nmodel: overheads\nfirst_token_us: 7000\nstep_us: 0\n"
    )
    base = validate(read_measured(TINY))
    with_overheads = validate(read_measured(TINY), overheads=file)
    ttft = lambda r: r["comparison"]["ttft_ms"]["mean"]["simulated"]  # noqa: E731
    # 7 ms before each request is queued; nothing else changes (no step overhead, light load)
    assert ttft(with_overheads) == pytest.approx(ttft(base) + 7.0, abs=0.5)
    assert (
        main(["validate", str(TINY), "--overheads", str(file), "--out", str(tmp_path / "v")]) == 0
    )
    text = capsys.readouterr().out
    assert f"latency model overheads (first token 7000 us, step 0 us; from {file})" in text
    assert main(["validate", str(TINY), "--overheads", str(tmp_path / "missing.yaml")]) == 2
    assert "--overheads" in capsys.readouterr().err


def test_only_distserves_own_vllm_runs_replay_with_vllm_v0s_scheduler():
    distserve = read_measured(DATA / "opt-13b-tiny" / "vllm-3-1.5.exp")
    data, assumed = replay_scenario(distserve, "trace.csv")
    assert data["engine"]["prefill_first"] is True
    assert any("vLLM v0 scheduler" in a for a in assumed)
    # v0 swaps only groups of several sequences: single-sequence requests are recomputed
    assert data["engine"]["preemption_mode"] == "recompute"
    assert any("preemption by recompute" in a for a in assumed)
    # a CSV of the same model and system says nothing about the vLLM version: v1 scheduling
    generic = read_measured(DATA / "generic.csv")
    data, assumed = replay_scenario(generic, "trace.csv")
    assert "prefill_first" not in data["engine"]
    assert data["latency"]["model"] == "distserve-profile"


def test_a_broken_overheads_file_is_reported_as_itself_not_as_a_missing_latency_model(tmp_path):
    file = tmp_path / "overheads.yaml"
    file.write_text("first_token_us: 10\n")  # no step_us
    with pytest.raises(ScenarioError) as info:
        validate(read_measured(TINY), overheads=file)
    assert info.value.path == f"{file}: step_us"


SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "measured" / "distserve_opt13b"


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared measured data not present")
@pytest.mark.parametrize(
    "name, pp", [("distserve-c21d11-300-7.5", 1), ("distserve-c21d12-800-8", 2)]
)
def test_distserves_disaggregated_runs_replay_with_its_engines_swap_and_back_pressure(name, pp):
    run = read_measured(SHARED / "measured" / f"{name}.exp")
    data, assumed = replay_scenario(run, "trace.csv")
    transfer = data["cluster"]["kv_transfer"]
    assert transfer["decode_full"] == "backpressure" and transfer["decode_queue_limit"] == 0.05
    decode = data["cluster"]["pools"]["decode"]["engine"]
    assert decode["preemption_mode"] == "swap" and decode["swap_space"] == 16 * pp
    assert "preemption_mode" not in data["cluster"]["pools"]["prefill"].get("engine", {})
    assert any("swapping to 16 GiB" in a for a in assumed)
    assert any("decode_queue_limit" in a for a in assumed)
