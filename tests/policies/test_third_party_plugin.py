"""A third-party package's router and scorer arrive through the ``servesim.plugins`` entry point
and pass the same contract checks as the built-ins (tests/plugin_pkg/servesim_example_plugin)."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from servesim.policies.routing import Weighted
from servesim.policies.snapshot import InstanceSnapshot
from servesim.simcore import registry
from servesim.simcore.registry import PluginContext
from servesim.testing import ProbeRequest, check_router, check_scorer

PLUGIN_DIR = Path(__file__).resolve().parent.parent / "plugin_pkg"
ADDED = (("routing", "example-first"), ("scorer", "example-empty-queue"))


@pytest.fixture
def installed(monkeypatch):
    """Pretend ``servesim_example_plugin`` is installed with its entry point; undo afterwards."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    point = EntryPoint(
        name="example", value="servesim_example_plugin:register", group=registry.ENTRY_POINT_GROUP
    )
    groups = []

    def fake_entry_points(*, group):
        groups.append(group)
        return [point] if group == point.group else []

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_discovered", False)
    yield groups
    for kind, name in ADDED:
        registry.REGISTRIES[kind]._items.pop(name, None)
    sys.modules.pop("servesim_example_plugin", None)


def test_the_plugin_is_unknown_until_discovered():
    assert "example-first" not in registry.registry("routing")


def test_discovery_registers_the_third_party_router_and_scorer(installed):
    router_cls = registry.get("routing", "example-first")
    assert installed == [registry.ENTRY_POINT_GROUP]
    assert router_cls.__module__ == "servesim_example_plugin"
    assert "example-empty-queue" in registry.describe()["scorer"]
    router = router_cls.from_config({}, PluginContext("policies.routing"))
    router.bind(4)
    snaps = [InstanceSnapshot(3), InstanceSnapshot(1, queue_depth=9)]
    assert router.route(ProbeRequest(0), snaps) == 1


def test_the_third_party_plugins_pass_the_contract_checks(installed):
    router_cls = registry.get("routing", "example-first")
    check_router(lambda: router_cls.from_config({}, PluginContext("policies.routing")))
    check_scorer(registry.get("scorer", "example-empty-queue")())
    check_router(
        lambda: Weighted.from_config(
            {"scorers": {"example-empty-queue": 1, "queue-depth": 1}},
            PluginContext("policies.routing"),
        )
    )


def test_registrations_are_cleaned_up_afterwards():
    assert "example-first" not in registry.registry("routing")
    assert "example-empty-queue" not in registry.registry("scorer")
