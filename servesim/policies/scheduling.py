"""Instance schedulers: the order of the wait queue at each step.

vLLM serves waiting requests head first; a scheduler may reorder the queue before each batch is
formed (a stable reorder, so equal keys keep arrival order). ``fcfs`` keeps arrival order and is
free: the engine skips the call entirely.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping
from typing import Any

from servesim.simcore.config import check_keys
from servesim.simcore.registry import register


class Scheduler(ABC):
    """Base class. ``reorders`` False means the queue stays in arrival order (no call per step)."""

    name = ""
    reorders = True

    @abstractmethod
    def order(self, waiting: deque) -> None:
        """Reorder ``waiting`` in place (head = next to admit)."""

    @classmethod
    def from_config(cls, params: Mapping[str, Any], path: str) -> Scheduler:
        check_keys(params, [], path)
        return cls()


@register("scheduler", "fcfs")
class FCFS(Scheduler):
    """First come, first served (vLLM's default)."""

    name = "fcfs"
    reorders = False

    def order(self, waiting: deque) -> None:
        return None
