""":func:`run_plan`, and where a plan's candidates are searched: in this process (``serial``),
on a local process pool (``process``) or as Ray tasks (``ray``, when Ray is installed).

A candidate's search (its checks, then its instance counts one after the other) is the unit of
work: its answer depends only on the plan and the candidate, so any worker may run it and the
plan's answer does not depend on the backend. A pool worker keeps one planner for every
candidate it is given, so its caches (memory checks, simulations) serve those candidates; a Ray
task starts a fresh one. Only the search's counts (simulations, cache hits) differ.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable
from typing import Any

import attrs

from servesim.simcore.errors import ScenarioError
from servesim.studies.plan.results import CandidateResult, PlanResult, pareto_front, rank_results
from servesim.studies.plan.search import _Planner, search_candidates
from servesim.studies.plan.space import Candidate, candidates
from servesim.studies.plan.spec import Plan
from servesim.studies.sweep.backends import _import_ray

PLAN_BACKENDS = ("serial", "process", "ray")

Progress = Callable[[CandidateResult, int, int], None]

_WORKER: dict[str, Any] = {}
"""A pool worker's planner, made once by :func:`_init_worker`."""


def run_plan(
    plan: Plan,
    progress: Callable[[CandidateResult, int, int], None] | None = None,
    *,
    backend: str = "serial",
    workers: int | None = None,
) -> PlanResult:
    """Search every candidate of ``plan``; ``progress(result, done, total)`` is called as each
    candidate finishes. ``backend``: ``serial`` (this process), ``process`` (a process pool of
    ``workers``, default the CPU count) or ``ray`` (Ray tasks, when Ray is installed). The
    answer does not depend on the backend; only the search's counts (simulations, cache hits)
    may, as each worker has its own cache."""
    started = time.perf_counter()
    items = candidates(plan)
    results, counts = dispatch(plan, items, progress, backend, workers)
    results.sort(key=lambda r: r.index)
    ranked = rank_results(results, plan.objective, plan.fitness, plan.metric)
    front = {id(r) for r in pareto_front(ranked)}
    ranked = [attrs.evolve(r, pareto=id(r) in front) for r in ranked]
    rejected = [r for r in results if not r.feasible]
    return PlanResult(
        plan=plan,
        candidates=tuple(ranked + rejected),
        simulations=counts["simulations"],
        simulated_requests=counts["simulated_requests"],
        cache_hits=counts["cache_hits"],
        wall_s=time.perf_counter() - started,
        arrival_span_s=counts["arrival_span_s"],
    )


def dispatch(
    plan: Plan,
    items: list[Candidate],
    progress: Progress | None,
    backend: str,
    workers: int | None,
) -> tuple[list[CandidateResult], dict[str, Any]]:
    """Search ``items`` on ``backend``; returns the results (in completion order) and the
    summed counts."""
    if backend not in PLAN_BACKENDS:
        raise ScenarioError("--backend", backend, f"must be one of: {', '.join(PLAN_BACKENDS)}")
    if workers is not None and workers < 1:
        raise ScenarioError("--workers", workers, "must be at least 1")
    total = len(items)
    if backend == "serial":
        done: list[CandidateResult] = []

        def each(result: CandidateResult) -> None:
            done.append(result)
            if progress is not None:
                progress(result, len(done), total)

        return search_candidates(plan, items, each)
    if backend == "process":
        return _on_pool(plan, items, progress, workers or os.cpu_count() or 1)
    return _on_ray(plan, items, progress, workers)


def _add(counts: dict[str, Any], more: dict[str, Any]) -> None:
    for key in ("simulations", "simulated_requests", "cache_hits"):
        counts[key] += more[key]
    spans = [s for s in (counts["arrival_span_s"], more["arrival_span_s"]) if s is not None]
    counts["arrival_span_s"] = max(spans) if spans else None


def _empty_counts() -> dict[str, Any]:
    return {"simulations": 0, "simulated_requests": 0, "cache_hits": 0, "arrival_span_s": None}


# ------------------------------------------------------------------------------ process pool


def _init_worker(plan: Plan) -> None:
    _WORKER["planner"] = _Planner(plan)


def _pool_search(c: Candidate) -> tuple[CandidateResult, dict[str, Any]]:
    """One candidate on this worker's planner; the counts are this search's own."""
    planner = _WORKER["planner"]
    before = planner.counts()
    result = planner.candidate(c)
    after = planner.counts()
    delta = {k: after[k] - before[k] for k in ("simulations", "simulated_requests", "cache_hits")}
    delta["arrival_span_s"] = after["arrival_span_s"]
    return result, delta


def _on_pool(
    plan: Plan, items: list[Candidate], progress: Progress | None, workers: int
) -> tuple[list[CandidateResult], dict[str, Any]]:
    results: list[CandidateResult] = []
    counts = _empty_counts()
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=min(workers, max(1, len(items))),
        initializer=_init_worker,
        initargs=(plan,),
    ) as pool:
        futures = [pool.submit(_pool_search, c) for c in items]
        try:
            for future in concurrent.futures.as_completed(futures):
                result, more = future.result()
                results.append(result)
                _add(counts, more)
                if progress is not None:
                    progress(result, len(results), len(items))
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return results, counts


# ------------------------------------------------------------------------------ Ray


def _ray_search(plan: Plan, c: Candidate) -> tuple[CandidateResult, dict[str, Any]]:
    """One candidate on a fresh planner (a Ray task keeps no state between calls)."""
    planner = _Planner(plan)
    return planner.candidate(c), planner.counts()


def _on_ray(
    plan: Plan, items: list[Candidate], progress: Progress | None, workers: int | None
) -> tuple[list[CandidateResult], dict[str, Any]]:
    """Ray tasks of one CPU each, at most ``workers`` (default: the cluster's CPUs) at once.
    Ray is imported as a sweep imports it (the same message when it is missing)."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False)
    try:
        limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=1)(_ray_search)
        plan_ref = ray.put(plan)
        pending = list(items)
        running: list[Any] = []
        results: list[CandidateResult] = []
        counts = _empty_counts()
        while pending or running:
            while pending and len(running) < limit:
                running.append(task.remote(plan_ref, pending.pop(0)))
            done, running = ray.wait(running, num_returns=1)
            for ref in done:
                result, more = ray.get(ref)
                results.append(result)
                _add(counts, more)
                if progress is not None:
                    progress(result, len(results), len(items))
        return results, counts
    finally:
        if started:
            ray.shutdown()
