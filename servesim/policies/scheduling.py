"""Instance schedulers: the order of the wait queue at each step.

vLLM serves waiting requests head first; a scheduler may reorder the queue before each batch is
formed (a stable reorder, so equal keys keep arrival order). ``fcfs`` keeps arrival order and is
free: the engine skips the call entirely.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from servesim.policies.base import Policy
from servesim.simcore.registry import register


class Scheduler(Policy):
    """Base class. ``reorders`` False means the queue stays in arrival order (no call per step)."""

    reorders = True

    @abstractmethod
    def order(self, waiting: deque) -> None:
        """Reorder ``waiting`` in place (head = next to admit)."""


@register("scheduler", "fcfs")
class FCFS(Scheduler):
    """First come, first served (vLLM's default)."""

    name = "fcfs"
    reorders = False

    def order(self, waiting: deque) -> None:
        return None


def _sort_in_place(waiting: deque, key: Callable[[Any], Any]) -> None:
    items = sorted(waiting, key=key)  # stable: equal keys keep their queue order
    waiting.clear()
    waiting.extend(items)


def _priority_first(r: Any) -> tuple[int, int, int]:
    return (-r.priority, r.arrival_us, r.id)


def _priority_last(r: Any) -> tuple[int, int, int]:
    return (r.priority, r.arrival_us, r.id)


def _shortest_prompt_first(r: Any) -> tuple[int, int, int]:
    return (r.prompt_tokens, r.arrival_us, r.id)


@register("scheduler", "priority-fcfs")
class PriorityFCFS(Scheduler):
    """Most important class first (cluster priority ↓), then arrival order, then id."""

    name = "priority-fcfs"

    def order(self, waiting: deque) -> None:
        _sort_in_place(waiting, _priority_first)


@register("scheduler", "sjf")
class ShortestJobFirst(Scheduler):
    """Shortest prompt first (the output length is unknown to a scheduler), then arrival, id."""

    name = "sjf"

    def order(self, waiting: deque) -> None:
        _sort_in_place(waiting, _shortest_prompt_first)


@register("scheduler", "reverse-priority")
class ReversePriority(Scheduler):
    """Least important class first, then arrival, then id: a pathological baseline (spec §4.6)."""

    name = "reverse-priority"

    def order(self, waiting: deque) -> None:
        _sort_in_place(waiting, _priority_last)
