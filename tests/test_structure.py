"""The layering rules of DESIGN §1 and the oracle boundary (INV-9), checked on the source with ast.

* ``simcore`` knows nothing about LLMs: it imports nothing from ``components``, ``policies``,
  ``latency`` or ``workloads`` (the registry names the built-in plugin packages as strings, for
  lazy discovery; that is the one allowed mention).
* ``simcore`` uses no word of the served domain (request, token, KV, prefill, ...): it is a
  generic discrete-event kit.
* ``audit`` reads the run record's plain arrays: it imports ``simcore`` and nothing else of
  servesim.
* ``policies``, ``latency`` and ``workloads`` depend on ``simcore`` only; policies and latency
  models never import SimPy, directly or through another servesim module.
* INV-9: a request's oracle output length (``oracle_output_tokens``) is read only by the
  mechanism that must know it (request, engine, cluster recorder, record, results) and the
  post-run auditor — never by a
  policy, the scenario loader or routing code.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

import servesim

PACKAGE_DIR = Path(servesim.__file__).parent
LLM_SUBPACKAGES = ("components", "policies", "latency", "workloads")


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


ALL_FILES = sorted(PACKAGE_DIR.rglob("*.py"))
MODULES = {module_name(f): f for f in ALL_FILES}


def files_in(subpackage: str) -> list[Path]:
    return sorted((PACKAGE_DIR / subpackage).rglob("*.py"))


def rel(file: Path) -> str:
    return file.relative_to(PACKAGE_DIR.parent).as_posix()


@cache
def tree(file: Path) -> ast.Module:
    return ast.parse(file.read_text(encoding="utf-8"), filename=str(file))


def imports(file: Path) -> list[tuple[str, int]]:
    """Every module an import statement in ``file`` names (function-level imports included),
    resolved to absolute names; ``from pkg import name`` yields ``pkg.name`` when that is a module."""
    module = module_name(file)
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree(file)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, node.lineno))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.append((f"{base}.{alias.name}", node.lineno))
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_source_tree_is_where_the_tests_expect_it():
    for sub in ("simcore", *LLM_SUBPACKAGES):
        assert (PACKAGE_DIR / sub / "__init__.py").is_file(), sub
    assert files_in("simcore") and files_in("policies") and files_in("latency")


# ------------------------------------------------------------------ simcore


@pytest.mark.parametrize("file", files_in("simcore"), ids=rel)
def test_simcore_imports_nothing_llm_specific(file):
    bad = [
        f"{rel(file)}:{line} imports {name}"
        for name, line in imports(file)
        if any(under(name, f"servesim.{sub}") for sub in LLM_SUBPACKAGES)
        or under(name, "servesim.scenario")
        or under(name, "servesim.analysis")
        or under(name, "servesim.run")
    ]
    assert not bad, bad


def test_simcore_names_plugin_packages_only_in_the_registry_discovery_list():
    """String mentions of the LLM packages (e.g. for importlib) are allowed only in
    registry.py's ``_BUILTIN_MODULES`` tuple, and only simcore/registry.py imports dynamically."""
    allowed: set[int] = set()
    registry_file = PACKAGE_DIR / "simcore" / "registry.py"
    for node in ast.walk(tree(registry_file)):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_BUILTIN_MODULES" for t in node.targets
        ):
            allowed.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    assert allowed, "registry.py should list the built-in plugin modules in _BUILTIN_MODULES"

    problems = []
    for file in files_in("simcore"):
        for node in ast.walk(tree(file)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.strip()
                mentions = any(text.startswith(f"servesim.{sub}") for sub in LLM_SUBPACKAGES)
                if mentions and id(node) not in allowed:
                    problems.append(f"{rel(file)}:{node.lineno} names {text!r}")
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("import_module", "__import__") and file != registry_file:
                    problems.append(f"{rel(file)}:{node.lineno} imports dynamically")
    assert not problems, problems


def test_the_registry_discovery_list_names_only_plugin_packages():
    from servesim.simcore import registry

    for name in registry._BUILTIN_MODULES:
        assert name in MODULES, name
        assert any(under(name, f"servesim.{sub}") for sub in ("latency", "workloads", "policies"))


# Words of the served domain. simcore is a generic DES kit: none of these may appear in its
# source (identifiers, strings, comments or docstrings), except in the registry's two declared
# tables of contents (the plugin ``KINDS`` and the ``_BUILTIN_MODULES`` to import), which name
# the plugin kinds users write in scenarios. "latency" counts: a step-time model is LLM serving's.
DOMAIN_WORDS = re.compile(
    r"\b(requests?|tokens?|kv|prefill\w*|decod\w*|models?|gpus?|batch\w*|latency|instances?|"
    r"llms?|prompts?|vllm|disaggregat\w*|sessions?)\b",
    re.IGNORECASE,
)
REGISTRY_TABLES = ("KINDS", "_BUILTIN_MODULES")


def _registry_table_lines(file: Path) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree(file)):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in REGISTRY_TABLES for t in node.targets
        ):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


@pytest.mark.parametrize("file", files_in("simcore"), ids=rel)
def test_simcore_source_uses_no_words_of_the_served_domain(file):
    exempt = _registry_table_lines(file) if file.name == "registry.py" else set()
    found = [
        f"{rel(file)}:{number}: {match.group(0)!r} in {line.strip()!r}"
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1)
        if number not in exempt
        for match in DOMAIN_WORDS.finditer(line)
    ]
    assert not found, found


def test_the_domain_word_scan_is_not_vacuous():
    sample = "a Request's KV blocks, its prefill and decode tokens on GPU instance 2"
    assert len(DOMAIN_WORDS.findall(sample)) == 7
    assert not DOMAIN_WORDS.search("isinstance(value, str); the step priority; a server")
    registry_file = PACKAGE_DIR / "simcore" / "registry.py"
    assert _registry_table_lines(registry_file), "registry.py should declare KINDS"


# ------------------------------------------------------------------ audit


@pytest.mark.parametrize("file", files_in("audit"), ids=rel)
def test_the_auditor_depends_on_simcore_and_the_run_record_only(file):
    """DESIGN §1: ``audit`` → ``simcore`` and the run record; it reads plain arrays, so it can
    check a saved run, and never imports SimPy or the processes that made the run."""
    allowed = ("servesim.simcore", "servesim.audit", "servesim.components.record")
    bad = [
        f"{rel(file)}:{line} imports {name}"
        for name, line in imports(file)
        if (under(name, "servesim") and not any(under(name, a) for a in allowed))
        or under(name, "simpy")
    ]
    assert not bad, bad


# ------------------------------------------------------------------ policies, latency, workloads


def servesim_deps(module: str) -> set[str]:
    """servesim modules imported by ``module`` (plus the packages whose __init__ runs first)."""
    out = set()
    for name, _ in imports(MODULES[module]):
        if not under(name, "servesim"):
            continue
        while name not in MODULES and "." in name:
            name = name.rpartition(".")[0]
        parts = name.split(".")
        # importing a.b.c runs a.b/__init__ too; the top-level servesim/__init__ (the public API
        # that re-exports everything) is excluded, it is not a dependency of a leaf module
        for i in range(2, len(parts) + 1):
            out.add(".".join(parts[:i]))
    return out - {module}


def closure(module: str) -> tuple[set[str], set[str]]:
    """(servesim modules reachable from ``module``, third-party top-level imports on the way)."""
    seen, third_party, todo = set(), set(), [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, _ in imports(MODULES[current]):
            if not under(name, "servesim"):
                third_party.add(name.split(".")[0])
        todo.extend(servesim_deps(current) - seen)
    return seen, third_party


LEAF_FILES = files_in("policies") + files_in("latency") + files_in("workloads")


@pytest.mark.parametrize("file", LEAF_FILES, ids=rel)
def test_policies_latency_and_workloads_depend_on_simcore_only(file):
    module = module_name(file)
    own = module.split(".")[1]
    bad = [
        f"{rel(file)}:{line} imports {name}"
        for name, line in imports(file)
        if under(name, "servesim")
        and not under(name, "servesim.simcore")
        and not under(name, f"servesim.{own}")
    ]
    assert not bad, bad


@pytest.mark.parametrize("file", files_in("policies") + files_in("latency"), ids=rel)
def test_policies_and_latency_models_never_reach_simpy_or_components(file):
    reachable, third_party = closure(module_name(file))
    assert "simpy" not in third_party, f"{rel(file)} reaches simpy via {sorted(reachable)}"
    leaks = sorted(m for m in reachable if under(m, "servesim.components"))
    assert not leaks, leaks
    assert "servesim.simcore.env" not in reachable  # the SimPy wrapper


# ------------------------------------------------------------------ INV-9 oracle boundary

ORACLE = "oracle_output_tokens"
ORACLE_READERS = {
    "servesim/components/request.py",
    "servesim/components/engine.py",
    "servesim/components/cluster.py",
    "servesim/components/record.py",
    "servesim/analysis/metrics.py",
    "servesim/audit/timeline.py",  # after the run: no request outputs more than it sampled
}
# Request fields computed from the oracle length at enqueue (the engine's private knowledge).
ORACLE_DERIVED = {ORACLE, "target_output", "finish_step"}


def mentions(file: Path, names: set[str]) -> list[str]:
    """Code uses of any identifier in ``names``: attributes, names, keywords, parameters and
    exact string constants (getattr/slots); prose in docstrings does not count."""
    found = []
    for node in ast.walk(tree(file)):
        hit = None
        if isinstance(node, ast.Attribute) and node.attr in names:
            hit = node.attr
        elif isinstance(node, ast.Name) and node.id in names:
            hit = node.id
        elif isinstance(node, ast.keyword) and node.arg in names:
            hit = node.arg
        elif isinstance(node, ast.arg) and node.arg in names:
            hit = node.arg
        elif isinstance(node, ast.Constant) and node.value in names:
            hit = node.value
        if hit:
            found.append(f"{rel(file)}:{getattr(node, 'lineno', '?')} uses {hit}")
    return found


def test_the_oracle_output_length_is_read_only_by_the_mechanism():
    leaks = [m for f in ALL_FILES if rel(f) not in ORACLE_READERS for m in mentions(f, {ORACLE})]
    assert not leaks, leaks


def test_the_boundary_check_does_see_the_known_readers():
    # guards against a vacuous pass (e.g. a renamed field)
    assert mentions(PACKAGE_DIR / "components" / "engine.py", {ORACLE})
    assert mentions(PACKAGE_DIR / "components" / "cluster.py", {ORACLE})


@pytest.mark.parametrize("file", files_in("policies"), ids=rel)
def test_policies_never_read_the_oracle_or_fields_derived_from_it(file):
    leaks = mentions(file, ORACLE_DERIVED)
    assert not leaks, leaks


@pytest.mark.parametrize(
    "file",
    [
        *files_in("scenario"),
        PACKAGE_DIR / "components" / "gateway.py",
        *sorted(PACKAGE_DIR.rglob("*rout*.py")),
    ],
    ids=rel,
)
def test_the_scenario_loader_and_routing_code_never_read_the_oracle(file):
    leaks = mentions(file, ORACLE_DERIVED)
    assert not leaks, leaks


def test_the_engine_reads_the_oracle_only_when_a_request_is_enqueued():
    """The engine turns the oracle into the request's target once, in ``set_target``, called when
    a request is enqueued (``add_request``); batch formation and preemption work from
    ``target_output``, never from the oracle again. (Disaggregated serving also calls it when a
    split request's prefill has made its first token: see the cluster test below.)"""
    engine = tree(PACKAGE_DIR / "components" / "engine.py")
    readers = set()
    callers = set()
    for fn in ast.walk(engine):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(isinstance(n, ast.Attribute) and n.attr == ORACLE for n in ast.walk(fn)):
                readers.add(fn.name)
            if any(isinstance(n, ast.Attribute) and n.attr == "set_target" for n in ast.walk(fn)):
                callers.add(fn.name)
    assert readers == {"set_target"}
    assert callers == {"add_request"}


def test_the_cluster_sets_a_split_requests_target_only_after_its_first_token():
    """A split request learns whether its first token was its last (an EOS the client can see)
    only once the prefill instance produced it: ``_on_prefill_done`` is the only caller."""
    callers = {
        fn.name
        for file in ("cluster.py", "lifecycle.py", "disaggregation.py")
        for fn in ast.walk(tree(PACKAGE_DIR / "components" / file))
        if isinstance(fn, ast.FunctionDef)
        and any(isinstance(n, ast.Attribute) and n.attr == "set_target" for n in ast.walk(fn))
    }
    assert callers == {"_on_prefill_done"}


CONTROL_PLANE_METHODS = {
    "_lifecycle",
    "_refuse",
    "_on_refused",
    "_trace_decision",
    "_choose",
    "_choose_pd",
}


def test_the_cluster_control_plane_never_reads_the_oracle():
    """Admission, gateway hand-off and routing (lifecycle.py, disaggregation.py) work without the
    output length; only request creation (_source) and recording (_append) touch it."""
    seen = set()
    for fn in (
        fn
        for file in ("lifecycle.py", "disaggregation.py")
        for fn in ast.walk(tree(PACKAGE_DIR / "components" / file))
    ):
        if isinstance(fn, ast.FunctionDef) and fn.name in CONTROL_PLANE_METHODS:
            seen.add(fn.name)
            for node in ast.walk(fn):
                name = getattr(node, "attr", None) or getattr(node, "id", None)
                assert name not in ORACLE_DERIVED, f"{fn.name} reads {name}"
    assert seen == CONTROL_PLANE_METHODS, f"methods renamed? found {sorted(seen)}"


# ------------------------------------------------------------------ rooms: sizes and circles

LONGEST = 600
LONGEST_EXCEPTIONS = {"servesim/components/engine.py": 800}  # the batch loop reads better whole


def test_no_module_is_longer_than_its_limit():
    too_long = []
    for file in ALL_FILES:
        limit = LONGEST_EXCEPTIONS.get(rel(file), LONGEST)
        lines = len(file.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            too_long.append(f"{rel(file)}: {lines} lines (limit {limit})")
    assert not too_long, "split these by noun: " + "; ".join(too_long)


def _module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, file in MODULES.items():
        targets = set()
        for target, _ in imports(file):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]  # `from pkg.mod import name` -> pkg.mod
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)  # a package's __init__ importing its own modules is fine
        graph[name] = targets
    return graph


def test_no_import_circles_between_modules():
    # Function-level imports count too: a circle that only runs lazily is still two rooms that
    # each need the other.
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"
