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


# --- KV capacity: the run's own block count wins, and the report says where it came from ------

RUN_DIR = DATA / "llmservingsim_run"


def copy_run(tmp_path: Path, **meta_extra) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    for f in RUN_DIR.iterdir():
        (run_dir / f.name).write_bytes(f.read_bytes())
    meta = json.loads((RUN_DIR / "vllm_meta.json").read_text())
    meta.update(meta_extra)
    (run_dir / "vllm_meta.json").write_text(json.dumps(meta))
    return run_dir


def test_the_block_count_vllm_recorded_is_the_replays_kv_capacity_and_is_listed(tmp_path):
    run_dir = copy_run(
        tmp_path,
        kv_cache={"num_gpu_blocks": 35913, "block_size": 16, "gpu_memory_utilization": 0.92},
    )
    run = read_measured(run_dir)
    assert run.kv_blocks == 35913 and run.block_size == 16
    data, assumed = replay_scenario(run, "trace.csv")
    assert data["engine"]["kv_blocks"] == 35913
    assert data["engine"]["gpu_memory_utilization"] == 0.92
    line = next(a for a in assumed if a.startswith("KV capacity"))
    assert line.startswith("KV capacity: 35913 blocks, from ")
    assert "vllm_meta.json" in line and "kv_cache.num_gpu_blocks" in line
    assert not any("block_size 16 (vLLM default)" in a for a in assumed)  # recorded now


def test_with_data_parallelism_each_engines_own_block_count_is_used(tmp_path):
    # vLLM's kv_cache.num_gpu_blocks counts both ranks; each engine logs its own token count.
    meta = json.loads((RUN_DIR / "vllm_meta.json").read_text())
    meta["engine_kwargs"]["data_parallel_size"] = 2
    run_dir = copy_run(
        tmp_path,
        engine_kwargs=meta["engine_kwargs"],
        kv_cache={"num_gpu_blocks": 75638, "block_size": 16},
        resolved_config={"cache_config": {"kv_cache_size_tokens": 605104}},
    )
    run = read_measured(run_dir)
    assert run.kv_blocks == 605104 // 16 == 37819
    assert "per engine" in run.extra["kv_blocks_source"]
    del meta
    plain = copy_run(tmp_path / "b", kv_cache={"num_gpu_blocks": 75638, "block_size": 16})
    meta = json.loads((plain / "vllm_meta.json").read_text())
    meta["engine_kwargs"]["data_parallel_size"] = 2
    (plain / "vllm_meta.json").write_text(json.dumps(meta))
    assert read_measured(plain).kv_blocks == 37819


@pytest.mark.parametrize(
    ("line", "blocks"),
    [
        ("INFO 12-13 executor_base.py:95] # GPU blocks: 6001, # CPU blocks: 1638", 6001),
        ("INFO 04-24 kv_cache_utils.py:634] GPU KV cache size: 158,656 tokens", 158_656 // 16),
    ],
)
def test_a_vllm_log_next_to_the_run_gives_the_block_count(tmp_path, line, blocks):
    run_dir = copy_run(tmp_path)
    (run_dir / "server.log").write_text(f"INFO starting\n{line}\nINFO done\n")
    run = read_measured(run_dir)
    assert run.kv_blocks == blocks
    _, assumed = replay_scenario(run, "trace.csv")
    assert any(a.startswith(f"KV capacity: {blocks} blocks, from ") and "server.log" in a
               for a in assumed)  # fmt: skip


def test_a_csvs_kv_blocks_setting_is_the_capacity_and_its_source(tmp_path):
    csv = tmp_path / "run.csv"
    csv.write_text("# kv_blocks: 4000\n" + TINY.read_text())
    run = read_measured(csv)
    _, assumed = replay_scenario(run, "trace.csv")
    assert any(a == f"KV capacity: 4000 blocks, from {csv} ('# kv_blocks:' line)" for a in assumed)


def test_without_a_recorded_count_the_memory_models_count_is_named(tmp_path, capsys):
    out = tmp_path / "val"
    assert main(["validate", str(TINY), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "validation.json").read_text())
    blocks = report["scenario"]["engine"]["kv_blocks"]
    expected = f"KV capacity computed by servesim memory model: {blocks} blocks"
    assert any(a.startswith(expected) for a in report["assumed"])
    assert f"assumed    {expected}" in text
    # and the other guesses are listed too
    for fragment in ("scheduler: vLLM v1", "latency model blackbox: the first of",
                     "serving overheads: none"):  # fmt: skip
        assert any(fragment in a for a in report["assumed"]), fragment


def test_a_distserve_run_without_its_capacity_table_names_the_file_and_the_flags(tmp_path, capsys):
    exp = tmp_path / "distserve-c21d11-3-1.5.exp"
    exp.write_text((DATA / "opt-13b-tiny" / "vllm-3-1.5.exp").read_text())
    assert main(["validate", str(exp), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "profile_data/max_num_tokens.csv" in err and str(tmp_path / "profile_data") in err
    assert "--kv-blocks-prefill N and --kv-blocks-decode N" in err
    # the per-pool flags replace it, one capacity per instance
    assert main(["validate", str(exp), "--kv-blocks-prefill", "900", "--kv-blocks-decode", "700",
                 "--model", "opt-13b", "--json", "--out", str(tmp_path / "v")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert "KV capacity (prefill): 900 blocks, given by --kv-blocks-prefill" in report["assumed"]
    assert "KV capacity (decode): 700 blocks, given by --kv-blocks-decode" in report["assumed"]
    blocks = {i["role"]: i["kv_blocks"] for i in report["instances"]}
    assert blocks == {"prefill": 900, "decode": 700}
    # a colocated run has no pools to size
    assert (
        main(["validate", str(TINY), "--kv-blocks-decode", "5", "--out", str(tmp_path / "w")]) == 2
    )
    assert "--kv-blocks-decode" in capsys.readouterr().err


def test_an_unreadable_placement_is_refused_naming_the_flag_and_accepted_from_it(tmp_path, capsys):
    exp = tmp_path / "opt-13b" / "distserve-3-1.5.exp"
    exp.parent.mkdir()
    exp.write_text((DATA / "opt-13b-tiny" / "vllm-3-1.5.exp").read_text())
    (exp.parent / "max_num_tokens.csv").write_text(
        (DATA / "opt-13b-tiny" / "max_num_tokens.csv").read_text()
    )
    assert main(["validate", str(exp), "--out", str(tmp_path / "v")]) == 2
    assert "--placement cXYdZW" in capsys.readouterr().err
    assert main(["validate", str(exp), "--placement", "c21d11", "--json",
                 "--out", str(tmp_path / "v")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert any(a.startswith("placement c21d11 (prefill TP2/PP1, decode TP1/PP1), from --placement")
               for a in report["assumed"])  # fmt: skip


def test_tpot_and_vllms_itl_are_both_reported_and_labelled(tmp_path, capsys):
    out = tmp_path / "val"
    assert main(["validate", str(TINY), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "\nTPOT ms " in text and "\nITL ms " in text
    assert "TPOT = (E2E - TTFT)/(output - 1) per request, averaged" in text
    assert "ITL = vLLM's: every inter-token gap, token-weighted" in text
    report = json.loads((out / "validation.json").read_text())
    assert set(report["comparison"]) == {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}
    assert "token-weighted" in report["metric_definitions"]["itl_ms"]
    itl = report["comparison"]["itl_ms"]
    run = read_measured(TINY)
    two = run.output_tokens > 1
    exact = (run.e2e_us[two] - run.ttft_us[two]).sum() / (run.output_tokens[two] - 1).sum() / 1000
    assert itl["mean"]["measured"] == pytest.approx(exact)
    assert itl["p50"]["measured"] is None and itl["p50"]["simulated"] > 0  # no per-token times
    assert "percentiles not measured" in report["itl_measured"]
    assert report["comparison"]["tpot_ms"]["mean"]["measured"] == pytest.approx(
        float(np_mean_tpot(run))
    )


def np_mean_tpot(run) -> float:
    import numpy as np

    t = np.asarray(run.tpot_us)
    return t[t >= 0].mean() / 1000
