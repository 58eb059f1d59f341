"""Plugin registries, one per plugin kind, plus third-party discovery via entry points.

Built-ins register with a decorator::

    @register("routing", "round-robin")
    class RoundRobin(RoutingPolicy): ...

Third-party packages declare an entry point in the group ``servesim.plugins`` whose value is a
module (imported for its ``register`` side effects) or a callable (called with no arguments).
A scenario names plugins by their kebab-case string; an unknown name raises
:class:`~servesim.simcore.errors.UnknownPluginError` listing the known ones.

Every plugin kind is built the same way, ``cls.from_config(params, ctx)``: ``params`` is the
plugin's own mapping from the scenario, ``ctx`` a frozen :class:`PluginContext` saying where it
sits (``ctx.path`` for error messages) and what else its kind needs (a kind may subclass the
context to add more). :func:`register` refuses a class whose
``from_config`` still has the older per-kind shape, naming the fix.

A kind's built-ins are imported at its first lookup, and the installed entry points are scanned
only when a name is not among the built-ins (or when every name is asked for): a run imports the
packages of the kinds it names (no trace readers for a synthetic workload) and never reads every
installed distribution's metadata, which costs more than a small run.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from servesim.simcore.errors import ServesimError, UnknownPluginError

_BUILTIN_MODULES = {
    "servesim.policies": (
        "admission",
        "routing",
        "scorer",
        "scheduler",
        "preemption",
        "disaggregation",
        "saturation",
        "autoscaler",
    ),
    "servesim.latency": ("latency",),
    "servesim.workloads": ("arrival", "length"),
    "servesim.workloads.traces": ("trace_format",),
}
"""The packages whose import registers the built-in plugins, with the kinds each registers: the
one list of plugin kinds (every kind has built-ins)."""

KINDS = tuple(kind for kinds in _BUILTIN_MODULES.values() for kind in kinds)
"""Every plugin kind, in the order ``servesim list`` shows them."""

ENTRY_POINT_GROUP = "servesim.plugins"


@dataclass(frozen=True)
class PluginContext:
    """What a plugin's ``from_config(params, ctx)`` may know besides its own parameters.

    One small frozen object for every kind, so a plugin author learns one signature and a new
    need adds a field here instead of a parameter to every ``from_config``. ``path`` is where the
    parameters sit in the scenario (``policies.routing``): start every error with it.
    """

    path: str
    _: KW_ONLY
    base_dir: str | Path | None = None
    """The scenario file's directory, to resolve a relative file name (None: the working one)."""
    rate: float | None = None
    """The arrival kind only: the mean rate per second the process must produce."""

    def at(self, path: str) -> PluginContext:
        """The same context for a part of this plugin's parameters (a nested plugin's)."""
        return replace(self, path=path)


T = TypeVar("T")


class Registry:
    """Name -> object map for one plugin kind. Names are kebab-case strings."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None, *, replace: bool = False):
        """Register ``obj`` under ``name``; without ``obj`` return a decorator.

        ``replace=True`` overrides whatever is registered under ``name``, a built-in included:
        the built-ins are loaded first, so they cannot register over the replacement later.
        """

        def add(target: T) -> T:
            if replace:
                _discover()
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"{self.kind} plugin name must be a non-empty string, got {name!r}"
                )
            _check_from_config(self.kind, name, target)
            if name in self._items and self._items[name] is not target and not replace:
                raise ValueError(
                    f"{self.kind} plugin {name!r} is already registered "
                    f"({self._items[name]!r}); pass replace=True to override it"
                )
            self._items[name] = target
            return target

        return add if obj is None else add(obj)

    def get(self, name: str, path: str | None = None) -> Any:
        if name not in self:
            raise UnknownPluginError(path or self.kind, self.kind, name, self.names())
        return self._items[name]

    def names(self) -> list[str]:
        _discover()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        _load_builtins(self.kind)
        try:
            if name in self._items:
                return True
        except TypeError:  # an unhashable name (a list from YAML) is never registered
            return False
        _discover()
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


def _check_from_config(kind: str, name: str, target: Any) -> None:
    """Refuse a ``from_config`` with the pre-context shape, e.g. ``(cls, params, path)`` or
    ``(cls, params, rate, path)``: it would be called with a :class:`PluginContext` where it
    expects a string and fail far from here. The old shapes all named a parameter ``path``."""
    method = getattr(target, "from_config", None)
    if method is None:
        return
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: nothing to inspect
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    takes_ctx = len(positional) >= 2 and len(required) <= 2 and positional[1].name != "path"
    if not takes_ctx:
        shown = ", ".join(p.name for p in parameters)
        raise TypeError(
            f"{kind} plugin {name!r}: {getattr(target, '__qualname__', target)}.from_config"
            f"({shown}) has the old signature; servesim calls from_config(params, ctx) for every "
            "plugin kind: take ctx (a servesim.plugins.PluginContext) and read ctx.path and the "
            "kind's other fields (ctx.rate, ctx.base_dir, ...) from it"
        )


REGISTRIES: dict[str, Registry] = {kind: Registry(kind) for kind in KINDS}


def registry(kind: str) -> Registry:
    try:
        return REGISTRIES[kind]
    except KeyError:
        raise ValueError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}") from None


def register(kind: str, name: str, obj: Any = None, *, replace: bool = False):
    """Register a plugin: ``@register("routing", "my-router")`` or ``register(kind, name, obj)``."""
    return registry(kind).register(name, obj, replace=replace)


def get(kind: str, name: str, path: str | None = None) -> Any:
    return registry(kind).get(name, path)


_loaded_kinds: set[str] = set()
_discovered = False
"""Whether the third-party entry points have been loaded (tests reset it to load them again)."""


def entry_points(*, group: str) -> Any:
    """The installed entry points of ``group`` (:func:`importlib.metadata.entry_points`, whose
    import alone costs ~25 ms, imported here on first use)."""
    from importlib.metadata import entry_points as installed

    return installed(group=group)


def _load_builtins(kind: str) -> None:
    """Import the package of ``kind``'s built-in plugins (they register on import), once."""
    if kind in _loaded_kinds:
        return
    for module, kinds in _BUILTIN_MODULES.items():
        if kind in kinds:
            _loaded_kinds.update(kinds)
            importlib.import_module(module)


def _discover() -> None:
    """Import built-in plugin modules and third-party entry points, once."""
    global _discovered
    for kind in KINDS:
        _load_builtins(kind)
    if _discovered:
        return
    _discovered = True
    failures = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded: Any = ep.load()
            if callable(loaded) and not isinstance(loaded, type(importlib)):
                loaded()
        except (
            Exception
        ) as exc:  # a third party's bug must not hide the others or crash with a trace
            failures.append(f"{ep.name} ({ep.value}): {exc.__class__.__name__}: {exc}")
    if failures:
        raise ServesimError(
            f"plugin entry point(s) in group {ENTRY_POINT_GROUP!r} failed to load: {'; '.join(failures)}; "
            "fix or uninstall the package that provides them"
        )


def describe() -> dict[str, list[str]]:
    """Every registered plugin name, by kind (what ``servesim list`` prints)."""
    return {kind: REGISTRIES[kind].names() for kind in KINDS}


Factory = Callable[..., Any]
