"""A plan's results: one :class:`CandidateResult` per candidate, their ranking by the objective,
the Pareto front over (cost per hour, goodput) and the :class:`PlanResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from servesim.simcore.errors import ScenarioError
from servesim.studies.plan.objectives import OBJECTIVES
from servesim.studies.plan.spec import PLAN_VERSION, Plan


@attrs.frozen
class CandidateResult:
    """One candidate's outcome. ``status`` is ``feasible`` or ``rejected``; a rejected one says
    why (``rejected_by``: ``memory``, ``tp``, ``parallelism``, ``latency``, ``projection``,
    ``confidence``, ``pd``, ``budget``, ``scenario``, ``slo`` or ``simulation``; ``reason``: the
    numbers). For a feasible one the metrics are those of the
    run at ``instances``, the smallest count that met the SLO attainment; for one rejected by
    ``slo`` they are those of the run at the search's maximum count."""

    gpu: str
    tp: int
    max_num_seqs: int
    routing: str
    pp: int = 1
    ep: int = 1
    max_num_batched_tokens: int | None = None
    """None: the base scenario's own."""
    pd: str | None = None
    """``P:D`` prefill:decode instances per unit, ``none`` (co-located) or None (not searched)."""
    name: str = ""
    """The candidate's label in the plan (:attr:`label`)."""
    index: int = 0
    """Position in the search order."""
    status: str = "feasible"
    rejected_by: str | None = None
    reason: str = ""
    latency_model: str | None = None
    latency_note: str = ""
    kv_blocks: int | None = None
    usd_per_gpu_hour: float | None = None
    watts_per_gpu: float | None = None
    """The plan's power figure for the GPU (None: not given)."""
    instances: int | None = None
    gpus: int | None = None
    cost_per_hour: float | None = None
    throughput_per_gpu: float | None = None
    """Output tokens per second per GPU at the offered load (``tokens_per_sec / gpus``)."""
    offered_rps: float | None = None
    """The rate at which the simulated requests arrived: (n − 1) / (last − first arrival)."""
    responses_per_sec: float | None = None
    """Completed requests per second at the offered load (offered rate × share completed)."""
    tokens_per_sec: float | None = None
    """Output tokens per second at the offered load (offered rate × output tokens per request)."""
    goodput_rps: float | None = None
    """Requests per second within SLO at the offered load: offered rate × the share of all
    simulated requests that met every target of their class."""
    attainment: float | None = None
    """The lowest per-class SLO attainment (the one the requirement binds)."""
    attainment_by_class: Mapping[str, float] = attrs.field(factory=dict)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    """p99 of each request's mean inter-token latency (what an ``itl`` target judges)."""
    itl_p99_ms: float | None = None
    """p99 over every inter-token gap of the run."""
    e2e_p99_ms: float | None = None
    evaluated: tuple[tuple[int, float, bool], ...] = ()
    """Every simulated count: (instances, attainment, met the requirement)."""
    rank: int | None = None
    pareto: bool = False
    fitness: float | None = None
    """The weighted fitness score, when the plan ranks by ``fitness``."""
    objective_value: float | None = None
    """The summary field the plan ranks by, when it ranks by one (at ``instances``)."""

    @property
    def cost_per_million_tokens(self) -> float | None:
        """USD per million output tokens at the offered load (cost per hour / tokens per hour)."""
        if not self.cost_per_hour or not self.tokens_per_sec:
            return None
        return self.cost_per_hour / (self.tokens_per_sec * 3600 / 1e6)

    @property
    def energy_per_million_tokens(self) -> float | None:
        """kWh per million output tokens at the offered load, every GPU drawing
        ``watts_per_gpu`` (:mod:`servesim.studies.plan.energy`)."""
        from servesim.studies.plan.energy import energy_kwh_per_million

        return energy_kwh_per_million(self.gpus, self.watts_per_gpu, self.tokens_per_sec)

    @property
    def feasible(self) -> bool:
        return self.status == "feasible"

    @property
    def label(self) -> str:
        return self.name or f"{self.gpu} tp{self.tp} seqs{self.max_num_seqs} {self.routing}"

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=False)
        out["attainment_by_class"] = dict(self.attainment_by_class)
        out["evaluated"] = [
            {"instances": n, "attainment": a, "meets": ok} for n, a, ok in self.evaluated
        ]
        out["label"] = self.label
        out["cost_per_million_tokens"] = self.cost_per_million_tokens
        out["energy_per_million_tokens"] = self.energy_per_million_tokens
        return out


def pareto_front(results: Sequence[CandidateResult]) -> list[CandidateResult]:
    """The feasible results no other feasible result beats on both cost per hour (lower is
    better) and goodput (higher is better); sorted by cost, then goodput descending. Results
    with identical cost and goodput are all kept."""
    feasible = [
        r
        for r in results
        if r.feasible and r.cost_per_hour is not None and r.goodput_rps is not None
    ]
    points = [(r, _num(r.cost_per_hour), _num(r.goodput_rps)) for r in feasible]
    front = [
        r
        for r, cost, good in points
        if not any(c <= cost and g >= good and (c < cost or g > good) for _, c, g in points)
    ]
    return sorted(front, key=lambda r: (_num(r.cost_per_hour), -_num(r.goodput_rps), r.label))


def _num(value: float | int | None) -> float:
    """A metric of a feasible result (always set) as a sort key."""
    return float(value) if value is not None else 0.0


def _sort_key(
    objective: str, metric: tuple[str, str] | None = None
) -> Callable[[CandidateResult], tuple]:
    if metric is not None:
        sign = 1.0 if metric[1] == "lowest" else -1.0
        return lambda r: (
            sign * r.objective_value if r.objective_value is not None else float("inf"),
            _num(r.cost_per_hour),
            r.label,
        )
    if objective == "fitness":
        return lambda r: (-_num(r.fitness), _num(r.cost_per_hour), r.label)
    if objective in (
        "cost_per_million_tokens",
        "energy_per_million_tokens",
        "ttft_p99_ms",
        "tpot_p99_ms",
        "itl_p99_ms",
        "e2e_p99_ms",
    ):
        return lambda r: (_inf(getattr(r, objective)), _num(r.cost_per_hour), r.label)
    if objective == "cost":
        return lambda r: (_num(r.cost_per_hour), -_num(r.goodput_rps), _num(r.gpus), r.label)
    if objective == "throughput_per_gpu":
        return lambda r: (
            -_num(r.throughput_per_gpu),
            _num(r.cost_per_hour),
            -_num(r.goodput_rps),
            r.label,
        )
    if objective == "goodput":
        return lambda r: (-_num(r.goodput_rps), _num(r.cost_per_hour), r.label)
    raise ScenarioError("objective", objective, f"must be one of: {', '.join(OBJECTIVES)}")


def _inf(value: float | None) -> float:
    """A lower-is-better metric as a sort key; a missing one sorts last."""
    return float(value) if value is not None else float("inf")


def rank_results(
    results: Sequence[CandidateResult],
    objective: str,
    fitness: Sequence[Any] = (),
    metric: tuple[str, str] | None = None,
) -> list[CandidateResult]:
    """The feasible results, best first by ``objective``, each with its ``rank`` (1 = best) set.
    Ties: ``cost`` → more goodput, fewer GPUs, the label; ``throughput_per_gpu`` → cheaper, more
    goodput, the label; ``goodput``, a latency percentile, cost per million tokens,
    ``fitness`` (scored with the ``fitness`` objectives) and a summary ``metric`` (field,
    ``lowest``/``highest``; a run without the field sorts last) → cheaper, the label."""
    feasible = [r for r in results if r.feasible]
    if objective == "fitness":
        from servesim.analysis.verdict import fitness as score

        if not fitness:
            raise ScenarioError("fitness", None, "objective fitness needs fitness weights")
        feasible = [attrs.evolve(r, fitness=score(r.to_dict(), tuple(fitness))) for r in feasible]
    key = _sort_key(objective, metric)
    ranked = sorted(feasible, key=key)
    return [attrs.evolve(r, rank=i + 1) for i, r in enumerate(ranked)]


@attrs.frozen
class PlanResult:
    """What :func:`run_plan` found: every candidate (ranked feasible ones first, then the
    rejected ones in search order), the Pareto front and the search's cost."""

    plan: Plan
    candidates: tuple[CandidateResult, ...]
    simulations: int
    simulated_requests: int
    cache_hits: int
    wall_s: float
    arrival_span_s: float | None = None
    """How long the simulated requests took to arrive (first to last arrival)."""

    @property
    def ranked(self) -> list[CandidateResult]:
        return [c for c in self.candidates if c.feasible]

    @property
    def rejected(self) -> list[CandidateResult]:
        return [c for c in self.candidates if not c.feasible]

    @property
    def pareto(self) -> list[CandidateResult]:
        return pareto_front(self.candidates)

    @property
    def best(self) -> CandidateResult | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    def to_dict(self) -> dict[str, Any]:
        """plan.json: the plan, the answers (best, ranking, Pareto front, every rejection with
        its reason) and every candidate."""
        plan = self.plan
        return {
            "plan_version": PLAN_VERSION,
            "name": plan.name,
            "model": plan.model.name,
            "workload": plan.workload,
            "seed": plan.seed,
            "requests_per_candidate": plan.requests,
            "slo": {
                cls: {k.replace("_us", "_ms"): v / 1000.0 if v else None for k, v in t.items()}
                for cls, t in plan.slo.items()
            },
            "attainment_required": plan.attainment,
            "objective": plan.objective,
            "objective_order": plan.metric[1] if plan.metric else None,
            "budget_usd_per_hour": plan.budget,
            "power_watts_per_gpu": dict(plan.power),
            "pareto_axes": {"cost_per_hour": "minimise", "goodput_rps": "maximise"},
            "costs": {
                g.name: {"usd_per_gpu_hour": g.usd_per_gpu_hour, "source": g.cost_source}
                for g in plan.gpus
            },
            "search": {
                "gpu": [g.name for g in plan.gpus],
                "tp": list(plan.tps),
                "instances": {"min": plan.instances_min, "max": plan.instances_max},
                "max_num_seqs": list(plan.max_num_seqs),
                "routing": [label for label, _ in plan.routings],
                "pp": list(plan.space.pps),
                "ep": list(plan.space.eps),
                "max_num_batched_tokens": list(plan.space.batched_tokens),
                "pd": [f"{p}:{d}" if p else "none" for p, d in _splits(plan)],
                "latency": plan.latency,
                "candidates": plan.candidate_count,
            },
            "best": self.best.label if self.best else None,
            "ranking": [c.label for c in self.ranked],
            "pareto_front": [c.label for c in self.pareto],
            "rejected": [
                {"label": c.label, "rejected_by": c.rejected_by, "reason": c.reason}
                for c in self.rejected
            ],
            "candidates": [c.to_dict() for c in self.candidates],
            "simulations": self.simulations,
            "simulated_requests": self.simulated_requests,
            "cache_hits": self.cache_hits,
            "arrival_span_s": self.arrival_span_s,
            "wall_s": self.wall_s,
        }


def _splits(plan: Plan) -> list[tuple[int, int]]:
    """The plan's PD splits as pairs, (0, 0) for co-located."""
    return [split or (0, 0) for split in plan.space.pd_splits]
