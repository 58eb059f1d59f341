"""The layout of ``analysis/`` and ``studies/`` (DESIGN §1), checked on the source with ast.

* every module stays under 600 lines;
* ``analysis`` reads what a run left behind: it imports nothing from ``studies``, ``fidelity``,
  ``cli`` or ``run`` (``run`` imports it), and ``studies`` imports nothing from ``cli``;
* the figures never import the report (the report draws the figures), and no module of either
  package takes part in an import circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import servesim

PACKAGE_DIR = Path(servesim.__file__).parent
FILES = sorted((PACKAGE_DIR / "analysis").rglob("*.py")) + sorted(
    (PACKAGE_DIR / "studies").rglob("*.py")
)
MAX_LINES = 600


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def rel(file: Path) -> str:
    return file.relative_to(PACKAGE_DIR.parent).as_posix()


def imported(file: Path, *, top_level_only: bool = False) -> set[str]:
    """servesim modules named by the import statements of ``file`` (absolute imports only, which
    is all the package uses); ``top_level_only`` skips imports inside functions."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name == "servesim" or name.startswith("servesim.")}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_packages_are_where_the_tests_expect_them():
    assert (PACKAGE_DIR / "analysis" / "plots" / "__init__.py").is_file()
    assert (PACKAGE_DIR / "studies" / "sweep" / "__init__.py").is_file()
    assert (PACKAGE_DIR / "studies" / "plan" / "__init__.py").is_file()
    for old in ("results", "plots", "report", "saved", "sweep", "plan"):
        assert not (PACKAGE_DIR / f"{old}.py").exists(), f"servesim/{old}.py is back"


@pytest.mark.parametrize("file", FILES, ids=rel)
def test_every_module_stays_under_600_lines(file):
    n = len(file.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{rel(file)} has {n} lines; split it by noun"


@pytest.mark.parametrize("file", FILES, ids=rel)
def test_imports_flow_one_way(file):
    module = module_name(file)
    banned = ["servesim.cli"]
    if under(module, "servesim.analysis"):
        banned += ["servesim.studies", "servesim.fidelity", "servesim.run"]
    if under(module, "servesim.analysis.plots"):
        banned += ["servesim.analysis.report", "servesim.analysis.accessor"]
    bad = sorted(n for n in imported(file) if any(under(n, b) for b in banned))
    assert not bad, f"{rel(file)} imports {bad}"


def test_no_module_of_analysis_or_studies_is_in_an_import_circle():
    modules = {module_name(f): f for f in FILES}
    graph = {}
    for name, file in modules.items():
        deps = set()
        for dep in imported(file, top_level_only=True):
            while dep not in modules and "." in dep:
                dep = dep.rpartition(".")[0]
            # importing a.b.c runs a.b/__init__ first; a package's own __init__ re-exporting its
            # modules is not a circle, so a module's own package is left out
            if dep in modules and dep != name and not under(name, dep):
                deps.add(dep)
        graph[name] = deps

    done, stack, circles = set(), [], []

    def visit(node: str) -> None:
        if node in stack:
            circles.append(stack[stack.index(node) :] + [node])
            return
        if node in done:
            return
        stack.append(node)
        for dep in sorted(graph[node]):
            visit(dep)
        stack.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    assert not circles, circles
