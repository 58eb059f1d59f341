""":func:`project`: a scenario's steady state in closed form, per instance group and for the cluster.

The cluster's rate is split evenly over its instances (what a balanced router achieves on a
homogeneous cluster; routing policies are not modelled). Instances that differ (``cluster.groups``)
are projected one group at a time, each at its even share; the cluster's maximum sustainable rate
is then set by the group that saturates first. Disaggregated (prefill/decode) clusters are refused.
"""

from __future__ import annotations

import math
import time
from typing import Any

import attrs

from servesim.projection.confidence import Confidence, confidence_of
from servesim.projection.steady import (
    InstanceLimits,
    SteadyState,
    StepModel,
    max_sustainable_rate,
    request_kv_tokens,
    steady_state,
)
from servesim.projection.workload import WorkloadMoments, workload_moments
from servesim.simcore.errors import ScenarioError

PROJECTION_VERSION = 1
"""Version of the ``servesim project --json`` layout; bumped when a field changes meaning."""


@attrs.frozen
class GroupProjection:
    """One kind of instance (a ``cluster.groups`` entry, or every instance of a plain cluster)."""

    group: int
    instances: int
    gpu: str
    tp: int
    latency: str
    kv_blocks: int
    kv_tokens: int
    max_num_seqs: int
    state: SteadyState
    max_rate: float
    max_rate_limit: str
    max_concurrency: float
    concurrency_limit: int
    confidence: Confidence


@attrs.frozen
class Projection:
    """The projected steady state of a scenario (cluster totals and each group)."""

    scenario: str
    model: str
    rate: float
    instances: int
    workload: WorkloadMoments
    groups: tuple[GroupProjection, ...]
    cpu_ms: float

    @property
    def sustainable(self) -> bool:
        return all(g.state.sustainable for g in self.groups)

    @property
    def max_rate(self) -> float:
        """Cluster requests/s at which the first instance saturates (even split)."""
        return min(g.max_rate for g in self.groups) * self.instances

    @property
    def limit(self) -> str:
        return min(self.groups, key=lambda g: g.max_rate).max_rate_limit

    @property
    def confidence(self) -> Confidence:
        """The weakest rung of any group (a chain is as sure as its least sure link)."""
        return min((g.confidence for g in self.groups), key=lambda c: c.rank)

    def _mean(self, key: str) -> float:
        total = sum(g.instances * getattr(g.state, key) for g in self.groups)
        return total / self.instances

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (schema: docs/reference/cli.md, servesim project)."""
        w = self.workload
        ok = self.sustainable
        rps = self.rate if ok else self.max_rate
        return {
            "projection_version": PROJECTION_VERSION,
            "scenario": self.scenario,
            "model": self.model,
            "instances": self.instances,
            "rate_rps": self.rate,
            "sustainable": ok,
            "limit": self.limit if not ok else "none",
            "max_rate_rps": _finite(self.max_rate),
            "max_rate_limit": self.limit,
            "utilization": self.rate / self.max_rate if self.max_rate > 0 else None,
            "ttft_mean_ms": _ms(self._mean("ttft_us")) if ok else None,
            "tpot_mean_ms": _ms(self._mean("tpot_us")) if ok else None,
            "itl_mean_ms": _ms(self._mean("tpot_us")) if ok else None,
            "e2e_mean_ms": _ms(self._mean("e2e_us")) if ok else None,
            "responses_per_sec": rps,
            "tokens_per_sec": rps * w.output,
            "input_tokens_per_sec": rps * w.prompt,
            "concurrency": self._mean("in_system") * self.instances if ok else None,
            "max_concurrency": sum(g.instances * g.max_concurrency for g in self.groups),
            "confidence": self.confidence.to_dict(),
            "workload": w.to_dict(),
            "groups": [_group_dict(g) for g in self.groups],
            "cpu_ms": self.cpu_ms,
        }


def _ms(us: float) -> float | None:
    return us / 1000.0 if math.isfinite(us) else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _group_dict(g: GroupProjection) -> dict[str, Any]:
    s = g.state
    return {
        "group": g.group,
        "instances": g.instances,
        "gpu": g.gpu,
        "tp": g.tp,
        "latency": g.latency,
        "kv_blocks": g.kv_blocks,
        "kv_tokens": g.kv_tokens,
        "max_num_seqs": g.max_num_seqs,
        "rate_rps": s.rate,
        "sustainable": s.sustainable,
        "limit": s.limit,
        "step_ms": _ms(s.step_us),
        "decode_batch": _finite(s.decode_batch),
        "running": _finite(s.running),
        "prefill_utilization": _finite(s.prefill_utilization),
        "budget_utilization": _finite(s.budget_utilization),
        "kv_utilization": _finite(s.kv_utilization),
        "prefill_ms": _ms(s.prefill_us),
        "prefill_queue_ms": _ms(s.prefill_queue_us),
        "ttft_mean_ms": _ms(s.ttft_us),
        "tpot_mean_ms": _ms(s.tpot_us),
        "e2e_mean_ms": _ms(s.e2e_us),
        "max_rate_rps": _finite(g.max_rate),
        "max_rate_limit": g.max_rate_limit,
        "max_concurrency": _finite(g.max_concurrency),
        "concurrency_limit": g.concurrency_limit,
        "confidence": g.confidence.to_dict(),
    }


def _refuse_unsupported(scenario: Any) -> None:
    if scenario.pd is not None:
        raise ScenarioError(
            "cluster.pools",
            sorted({s.role for s in scenario.instance_specs}),
            "the projector does not model prefill/decode disaggregation (KV transfers, two "
            "pools); simulate it (servesim run), or project one mixed pool without pools",
        )
    for spec in scenario.instance_specs:
        if spec.engine.spec_draft_tokens:
            raise ScenarioError(
                "engine.speculative",
                spec.engine.spec_draft_tokens,
                "the projector does not model speculative decoding; remove it to project "
                "plain decoding, or simulate",
            )
        parallel = getattr(spec.engine, "parallel", None)
        for field in ("pp", "dp"):
            degree = getattr(parallel, field, 1) if parallel is not None else 1
            if degree > 1:
                raise ScenarioError(
                    f"engine.{field}",
                    degree,
                    "the projector does not model pipeline rounds or data-parallel ranks yet; "
                    f"simulate it (servesim run), or project engine.{field}: 1",
                )
        if spec.engine.prefill_first:
            raise ScenarioError(
                "engine.prefill_first",
                True,
                "the projector models vLLM v1 (chunked prefill beside decodes); set "
                "prefill_first: false, or simulate the v0 scheduler",
            )


def _latency_model(scenario: Any, spec: Any, where: str) -> Any:
    """The instance's latency model, built as the simulator builds it (parallelism included)."""
    from servesim.latency.expert_parallel import instance_latency
    from servesim.scenario import latency_context

    parallel = getattr(spec.engine, "parallel", None)
    context = latency_context(scenario.model, spec.gpu, spec.tp, parallel)
    return instance_latency(spec.latency.name, spec.latency.params, context, where)


def project(scenario: Any) -> Projection:
    """Project ``scenario`` (a loaded :class:`~servesim.scenario.Scenario`) in closed form."""
    started = time.process_time()
    _refuse_unsupported(scenario)
    grouped = len({s.group for s in scenario.instance_specs}) > 1
    by_group: dict[int, list[Any]] = {}
    for spec in scenario.instance_specs:
        by_group.setdefault(spec.group, []).append(spec)
    count = len(scenario.instance_specs)
    groups = []
    workload = None
    for index, specs in sorted(by_group.items()):
        spec = specs[0]
        where = f"cluster.groups[{index}].latency" if grouped else "latency"
        moments = workload_moments(scenario.workload, spec.engine)
        workload = workload or moments
        groups.append(_project_group(scenario, spec, len(specs), moments, count, where))
    assert workload is not None  # a scenario has at least one instance
    return Projection(
        scenario=scenario.name,
        model=scenario.model.name,
        rate=workload.rate,
        instances=count,
        workload=workload,
        groups=tuple(groups),
        cpu_ms=(time.process_time() - started) * 1000.0,
    )


def _project_group(
    scenario: Any, spec: Any, instances: int, w: WorkloadMoments, total: int, where: str
) -> GroupProjection:
    latency = _latency_model(scenario, spec, where)
    limits = InstanceLimits.of(spec.engine)
    model = StepModel(latency, limits, w)
    share = w.rate / total
    state = steady_state(model, share)
    max_rate, limit = max_sustainable_rate(model, share)
    at_max = steady_state(model, max_rate) if math.isfinite(max_rate) and max_rate > 0 else None
    footprint = request_kv_tokens(w, limits)
    return GroupProjection(
        group=spec.group,
        instances=instances,
        gpu=spec.gpu.name,
        tp=spec.tp,
        latency=spec.latency.name,
        kv_blocks=limits.kv_blocks,
        kv_tokens=limits.kv_tokens,
        max_num_seqs=limits.max_num_seqs,
        state=state,
        max_rate=max_rate,
        max_rate_limit=limit,
        max_concurrency=at_max.in_system if at_max is not None else 0.0,
        concurrency_limit=int(
            min(limits.max_num_seqs, max(limits.kv_tokens - w.shared_kv, 0) // footprint)
        ),
        confidence=confidence_of(latency, spec),
    )
