"""Capacity planning: the cheapest fleet that serves a workload within its SLOs (``servesim plan``).

A plan (``PLAN.yaml``) names a base scenario — the model, the workload (whose rate is the demand)
and the engine defaults — the SLO targets, the share of requests that must meet them, and the
search space: GPU types, tensor parallelism, ``max_num_seqs`` and routing policies. For each
combination (a *candidate*) :func:`run_plan`

1. checks memory first: the model's weights and reserves must fit the ``tp`` GPUs with room for
   KV blocks (:func:`~servesim.memory.memory_breakdown`, the arithmetic of
   ``engine.kv_blocks: auto``); a candidate that does not fit is rejected with the numbers;
2. picks the latency model: ``blackbox`` when bundled coefficients exist for the (model, GPU,
   tp), else ``trained-physics``, else ``roofline`` (the first that accepts the model and GPU);
3. finds the smallest instance count whose simulated run meets the SLO attainment in every
   class with a target: counts ``min, 2·min, 4·min, …`` up to ``max`` until one meets it, then
   bisection between the last count that failed and the first that met it. This assumes the
   attainment does not get worse with more instances (the demand is fixed). Both the count found
   and the count below it are simulated, so the answer is checked, not extrapolated. Every
   simulation is cached by (candidate, count); at one instance every routing policy sends every
   request to it, so candidates that differ only in routing share that simulation.

Feasible candidates are ranked by the objective (``cost`` per hour, ``throughput_per_gpu`` or
``goodput``); the Pareto front is over (cost per hour ↓, goodput ↑). Costs are USD per GPU-hour
from ``hardware.yaml`` (``cost_per_hour``: indicative list prices, see that file), overridden by
the plan's ``costs:``, ``--costs FILE`` and ``--cost GPU=USD``.
Modules: ``spec`` (the plan file), ``search`` (:func:`run_plan`), ``results`` (ranking, Pareto
front), ``output`` (console text and files), ``cli`` (``servesim plan``).
"""

from servesim.studies.plan.cli import add_plan_parser, cmd_plan
from servesim.studies.plan.objectives import OBJECTIVES
from servesim.studies.plan.output import format_plan, write_plan
from servesim.studies.plan.results import CandidateResult, PlanResult, pareto_front, rank_results
from servesim.studies.plan.runner import PLAN_BACKENDS, run_plan
from servesim.studies.plan.spec import (
    CSV_COLUMNS,
    LATENCY_CHOICES,
    PLAN_FIELDS,
    SEARCH_FIELDS,
    Plan,
    load_plan,
)

__all__ = [
    "CSV_COLUMNS",
    "PLAN_BACKENDS",
    "LATENCY_CHOICES",
    "OBJECTIVES",
    "PLAN_FIELDS",
    "SEARCH_FIELDS",
    "CandidateResult",
    "Plan",
    "PlanResult",
    "add_plan_parser",
    "cmd_plan",
    "format_plan",
    "load_plan",
    "pareto_front",
    "rank_results",
    "run_plan",
    "write_plan",
]
