"""One candidate's search (:class:`_Planner`): the memory check, the latency model, the
projector's pruning, the budget and the smallest instance count that meets the SLO attainment
(doubling, then bisection), every simulation cached. :mod:`servesim.studies.plan.runner` runs
the candidates.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from servesim.simcore.config import (
    expect_mapping,
)
from servesim.simcore.errors import ScenarioError, ServesimError
from servesim.studies.plan.results import CandidateResult
from servesim.studies.plan.space import Candidate
from servesim.studies.plan.spec import LATENCY_PREFERENCE, GPUChoice, Plan


@attrs.frozen
class _Run:
    """One simulated (candidate, count)."""

    meets: bool
    attainment: float
    by_class: Mapping[str, float]
    worst_class: str
    by_dim: Mapping[str, float]
    offered_rps: float
    goodput_rps: float
    responses_per_sec: float
    tokens_per_sec: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    itl_p99_ms: float
    e2e_p99_ms: float
    kv_blocks: int
    injected: int
    objective_value: float | None = None
    error: str | None = None
    error_kind: str = "simulation"


class _Planner:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.cache: dict[tuple, _Run] = {}
        self.simulations = 0
        self.simulated_requests = 0
        self.cache_hits = 0
        self.arrival_span_s: float | None = None
        self._memory: dict[tuple, tuple[str | None, str, int | None]] = {}
        self._latency: dict[tuple[str, int], tuple[str | None, str]] = {}

    def counts(self) -> dict[str, Any]:
        """What this planner's searches cost: simulations, their requests, cache hits and the
        longest arrival span."""
        return {
            "simulations": self.simulations,
            "simulated_requests": self.simulated_requests,
            "cache_hits": self.cache_hits,
            "arrival_span_s": self.arrival_span_s,
        }

    # -- checks that need no simulation

    def memory(self, c: Candidate) -> tuple[str | None, str, int | None]:
        """(rejected_by or None, reason, kv_blocks) for the model on one instance of ``c``."""
        key = c.memory_key
        if key not in self._memory:
            self._memory[key] = self._check_memory(c)
        return self._memory[key]

    def _parallel(self, c: Candidate) -> Any:
        """``c``'s layout beyond tp (the base scenario's dp, cp and nodes; the candidate's pp
        and ep), or None when it is plain tensor parallelism."""
        from servesim.latency.parallel import Parallelism

        engine = expect_mapping(self.plan.base.get("engine"), "engine")
        base = {k: int(engine.get(k, 1)) for k in ("dp", "cp")}
        par = Parallelism(pp=c.pp, ep=c.ep, **base)
        if "gpus_per_node" in engine:
            par = attrs.evolve(par, gpus_per_node=int(engine["gpus_per_node"]))
        return None if par.plain else par

    def _check_memory(self, c: Candidate) -> tuple[str | None, str, int | None]:
        from servesim.latency.parallel import check_parallelism
        from servesim.memory import memory_breakdown

        gpu, tp = c.gpu, c.tp
        spec = self.plan.model.spec
        if spec is None:
            return None, "memory not checked: the model has no architecture config", None
        parallel = self._parallel(c)
        if parallel is not None:
            try:
                check_parallelism(spec, tp, parallel, "engine")
            except ScenarioError as exc:
                return "parallelism", f"parallelism: {exc.path}={exc.value}: {exc.fix}", None
        engine = expect_mapping(self.plan.base.get("engine"), "engine")
        block_size = int(engine.get("block_size", 16))
        utilisation = float(engine.get("gpu_memory_utilization", 0.9))
        batched = c.max_num_batched_tokens or int(engine.get("max_num_batched_tokens", 2048))
        try:
            d = memory_breakdown(
                spec,
                gpu.spec,
                tp,
                block_size,
                utilisation,
                max_num_batched_tokens=batched,
                max_num_seqs=c.max_num_seqs,
                parallel=parallel,
            )
        except ScenarioError as exc:
            return "tp", f"tp={tp}: {exc.fix}", None
        if d["feasible"]:
            return None, "", int(d["kv_blocks"])
        gpus = c.gpus_per_instance
        reserves = (d["activation_peak_gib"] + d["non_torch_gib"] + d["cuda_graph_gib"]) * gpus
        reason = (
            f"memory: {d['model']} needs {d['overhead_gib']:.1f} GiB per instance (weights "
            f"{d['weights_gib']:.1f} + activation peak and reserves {reserves:.1f}) but "
            f"{gpus} × {gpu.name} "
            f"({d['gpu_memory_gib']:g} GiB each) give {d['available_gib']:.1f} GiB at "
            f"gpu_memory_utilization {utilisation:g}"
        )
        if d.get("min_gpus") is None:
            reason += f"; no number of {gpu.name} GPUs holds it"
        else:
            min_tp = d.get("min_tp")
            reason += f"; it needs at least {d['min_gpus']} GPUs" + (
                f" (tp={min_tp})" if min_tp not in (None, d["min_gpus"]) else ""
            )
        return "memory", reason, None

    def latency(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str]:
        """(latency model name or None, note) for ``tp`` × ``gpu``."""
        key = (gpu.name, tp)
        if key not in self._latency:
            self._latency[key] = self._choose_latency(gpu, tp)
        return self._latency[key]

    def _choose_latency(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str]:
        from servesim.scenario import latency_context
        from servesim.simcore import registry

        plan = self.plan
        context = latency_context(plan.model, gpu.spec, tp)
        if plan.latency == "scenario":
            section = plan.base.get("latency") or {"model": "blackbox"}
            if isinstance(section, str):
                section = {"model": section}
            name = str(section.get("model", "blackbox"))
            params = {k: v for k, v in section.items() if k != "model"}
            try:
                registry.get("latency", name).from_config(params, context)
            except ScenarioError as exc:
                return None, f"latency: the base scenario's {name} model refuses it: {exc.fix}"
            return name, "the base scenario's latency section"
        order = LATENCY_PREFERENCE if plan.latency == "auto" else (plan.latency,)
        refused = []
        for name in order:
            try:
                registry.get("latency", name).from_config({}, context)
            except ScenarioError as exc:
                refused.append(
                    "no bundled blackbox coefficients for this model, GPU and tp"
                    if name == "blackbox"
                    else f"{name} refuses it: {exc.fix}"
                )
                continue
            if name == "blackbox":
                return name, "bundled blackbox coefficients for this model, GPU and tp"
            return name, "; ".join(refused) or "named in the plan"
        return None, "latency: no latency model can price it: " + "; ".join(refused)

    def prune(self, c: Candidate, latency: str, instances: int) -> tuple[str, str] | None:
        """(rejected_by, reason) when the projector rejects the candidate at the most instances
        the search may reach (servesim.projection.prune), else None."""
        from servesim.projection.prune import prune_reason
        from servesim.scenario import build_scenario

        plan = self.plan
        if plan.prune_margin is None and plan.min_confidence is None:
            return None
        raw = self.scenario_raw(c, instances, latency)
        try:
            scenario = build_scenario(raw, base_dir=plan.base_dir)
        except ScenarioError:
            return None  # the simulation reports it
        return prune_reason(scenario, plan.prune_margin, plan.min_confidence)

    # -- simulation

    def scenario_raw(self, c: Candidate, count: int, latency: str) -> dict[str, Any]:
        """The base scenario with ``c``'s settings and ``count`` instances (with a PD split:
        ``count`` / unit units of P prefill and D decode instances)."""
        raw = copy.deepcopy(dict(self.plan.base))
        raw["gpu"] = c.gpu.scenario_value
        raw["tp"] = c.tp
        cluster = dict(raw.get("cluster") or {})
        cluster["instances"] = count
        policies = dict(raw.get("policies") or {})
        policies["routing"] = copy.deepcopy(c.routing[1])
        if c.pd is not None:
            units = count // c.unit
            cluster["pools"] = {
                "prefill": {"instances": units * c.pd[0]},
                "decode": {"instances": units * c.pd[1]},
            }
        elif "pd" in c.shown:  # the co-located candidates of a PD search
            cluster.pop("kv_transfer", None)
            policies.pop("disaggregation", None)
        raw["cluster"] = cluster
        raw["policies"] = policies
        engine = dict(raw.get("engine") or {})
        engine["max_num_seqs"] = c.max_num_seqs
        for key in ("pp", "ep"):
            if key in c.shown:
                engine[key] = getattr(c, key)
        if c.max_num_batched_tokens is not None:
            engine["max_num_batched_tokens"] = c.max_num_batched_tokens
        raw["engine"] = engine
        if self.plan.latency != "scenario":
            raw["latency"] = {"model": latency}
        raw.pop("output", None)  # nothing is written; a decision trace would only slow it down
        return raw

    def evaluate(self, c: Candidate, count: int, latency: str) -> _Run:
        key = c.run_key(count)
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        run = self._simulate(c, count, latency)
        self.cache[key] = run
        return run

    def _simulate(self, c: Candidate, count: int, latency: str) -> _Run:
        from servesim.run import simulate
        from servesim.scenario import build_scenario

        raw = self.scenario_raw(c, count, latency)
        try:
            scenario = build_scenario(raw, base_dir=self.plan.base_dir)
        except ScenarioError as exc:
            return _failed("scenario", f"at {count} instance(s): {exc}")
        self.simulations += 1
        try:
            results = simulate(scenario)
        except ServesimError as exc:
            return _failed("simulation", f"{type(exc).__name__} at {count} instance(s): {exc}")
        except Exception as exc:  # one broken candidate must not end the search
            return _failed(
                "simulation", f"internal {type(exc).__name__} at {count} instance(s): {exc}"
            )
        self.simulated_requests += int(results.summary["injected_requests"])
        return self._judge(results, scenario)

    def _judge(self, results: Any, scenario: Any) -> _Run:
        from servesim.components.record import STATUS_COMPLETED

        summary = results.summary
        goodput = summary.get("goodput") or {}
        judged = {cls: g for cls, g in goodput.items() if g["count"] > 0}
        if not judged:
            classes = sorted(summary.get("per_class") or {}) or ["(none completed)"]
            raise ScenarioError(
                "slo",
                sorted(self.plan.slo),
                "no simulated request belongs to a class with a target; the workload's "
                f"requests are in {', '.join(classes)}: give targets for those classes",
            )
        by_class = {cls: float(g["slo_attainment"]) for cls, g in judged.items()}
        worst = min(by_class, key=lambda c: (by_class[c], c))
        attainment = by_class[worst]
        # Rates at the offered load: the share of requests served (within SLO), times the rate
        # at which they arrived. (The summary's own rates divide by the whole run, which with a
        # few hundred requests is dominated by draining the last ones.)
        req = results.requests
        arrival = req["arrival_us"]
        n = len(arrival)
        span_us = float(arrival.max() - arrival.min()) if n else 0.0
        offered = (
            (n - 1) / span_us * 1e6 if n > 1 and span_us > 0 else n / summary["sim_duration_s"]
        )
        span_s = span_us / 1e6
        self.arrival_span_s = max(self.arrival_span_s or 0.0, span_s)
        done = req["status"] == STATUS_COMPLETED
        good = sum(int(g["good"]) for g in judged.values())
        per_request = offered / n if n else 0.0
        return _Run(
            meets=all(a >= self.plan.attainment - 1e-12 for a in by_class.values()),
            attainment=attainment,
            by_class=by_class,
            worst_class=worst,
            by_dim=dict(judged[worst].get("slo_attainment_by_dim") or {}),
            offered_rps=offered,
            goodput_rps=good * per_request,
            responses_per_sec=int(done.sum()) * per_request,
            tokens_per_sec=float(req["output_tokens"][done].sum()) * per_request,
            ttft_p99_ms=float(summary["ttft_p99_ms"]),
            tpot_p99_ms=float(summary["tpot_p99_ms"]),
            itl_p99_ms=float(summary["itl_p99_ms"]),
            e2e_p99_ms=float(summary["e2e_p99_ms"]),
            kv_blocks=int(scenario.engine.kv_blocks),
            injected=int(summary["injected_requests"]),
            objective_value=self._objective_value(summary),
        )

    def _objective_value(self, summary: Mapping[str, Any]) -> float | None:
        """The summary field the plan ranks by (None: it ranks by a named objective)."""
        if self.plan.metric is None:
            return None
        from servesim.studies.sweep.metrics import metric_value

        value = metric_value(summary, self.plan.metric[0])
        return None if value is None else float(value)

    # -- one candidate

    def bounds(self, c: Candidate) -> tuple[int, int, int] | tuple[str, str]:
        """(lowest, highest, affordable) unit counts the search may try for ``c``, or
        (rejected_by, reason) when there is none: no multiple of the PD unit lies within
        ``search.instances``, or even the smallest fleet costs more than the budget."""
        plan = self.plan
        unit = c.unit
        lo = max(1, math.ceil(plan.instances_min / unit))
        hi = plan.instances_max // unit
        if hi < lo:
            return (
                "pd",
                f"pd {c.pd_label} grows in units of {unit} instances, and no multiple of "
                f"{unit} lies in search.instances {plan.instances_min}-{plan.instances_max}; "
                f"raise search.instances.max to at least {lo * unit}",
            )
        if plan.budget is None:
            return lo, hi, hi
        unit_cost = unit * c.gpus_per_instance * c.gpu.usd_per_gpu_hour
        affordable = hi if unit_cost <= 0 else min(hi, math.floor(plan.budget / unit_cost + 1e-9))
        if affordable < lo:
            return (
                "budget",
                f"over budget: the smallest fleet searched, {lo * unit} instance(s) of "
                f"{c.gpus_per_instance} GPU(s), costs ${lo * unit_cost:.2f}/hour > the budget "
                f"${plan.budget:.2f}/hour",
            )
        return lo, hi, affordable

    def candidate(self, c: Candidate) -> CandidateResult:
        """Search one candidate: the checks that need no simulation, then the smallest unit
        count that meets the SLO attainment (doubling, then bisection)."""
        base = CandidateResult(
            gpu=c.gpu.name,
            tp=c.tp,
            max_num_seqs=c.max_num_seqs,
            routing=c.routing[0],
            pp=c.pp,
            ep=c.ep,
            max_num_batched_tokens=c.max_num_batched_tokens,
            pd=c.pd_label if "pd" in c.shown else None,
            name=c.label,
            index=c.index,
            usd_per_gpu_hour=c.gpu.usd_per_gpu_hour,
            watts_per_gpu=self.plan.power.get(c.gpu.name),
        )
        rejected_by, reason, kv_blocks = self.memory(c)
        if rejected_by is not None:
            return _rejected(base, rejected_by, reason)
        latency, note = self.latency(c.gpu, c.tp)
        base = attrs.evolve(base, latency_model=latency, latency_note=note, kv_blocks=kv_blocks)
        if latency is None:
            return _rejected(base, "latency", note)
        bounds = self.bounds(c)
        if isinstance(bounds[0], str):
            return _rejected(base, str(bounds[0]), str(bounds[1]))
        lo, hi, cap = (int(b) for b in bounds)
        pruned = self.prune(c, latency, cap * c.unit)
        if pruned is not None:
            return _rejected(base, pruned[0], pruned[1])

        evaluated: dict[int, _Run] = {}  # by instance count

        def run(units: int) -> _Run:
            n = units * c.unit
            if n not in evaluated:
                evaluated[n] = self.evaluate(c, n, latency)
            return evaluated[n]

        n, last_fail = lo, None
        while True:  # exponential search: lo, 2·lo, 4·lo, ... up to the cap
            r = run(n)
            if r.error is not None:
                return self._error(base, r, evaluated)
            if r.meets:
                break
            last_fail = n
            if n == cap:
                return self._not_met(base, r, evaluated, cap * c.unit, over_budget=cap < hi)
            n = min(max(2 * n, n + 1), cap)
        found = n
        if last_fail is not None:  # bisection: last_fail fails, found meets
            low = last_fail
            while found - low > 1:
                mid = (low + found) // 2
                r = run(mid)
                if r.error is not None:
                    return self._error(base, r, evaluated)
                if r.meets:
                    found = mid
                else:
                    low = mid
        # check: the count found meets the requirement and the one below it does not
        best = run(found)
        if found > lo:
            below = run(found - 1)
            if below.error is not None:
                return self._error(base, below, evaluated)
        instances = found * c.unit
        gpus = instances * c.gpus_per_instance
        return attrs.evolve(
            base,
            kv_blocks=best.kv_blocks,
            instances=instances,
            gpus=gpus,
            cost_per_hour=gpus * c.gpu.usd_per_gpu_hour,
            throughput_per_gpu=best.tokens_per_sec / gpus,
            objective_value=best.objective_value,
            **_metrics(best),
            evaluated=_evaluated(evaluated),
        )

    def _not_met(
        self,
        base: CandidateResult,
        r: _Run,
        evaluated: Mapping[int, _Run],
        hi: int,
        over_budget: bool = False,
    ) -> CandidateResult:
        dims = ", ".join(
            f"{dim.replace('_ms', '').upper()} {share:.0%}"
            for dim, share in sorted(r.by_dim.items())
        )
        budget = self.plan.budget
        where = (
            f"over budget: SLO not met at {hi} instance(s), the most the budget "
            f"${budget:.2f}/hour buys"
            if over_budget and budget is not None
            else f"SLO not met even at {hi} instance(s)"
        )
        reason = (
            f"{where}: attainment {r.attainment:.1%} "
            f"({r.worst_class}) < {self.plan.attainment:.0%}"
            + (f"; met per target: {dims}" if dims else "")
            + f"; p99 TTFT {r.ttft_p99_ms:.0f} ms, p99 TPOT {r.tpot_p99_ms:.1f} ms"
        )
        return attrs.evolve(
            base,
            status="rejected",
            rejected_by="budget" if over_budget else "slo",
            reason=reason,
            kv_blocks=r.kv_blocks,
            **_metrics(r),
            evaluated=_evaluated(evaluated),
        )

    def _error(
        self, base: CandidateResult, r: _Run, evaluated: Mapping[int, _Run]
    ) -> CandidateResult:
        return attrs.evolve(
            base,
            status="rejected",
            rejected_by=r.error_kind,
            reason=f"{r.error_kind} error: {r.error}",
            evaluated=_evaluated({n: e for n, e in evaluated.items() if e.error is None}),
        )


def _rejected(base: CandidateResult, rejected_by: str, reason: str) -> CandidateResult:
    return attrs.evolve(base, status="rejected", rejected_by=rejected_by, reason=reason)


def _failed(kind: str, message: str) -> _Run:
    nan = float("nan")
    return _Run(
        False,
        nan,
        {},
        "",
        {},
        nan,
        nan,
        nan,
        nan,
        nan,
        nan,
        nan,
        nan,
        0,
        0,
        error=message,
        error_kind=kind,
    )


def _metrics(r: _Run) -> dict[str, Any]:
    return {
        "offered_rps": r.offered_rps,
        "responses_per_sec": r.responses_per_sec,
        "tokens_per_sec": r.tokens_per_sec,
        "goodput_rps": r.goodput_rps,
        "attainment": r.attainment,
        "attainment_by_class": dict(r.by_class),
        "ttft_p99_ms": r.ttft_p99_ms,
        "tpot_p99_ms": r.tpot_p99_ms,
        "itl_p99_ms": r.itl_p99_ms,
        "e2e_p99_ms": r.e2e_p99_ms,
    }


def _evaluated(evaluated: Mapping[int, _Run]) -> tuple[tuple[int, float, bool], ...]:
    return tuple((n, r.attainment, r.meets) for n, r in sorted(evaluated.items()))


def search_candidates(
    plan: Plan,
    items: list[Candidate],
    progress: Callable[[CandidateResult], None] | None = None,
) -> tuple[list[CandidateResult], dict[str, Any]]:
    """Search ``items`` one after the other with one planner (its caches shared); returns the
    results and the planner's counts (simulations, simulated_requests, cache_hits,
    arrival_span_s)."""
    planner = _Planner(plan)
    results = []
    for c in items:
        result = planner.candidate(c)
        results.append(result)
        if progress is not None:
            progress(result)
    return results, planner.counts()
