"""The ``servesim`` command line: run, check, list, audit, --help (DESIGN §6, §7, §8).

Most tests call :func:`servesim.cli.main` in-process and read its output with ``capsys``; two run
the installed console script to check the real process boundary (exit codes, stderr).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from servesim.cli import SHORTCUTS, main

SERVESIM = Path(sys.executable).with_name("servesim")
FAST = ["--requests", "40"]

SUMMARY_KEYS = [
    f"{metric}_{stat}_ms"
    for metric in ("ttft", "itl", "e2e", "scheduling_delay")
    for stat in ("mean", "p50", "p90", "p95", "p99")
] + [
    "injected_requests",
    "completed_requests",
    "responses_per_sec",
    "tokens_per_sec",
    "preemption_count",
    "cache_hit_rate",
    "kv_utilization_mean",
    "conservation",
    "audit",
]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A small run written to disk once, for the audit tests (copied before corrupting)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    assert main(["run", "--requests", "60", "--out", str(out)]) == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for file in src.iterdir():
        (dst / file.name).write_bytes(file.read_bytes())
    return dst


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(path.open(newline="", encoding="utf-8")))
    return rows[0], rows[1:]


def write_rows(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows([header, *rows])


# ------------------------------------------------------------------ run


def test_run_prints_a_summary_with_latencies_and_a_passed_audit(tmp_path, capsys):
    out = tmp_path / "results"
    code, stdout, stderr = run_cli(capsys, "run", "--requests", "200", "--out", str(out))
    assert code == 0, stderr
    assert "TTFT" in stdout and "ITL" in stdout and "E2E" in stdout
    assert "audit      passed" in stdout
    assert "200 completed of 200" in stdout
    assert f"results: {out.resolve()}" in stdout
    for name in ("summary.json", "requests.csv", "timeseries.csv", "steps.npz", "scenario.yaml"):
        assert (out / name).is_file(), name
    assert stderr == ""


def test_run_without_out_writes_under_results_in_the_working_directory(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    code, _, _ = run_cli(capsys, "run", *FAST)
    assert code == 0
    assert (tmp_path / "results" / "scenario" / "summary.json").is_file()


def test_no_write_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = run_cli(capsys, "run", *FAST, "--no-write")
    assert code == 0
    assert "results:" not in stdout
    assert list(tmp_path.iterdir()) == []


def test_json_prints_the_summary_with_the_documented_keys(capsys):
    code, stdout, _ = run_cli(capsys, "run", *FAST, "--no-write", "--json")
    assert code == 0
    summary = json.loads(stdout)
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    assert not missing, missing
    assert summary["audit"] == {"checked": True, "passed": True, "violations": []}
    assert summary["conservation"]["balanced"] is True
    assert summary["injected_requests"] == summary["completed_requests"] == 40


def test_json_output_equals_the_written_summary(tmp_path, capsys):
    out = tmp_path / "r"
    code, stdout, _ = run_cli(capsys, "run", *FAST, "--json", "--out", str(out))
    assert code == 0
    assert stdout == (out / "summary.json").read_text(encoding="utf-8")


def test_no_audit_skips_the_audit(capsys):
    code, stdout, _ = run_cli(capsys, "run", *FAST, "--no-write", "--no-audit")
    assert code == 0
    assert "audit      skipped" in stdout


# ------------------------------------------------------------------ shortcut flags

# flag -> (value given, getter on the summary's scenario facts, expected value)
FLAG_CASES = {
    "--model": ("qwen2.5-7b-instruct", lambda s: s["scenario"]["model"], "qwen2.5-7b-instruct"),
    "--gpu": ("A100-80", lambda s: s["scenario"]["gpu"], "A100-80"),
    "--tp": ("2", lambda s: s["scenario"]["tp"], 2),
    "--instances": ("3", lambda s: s["scenario"]["instances"], 3),
    "--rate": ("7.5", lambda s: s["scenario"]["workload"]["rate"], 7.5),
    "--requests": ("25", lambda s: s["injected_requests"], 25),
    "--preset": ("summarization", lambda s: s["scenario"]["workload"]["preset"], "summarization"),
    "--arrival": (
        "constant",
        lambda s: s["scenario"]["workload"]["arrival"]["process"],
        "constant",
    ),
    "--seed": ("1234", lambda s: s["scenario"]["seed"], 1234),
    "--latency-model": ("blackbox", lambda s: s["scenario"]["latency"]["model"], "blackbox"),
    "--max-num-seqs": ("8", lambda s: s["scenario"]["engine"]["max_num_seqs"], 8),
    "--max-num-batched-tokens": (
        "1024",
        lambda s: s["scenario"]["engine"]["max_num_batched_tokens"],
        1024,
    ),
    "--kv-blocks": ("3000", lambda s: s["scenario"]["engine"]["kv_blocks"], 3000),
    "--block-size": ("32", lambda s: s["scenario"]["engine"]["block_size"], 32),
    "--max-model-len": ("4096", lambda s: s["scenario"]["engine"]["max_model_len"], 4096),
    "--horizon": ("2min", lambda s: s["scenario"]["horizon_us"], 120_000_000),
    # responses_per_sec: x / (x + 10); with only it weighted, the score is that ratio
    "--fitness": (
        "responses_per_sec:1",
        lambda s: round(s["fitness"] - s["responses_per_sec"] / (s["responses_per_sec"] + 10), 12),
        0,
    ),
}
# flags that need companions to make a valid scenario
FLAG_COMPANIONS = {
    "--gpu": ["--model", "qwen2.5-7b-instruct"],
    "--tp": ["--model", "qwen2.5-7b-instruct"],
}


def test_every_shortcut_flag_has_a_mapping_test():
    assert set(SHORTCUTS) == set(FLAG_CASES) | {"--out"}


@pytest.mark.parametrize("flag", sorted(FLAG_CASES))
def test_a_shortcut_flag_sets_its_scenario_field(flag, capsys):
    value, getter, expected = FLAG_CASES[flag]
    argv = [
        "run",
        "--requests",
        "20",
        "--no-write",
        "--json",
        *FLAG_COMPANIONS.get(flag, []),
        flag,
        value,
    ]
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 0, stderr
    assert getter(json.loads(stdout)) == expected


@pytest.mark.parametrize("flag", sorted(SHORTCUTS))
def test_a_shortcut_flag_is_the_same_as_set_on_its_field(flag):
    path = SHORTCUTS[flag][0]
    value = FLAG_CASES[flag][0] if flag in FLAG_CASES else "somewhere"
    overrides = [f"{path}={value}"]
    companions = FLAG_COMPANIONS.get(flag, [])
    for other, other_value in zip(companions[::2], companions[1::2]):
        overrides.insert(0, f"{SHORTCUTS[other][0]}={other_value}")
    via_set = servesim.load_scenario(None, overrides)
    from servesim.cli import _load, build_parser

    args = build_parser().parse_args(["check", *companions, flag, value])
    via_flag = _load(args)
    assert via_flag.to_yaml() == via_set.to_yaml()
    assert via_flag.engine == via_set.engine
    assert via_flag.workload.describe() == via_set.workload.describe()


def test_out_sets_the_results_directory(tmp_path, capsys):
    out = tmp_path / "here"
    code, _, _ = run_cli(capsys, "run", *FAST, "--out", str(out))
    assert code == 0
    saved = json.loads((out / "summary.json").read_text())
    assert saved["injected_requests"] == 40


def test_exact_steps_flag_sets_the_field(capsys):
    code, stdout, _ = run_cli(capsys, "run", *FAST, "--no-write", "--json", "--exact-steps")
    assert code == 0
    summary = json.loads(stdout)
    assert summary["scenario"]["exact_steps"] is True
    assert summary["fast_forward_windows"] == 0


def test_set_wins_over_a_shortcut_flag(capsys):
    code, stdout, _ = run_cli(
        capsys,
        "run", "--no-write", "--json",
        "--requests", "10", "--set", "workload.requests=15",
        "--max-num-seqs", "4", "--set", "engine.max_num_seqs=6",
    )  # fmt: skip
    assert code == 0
    summary = json.loads(stdout)
    assert summary["injected_requests"] == 15
    assert summary["scenario"]["engine"]["max_num_seqs"] == 6


def test_flags_win_over_the_scenario_file_and_later_sets_win_over_earlier(tmp_path, capsys):
    file = tmp_path / "s.yaml"
    file.write_text(
        "engine: {max_num_seqs: 100, kv_blocks: 900}\n"
        "workload: {preset: chatbot, rate: 5, requests: 12}\n",
        encoding="utf-8",
    )
    code, stdout, _ = run_cli(
        capsys,
        "run", str(file), "--no-write", "--json",
        "--max-num-seqs", "9", "--set", "engine.kv_blocks=700", "--set", "engine.kv_blocks=800",
    )  # fmt: skip
    assert code == 0
    s = json.loads(stdout)
    assert s["scenario"]["engine"]["max_num_seqs"] == 9
    assert s["scenario"]["engine"]["kv_blocks"] == 800
    assert s["injected_requests"] == 12  # untouched file value


# ------------------------------------------------------------------ check and list


def test_check_prints_the_resolved_kv_blocks_and_context_limit(capsys):
    code, stdout, _ = run_cli(capsys, "check")
    assert code == 0
    assert "is valid" in stdout
    expected = servesim.load_scenario().engine
    assert f"kv_blocks {expected.kv_blocks} (auto: H100 x1" in stdout
    assert f"max_model_len {expected.max_model_len}" in stdout


def test_check_shows_explicit_values_and_flags(capsys):
    code, stdout, _ = run_cli(capsys, "check", "--kv-blocks", "1234", "--instances", "2")
    assert code == 0
    assert "kv_blocks 1234 (explicit)" in stdout
    assert "2 instance(s)" in stdout


def test_check_does_not_run_a_simulation(capsys, monkeypatch):
    import servesim.components.cluster as cluster

    def boom(*a, **k):
        raise AssertionError("check must not simulate")

    monkeypatch.setattr(cluster.Cluster, "run", boom)
    code, _, _ = run_cli(capsys, "check")
    assert code == 0


def test_list_shows_plugin_kinds_and_names(capsys):
    code, stdout, _ = run_cli(capsys, "list")
    assert code == 0
    for kind in ("routing", "scheduler", "preemption", "latency", "arrival", "length"):
        assert any(line.startswith(kind) for line in stdout.splitlines()), kind
    for name in ("blackbox", "round-robin", "fcfs", "poisson", "gaussian", "qwen3-14b", "H100"):
        assert name in stdout


def test_list_latency_shows_only_latency_models(capsys):
    code, stdout, _ = run_cli(capsys, "list", "latency")
    assert code == 0
    assert stdout.splitlines() == [
        line for line in stdout.splitlines() if line.startswith("latency")
    ]
    assert "blackbox" in stdout


# ------------------------------------------------------------------ audit


def test_audit_of_a_written_run_says_all_invariants_hold(saved_run, capsys):
    code, stdout, _ = run_cli(capsys, "audit", str(saved_run))
    assert code == 0
    assert "all invariants hold" in stdout
    assert "60 requests" in stdout


def test_audit_detects_a_completion_before_arrival(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "corrupt")
    header, rows = read_rows(run / "requests.csv")
    completion = header.index("completion_s")
    rows[7][completion] = "0.000000"
    write_rows(run / "requests.csv", header, rows)
    code, stdout, _ = run_cli(capsys, "audit", str(run))
    assert code == 3
    assert "INV-5" in stdout
    assert f"request {rows[7][0]}" in stdout


def test_audit_detects_a_deleted_request_row(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "corrupt")
    header, rows = read_rows(run / "requests.csv")
    del rows[10]
    write_rows(run / "requests.csv", header, rows)
    code, stdout, _ = run_cli(capsys, "audit", str(run))
    assert code == 3
    assert "INV-1" in stdout


def test_audit_detects_a_duplicated_request_row(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "corrupt")
    header, rows = read_rows(run / "requests.csv")
    rows.append(rows[3])
    write_rows(run / "requests.csv", header, rows)
    code, stdout, _ = run_cli(capsys, "audit", str(run))
    assert code == 3
    assert "INV-1" in stdout and f"request {rows[3][0]}" in stdout


def test_audit_of_a_directory_that_is_not_a_run_exits_2(tmp_path, capsys):
    code, _, stderr = run_cli(capsys, "audit", str(tmp_path))
    assert code == 2
    assert "summary.json" in one_error_line(stderr)


def test_audit_of_a_malformed_requests_row_exits_2(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "corrupt")
    header, rows = read_rows(run / "requests.csv")
    rows[2][0] = "not-a-number"
    write_rows(run / "requests.csv", header, rows)
    code, _, stderr = run_cli(capsys, "audit", str(run))
    assert code == 2
    assert "requests.csv line 4" in one_error_line(stderr)


def test_audit_of_a_corrupt_summary_json_exits_2_with_one_line(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "corrupt")
    (run / "summary.json").write_text("{not json", encoding="utf-8")
    code, _, stderr = run_cli(capsys, "audit", str(run))
    assert code == 2
    assert "summary.json" in one_error_line(stderr)


def test_audit_of_a_corrupt_steps_file_exits_2_with_one_line(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "corrupt")
    (run / "steps.npz").write_bytes(b"definitely not an npz archive")
    code, _, stderr = run_cli(capsys, "audit", str(run))
    assert code == 2
    assert "steps.npz" in one_error_line(stderr)


# ------------------------------------------------------------------ errors and help


def test_an_unwritable_results_directory_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    code, _, stderr = run_cli(capsys, "run", *FAST, "--out", str(blocker / "results"))
    assert code == 2
    assert str(blocker) in one_error_line(stderr)


def test_a_bad_flag_value_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--tp", "two"])
    assert info.value.code == 2
    assert "--tp" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    code, stdout, _ = run_cli(capsys)
    assert code == 0
    assert "COMMAND" in stdout or "run" in stdout


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_says_what_is_not_modelled(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "not modelled" in text
    for feature in ("disaggregation", "timeouts", "LoRA"):
        assert feature in text


def test_run_help_names_the_field_each_shortcut_sets(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for path, _, _ in SHORTCUTS.values():
        assert f"[{path}]" in text, path


# ------------------------------------------------------------------ the real console script


def console(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SERVESIM), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_console_script_runs_and_audits_a_written_run(tmp_path):
    out = tmp_path / "r"
    proc = console("run", "--requests", "200", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "audit      passed" in proc.stdout
    assert proc.stderr == ""
    proc = console("audit", str(out))
    assert proc.returncode == 0
    assert "all invariants hold" in proc.stdout


def test_console_script_exits_3_on_a_corrupted_run_and_2_on_bad_input(saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path / "corrupt")
    header, rows = read_rows(run / "requests.csv")
    del rows[0]
    write_rows(run / "requests.csv", header, rows)
    proc = console("audit", str(run))
    assert proc.returncode == 3
    assert "INV-1" in proc.stdout
    proc = console("run", "--set", "engine.max_num_seq=4", "--no-write")
    assert proc.returncode == 2
    assert "engine.max_num_seq" in one_error_line(proc.stderr)


def test_a_run_with_a_horizon_exits_0(capsys):
    code, stdout, stderr = run_cli(
        capsys, "run", "--requests", "100", "--rate", "10", "--horizon", "2s", "--no-write"
    )
    assert code == 0, stderr
    assert "audit      passed" in stdout


def test_audit_prints_each_recorded_kv_note_with_one_invariant_prefix(saved_run, tmp_path, capsys):
    run = copy_run(saved_run, tmp_path / "noted")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    note = "INV-4: instance 0: KV conservation broken: used 3 + free 5 != total 9"
    summary["audit"] = {"checked": True, "passed": False, "violations": [note]}
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    code, stdout, _ = run_cli(capsys, "audit", str(run))
    assert code == 3
    assert f"  {note}" in stdout.splitlines()
    assert "INV-4: INV-4" not in stdout


def test_an_unnamed_run_does_not_silently_replace_another_scenarios_results(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "run", *FAST)[0] == 0
    assert run_cli(capsys, "run", *FAST)[0] == 0  # the same scenario again: replaced
    code, _, stderr = run_cli(capsys, "run", "--requests", "41")
    assert code == 2
    line = one_error_line(stderr)
    assert "results/scenario" in line and "--force" in line
    assert "requests: 40" in (tmp_path / "results/scenario/scenario.yaml").read_text()
    assert run_cli(capsys, "run", "--requests", "41", "--force")[0] == 0
    assert "requests: 41" in (tmp_path / "results/scenario/scenario.yaml").read_text()


# ------------------------------------------------------------------ first-try friction


def test_trace_with_rate_names_both_flags(capsys):
    code, _, stderr = run_cli(capsys, "run", "--trace", "azure-conv", "--rate", "5", "--no-write")
    line = one_error_line(stderr)
    assert code == 2 and "--rate" in line and "--trace" in line


def test_an_empty_scenario_or_trace_file_says_empty_file(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text("", encoding="utf-8")
    (tmp_path / "t.csv").write_text("\n", encoding="utf-8")
    for argv in (["run", str(tmp_path / "s.yaml")], ["run", "--trace", str(tmp_path / "t.csv")]):
        code, _, stderr = run_cli(capsys, *argv, "--no-write")
        assert code == 2 and "empty file" in one_error_line(stderr)


def test_an_unsorted_trace_is_replayed_sorted_with_a_warning(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n1,5,5\n0,5,5\n", encoding="utf-8")
    code, _, stderr = run_cli(capsys, "run", "--trace", str(trace), "--no-write")
    assert code == 0
    assert "warning: 1 trace row(s) are not in arrival order (the first at line 3)" in stderr


@pytest.mark.parametrize("where", ["missing/out.csv", "a-file/out.csv", "a-folder"])
def test_convert_refuses_a_destination_it_cannot_write(tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    (tmp_path / "a-folder").mkdir()
    code, _, stderr = run_cli(capsys, "convert", "azure-conv", str(tmp_path / where))
    assert code == 2 and one_error_line(stderr).startswith("error: destination:")
