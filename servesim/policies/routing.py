"""Routing policies: which instance serves a request.

A routing policy never reads a request's oracle output length (INV-9): it sees the request's
prompt length, class and prefix group, and the instances' snapshots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from servesim.simcore.config import check_keys
from servesim.simcore.registry import register


class RoutingPolicy(ABC):
    """Base class: implement :meth:`route`. ``bind`` is called once with the number of instances."""

    name = ""

    def bind(self, num_instances: int) -> None:
        self.num_instances = num_instances

    @abstractmethod
    def route(self, request: Any, snapshots: Sequence[Any]) -> int:
        """Return the decision (see the class docstring)."""

    @classmethod
    def from_config(cls, params: Mapping[str, Any], path: str) -> RoutingPolicy:
        check_keys(params, [], path)
        return cls()


@register("routing", "round-robin")
class RoundRobin(RoutingPolicy):
    """Instances in turn, 0, 1, ..., N-1, 0, ... (needs no snapshot)."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Any, snapshots: Sequence[Any]) -> int:
        choice = self._next
        self._next = (choice + 1) % self.num_instances
        return choice
