"""What every policy kind's base class shares: a name and the parameterless ``from_config``.

Each kind (admission, routing, scheduling, preemption, disaggregation, saturation) has its own
base class with its one decision method; they all subclass :class:`Policy`, so the registry's
contract (``name``, ``from_config(params, ctx)``) is written once instead of once per kind.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from typing import Any, TypeVar

from servesim.simcore.config import check_keys
from servesim.simcore.registry import PluginContext

__all__ = ["Policy"]

P = TypeVar("P", bound="Policy")


class Policy(ABC):  # noqa: B024 - each kind's base declares the abstract decision method
    """Base of the policy kinds' base classes.

    ``name`` is the registered kebab-case name (empty on a base class). The default
    :meth:`from_config` suits a policy without parameters: any key is an error naming
    ``ctx.path``, and the class is built with no arguments. A policy with parameters overrides it.
    """

    name = ""

    @classmethod
    def from_config(cls: type[P], params: Mapping[str, Any], ctx: PluginContext) -> P:
        check_keys(params, [], ctx.path)
        return cls()
