"""Readers of measured serving runs: tiny fixtures, malformed inputs, and the real shared data."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from servesim.fidelity import (
    MeasuredRun,
    needs_placement,
    read_distserve_exp,
    read_generic_csv,
    read_llmservingsim,
    read_measured,
    summarize,
)
from servesim.simcore.errors import ScenarioError

DATA = Path(__file__).parent / "data"
EXP = DATA / "opt-13b-tiny" / "vllm-3-1.5.exp"
RUN_DIR = DATA / "llmservingsim_run"
CSV = DATA / "generic.csv"

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "measured"
DISTSERVE = SHARED / "distserve_opt13b" / "measured"
LLMSERVINGSIM = SHARED / "llmservingsim_vllm"


def approx_us(values):
    return pytest.approx(values, abs=1e-3)


# ====================================================================== DistServe .exp


def test_exp_records_are_sorted_by_issue_time_and_converted_to_microseconds():
    run = read_distserve_exp(EXP)
    assert run.n == 3
    assert run.system == "vllm"
    assert run.arrival_us.dtype == np.int64
    assert run.arrival_us.tolist() == [0, 500_000, 1_000_000]
    assert run.input_tokens.tolist() == [50, 100, 200]
    assert run.output_tokens.tolist() == [1, 3, 5]
    assert run.ttft_us.tolist() == approx_us([50_000, 100_000, 250_000])
    assert run.e2e_us.tolist() == approx_us([50_000, 200_000, 650_000])
    # a single-token output has no TPOT (DistServe writes 0 for it)
    assert run.tpot_us.tolist() == approx_us([-1, 50_000, 100_000])
    assert run.request_ids == ("record 1", "record 0", "record 2")
    assert any("completion order" in note for note in run.notes)


def test_exp_file_name_and_directory_give_the_settings_and_say_they_were_inferred():
    run = read_distserve_exp(EXP)
    assert run.request_rate == 1.5
    assert run.extra["nominal_requests"] == 3
    assert (run.tp, run.pp, run.num_instances) == (1, 1, 1)
    assert run.model == "facebook/opt-13b"
    assert run.gpu == "A100-80"
    assert run.kv_capacity_tokens == 66144  # from the max_num_tokens.csv beside it
    assert {"tp", "pp", "model", "gpu", "kv_capacity_tokens"} <= set(run.inferred)
    assert not run.disaggregated


def test_exp_summary_block_is_read_into_reported():
    run = read_distserve_exp(EXP)
    assert run.reported["num_requests"] == 3
    assert run.reported["avg_ttft_ms"] == pytest.approx(133.333333)
    assert run.metrics()["ttft_ms"]["mean"] == pytest.approx(run.reported["avg_ttft_ms"])


def test_exp_overrides_replace_the_inferred_model_and_gpu():
    run = read_distserve_exp(EXP, model="my/model", gpu="A100-SXM")
    assert run.model == "my/model"
    assert run.gpu == "A100-80"  # canonical name of the alias
    assert "model" not in run.inferred and "gpu" not in run.inferred


def test_disaggregated_file_names_give_prefill_and_decode_parallelism(tmp_path):
    folder = tmp_path / "opt-13b-sharegpt"
    folder.mkdir()
    shutil.copy(EXP, folder / "distserve-c21d12-3-1.5.exp")
    run = read_distserve_exp(folder / "distserve-c21d12-3-1.5.exp")
    assert run.system == "distserve"
    assert (run.prefill_tp, run.prefill_pp, run.decode_tp, run.decode_pp) == (2, 1, 1, 2)
    assert run.disaggregated
    assert "prefill_tp" not in run.inferred  # read from the name, not assumed
    assert run.tp is None


def test_a_placement_the_file_name_does_not_give_is_refused_unless_the_flag_gives_it(tmp_path):
    shutil.copy(EXP, tmp_path / "distserve-3-1.5.exp")
    assert needs_placement(tmp_path / "distserve-3-1.5.exp")
    assert not needs_placement(tmp_path / "distserve-c21d11-3-1.5.exp")
    with pytest.raises(ScenarioError, match="--placement cXYdZW") as err:
        read_distserve_exp(tmp_path / "distserve-3-1.5.exp")
    assert "no cXYdZW placement code" in str(err.value)
    run = read_measured(tmp_path / "distserve-3-1.5.exp", placement="c21d11")
    assert (run.prefill_tp, run.prefill_pp, run.decode_tp, run.decode_pp) == (2, 1, 1, 1)
    assert run.extra["placement_source"].startswith("--placement")
    assert any("as given by --placement c21d11" in note for note in run.notes)
    assert run.model is None  # no opt-<size>b directory
    assert any("model unknown" in note for note in run.notes)
    with pytest.raises(ScenarioError, match="cXYdZW") as err:
        read_measured(tmp_path / "distserve-3-1.5.exp", placement="c2d1")
    assert err.value.path == "--placement"
    # A placement the file name contradicts, or one for a colocated run, is refused too.
    shutil.copy(EXP, tmp_path / "distserve-c11d11-3-1.5.exp")
    with pytest.raises(ScenarioError, match="says c11d11"):
        read_measured(tmp_path / "distserve-c11d11-3-1.5.exp", placement="c21d11")
    with pytest.raises(ScenarioError, match="not a disaggregated"):
        read_measured(EXP, placement="c21d11")
    with pytest.raises(ScenarioError, match="applies to those only"):
        read_measured(CSV, placement="c21d11")


def test_an_unconventional_exp_name_reads_with_unknown_settings(tmp_path):
    shutil.copy(EXP, tmp_path / "my-run.exp")
    run = read_distserve_exp(tmp_path / "my-run.exp")
    assert run.system == "unknown" and run.request_rate is None
    assert run.n == 3


GOOD = {
    "prompt_len": 10,
    "output_len": 3,
    "issue_time": 5.0,
    "first_token_time": 5.1,
    "complete_time": 5.3,
    "ttft_ms": 100.0,
    "tpot_ms": 100.0,
    "latency_ms": 300.0,
}


def write_exp(tmp_path: Path, records: list[str], *, one_line: bool = True) -> Path:
    file = tmp_path / "vllm-3-1.exp"
    joiner = ", " if one_line else ",\n"
    file.write_text("[" + joiner.join(records) + "]\n", encoding="utf-8")
    return file


def literal(**changes) -> str:
    rec = {**GOOD, **changes}
    return repr({k: v for k, v in rec.items() if v is not None})


@pytest.mark.parametrize(
    "bad, expected",
    [
        (literal(ttft_ms=None), ["record 1", "field ttft_ms", "missing"]),
        (literal(prompt_len=-5), ["record 1", "field prompt_len", ">= 1"]),
        (literal(output_len=2.5), ["record 1", "field output_len", "whole number"]),
        (literal(issue_time="soon"), ["record 1", "field issue_time", "number"]),
        (
            literal().replace("'issue_time': 5.0", "'issue_time': 1e999"),
            ["record 1", "field issue_time", "finite"],
        ),
        (
            literal(first_token_time=4.0),
            ["record 1", "field first_token_time", "earlier than issue_time"],
        ),
        (
            literal(complete_time=5.05),
            ["record 1", "field complete_time", "earlier than first_token_time"],
        ),
        (literal(ttft_ms=150.0), ["record 1", "field ttft_ms", "disagrees"]),
        (literal(tpot_ms=10.0), ["record 1", "field tpot_ms", "disagrees"]),
        ("[1, 2]", ["record 1", "expected a dict"]),
        ("{'prompt_len': float('nan')}", ["record 1", "field prompt_len", "not a plain literal"]),
        ("{1: 2}", ["record 1", "keys must be quoted field names"]),
    ],
)
def test_malformed_exp_records_name_the_file_line_record_and_field(tmp_path, bad, expected):
    file = write_exp(tmp_path, [literal(), bad, literal()])
    with pytest.raises(ScenarioError) as info:
        read_distserve_exp(file)
    message = str(info.value)
    assert message.startswith(f"{file}:1:")
    for part in expected:
        assert part in message


def test_exp_errors_give_the_line_of_a_record_in_a_multi_line_file(tmp_path):
    file = write_exp(tmp_path, [literal(), literal(), literal(latency_ms=-1)], one_line=False)
    with pytest.raises(ScenarioError, match=r":3: .*record 2, field latency_ms"):
        read_distserve_exp(file)


def test_exp_syntax_errors_give_the_line(tmp_path):
    file = tmp_path / "vllm-1-1.exp"
    file.write_text("[" + literal() + ",\n{'prompt_len': 1,, }]\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r":2: .*not a Python literal"):
        read_distserve_exp(file)


def test_exp_that_is_not_a_list_or_is_empty_is_rejected(tmp_path):
    file = tmp_path / "vllm-1-1.exp"
    file.write_text(literal(), encoding="utf-8")
    with pytest.raises(ScenarioError, match="expected a list of records"):
        read_distserve_exp(file)
    file.write_text("[]", encoding="utf-8")
    with pytest.raises(ScenarioError, match="no records"):
        read_distserve_exp(file)


def test_exp_parsing_never_evaluates_code(tmp_path):
    marker = tmp_path / "pwned"
    file = write_exp(tmp_path, [f"__import__('pathlib').Path({str(marker)!r}).touch()"])
    with pytest.raises(ScenarioError, match="record 0: expected a dict"):
        read_distserve_exp(file)
    file = write_exp(
        tmp_path, [f"{{'prompt_len': __import__('pathlib').Path({str(marker)!r}).touch()}}"]
    )
    with pytest.raises(ScenarioError, match="field prompt_len: not a plain literal"):
        read_distserve_exp(file)
    assert not marker.exists()


# ====================================================================== LLMServingSim


def test_llmservingsim_run_reads_requests_and_engine_settings():
    run = read_llmservingsim(RUN_DIR)
    assert run.name == "llmservingsim_run"
    assert run.system == "vllm"
    assert run.n == 3
    # sorted by queued_ts: bench-0 (500.0), bench-2 (500.25), bench-1 (500.5)
    assert run.request_ids == ("bench-0", "bench-2", "bench-1")
    assert run.arrival_us.tolist() == [0, 250_000, 500_000]
    assert run.input_tokens.tolist() == [100, 300, 20]
    assert run.output_tokens.tolist() == [3, 11, 1]
    assert run.ttft_us.tolist() == approx_us([200_000, 200_000, 50_000])
    assert run.e2e_us.tolist() == approx_us([400_000, 1_200_000, 50_000])
    assert run.tpot_us.tolist() == approx_us([100_000, 100_000, -1])
    assert run.queued_us is not None
    assert run.queued_us.tolist() == approx_us([10_000, 50_000, 0])
    assert run.model == "meta-llama/Llama-3.1-8B"
    assert run.gpu == "RTX-PRO-6000"
    assert run.engine_version == "vllm 0.19.0"
    assert (run.tp, run.pp, run.dp, run.expert_parallel) == (1, 1, 1, False)
    assert (run.max_num_seqs, run.max_num_batched_tokens) == (128, 2048)
    assert run.kv_blocks is None and run.block_size is None
    assert run.request_rate == 10.0 and "request_rate" in run.inferred
    assert run.num_instances == 1
    assert run.extra["gpu_memory_utilization"] == 0.9


def test_llmservingsim_validation_summary_goes_to_reported():
    run = read_llmservingsim(RUN_DIR)
    assert run.reported == {
        "ttft_mean_ms": 150.0,
        "ttft_p50_ms": 200.0,
        "tpot_mean_ms": 100.0,
        "e2e_mean_ms": 550.0,
    }
    assert run.extra["llmservingsim_sim_ms"]["ttft_mean_ms"] == 140.0
    metrics = run.metrics()
    assert metrics["ttft_ms"]["mean"] == pytest.approx(150.0)
    assert metrics["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert metrics["e2e_ms"]["mean"] == pytest.approx(550.0)


def test_llmservingsim_reads_the_upstream_layout_and_the_requests_file(tmp_path):
    case = tmp_path / "H100" / "llama"
    (case / "vllm").mkdir(parents=True)
    (case / "validation").mkdir()
    shutil.copy(RUN_DIR / "vllm_requests.jsonl", case / "vllm" / "requests.jsonl")
    shutil.copy(RUN_DIR / "vllm_meta.json", case / "vllm" / "meta.json")
    shutil.copy(RUN_DIR / "config.json", case / "config.json")
    shutil.copy(RUN_DIR / "validation_summary.txt", case / "validation" / "summary.txt")
    for target in (case, case / "vllm" / "requests.jsonl"):
        run = read_llmservingsim(target)
        assert run.name == "llama"
        assert run.n == 3 and run.max_num_seqs == 128 and run.gpu == "RTX-PRO-6000"
        assert run.reported["e2e_mean_ms"] == 550.0


def copy_run(tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(RUN_DIR, target)
    return target


def rewrite_line(file: Path, line: int, change) -> None:
    lines = file.read_text(encoding="utf-8").splitlines()
    lines[line - 1] = change(lines[line - 1])
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")


def edit_record(**changes):
    def change(text: str) -> str:
        rec = json.loads(text)
        for key, value in changes.items():
            if value is None:
                rec.pop(key)
            else:
                rec[key] = value
        return json.dumps(rec)

    return change


@pytest.mark.parametrize(
    "line, change, expected",
    [
        (2, lambda text: text[:-1], ["record 1", "not valid JSON"]),
        (2, lambda text: "[1, 2]", ["record 1", "expected a JSON object"]),
        (3, edit_record(first_token_ts=None), ["record 2", "field first_token_ts", "missing"]),
        (2, edit_record(output_toks=-3), ["record 1", "field output_toks", ">= 1"]),
        (2, edit_record(input_toks="many"), ["record 1", "field input_toks", "number"]),
        (
            3,
            lambda text: text.replace('"queued_ts": 500.25', '"queued_ts": NaN'),
            ["record 2", "field queued_ts", "finite"],
        ),
        (
            1,
            edit_record(last_token_ts=500.1),
            ["record 0", "field last_token_ts", "earlier than first_token_ts"],
        ),
        (
            1,
            edit_record(scheduled_ts=499.0),
            ["record 0", "field scheduled_ts", "earlier than queued_ts"],
        ),
    ],
)
def test_malformed_jsonl_records_name_the_file_line_record_and_field(
    tmp_path, line, change, expected
):
    run_dir = copy_run(tmp_path)
    file = run_dir / "vllm_requests.jsonl"
    rewrite_line(file, line, change)
    with pytest.raises(ScenarioError) as info:
        read_llmservingsim(run_dir)
    message = str(info.value)
    assert message.startswith(f"{file}:{line}:")
    for part in expected:
        assert part in message


def test_malformed_llmservingsim_metadata_names_the_file_and_key(tmp_path):
    run_dir = copy_run(tmp_path)
    meta = run_dir / "vllm_meta.json"
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["engine_kwargs"]["max_num_seqs"] = -1
    meta.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"vllm_meta\.json: engine_kwargs\.max_num_seqs"):
        read_llmservingsim(run_dir)


def test_llmservingsim_without_metadata_still_reads_and_notes_what_is_missing(tmp_path):
    run_dir = tmp_path / "bare"
    run_dir.mkdir()
    shutil.copy(RUN_DIR / "vllm_requests.jsonl", run_dir / "requests.jsonl")
    run = read_llmservingsim(run_dir)
    assert run.n == 3 and run.tp is None and run.gpu is None
    assert any("no meta.json" in note for note in run.notes)
    assert any("no config.json" in note for note in run.notes)


def test_a_directory_without_requests_is_rejected(tmp_path):
    with pytest.raises(ScenarioError, match="no requests file"):
        read_llmservingsim(tmp_path)
    with pytest.raises(ScenarioError, match="LLMServingSim run"):
        read_measured(tmp_path)


# ====================================================================== generic CSV


def test_generic_csv_reads_columns_settings_and_unknowns():
    run = read_generic_csv(CSV)
    assert run.n == 3
    assert run.system == "vllm"
    assert (run.model, run.gpu, run.tp, run.max_num_seqs) == ("facebook/opt-13b", "A100-80", 1, 256)
    assert run.extra["campaign"] == "tiny example"
    assert run.arrival_us.tolist() == [0, 500_000, 1_500_000]
    assert run.input_tokens.tolist() == [100, 200, 50]
    assert run.ttft_us.tolist() == approx_us([100_000, 200_000, 50_000])
    assert run.e2e_us.tolist() == approx_us([300_000, -1, 50_000])  # empty cell: unknown
    assert run.tpot_us.tolist() == approx_us([100_000, -1, -1])
    assert run.queued_us is not None
    assert run.queued_us.tolist() == approx_us([10_000, 0, -1])
    assert run.request_ids == ("line 8", "line 10", "line 9")
    assert any("comment" in note for note in run.notes)  # the ignored column
    assert any("out of arrival order" in note for note in run.notes)


HEADER = "arrival_s,input_tokens,output_tokens,ttft_s,e2e_s,queued_s"


@pytest.mark.parametrize(
    "row, expected",
    [
        ("0.5,10,2,-0.1,0.3,", ["record 1", "column ttft_s", ">= 0"]),
        ("0.5,10,2,nan,0.3,", ["record 1", "column ttft_s", "finite"]),
        ("0.5,10,2,inf,0.3,", ["record 1", "column ttft_s", "finite"]),
        ("0.5,10,2,0.4,0.3,", ["record 1", "column e2e_s", "earlier than ttft_s"]),
        ("0.5,10,2,0.1,0.3,0.2", ["record 1", "column ttft_s", "earlier than queued_s"]),
        ("0.5,ten,2,0.1,0.3,", ["record 1", "column input_tokens", "whole number"]),
        ("0.5,10,0,0.1,0.3,", ["record 1", "column output_tokens", "at least 1"]),
        (",10,2,0.1,0.3,", ["record 1", "column arrival_s", "required"]),
        ("0.5,10,2,0.1", ["expected 6 columns"]),
    ],
)
def test_malformed_csv_rows_name_the_file_line_and_column(tmp_path, row, expected):
    file = tmp_path / "run.csv"
    file.write_text(f"# system: vllm\n{HEADER}\n0.0,10,2,0.1,0.2,0.0\n{row}\n", encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        read_generic_csv(file)
    message = str(info.value)
    assert message.startswith(f"{file}:4:")
    for part in expected:
        assert part in message


def test_csv_without_a_required_column_names_the_header_line(tmp_path):
    file = tmp_path / "run.csv"
    file.write_text(
        "# tp: 2\narrival_s,input_tokens,output_tokens,ttft_s\n0,1,1,0.1\n", encoding="utf-8"
    )
    with pytest.raises(ScenarioError, match=r"run\.csv:2: .*missing column\(s\) e2e_s"):
        read_generic_csv(file)


def test_csv_settings_of_the_wrong_type_name_their_line(tmp_path):
    file = tmp_path / "run.csv"
    file.write_text(f"# tp: two\n{HEADER}\n0,1,1,0.1,0.2,\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"run\.csv:1: .*setting tp"):
        read_generic_csv(file)


def test_csv_with_no_rows_is_rejected(tmp_path):
    file = tmp_path / "run.csv"
    file.write_text(f"{HEADER}\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="no rows"):
        read_generic_csv(file)


# ====================================================================== dispatch, summaries


def test_read_measured_dispatches_on_what_the_path_is():
    assert read_measured(EXP).source == str(EXP)
    assert read_measured(RUN_DIR).name == "llmservingsim_run"
    assert read_measured(RUN_DIR / "vllm_requests.jsonl").name == "llmservingsim_run"
    assert read_measured(CSV).system == "vllm"


def test_read_measured_rejects_unknown_kinds_and_missing_paths(tmp_path):
    other = tmp_path / "run.parquet"
    other.write_bytes(b"x")
    with pytest.raises(ScenarioError, match="unknown kind of measured run"):
        read_measured(other)
    with pytest.raises(ScenarioError, match="no such file"):
        read_measured(tmp_path / "missing.exp")


def test_summarize_ignores_unknowns_and_nan():
    stats = summarize([1.0, 2.0, 3.0, 4.0, -1.0, math.nan])
    assert stats["count"] == 4
    assert stats["mean"] == pytest.approx(2.5)
    assert stats["p50"] == pytest.approx(2.5)
    assert stats["p90"] == pytest.approx(3.7)
    assert stats["p99"] == pytest.approx(3.97)
    empty = summarize(np.array([-1.0, math.nan]))
    assert empty["count"] == 0 and empty["mean"] is None and empty["p99"] is None


def test_a_run_writes_a_trace_that_servesim_replays(tmp_path):
    from servesim.workloads.traces import read_trace

    run = read_distserve_exp(EXP)
    trace = run.write_trace_csv(tmp_path / "trace.csv")
    specs = read_trace(str(trace), format="csv")
    assert [s.arrival_us for s in specs] == run.arrival_us.tolist()
    assert [s.prompt_tokens for s in specs] == run.input_tokens.tolist()
    assert [s.output_tokens for s in specs] == run.output_tokens.tolist()


def test_measured_run_checks_its_arrays_have_one_length():
    with pytest.raises(ValueError, match="ttft_us"):
        MeasuredRun(
            name="x",
            source="x",
            system="vllm",
            arrival_us=[0, 1],
            input_tokens=[1, 1],
            output_tokens=[1, 1],
            ttft_us=[1.0],
            e2e_us=[1.0, 1.0],
            tpot_us=[-1.0, -1.0],
        )


# ====================================================================== the real shared data


def shared_files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


@pytest.fixture
def distserve_dir() -> Path:
    if not DISTSERVE.is_dir():
        pytest.skip(f"{DISTSERVE} is not on this machine")
    return DISTSERVE


def test_every_shared_exp_file_reads_and_matches_its_own_summary(distserve_dir):
    files = shared_files(distserve_dir, "*.exp")
    assert files
    for file in files:
        run = read_measured(file, placement="c21d11" if needs_placement(file) else None)
        assert run.model == "facebook/opt-13b"
        assert run.n == run.extra["nominal_requests"] == int(run.reported["num_requests"])
        metrics = run.metrics()
        assert metrics["ttft_ms"]["mean"] == pytest.approx(run.reported["avg_ttft_ms"], rel=1e-9)
        # DistServe averages TPOT over every request, counting a single-token output as 0
        assert metrics["tpot_ms"]["count"] == int(np.count_nonzero(run.output_tokens >= 2))
        tpot_all = np.where(run.tpot_us >= 0, run.tpot_us, 0.0).mean() / 1000
        assert tpot_all == pytest.approx(run.reported["avg_tpot_ms"], rel=1e-9)
        assert run.measured_rate() == pytest.approx(run.request_rate, rel=0.02)


def test_shared_distserve_runs_have_the_documented_figures(distserve_dir):
    known = {  # from the data README: run -> (TTFT mean ms, TPOT mean ms)
        "vllm-300-3": (462, 99.9),
        "distserve-c21d11-300-3": (92, 38.3),
    }
    checked = 0
    for name, (ttft, tpot) in known.items():
        file = distserve_dir / f"{name}.exp"
        if not file.is_file():
            continue
        metrics = read_distserve_exp(file).metrics()
        assert metrics["ttft_ms"]["mean"] == pytest.approx(ttft, abs=0.5)
        assert metrics["tpot_ms"]["mean"] == pytest.approx(tpot, abs=0.05)
        checked += 1
    if not checked:
        pytest.skip("none of the documented runs is in the shared data")


def test_shared_disaggregated_run_has_its_parallelism_and_kv_capacity(distserve_dir):
    file = distserve_dir / "distserve-c21d12-800-8.exp"
    if not file.is_file():
        pytest.skip(f"{file.name} is not in the shared data")
    run = read_distserve_exp(file)
    assert run.n == 800 and run.request_rate == 8.0
    assert (run.prefill_tp, run.prefill_pp, run.decode_tp, run.decode_pp) == (2, 1, 1, 2)
    assert run.extra["prefill_kv_capacity_tokens"] == 163008
    assert run.extra["decode_kv_capacity_tokens"] == 163008
    assert int(np.count_nonzero(run.tpot_us < 0)) == 1  # one single-token output


@pytest.mark.parametrize(
    "case, model, dp",
    [
        ("RTXPRO6000_Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 1),
        ("RTXPRO6000_Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B-Instruct-2507", 2),
    ],
)
def test_shared_llmservingsim_runs_reproduce_their_validation_summary(case, model, dp):
    run_dir = LLMSERVINGSIM / case
    if not run_dir.is_dir():
        pytest.skip(f"{run_dir} is not on this machine")
    run = read_measured(run_dir)
    assert run.n == 300
    assert run.model == model and run.dp == dp and run.tp == 1
    assert run.gpu == "RTX-PRO-6000"
    assert (run.max_num_seqs, run.max_num_batched_tokens) == (128, 2048)
    metrics = run.metrics()
    for metric in ("ttft", "tpot", "e2e"):
        for stat in ("mean", "p50", "p90", "p95", "p99"):
            reported = run.reported[f"{metric}_{stat}_ms"]
            assert metrics[f"{metric}_ms"][stat] == pytest.approx(reported, abs=0.051), (
                metric,
                stat,
            )


def test_a_run_from_timestamps_sorts_by_arrival_and_measures_from_it():
    from servesim.fidelity.readers.common import UNKNOWN, _run_from_timestamps

    run, order, out_of_order = _run_from_timestamps(
        arrival_s=np.array([2.0, 1.0, 1.5]),
        first_token_s=np.array([2.5, 1.25, 1.75]),
        last_token_s=np.array([3.0, 2.25, 1.75]),
        input_tokens=np.array([10, 20, 30]),
        output_tokens=np.array([2, 5, 1]),
        request_ids=["a", "b", "c"],
        scheduled_s=np.array([2.125, np.nan, 1.5]),
        name="r",
        source="s",
        system="x",
    )
    assert order.tolist() == [1, 2, 0] and out_of_order == 1
    assert run.request_ids == ("b", "c", "a")
    assert run.arrival_us.tolist() == [0, 500_000, 1_000_000]
    assert run.ttft_us.tolist() == [250_000.0, 250_000.0, 500_000.0]
    assert run.e2e_us.tolist() == [1_250_000.0, 250_000.0, 1_000_000.0]
    assert run.tpot_us.tolist() == [250_000.0, UNKNOWN, 500_000.0]  # output 1: no TPOT
    assert run.queued_us.tolist() == [UNKNOWN, 0.0, 125_000.0]


def test_timed_columns_name_the_fields_as_the_run_takes_them_and_leave_absent_times_nan():
    from servesim.fidelity.readers.common import _timed_columns

    seen = []
    records = [
        (3, {"in": 4, "out": 2, "t0": 1.0, "t2": 2.0}),
        (4, {"in": 5, "out": 1, "t0": 1.5, "t1": 1.75, "t2": 3.0}),
    ]
    columns = _timed_columns(
        records,
        "f.jsonl",
        ("in", "out", "t0", "t2"),
        ("in", "out"),
        (("arrival_s", "t0"), ("scheduled_s", "t1"), ("last_token_s", "t2")),
        lambda i, rec, times, output: seen.append((i, times["scheduled_s"], output)),
    )
    assert columns["input_tokens"].tolist() == [4, 5]
    assert columns["output_tokens"].tolist() == [2, 1]
    assert columns["arrival_s"].tolist() == [1.0, 1.5]
    assert np.isnan(columns["scheduled_s"][0]) and columns["scheduled_s"][1] == 1.75
    assert seen == [(0, None, 2), (1, 1.75, 1)]
    bad = [(7, {"in": 4, "out": 2, "t0": 2.0, "t2": 1.0})]
    with pytest.raises(ScenarioError, match="record 0, field t2: earlier than t0") as info:
        _timed_columns(
            bad,
            "f.jsonl",
            ("in", "out", "t0", "t2"),
            ("in", "out"),
            (("arrival_s", "t0"), ("last_token_s", "t2")),
        )
    assert info.value.path == "f.jsonl:7"
