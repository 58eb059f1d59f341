"""Point identity and the values points carry: the id (a short hash of the base scenario's content,
the point's overrides and its seed, so an unchanged point keeps its id, and its result, across
edits of the sweep), the overrides as ``--set`` strings, table cells, atomic file writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from servesim.simcore.config import plain_data as _plain
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic

ID_LENGTH = 10


def override_strings(overrides: Mapping[str, Any]) -> list[str]:
    """``{"workload.rate": 10}`` as the ``FIELD=VALUE`` strings load_scenario takes."""
    return [f"{key}={_yaml_value(value)}" for key, value in overrides.items()]


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(
        value, default_flow_style=True, sort_keys=False, width=2**31, allow_unicode=True
    )
    return text.removesuffix("\n...\n").strip()


def _point_id(
    base_content: Any, overrides: Mapping[str, Any], file_dirs: Sequence[Path] = ()
) -> str:
    """A point's id: a hash of the base scenario, its overrides and the content of every file
    they name (a trace, a model config, a coefficients file); ids of scenarios that name no
    file are as before."""
    identity: dict[str, Any] = {"scenario": base_content, "overrides": overrides}
    files = _referenced_files({"scenario": base_content, "overrides": overrides}, file_dirs)
    if files:
        identity["files"] = files
    text = _canonical(identity)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:ID_LENGTH]


def _referenced_files(value: Any, dirs: Sequence[Path]) -> dict[str, str]:
    """{text: sha256 of the file's bytes} for every string in ``value`` that names an existing
    file (absolute, or relative to one of ``dirs``)."""
    found: dict[str, str] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif (
            isinstance(item, str)
            and item not in found
            and 0 < len(item) < 4096
            and "\n" not in item
        ):
            file = _existing_file(item, dirs)
            if file is not None:
                found[item] = _file_digest(file)
    return found


def _existing_file(text: str, dirs: Sequence[Path]) -> Path | None:
    try:
        candidate = Path(text).expanduser()
        for file in [candidate] if candidate.is_absolute() else [d / candidate for d in dirs]:
            if file.is_file():
                return file
    except (OSError, ValueError):
        return None
    return None


def _file_digest(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), default=str)


def _cell(value: Any) -> str:
    """A table cell: exact numbers (shortest round-trip), JSON for lists and mappings."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, (list, tuple, Mapping)):
        return json.dumps(_plain(value), separators=(",", ":"))
    return str(value)


def _write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary sibling and a rename: a reader never sees half a file."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise ScenarioError(
            "--out", str(path), f"cannot write it ({exc.strerror or exc}); choose another --out"
        ) from None
