"""Files named by scenario fields: where a relative path points, and the error when none is there.

A scenario may name files (a length histogram, a coefficients YAML, ...). Every such field
resolves the same way, so that a scenario moved with its files keeps working: ``~`` is expanded
and a relative path is taken against the scenario's directory when it is known, else against the
working directory. A missing file is refused with the resolved path and the directory used.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import Any

from servesim.simcore.errors import ScenarioError


def existing_file(
    name: str | PathLike[str],
    path: str,
    base_dir: str | PathLike[str] | None,
    *,
    shown: Any,
    hint: str = "",
) -> Path:
    """The existing file ``name`` names, resolved as the module says.

    A missing file raises a ScenarioError for the field ``path`` showing ``shown`` (the value as
    the scenario gave it), the resolved path and the directory relative paths are resolved
    against; ``hint`` ends the message with how to make one.
    """
    file = Path(name).expanduser()
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if not file.is_absolute():
        file = base / file
    if not file.is_file():
        raise ScenarioError(
            path, shown, f"no such file: {file} (relative paths are resolved against {base}){hint}"
        )
    return file
