"""What a plan ranks by: the named objectives, any numeric summary.json field
(:func:`parse_objective`) and the fitness weights (:func:`_fitness`).
"""

from __future__ import annotations

from typing import Any

from servesim.simcore.config import as_str
from servesim.simcore.errors import ScenarioError

OBJECTIVES = (
    "cost",
    "throughput_per_gpu",
    "goodput",
    "cost_per_million_tokens",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "e2e_p99_ms",
    "fitness",
    "energy_per_million_tokens",
)
"""Named ranking objectives: cost per hour (lower first), output tokens/s per GPU (higher first),
goodput in requests/s within SLO (higher first), USD per million output tokens and the latency
percentiles (lower first), or ``fitness``: the weighted score of the plan's ``fitness`` weights
(higher first; :mod:`servesim.analysis.verdict`), or kWh per million output tokens at the
plan's ``power`` figures (lower first; :mod:`servesim.studies.plan.energy`). Any other numeric
summary.json field (``ttft_p50_ms``, ``goodput.standard.slo_attainment``, ...) ranks too:
:func:`parse_objective`."""


def parse_objective(value: Any, path: str) -> tuple[str, tuple[str, str] | None]:
    """(objective, None) for a named objective; (the field, (field, direction)) for a
    summary.json field, ranked lowest first unless it is a throughput, goodput or fraction
    (:meth:`servesim.analysis.verdict.Objective.direction`); ``max:FIELD`` or ``min:FIELD``
    says the direction outright."""
    name = as_str(value, path).strip()
    if name in OBJECTIVES:
        return name, None
    way, sep, field = name.partition(":")
    if sep and way in ("min", "max"):
        direction = "lowest" if way == "min" else "highest"
    else:
        from servesim.analysis.verdict import Objective

        field = name
        direction = "lowest" if Objective(name, 1.0).direction() == "lower" else "highest"
    from servesim.studies.sweep.metrics import check_metric

    try:
        check_metric(field, path)
    except ScenarioError as exc:
        raise ScenarioError(
            path,
            value,
            f"{exc.fix}; or one of the named objectives: {', '.join(OBJECTIVES)}",
        ) from None
    return field, (field, direction)


def _fitness(weights: Any, objective: str, path: str) -> tuple[Any, ...]:
    """The fitness objectives ranking by ``fitness`` needs (and only then)."""
    from servesim.analysis.verdict import parse_fitness

    if objective != "fitness":
        if weights is not None:
            raise ScenarioError(
                path, weights, f"fitness weights rank only with objective: fitness, not {objective}"
            )
        return ()
    if weights is None:
        raise ScenarioError(
            "fitness",
            None,
            "objective fitness needs weights, e.g. fitness: {cost_per_hour: 2, "
            "ttft_p99_ms: 1} (or --fitness cost_per_hour:2,ttft_p99_ms:1)",
        )
    return parse_fitness(weights, path)
