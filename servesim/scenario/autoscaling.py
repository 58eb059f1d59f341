"""The checks of ``cluster.autoscaling`` that read more than one field (the section's fields are
declared in :mod:`servesim.scenario.schema`, which calls these)."""

from __future__ import annotations

from typing import Any

from servesim.simcore import registry
from servesim.simcore.config import expect_mapping
from servesim.simcore.errors import ScenarioError


def autoscaler_choice(given: Any, where: str) -> tuple[str, dict[str, Any]]:
    """The autoscaler's name and parameters from a name or ``{name: ..., its parameters}``. It
    is built once here, so that bad parameters fail at load time with their field path."""
    if given is None:
        raise ScenarioError(where, None, "missing; name an autoscaler, e.g. policy: queue-depth")
    spec = {"name": given} if isinstance(given, str) else dict(expect_mapping(given, where))
    name = spec.pop("name", None)
    if name is None:
        raise ScenarioError(f"{where}.name", None, "missing; e.g. {name: queue-depth, target: 4}")
    cls = registry.get("autoscaler", name, where if isinstance(given, str) else f"{where}.name")
    cls.from_config(spec, registry.PluginContext(where))
    return name, spec


def check_bounds(config: Any, path: str) -> None:
    """``min_instances`` ≤ ``initial_instances`` ≤ ``max_instances`` (0: not given)."""
    low, high, initial = config.min_instances, config.max_instances, config.initial_instances
    if high and high < low:
        raise ScenarioError(
            f"{path}.max_instances", high, f"must be at least min_instances ({low})"
        )
    if initial and (initial < low or (high and initial > high)):
        raise ScenarioError(
            f"{path}.initial_instances",
            initial,
            f"must lie between min_instances ({low}) and max_instances ({high or 'the fleet'})",
        )


def check_fits_the_fleet(config: Any, instances: int) -> None:
    """With autoscaling, ``cluster.instances`` is the fleet: the most that may ever run."""
    for name in ("max_instances", "min_instances", "initial_instances"):
        if getattr(config, name) > instances:
            raise ScenarioError(
                f"cluster.autoscaling.{name}",
                getattr(config, name),
                f"must be at most cluster.instances ({instances}), the instances the "
                f"autoscaler may start; raise cluster.instances or lower {name}",
            )
