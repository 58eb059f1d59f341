"""Files named by scenario fields (servesim.simcore.paths.existing_file) and the two fields that
resolve through it: a length histogram's ``file`` and ``latency.file``."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.latency.blackbox import resolve_coefficients_file
from servesim.simcore.errors import ScenarioError
from servesim.simcore.paths import existing_file
from servesim.workloads.lengths import resolve_path


def test_a_relative_name_resolves_against_the_base_directory(tmp_path):
    (tmp_path / "a.yaml").write_text("x: 1\n")
    assert existing_file("a.yaml", "f", tmp_path, shown="a.yaml") == tmp_path / "a.yaml"
    absolute = tmp_path / "a.yaml"
    assert existing_file(absolute, "f", Path("/elsewhere"), shown=absolute) == absolute


def test_a_relative_name_resolves_against_the_working_directory_without_a_base(
    tmp_path, monkeypatch
):
    (tmp_path / "a.yaml").write_text("x: 1\n")
    monkeypatch.chdir(tmp_path)
    assert existing_file("a.yaml", "f", None, shown="a.yaml") == tmp_path / "a.yaml"


def test_a_missing_file_names_the_field_the_resolved_path_and_the_directory(tmp_path):
    with pytest.raises(ScenarioError) as info:
        existing_file(
            "gone.csv", "workload.input.file", tmp_path, shown="gone.csv", hint="; add it"
        )
    assert info.value.path == "workload.input.file"
    assert info.value.fix == (
        f"no such file: {tmp_path / 'gone.csv'} (relative paths are resolved against "
        f"{tmp_path}); add it"
    )


def test_both_scenario_fields_keep_their_own_words_for_a_missing_file(tmp_path):
    with pytest.raises(ScenarioError) as lengths:
        resolve_path("gone.csv", "workload.input.file", tmp_path)
    assert lengths.value.fix.endswith(f"(relative paths are resolved against {tmp_path})")
    with pytest.raises(ScenarioError) as latency:
        resolve_coefficients_file("gone.yaml", "latency.file", tmp_path)
    assert latency.value.fix.endswith("; write one with `servesim calibrate ... --out FILE`")
