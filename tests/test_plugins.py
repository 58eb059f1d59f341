"""servesim.plugins, the plugin author's front door: what it exports, ``--plugin FILE`` from the
command line, and ``register(..., replace=True)`` taking effect on a built-in name."""

from __future__ import annotations

import csv
import sys
import textwrap

import pytest

import servesim
import servesim.plugins as plugins
from servesim.cli import main
from servesim.policies.admission import AdmissionPolicy, AlwaysAdmit
from servesim.simcore import registry

ROUTER_FILE = """\
from servesim.plugins import RoutingPolicy, register


@register("routing", "to-last-instance")
class ToLastInstance(RoutingPolicy):
    def route(self, request, snapshots):
        return snapshots[-1].index
"""


@pytest.fixture
def forget_plugin_file():
    """Unregister what a plugin file registered and forget its module, after the test."""
    names: list[tuple[str, str, str]] = []  # (kind, name, module)
    yield names
    for kind, name, module in names:
        registry.REGISTRIES[kind]._items.pop(name, None)
        sys.modules.pop(module, None)


def test_the_front_door_has_a_base_class_and_a_check_for_every_kind():
    assert set(plugins.BASE_CLASSES) == set(registry.KINDS)
    for kind, base in plugins.BASE_CLASSES.items():
        for name in registry.registry(kind).names():
            assert issubclass(registry.get(kind, name), base), (kind, name)
    checks = {
        name for name in plugins.__all__ if name.startswith("check_") and name != "check_keys"
    }
    assert checks == {
        "check_admission",
        "check_scheduler",
        "check_preemption",
        "check_saturation",
        "check_autoscaler",
        "check_decider",
        "check_scorer",
        "check_router",
        "check_latency_model",
        "check_arrival",
        "check_length",
    }
    for name in plugins.__all__:
        assert hasattr(plugins, name), name


def test_a_local_router_file_runs_from_the_cli_with_no_packaging(
    tmp_path, capsys, forget_plugin_file
):
    forget_plugin_file.append(("routing", "to-last-instance", "my_local_routers"))
    file = tmp_path / "my_local_routers.py"
    file.write_text(ROUTER_FILE)
    out = tmp_path / "results"
    code = main(
        [
            "run",
            "--plugin",
            str(file),
            "--set",
            "policies.routing=to-last-instance",
            "--set",
            "cluster.instances=3",
            "--requests",
            "40",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr().err
    with open(out / "requests.csv", newline="") as f:
        instances = {row["instance"] for row in csv.DictReader(f)}
    assert instances == {"2"}


def test_a_plugin_file_that_is_missing_or_broken_is_a_one_line_error(tmp_path, capsys):
    code = main(["run", "--plugin", str(tmp_path / "nope.py"), "--requests", "5", "--no-write"])
    err = capsys.readouterr().err
    assert code == 2 and "nope.py: file not found" in err

    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import servesim\n\nraise RuntimeError('oops')\n")
    code = main(["check", "--plugin", str(broken)])
    err = capsys.readouterr().err
    assert code == 2
    assert "broken_plugin.py failed to load at line 3: RuntimeError: oops" in err
    assert "Traceback" not in err
    assert "broken_plugin" not in sys.modules


def test_loading_the_same_plugin_file_twice_is_harmless(tmp_path, forget_plugin_file):
    forget_plugin_file.append(("routing", "to-last-instance", "twice_routers"))
    file = tmp_path / "twice_routers.py"
    file.write_text(ROUTER_FILE)
    first = plugins.load_plugin_file(file)
    assert plugins.load_plugin_file(file) is first
    assert "to-last-instance" in registry.registry("routing")


class RejectOddIds(AdmissionPolicy):
    def admit(self, request, state):
        return request.id % 2 == 0


def test_replacing_the_builtin_admission_policy_takes_effect():
    """The default admission name is ``always-admit``; replacing it must change the run, not be
    skipped by the cluster's admit-everything fast path."""
    scenario = {"workload": {"preset": "chatbot", "rate": 20, "requests": 120}}
    baseline = servesim.simulate(servesim.load_scenario(scenario))
    assert baseline.summary["rejected_requests"] == 0
    try:
        plugins.register("admission", "always-admit", RejectOddIds, replace=True)
        assert registry.get("admission", "always-admit") is RejectOddIds
        replaced = servesim.simulate(servesim.load_scenario(scenario))
    finally:
        registry.register("admission", "always-admit", AlwaysAdmit, replace=True)
    assert replaced.summary["rejected_requests"] == 60


def test_replace_true_before_the_builtins_load_still_wins(monkeypatch):
    """Registering over a built-in name loads the built-ins first, so their own registration
    cannot collide with (or silently undo) the replacement later."""
    monkeypatch.setattr(registry, "_discovered", False)
    try:
        registry.register("admission", "always-admit", RejectOddIds, replace=True)
        assert registry.get("admission", "always-admit") is RejectOddIds
    finally:
        registry.register("admission", "always-admit", AlwaysAdmit, replace=True)


def test_the_docs_router_is_at_most_15_lines():
    """The complete custom router of docs/howto/route-requests.md stays small (issue: ≤ 15)."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "howto" / "route-requests.md").read_text()
    block = doc.split("<!-- custom-router -->", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    lines = [line for line in textwrap.dedent(block).strip().splitlines() if line.strip()]
    assert len(lines) <= 15, len(lines)


def test_the_plugin_reference_has_a_row_per_kind_naming_its_base_class_and_check():
    """docs/reference/plugins.md lists every registry kind with the base class servesim.plugins
    exports for it, and each ``check_<kind>`` it names exists there."""
    import re
    from pathlib import Path

    import servesim.plugins as plugins

    page = (Path(__file__).parent.parent / "docs" / "reference" / "plugins.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", page, re.M)}
    assert set(rows) == set(plugins.KINDS)
    for kind, base in plugins.BASE_CLASSES.items():
        assert f"| `{base.__name__}` |" in rows[kind], kind
        for check in re.findall(r"`(check_\w+)`", rows[kind]):
            assert check in plugins.__all__, check
