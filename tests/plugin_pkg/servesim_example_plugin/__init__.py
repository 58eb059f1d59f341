"""A minimal third-party servesim plugin package (used by tests/policies/test_third_party_plugin.py).

A real package declares, in its pyproject.toml::

    [project.entry-points."servesim.plugins"]
    example = "servesim_example_plugin:register"

and servesim calls ``register()`` the first time it looks a plugin up.
"""

from __future__ import annotations

from servesim.policies.routing import RoutingPolicy
from servesim.policies.scorers import Scorer
from servesim.simcore.registry import register as register_plugin


class FirstCandidate(RoutingPolicy):
    """Every request to the lowest-numbered candidate instance."""

    name = "example-first"

    def route(self, request, snapshots):
        return min(s.index for s in snapshots)


class ShortQueue(Scorer):
    """1 for an empty wait queue, 0 otherwise."""

    name = "example-empty-queue"

    def score(self, request, snapshots):
        return [1.0 if s.queue_depth == 0 else 0.0 for s in snapshots]


def register() -> None:
    register_plugin("routing", FirstCandidate.name, FirstCandidate)
    register_plugin("scorer", ShortQueue.name, ShortQueue)
