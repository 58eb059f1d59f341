"""Autoscalers: how many instances the cluster should be serving with, from what it sees now.

The cluster's autoscaler process samples the fleet every ``cluster.autoscaling.interval`` and
hands the policy a :class:`FleetSignals`; the policy answers with the number of instances it
wants (:meth:`Autoscaler.desired`). The process does the rest, which no policy needs to repeat:
it clamps the answer to ``[min_instances, max_instances]``, applies the cooldowns, starts cold
instances (they load their weights and warm up before they take traffic) and drains ready ones
(they take no new requests and stop once their work is done).

``capacity`` (ready + starting instances) is what a policy compares its answer with: an
instance already loading counts, so a policy that keeps seeing a long queue while the new
instance loads does not start another one for the same backlog.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from servesim.policies.base import Policy
from servesim.simcore.config import as_float, as_int, check_keys, parse_duration_us
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext, register

__all__ = [
    "Autoscaler",
    "FleetSignals",
    "KVUtilizationTarget",
    "QueueDepthTarget",
    "Schedule",
    "SLOAttainmentTarget",
]


@attrs.define(eq=False)
class FleetSignals:
    """What an autoscaler sees at one sample (plain data; figures over the ready instances).

    ``queue_depth``: requests waiting in the ready instances' queues plus the gateway's;
    ``in_flight``: requests routed and not finished; ``kv_utilization``: mean over the ready
    instances; ``finished`` and ``attained``: requests that ended since the previous sample and
    how many of them completed within the policy's TTFT target (only for a policy that sets
    ``needs_ttft``; both 0 otherwise)."""

    now_us: int
    ready: int
    starting: int = 0
    draining: int = 0
    queue_depth: int = 0
    in_flight: int = 0
    kv_utilization: float = 0.0
    finished: int = 0
    attained: int = 0

    @property
    def capacity(self) -> int:
        """Instances serving or about to: ready plus starting (draining ones are leaving)."""
        return self.ready + self.starting


class Autoscaler(Policy):
    """Base class: implement :meth:`desired`.

    ``needs_ttft`` asks the cluster to count, for each sample, the requests that ended and those
    that completed with a TTFT at most ``ttft_target_us`` (:class:`SLOAttainmentTarget`)."""

    needs_ttft = False
    ttft_target_us = 0

    @abstractmethod
    def desired(self, signals: FleetSignals) -> int:
        """The number of instances the cluster should serve with (clamped by the caller)."""


def _proportional(capacity: int, per_instance: float, target: float, tolerance: float) -> int:
    """Kubernetes' HPA rule: ``ceil(capacity · per_instance / target)``, unless the ratio is
    within ``tolerance`` of 1 (then no change; it keeps a fleet near its target from flapping)."""
    ratio = per_instance / target
    if abs(ratio - 1.0) <= tolerance:
        return capacity
    return math.ceil(max(capacity, 1) * ratio - 1e-9)


def _target_params(
    params: Mapping[str, Any], path: str, default: float, maximum: float | None
) -> tuple[float, float]:
    """``target`` (> 0) and ``tolerance`` (default 0.1, in [0, 0.9]) of a proportional policy."""
    check_keys(params, ["target", "tolerance"], path)
    target = as_float(
        params.get("target", default), f"{path}.target", exclusive_minimum=0, maximum=maximum
    )
    tolerance = as_float(params.get("tolerance", 0.1), f"{path}.tolerance", minimum=0, maximum=0.9)
    return target, tolerance


@register("autoscaler", "queue-depth")
class QueueDepthTarget(Autoscaler):
    """Waiting requests per ready instance towards ``target`` (default 4; the production-stack
    rule on ``vllm:num_requests_waiting``): ``ceil(capacity · depth / target)``, HPA tolerance
    ``tolerance`` (default 0.1). An empty queue asks for the minimum."""

    name = "queue-depth"

    def __init__(self, target: float = 4.0, tolerance: float = 0.1):
        self.target = target
        self.tolerance = tolerance

    def desired(self, signals: FleetSignals) -> int:
        per_instance = signals.queue_depth / max(signals.ready, 1)
        return _proportional(signals.capacity, per_instance, self.target, self.tolerance)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> QueueDepthTarget:
        return cls(*_target_params(params, ctx.path, 4.0, None))


@register("autoscaler", "kv-utilization")
class KVUtilizationTarget(Autoscaler):
    """Mean KV-cache utilisation of the ready instances towards ``target`` (default 0.7):
    ``ceil(capacity · utilisation / target)``, HPA tolerance ``tolerance`` (default 0.1)."""

    name = "kv-utilization"

    def __init__(self, target: float = 0.7, tolerance: float = 0.1):
        self.target = target
        self.tolerance = tolerance

    def desired(self, signals: FleetSignals) -> int:
        return _proportional(signals.capacity, signals.kv_utilization, self.target, self.tolerance)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> KVUtilizationTarget:
        return cls(*_target_params(params, ctx.path, 0.7, 1.0))


@register("autoscaler", "slo-attainment")
class SLOAttainmentTarget(Autoscaler):
    """The share of requests ending in a sample period that completed with TTFT ≤ ``ttft``
    (default 1 s; refused and dropped requests count as missed). Below ``target`` (default 0.9):
    one instance more; at or above ``scale_down_above`` (default 0.99) with no request waiting:
    one fewer. No request ended: no change (nothing to judge)."""

    name = "slo-attainment"
    needs_ttft = True

    def __init__(
        self, ttft_us: int = 1_000_000, target: float = 0.9, scale_down_above: float = 0.99
    ):
        if scale_down_above < target:
            raise ValueError("scale_down_above must be at least target")
        self.ttft_target_us = ttft_us
        self.target = target
        self.scale_down_above = scale_down_above

    def desired(self, signals: FleetSignals) -> int:
        if not signals.finished:
            return signals.capacity
        attainment = signals.attained / signals.finished
        if attainment < self.target:
            return signals.capacity + 1
        if attainment >= self.scale_down_above and not signals.queue_depth:
            return signals.capacity - 1
        return signals.capacity

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> SLOAttainmentTarget:
        path = ctx.path
        check_keys(params, ["ttft", "target", "scale_down_above"], path)
        ttft = parse_duration_us(params.get("ttft", "1s"), f"{path}.ttft", minimum=1)
        target = as_float(params.get("target", 0.9), f"{path}.target", minimum=0, maximum=1)
        above = as_float(
            params.get("scale_down_above", max(0.99, target)),
            f"{path}.scale_down_above",
            minimum=0,
            maximum=1,
        )
        if above < target:
            raise ScenarioError(
                f"{path}.scale_down_above",
                above,
                f"must be at least target ({target:g}), or the policy would scale down while "
                "it misses its target",
            )
        return cls(ttft, target, above)


@register("autoscaler", "schedule")
class Schedule(Autoscaler):
    """A fixed plan: ``steps`` is a list of ``{at: TIME, instances: N}`` (the first at 0 s);
    the instances of the last step whose time has come. With ``every`` (e.g. ``24h``) the plan
    repeats with that period (a daily pattern). The signals are not read."""

    name = "schedule"

    def __init__(self, steps: Sequence[tuple[int, int]], every_us: int = 0):
        self.times = [at for at, _ in steps]
        self.counts = [count for _, count in steps]
        self.every_us = every_us

    def desired(self, signals: FleetSignals) -> int:
        now = signals.now_us % self.every_us if self.every_us else signals.now_us
        k = 0
        while k + 1 < len(self.times) and self.times[k + 1] <= now:
            k += 1
        return self.counts[k]

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> Schedule:
        path = ctx.path
        check_keys(params, ["steps", "every"], path)
        raw = params.get("steps")
        example = "e.g. steps: [{at: 0s, instances: 2}, {at: 10min, instances: 4}]"
        if not isinstance(raw, (list, tuple)) or not raw:
            raise ScenarioError(f"{path}.steps", raw, f"expected a non-empty list, {example}")
        steps: list[tuple[int, int]] = []
        for i, step in enumerate(raw):
            where = f"{path}.steps[{i}]"
            if not isinstance(step, Mapping):
                raise ScenarioError(where, step, f"expected a mapping, {example}")
            check_keys(step, ["at", "instances"], where)
            for key in ("at", "instances"):
                if key not in step:
                    raise ScenarioError(f"{where}.{key}", None, f"missing; {example}")
            at = parse_duration_us(step["at"], f"{where}.at")
            count = as_int(step["instances"], f"{where}.instances", minimum=1)
            if steps and at <= steps[-1][0]:
                raise ScenarioError(
                    f"{where}.at", step["at"], "steps must be in increasing time order"
                )
            steps.append((at, count))
        if steps[0][0] != 0:
            raise ScenarioError(
                f"{path}.steps[0].at", raw[0]["at"], "the first step must be at 0s (the start)"
            )
        every = parse_duration_us(params.get("every", 0), f"{path}.every")
        if every and steps[-1][0] >= every:
            raise ScenarioError(
                f"{path}.every",
                params["every"],
                "must be longer than the last step's time (the plan repeats with this period)",
            )
        return cls(steps, every)
