"""The fidelity rooms: small modules, imports only downward (readers → step tables → fits → the
calibrate command), no circles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import servesim.fidelity

ROOT = Path(servesim.fidelity.__file__).parent
FILES = sorted(ROOT.rglob("*.py"))
# a room may import only the rooms before it (and itself); a room not listed is not checked
ORDER = ("readers", "steptables", "replay", "fits", "validate", "calibrate")


def room(module: str) -> str:
    return module.removeprefix("servesim.fidelity.").split(".")[0]


def fidelity_imports(file: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "servesim.fidelity."
        ):
            found.append((node.module, node.lineno))
    return found


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.relative_to(ROOT).as_posix())
def test_every_fidelity_module_stays_under_600_lines(file):
    assert len(file.read_text(encoding="utf-8").splitlines()) <= 600


@pytest.mark.parametrize(
    "file",
    [f for f in FILES if f != ROOT / "__init__.py"],
    ids=lambda f: f.relative_to(ROOT).as_posix(),
)
def test_fidelity_modules_import_only_downward(file):
    own = room(".".join(file.relative_to(ROOT.parent.parent).with_suffix("").parts))
    if own not in ORDER:
        pytest.skip(f"{own} is not one of the ordered rooms")
    bad = [
        f"line {line} imports {module}"
        for module, line in fidelity_imports(file)
        if room(module) in ORDER and ORDER.index(room(module)) > ORDER.index(own)
    ]
    assert not bad, bad


def test_the_step_tables_never_import_the_fits():
    # the old calibrate <-> aiconfigurator circle: StepTable now lives below both
    for file in (ROOT / "steptables").glob("*.py"):
        assert all(room(m) in ("readers", "steptables") for m, _ in fidelity_imports(file)), file
