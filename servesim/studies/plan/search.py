""":func:`run_plan`: per candidate, the memory check, the latency model and the smallest instance
count that meets the SLO attainment (doubling, then bisection), every simulation cached.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from servesim.simcore.config import (
    expect_mapping,
)
from servesim.simcore.errors import ScenarioError, ServesimError
from servesim.studies.plan.results import CandidateResult, PlanResult, pareto_front, rank_results
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
        self._memory: dict[tuple[str, int], tuple[str | None, str, int | None]] = {}
        self._latency: dict[tuple[str, int], tuple[str | None, str]] = {}

    # -- checks that need no simulation

    def memory(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str, int | None]:
        """(rejected_by or None, reason, kv_blocks) for the model on ``tp`` × ``gpu``."""
        key = (gpu.name, tp)
        if key not in self._memory:
            self._memory[key] = self._check_memory(gpu, tp)
        return self._memory[key]

    def _check_memory(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str, int | None]:
        from servesim.memory import memory_breakdown

        spec = self.plan.model.spec
        if spec is None:
            return None, "memory not checked: the model has no architecture config", None
        engine = expect_mapping(self.plan.base.get("engine"), "engine")
        block_size = int(engine.get("block_size", 16))
        utilisation = float(engine.get("gpu_memory_utilization", 0.9))
        try:
            d = memory_breakdown(
                spec,
                gpu.spec,
                tp,
                block_size,
                utilisation,
                max_num_batched_tokens=int(engine.get("max_num_batched_tokens", 2048)),
                max_num_seqs=int(engine.get("max_num_seqs", 256)),
            )
        except ScenarioError as exc:
            return "tp", f"tp={tp}: {exc.fix}", None
        if d["feasible"]:
            return None, "", int(d["kv_blocks"])
        reserves = (d["activation_peak_gib"] + d["non_torch_gib"] + d["cuda_graph_gib"]) * tp
        reason = (
            f"memory: {d['model']} needs {d['overhead_gib']:.1f} GiB per instance (weights "
            f"{d['weights_gib']:.1f} + activation peak and reserves {reserves:.1f}) but "
            f"{tp} × {gpu.name} "
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

    def prune(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: tuple[str, Any], latency: str
    ) -> tuple[str, str] | None:
        """(rejected_by, reason) when the projector rejects the candidate at the most instances
        the plan allows (servesim.projection.prune), else None."""
        from servesim.projection.prune import prune_reason
        from servesim.scenario import build_scenario

        plan = self.plan
        if plan.prune_margin is None and plan.min_confidence is None:
            return None
        raw = self.scenario_raw(gpu, tp, seqs, routing[1], plan.instances_max, latency)
        try:
            scenario = build_scenario(raw, base_dir=plan.base_dir)
        except ScenarioError:
            return None  # the simulation reports it
        return prune_reason(scenario, plan.prune_margin, plan.min_confidence)

    # -- simulation

    def scenario_raw(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: Any, count: int, latency: str
    ) -> dict[str, Any]:
        raw = copy.deepcopy(dict(self.plan.base))
        raw["gpu"] = gpu.scenario_value
        raw["tp"] = tp
        cluster = dict(raw.get("cluster") or {})
        cluster["instances"] = count
        raw["cluster"] = cluster
        engine = dict(raw.get("engine") or {})
        engine["max_num_seqs"] = seqs
        raw["engine"] = engine
        policies = dict(raw.get("policies") or {})
        policies["routing"] = copy.deepcopy(routing)
        raw["policies"] = policies
        if self.plan.latency != "scenario":
            raw["latency"] = {"model": latency}
        raw.pop("output", None)  # nothing is written; a decision trace would only slow it down
        return raw

    def evaluate(
        self,
        gpu: GPUChoice,
        tp: int,
        seqs: int,
        routing: tuple[str, Any],
        count: int,
        latency: str,
    ) -> _Run:
        # one instance: every router sends every request to it, so routing does not matter
        key = (gpu.name, tp, seqs, routing[0] if count > 1 else "*", count)
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        run = self._simulate(gpu, tp, seqs, routing[1], count, latency)
        self.cache[key] = run
        return run

    def _simulate(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: Any, count: int, latency: str
    ) -> _Run:
        from servesim.run import simulate
        from servesim.scenario import build_scenario

        raw = self.scenario_raw(gpu, tp, seqs, routing, count, latency)
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
        )

    # -- one candidate

    def candidate(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: tuple[str, Any]
    ) -> CandidateResult:
        plan = self.plan
        base = CandidateResult(
            gpu=gpu.name,
            tp=tp,
            max_num_seqs=seqs,
            routing=routing[0],
            usd_per_gpu_hour=gpu.usd_per_gpu_hour,
        )
        rejected_by, reason, kv_blocks = self.memory(gpu, tp)
        if rejected_by is not None:
            return attrs.evolve(base, status="rejected", rejected_by=rejected_by, reason=reason)
        latency, note = self.latency(gpu, tp)
        base = attrs.evolve(base, latency_model=latency, latency_note=note, kv_blocks=kv_blocks)
        if latency is None:
            return attrs.evolve(base, status="rejected", rejected_by="latency", reason=note)
        pruned = self.prune(gpu, tp, seqs, routing, latency)
        if pruned is not None:
            return attrs.evolve(base, status="rejected", rejected_by=pruned[0], reason=pruned[1])

        evaluated: dict[int, _Run] = {}

        def run(n: int) -> _Run:
            if n not in evaluated:
                evaluated[n] = self.evaluate(gpu, tp, seqs, routing, n, latency)
            return evaluated[n]

        lo, hi = plan.instances_min, plan.instances_max
        n, last_fail = lo, None
        while True:  # exponential search: min, 2·min, 4·min, ... up to max
            r = run(n)
            if r.error is not None:
                return self._error(base, r, evaluated)
            if r.meets:
                break
            last_fail = n
            if n == hi:
                return self._not_met(base, r, evaluated)
            n = min(max(2 * n, n + 1), hi)
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
        gpus = found * tp
        return attrs.evolve(
            base,
            kv_blocks=best.kv_blocks,
            instances=found,
            gpus=gpus,
            cost_per_hour=gpus * gpu.usd_per_gpu_hour,
            throughput_per_gpu=best.tokens_per_sec / gpus,
            **_metrics(best),
            evaluated=_evaluated(evaluated),
        )

    def _not_met(
        self, base: CandidateResult, r: _Run, evaluated: Mapping[int, _Run]
    ) -> CandidateResult:
        hi = self.plan.instances_max
        dims = ", ".join(
            f"{dim.replace('_ms', '').upper()} {share:.0%}"
            for dim, share in sorted(r.by_dim.items())
        )
        reason = (
            f"SLO not met even at {hi} instance(s): attainment {r.attainment:.1%} "
            f"({r.worst_class}) < {self.plan.attainment:.0%}"
            + (f"; met per target: {dims}" if dims else "")
            + f"; p99 TTFT {r.ttft_p99_ms:.0f} ms, p99 TPOT {r.tpot_p99_ms:.1f} ms"
        )
        return attrs.evolve(
            base,
            status="rejected",
            rejected_by="slo",
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


def run_plan(
    plan: Plan,
    progress: Callable[[CandidateResult, int, int], None] | None = None,
) -> PlanResult:
    """Search every candidate of ``plan``; ``progress(result, done, total)`` is called as each
    candidate finishes."""
    started = time.perf_counter()
    planner = _Planner(plan)
    results = []
    total = plan.candidate_count
    for gpu in plan.gpus:
        for tp in plan.tps:
            for seqs in plan.max_num_seqs:
                for routing in plan.routings:
                    result = planner.candidate(gpu, tp, seqs, routing)
                    results.append(result)
                    if progress is not None:
                        progress(result, len(results), total)
    ranked = rank_results(results, plan.objective, plan.fitness)
    front = {id(r) for r in pareto_front(ranked)}
    ranked = [attrs.evolve(r, pareto=id(r) in front) for r in ranked]
    rejected = [r for r in results if not r.feasible]
    return PlanResult(
        plan=plan,
        candidates=tuple(ranked + rejected),
        simulations=planner.simulations,
        simulated_requests=planner.simulated_requests,
        cache_hits=planner.cache_hits,
        wall_s=time.perf_counter() - started,
        arrival_span_s=planner.arrival_span_s,
    )
