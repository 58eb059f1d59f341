"""Preemption victim policies: whom to evict when the KV cache cannot hold a step's new tokens."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from servesim.policies.base import Policy
from servesim.simcore.registry import register


class PreemptionPolicy(Policy):
    """Base class: :meth:`victim` returns the index (in batch order) of the request to preempt."""

    @abstractmethod
    def victim(self, running: Sequence[Any]) -> int:
        """Return the decision (see the class docstring)."""


@register("preemption", "fcfs")
class LastAdmitted(PreemptionPolicy):
    """vLLM's FCFS policy: preempt the most recently admitted running request."""

    name = "fcfs"

    def victim(self, running: Sequence[Any]) -> int:
        return len(running) - 1


@register("preemption", "priority")
class LowestPriority(PreemptionPolicy):
    """Preempt the least important running request (lowest cluster priority), the latest arrival
    among those; scanning from the tail, so among equals the most recently admitted (spec §2.4)."""

    name = "priority"

    def victim(self, running: Sequence[Any]) -> int:
        best = len(running) - 1
        r = running[best]
        priority, arrival = r.priority, r.arrival_us
        for i in range(best - 1, -1, -1):
            r = running[i]
            p = r.priority
            if p < priority or (p == priority and r.arrival_us > arrival):
                best, priority, arrival = i, p, r.arrival_us
        return best
