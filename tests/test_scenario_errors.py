"""Bad scenarios fail at load time with one clear line that names the field (DESIGN §6).

Every file in ``tests/data/bad/`` starts with ``# expect: <part of the field path>``. Loading it
must raise :class:`ScenarioError` naming that field, and ``servesim run FILE`` must exit with code
2 after printing exactly one ``error:`` line (no traceback).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from servesim.cli import main
from servesim.simcore.errors import ScenarioError, UnknownPluginError

BAD_DIR = Path(__file__).parent / "data" / "bad"
BAD_FILES = sorted(BAD_DIR.glob("*.yaml"))
SERVESIM = Path(sys.executable).with_name("servesim")


def expected_field(file: Path) -> str:
    first = file.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{file.name}: first line must be '# expect: <field>'"
    return first.removeprefix("# expect: ").strip()


def load_error(source, overrides=()) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        servesim.load_scenario(source, overrides)
    return info.value


def assert_one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2, f"exit code {code}, stderr: {err!r}"
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
    assert lines[0].startswith("error: ")
    return lines[0]


def test_the_corpus_has_at_least_fifty_bad_scenarios():
    assert len(BAD_FILES) >= 50


@pytest.mark.parametrize("file", BAD_FILES, ids=lambda f: f.stem)
def test_loading_a_bad_scenario_raises_an_error_naming_the_field(file):
    field = expected_field(file)
    err = load_error(file)
    assert field in err.path, f"error path {err.path!r} does not name {field!r}: {err}"
    message = str(err)
    assert field in message
    assert "\n" not in message
    # "<path>: invalid value <value>: <what is allowed>"
    assert message.startswith(f"{err.path}: invalid value ")
    assert err.fix.strip(), "the error must say what is allowed instead"


@pytest.mark.parametrize("file", BAD_FILES, ids=lambda f: f.stem)
def test_running_a_bad_scenario_prints_one_error_line_and_exits_2(file, capsys):
    code = main(["run", str(file), "--no-write"])
    captured = capsys.readouterr()
    line = assert_one_error_line(code, captured.out, captured.err)
    assert expected_field(file) in line


@pytest.mark.parametrize(
    "name", ["yaml_syntax_error", "model_does_not_fit", "missing_empirical_file"]
)
def test_the_console_script_reports_a_bad_scenario_in_one_line(name):
    file = BAD_DIR / f"{name}.yaml"
    proc = subprocess.run(
        [str(SERVESIM), "run", str(file), "--no-write"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    line = assert_one_error_line(proc.returncode, proc.stdout, proc.stderr)
    assert expected_field(file) in line


# ------------------------------------------------------------------ what the messages say


def test_unknown_plugins_list_the_known_names():
    for name, known in (
        ("unknown_routing", "round-robin"),
        ("unknown_scheduler", "fcfs"),
        ("unknown_latency_model", "blackbox"),
        ("unknown_preemption", "fcfs"),
    ):
        err = load_error(BAD_DIR / f"{name}.yaml")
        assert isinstance(err, UnknownPluginError), name
        assert known in err.known
        assert known in str(err)


def test_a_typo_in_a_field_name_suggests_the_right_one():
    assert "did you mean 'max_num_seqs'" in str(load_error(BAD_DIR / "unknown_nested_field.yaml"))
    assert "did you mean 'horizon'" in str(load_error(BAD_DIR / "unknown_top_level_field.yaml"))


def test_a_yaml_syntax_error_names_the_line():
    message = str(load_error(BAD_DIR / "yaml_syntax_error.yaml"))
    assert "YAML syntax error at line 3" in message


def test_a_model_that_does_not_fit_says_how_many_gpus_it_needs():
    message = str(load_error(BAD_DIR / "model_does_not_fit.yaml"))
    assert "does not fit" in message and "tp" in message


def test_missing_coefficients_name_the_combination_and_the_alternatives():
    message = str(load_error(BAD_DIR / "no_blackbox_coefficients.yaml"))
    assert "A100-80" in message and "tp=4" in message
    assert "H100 tp=1" in message  # what is available for that model
    assert "latency.alpha" in message  # the fix


def test_a_missing_file_is_named_with_its_resolved_path():
    message = str(load_error(BAD_DIR / "missing_empirical_file.yaml"))
    assert str(BAD_DIR / "no_such_lengths.txt") in message


def test_nan_and_infinite_rates_are_rejected_as_not_finite():
    for name in ("nan_rate", "inf_rate"):
        assert "finite" in str(load_error(BAD_DIR / f"{name}.yaml"))


def test_a_missing_scenario_file_or_a_directory_is_a_scenario_error(tmp_path):
    assert load_error(tmp_path / "nope.yaml").path == "scenario"
    assert "directory" in str(load_error(tmp_path))


# ------------------------------------------------------------------ --set


BAD_SETS = [
    (["engine..max_num_seqs=4"], "--set"),
    (["=4"], "--set"),
    (["no-equals-sign"], "--set"),
    (["engine.max_num_seq=4"], "engine.max_num_seq"),
    (["enigne.max_num_seqs=4"], "enigne"),
    (["engine.block_size.tokens=4"], "engine.block_size"),
    (["workload.rate=[1"], "workload.rate"),
    (["workload.rate=-1"], "workload.rate"),
    (["workload=5"], "workload"),
    (["policies.routing=fastest"], "policies.routing"),
    (["latency.model=no-such-model"], "latency.model"),
]


@pytest.mark.parametrize("overrides,field", BAD_SETS, ids=[o[0] for o, _ in BAD_SETS])
def test_a_bad_set_override_names_the_field(overrides, field):
    err = load_error(None, overrides)
    assert field in err.path
    assert "\n" not in str(err)


@pytest.mark.parametrize("overrides,field", BAD_SETS, ids=[o[0] for o, _ in BAD_SETS])
def test_a_bad_set_override_on_the_command_line_exits_2(overrides, field, capsys):
    argv = ["check"]
    for option in overrides:
        argv += ["--set", option]
    code = main(argv)
    captured = capsys.readouterr()
    assert field in assert_one_error_line(code, captured.out, captured.err)


def test_a_set_override_does_not_hide_a_malformed_section():
    # `workload: [chatbot, 10]` is reported as "workload: expected a mapping" on its own; a
    # shortcut flag (--requests 20 == --set workload.requests=20) must not silently discard the
    # user's list and report a different, misleading field instead.
    err = load_error(BAD_DIR / "workload_is_a_list.yaml", ["workload.requests=20"])
    assert err.path == "workload", str(err)


def test_every_bad_file_is_also_rejected_by_check(capsys):
    for file in BAD_FILES:
        code = main(["check", str(file)])
        captured = capsys.readouterr()
        assert_one_error_line(code, captured.out, captured.err)


def test_a_rejected_scenario_prints_no_warnings_before_its_error(capsys):
    # kv_blocks 100 caps max_model_len (a load-time warning) but the rate is invalid: the user
    # should see the one error line, not a warning about a scenario that will never run.
    code = main(["check", "--kv-blocks", "100", "--rate", "-1"])
    captured = capsys.readouterr()
    assert "workload.rate" in assert_one_error_line(code, captured.out, captured.err)


def test_a_field_given_twice_is_rejected(tmp_path):
    # PyYAML keeps the last of two equal keys: here the first `engine:` section (max_num_seqs: 8)
    # would be dropped without a word. A scenario that says two things must be an error.
    file = tmp_path / "twice.yaml"
    file.write_text(
        "engine: {max_num_seqs: 8}\n"
        "workload: {preset: chatbot, rate: 10, requests: 50}\n"
        "engine: {block_size: 32}\n",
        encoding="utf-8",
    )
    err = load_error(file)
    assert "engine" in str(err)


# ------------------------------------------------------------------ how a bad value is shown


def test_a_long_path_is_shown_whole_never_cut_in_the_middle():
    path = "/tmp/" + "/".join(f"folder-{i:03d}" for i in range(40)) + "/scenario.yaml"
    message = str(ScenarioError("output.dir", path, "choose another --out"))
    assert repr(path) in message


def test_numbers_are_shown_in_full_whatever_their_type():
    import numpy as np

    assert "123456789012345678901234567890" in str(
        ScenarioError("x", 123456789012345678901234567890, "f")
    )
    assert "invalid value 1e+300:" in str(ScenarioError("x", 1e300, "f"))
    assert "invalid value 3.5:" in str(ScenarioError("x", np.float64(3.5), "f"))


def test_a_huge_nested_value_is_abridged_without_being_expanded():
    # What a YAML alias bomb loads into: every level shares one list, so expanding it whole
    # would render 10**9 items.
    level = [1] * 10
    for _ in range(9):
        level = [level] * 10
    message = str(ScenarioError("workload.rate", level, "expected a number"))
    assert len(message) < 300
    assert "(10 items)" in message
