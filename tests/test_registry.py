"""Plugin registries (DESIGN §5): lookup errors list the known names, duplicates are refused, and
third-party plugins arrive through the ``servesim.plugins`` entry-point group."""

from __future__ import annotations

import types

import pytest

import servesim
from servesim.cli import main
from servesim.policies.routing import RoundRobin
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError, UnknownPluginError


@pytest.fixture
def cleanup():
    """Names registered by a test, as (kind, name); removed afterwards."""
    added: list[tuple[str, str]] = []
    yield added
    for kind, name in added:
        registry.REGISTRIES[kind]._items.pop(name, None)


class FakeEntryPoint:
    def __init__(self, name, target=None, error=None):
        self.name = name
        self.value = f"fake_pkg.{name}:plugin"
        self.group = registry.ENTRY_POINT_GROUP
        self._target = target
        self._error = error
        self.loads = 0

    def load(self):
        self.loads += 1
        if self._error is not None:
            raise self._error
        return self._target


class EntryPointList(list):
    """The fake installed entry points, plus the groups servesim asked for."""

    groups: list[str]


@pytest.fixture
def entry_points(monkeypatch):
    """Install fake entry points and force rediscovery; returns the list to fill."""
    points = EntryPointList()
    groups: list[str] = []

    def fake_entry_points(*, group):
        groups.append(group)
        return [p for p in points if p.group == group]

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_discovered", False)
    points.groups = groups
    return points


# ------------------------------------------------------------------ lookups


def test_builtins_are_registered_under_kebab_case_names():
    known = registry.describe()
    assert set(known) == set(registry.KINDS)
    assert "round-robin" in known["routing"]
    assert "fcfs" in known["scheduler"] and "fcfs" in known["preemption"]
    assert "blackbox" in known["latency"]
    assert {"poisson", "gamma"} <= set(known["arrival"])
    assert {"constant", "gaussian"} <= set(known["length"])
    for names in known.values():
        for name in names:
            assert name == name.lower() and "_" not in name and " " not in name, name


@pytest.mark.parametrize(
    "kind,known", [("routing", "round-robin"), ("scheduler", "fcfs"), ("latency", "blackbox")]
)
def test_an_unknown_name_raises_an_error_listing_the_known_ones(kind, known):
    with pytest.raises(UnknownPluginError) as info:
        registry.get(kind, "no-such-plugin", f"policies.{kind}")
    err = info.value
    assert isinstance(err, ScenarioError)
    assert err.kind == kind and known in err.known
    assert err.known == registry.registry(kind).names()
    message = str(err)
    assert "no-such-plugin" in message and known in message and f"policies.{kind}" in message


def test_a_non_string_name_is_an_unknown_plugin_not_a_crash():
    with pytest.raises(UnknownPluginError):
        registry.get("routing", ["round-robin"])  # type: ignore[arg-type]


def test_an_unknown_kind_lists_the_kinds():
    with pytest.raises(ValueError, match="routing"):
        registry.registry("routers")


def test_membership_and_repr():
    assert "round-robin" in registry.registry("routing")
    assert "nope" not in registry.registry("routing")
    assert "round-robin" in repr(registry.registry("routing"))


# ------------------------------------------------------------------ registering


def test_registering_a_duplicate_name_is_refused_unless_replace(cleanup):
    cleanup.append(("routing", "test-dup-router"))

    @registry.register("routing", "test-dup-router")
    class First(RoundRobin):
        """The first registration."""

    class Second(RoundRobin):
        """A different class under the same name."""

    with pytest.raises(ValueError, match="already registered") as info:
        registry.register("routing", "test-dup-router", Second)
    assert "replace=True" in str(info.value)
    assert registry.get("routing", "test-dup-router") is First

    registry.register("routing", "test-dup-router", Second, replace=True)
    assert registry.get("routing", "test-dup-router") is Second


def test_a_builtin_cannot_be_shadowed_by_accident():
    with pytest.raises(ValueError, match="already registered"):
        registry.register("routing", "round-robin", object())
    assert registry.get("routing", "round-robin") is RoundRobin


def test_registering_the_same_object_twice_is_harmless(cleanup):
    cleanup.append(("scheduler", "test-same"))
    obj = object()
    registry.register("scheduler", "test-same", obj)
    registry.register("scheduler", "test-same", obj)
    assert registry.get("scheduler", "test-same") is obj


@pytest.mark.parametrize("name", ["", None, 3])
def test_a_plugin_name_must_be_a_non_empty_string(name):
    with pytest.raises(ValueError, match="non-empty string"):
        registry.register("routing", name, object())  # type: ignore[arg-type]


# ------------------------------------------------------------------ third-party plugins


class ToFirstInstance(RoundRobin):
    """A third-party router: every request to instance 0."""

    name = "to-first-instance"

    def route(self, request, snapshots):
        return 0


def test_a_callable_entry_point_registers_a_third_party_plugin(entry_points, cleanup):
    cleanup.append(("routing", "to-first-instance"))
    ep = FakeEntryPoint(
        "first", target=lambda: registry.register("routing", "to-first-instance", ToFirstInstance)
    )
    entry_points.append(ep)
    assert registry.get("routing", "to-first-instance") is ToFirstInstance
    assert entry_points.groups == ["servesim.plugins"]
    assert "to-first-instance" in registry.describe()["routing"]
    registry.get("routing", "round-robin")
    assert ep.loads == 1  # discovery happens once


def test_a_module_entry_point_registers_on_import_and_is_not_called(entry_points, cleanup):
    cleanup.append(("scheduler", "test-module-scheduler"))
    module = types.ModuleType("fake_pkg.plugins")

    def load_module():
        registry.register("scheduler", "test-module-scheduler", object)  # the import side effect
        return module

    ep = FakeEntryPoint("mod")
    ep.load = load_module  # type: ignore[method-assign]
    entry_points.append(ep)
    assert "test-module-scheduler" in registry.registry("scheduler")


def test_a_scenario_can_use_a_third_party_plugin_end_to_end(entry_points, cleanup):
    cleanup.append(("routing", "to-first-instance"))
    entry_points.append(
        FakeEntryPoint(
            "first",
            target=lambda: registry.register("routing", "to-first-instance", ToFirstInstance),
        )
    )
    scenario = servesim.load_scenario(
        {
            "cluster": {"instances": 3},
            "policies": {"routing": "to-first-instance"},
            "workload": {"preset": "chatbot", "rate": 10, "requests": 30},
        }
    )
    results = servesim.simulate(scenario)
    assert set(results.requests["instance"].tolist()) == {0}
    assert results.summary["scenario"]["policies"]["routing"] == "to-first-instance"


def test_list_shows_third_party_plugins(entry_points, cleanup, capsys):
    cleanup.append(("routing", "to-first-instance"))
    entry_points.append(
        FakeEntryPoint(
            "first",
            target=lambda: registry.register("routing", "to-first-instance", ToFirstInstance),
        )
    )
    assert main(["list", "plugins"]) == 0
    assert "to-first-instance" in capsys.readouterr().out


def test_a_broken_third_party_plugin_is_a_one_line_error_naming_it(entry_points, cleanup, capsys):
    """A plugin package that fails to import should not crash every command with a traceback,
    nor leave discovery half done; the error names the entry point."""
    cleanup.append(("routing", "to-first-instance"))
    entry_points.append(FakeEntryPoint("broken", error=ImportError("No module named 'fake_pkg'")))
    entry_points.append(
        FakeEntryPoint(
            "first",
            target=lambda: registry.register("routing", "to-first-instance", ToFirstInstance),
        )
    )
    code = main(["list", "plugins"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "broken" in lines[0]


# ------------------------------------------------------------------ one from_config signature


class _OldPolicy(RoundRobin):
    @classmethod
    def from_config(cls, params, path):  # the pre-context shape
        return cls()


class _OldArrival:
    @classmethod
    def from_config(cls, params, rate, path):
        return cls()


class _OldLatency:
    @classmethod
    def from_config(cls, params, context, path):
        return cls()


@pytest.mark.parametrize(
    "kind, cls",
    [("routing", _OldPolicy), ("arrival", _OldArrival), ("latency", _OldLatency)],
)
def test_a_plugin_with_the_old_from_config_shape_is_refused_naming_the_fix(kind, cls, cleanup):
    cleanup.append((kind, "old-shape"))
    with pytest.raises(TypeError) as info:
        registry.register(kind, "old-shape", cls)
    message = str(info.value)
    assert "old-shape" in message and f"{cls.__qualname__}.from_config" in message
    assert "from_config(params, ctx)" in message and "ctx.path" in message
    assert "old-shape" not in registry.registry(kind).names()


def test_a_plugin_with_the_new_shape_or_none_registers(cleanup):
    class New(RoundRobin):
        @classmethod
        def from_config(cls, params, ctx):
            return cls()

    class Bare:  # no from_config at all (e.g. a trace format's own class)
        pass

    cleanup.extend([("routing", "new-shape"), ("routing", "bare")])
    registry.register("routing", "new-shape", New)
    registry.register("routing", "bare", Bare)
    built = registry.get("routing", "new-shape").from_config({}, registry.PluginContext("p"))
    assert isinstance(built, New)


def test_the_plugin_context_is_frozen_and_at_names_a_nested_part():
    ctx = registry.PluginContext("workload.arrival", rate=3.0)
    with pytest.raises(AttributeError):
        ctx.path = "elsewhere"  # type: ignore[misc]
    nested = ctx.at("workload.arrival.base")
    assert (nested.path, nested.rate, ctx.path) == (
        "workload.arrival.base",
        3.0,
        "workload.arrival",
    )


def test_a_latency_context_is_a_plugin_context_named_latency_unless_told():
    from servesim.latency.base import LatencyContext

    ctx = LatencyContext("qwen3-14b", "H100", 2)
    assert isinstance(ctx, registry.PluginContext)
    assert (ctx.path, ctx.model, ctx.gpu, ctx.tp) == ("latency", "qwen3-14b", "H100", 2)
    assert LatencyContext("m", "g", 1, path="cluster.groups[1].latency").path.endswith("latency")
    assert ctx.at("latency.base").model == "qwen3-14b"  # a nested model runs where its wrapper does


def test_every_builtin_plugin_takes_params_and_ctx():
    """The one signature, checked on every registered built-in (the registry would refuse the
    old shapes, so this guards the check itself against a built-in it lets through)."""
    import inspect

    for kind in registry.KINDS:
        for name in registry.registry(kind).names():
            method = getattr(registry.get(kind, name), "from_config", None)
            assert method is not None, f"{kind} {name!r} has no from_config"
            names = list(inspect.signature(method).parameters)
            assert names == ["params", "ctx"], f"{kind} {name!r}: from_config{tuple(names)}"


def test_a_built_in_name_is_found_without_scanning_the_entry_points(entry_points, cleanup):
    """The scan reads every installed distribution's metadata (issue 16: start-up): a lookup the
    built-ins answer never triggers it; the first name they do not know does, once."""
    cleanup.append(("routing", "to-first-instance"))
    ep = FakeEntryPoint(
        "first", target=lambda: registry.register("routing", "to-first-instance", ToFirstInstance)
    )
    entry_points.append(ep)
    assert registry.get("routing", "round-robin") is RoundRobin
    assert "fcfs" in registry.registry("scheduler")
    assert entry_points.groups == [] and ep.loads == 0
    assert registry.get("routing", "to-first-instance") is ToFirstInstance
    assert "also-unknown" not in registry.registry("routing")
    assert entry_points.groups == ["servesim.plugins"] and ep.loads == 1


def test_a_broken_third_party_plugin_does_not_stop_a_run_of_built_ins(entry_points):
    entry_points.append(FakeEntryPoint("broken", error=ImportError("No module named 'fake_pkg'")))
    assert registry.get("routing", "round-robin") is RoundRobin
    with pytest.raises(servesim.ServesimError, match="broken"):
        registry.get("routing", "no-such-router")
