"""Preemption victim policies: whom to evict when the KV cache cannot hold a step's new tokens."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from servesim.simcore.config import check_keys
from servesim.simcore.registry import register


class PreemptionPolicy(ABC):
    """Base class: :meth:`victim` returns the index (in batch order) of the request to preempt."""

    name = ""

    @abstractmethod
    def victim(self, running: Sequence[Any]) -> int:
        """Return the decision (see the class docstring)."""

    @classmethod
    def from_config(cls, params: Mapping[str, Any], path: str) -> PreemptionPolicy:
        check_keys(params, [], path)
        return cls()


@register("preemption", "fcfs")
class LastAdmitted(PreemptionPolicy):
    """vLLM's FCFS policy: preempt the most recently admitted running request."""

    name = "fcfs"

    def victim(self, running: Sequence[Any]) -> int:
        return len(running) - 1
