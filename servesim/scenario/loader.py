"""Reading a scenario: YAML files (I/O and syntax problems as one-line ScenarioErrors), dicts, the
default, and ``--set path.to.field=value`` overrides applied in order."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from servesim.scenario.build import Scenario, build_scenario
from servesim.scenario.schema import DEFAULT_SCENARIO
from servesim.simcore.config import (
    load_yaml,
    parse_set_option,
    plain_data,
    set_path,
)
from servesim.simcore.errors import ScenarioError


def read_yaml_file(file: str | Path, path: str = "scenario") -> dict[str, Any]:
    """Read a YAML mapping, turning I/O and syntax problems into one-line ScenarioErrors."""
    p = Path(file)
    if not p.exists():
        raise ScenarioError(path, str(file), "file not found; check the path")
    if p.is_dir():
        raise ScenarioError(path, str(file), "is a directory; give a YAML scenario file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(
            path, str(file), f"cannot read it ({exc.__class__.__name__}: {exc})"
        ) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(path, str(file), f"YAML syntax error{where}: {problem}") from None
    if data is None:
        raise ScenarioError(
            path,
            str(file),
            ("empty file" if not text.strip() else "the file holds only comments")
            + (
                "; a scenario needs at least a workload section, e.g. "
                "workload: {preset: chatbot, rate: 10, requests: 1000}"
                if path == "scenario"
                else f"; give the {path} file's fields"
            ),
        )
    if not isinstance(data, dict):
        raise ScenarioError(
            path, str(file), "the file must contain a YAML mapping (field: value) at the top level"
        )
    return data


def load_scenario(
    source: str | Path | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> Scenario:
    """Load and validate a scenario from a YAML file, a dict, or the default (``None``).

    ``overrides`` are ``path.to.field=value`` strings (what ``--set`` passes), applied in order.
    Fields the source omits take the defaults of :data:`DEFAULT_SCENARIO` and of each section.
    """
    base_dir: str | None = None
    if source is None:
        raw = copy.deepcopy(DEFAULT_SCENARIO)
    elif isinstance(source, Mapping):
        raw = copy.deepcopy(plain_data(source))
    else:
        raw = read_yaml_file(source)
        base_dir = str(Path(source).resolve().parent)
    for option in overrides:
        key, value = parse_set_option(option)
        set_path(raw, key, value)
    return build_scenario(raw, base_dir=base_dir)
