"""Admission policies: whether a request enters the cluster at all (spec §4.1).

``admit(request, state)`` is called once per request at its arrival, before routing; a rejected
request is counted (``shed_by_tier``) and never reaches an instance. Policies may keep state (a
token bucket's level), so a cluster builds one policy object per run.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from servesim.policies.base import Policy
from servesim.policies.saturation import utilization, utilization_thresholds
from servesim.policies.snapshot import ClusterState
from servesim.simcore.config import as_float, as_int, check_keys
from servesim.simcore.registry import PluginContext, register

__all__ = [
    "AdmissionPolicy",
    "AlwaysAdmit",
    "RejectAll",
    "TokenBucket",
    "TierShed",
    "GaieLegacy",
]


class AdmissionPolicy(Policy):
    """Base class: implement :meth:`admit`."""

    @abstractmethod
    def admit(self, request: Any, state: ClusterState) -> bool:
        """True to let ``request`` in, False to reject it."""


@register("admission", "always-admit")
class AlwaysAdmit(AdmissionPolicy):
    """Admit every request (the default)."""

    name = "always-admit"

    def admit(self, request: Any, state: ClusterState) -> bool:
        return True


@register("admission", "reject-all")
class RejectAll(AdmissionPolicy):
    """Reject every request (for tests and what-if baselines)."""

    name = "reject-all"

    def admit(self, request: Any, state: ClusterState) -> bool:
        return False


@register("admission", "token-bucket")
class TokenBucket(AdmissionPolicy):
    """A bucket of prompt tokens: ``capacity`` (default 10,000), refilled at ``refill_per_s``
    tokens per second (default 1,000) up to capacity; it starts full. A request costs its prompt
    tokens and is admitted iff the bucket holds at least that many (then they are taken)."""

    name = "token-bucket"

    def __init__(self, capacity: float = 10_000.0, refill_per_s: float = 1_000.0):
        self.capacity = capacity
        self.refill_per_s = refill_per_s
        self.tokens = capacity
        self.last_us = 0

    def admit(self, request: Any, state: ClusterState) -> bool:
        now = state.now_us
        elapsed = now - self.last_us
        if elapsed > 0:
            tokens = self.tokens + elapsed * self.refill_per_s / 1e6
            self.tokens = tokens if tokens < self.capacity else self.capacity
            self.last_us = now
        cost = request.prompt_tokens
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> TokenBucket:
        check_keys(params, ["capacity", "refill_per_s"], ctx.path)
        return cls(
            as_float(params.get("capacity", 10_000), f"{ctx.path}.capacity", exclusive_minimum=0),
            as_float(params.get("refill_per_s", 1_000), f"{ctx.path}.refill_per_s", minimum=0),
        )


@register("admission", "tier-shed")
class TierShed(AdmissionPolicy):
    """Shed low tiers under load: while the busiest instance's effective load exceeds
    ``threshold`` (default 0), reject requests whose cluster priority is below ``min_priority``
    (default 3 = ``standard``, so only ``critical`` and ``standard`` pass)."""

    name = "tier-shed"

    def __init__(self, threshold: float = 0, min_priority: int = 3):
        self.threshold = threshold
        self.min_priority = min_priority

    def admit(self, request: Any, state: ClusterState) -> bool:
        if state.max_effective_load <= self.threshold:
            return True
        return request.priority >= self.min_priority

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> TierShed:
        check_keys(params, ["threshold", "min_priority"], ctx.path)
        return cls(
            as_float(params.get("threshold", 0), f"{ctx.path}.threshold", minimum=0),
            as_int(
                params.get("min_priority", 3), f"{ctx.path}.min_priority", minimum=-100, maximum=100
            ),
        )


@register("admission", "gaie-legacy")
class GaieLegacy(AdmissionPolicy):
    """GAIE's original rule: non-sheddable requests (priority ≥ 0) always pass; sheddable ones are
    rejected while ``mean_i max(QD_i/queue_depth_threshold, KV_i/kv_utilization_threshold) ≥ 1``
    (defaults 5 and 0.8; no instance counts as saturated)."""

    name = "gaie-legacy"

    def __init__(self, queue_depth_threshold: float = 5.0, kv_utilization_threshold: float = 0.8):
        self.queue_depth_threshold = queue_depth_threshold
        self.kv_utilization_threshold = kv_utilization_threshold

    def admit(self, request: Any, state: ClusterState) -> bool:
        if request.priority >= 0:
            return True
        load = utilization(state, self.queue_depth_threshold, self.kv_utilization_threshold)
        return load < 1.0

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> GaieLegacy:
        return cls(*utilization_thresholds(params, ctx.path))
