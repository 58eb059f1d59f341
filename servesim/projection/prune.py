"""What ``servesim plan`` asks the projector before simulating a candidate.

A candidate is pruned (rejected without a simulation) when, at the largest instance count the plan
allows, its projected maximum sustainable rate is below the target rate by more than the safety
margin: ``max_rate < (1 − margin) · target``. The margin (default 20%) covers the projector's
error near saturation (docs/explanation/projection.md), so a candidate the simulator might still
accept is simulated. Scenarios the projector refuses (traces, sessions, disaggregation, ...) are
never pruned: they are simulated as before.

With a minimum confidence, a candidate whose step times sit lower on the ladder
(:mod:`servesim.projection.confidence`) is rejected too.
"""

from __future__ import annotations

from typing import Any

from servesim.projection.confidence import RUNGS, confidence_of
from servesim.simcore.errors import ScenarioError

DEFAULT_PRUNE_MARGIN = 0.2
"""Prune only when the projected max rate is more than 20% below the target."""


def check_margin(value: float, path: str = "--prune-margin") -> float:
    if not (0.0 <= value < 1.0):
        raise ScenarioError(
            path, value, "must be in [0, 1): the share by which the projected max rate may "
            "fall short of the target before a candidate is rejected unsimulated (0.2 = 20%)"
        )  # fmt: skip
    return value


def prune_reason(
    scenario: Any, margin: float | None, min_confidence: str | None
) -> tuple[str, str] | None:
    """(rejected_by, reason) when ``scenario`` (a candidate at its largest instance count) can be
    rejected without simulating it, else None. ``margin`` None: no rate pruning."""
    if min_confidence is not None:
        from servesim.projection.project import _latency_model

        spec = scenario.instance_specs[0]
        rung = confidence_of(_latency_model(scenario, spec, "latency"), spec)
        if rung.rank < RUNGS[min_confidence]:
            return (
                "confidence",
                f"confidence {rung.level} < required {min_confidence}: {rung.detail}",
            )
    if margin is None:
        return None
    from servesim.projection.project import project

    try:
        p = project(scenario)
    except ScenarioError:
        return None  # not projectable: the simulation decides
    floor = (1.0 - margin) * p.rate
    if p.max_rate < floor:
        return (
            "projection",
            f"projected max rate {p.max_rate:.2f} req/s < target {p.rate:.2f} req/s at "
            f"{p.instances} instance(s) ({p.limit}; pruned below {floor:.2f} req/s, margin "
            f"{margin:.0%}; --no-prune simulates it)",
        )
    return None
