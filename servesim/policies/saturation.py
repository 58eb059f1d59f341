"""Saturation detectors: how full the cluster is, for the gateway queue's dispatcher (spec §4.2).

``saturation(state)`` returns a number where ≥ 1 means saturated: the dispatcher holds requests
back while it is. ``never_saturates`` marks a detector that always returns 0 (flow control then
only adds bookkeeping; the scenario loader warns about it).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from servesim.policies.base import Policy
from servesim.policies.snapshot import ClusterState
from servesim.simcore.config import as_float, as_int, check_keys
from servesim.simcore.registry import PluginContext, register

__all__ = ["SaturationDetector", "Never", "Utilization", "Concurrency", "utilization"]


class SaturationDetector(Policy):
    """Base class: implement :meth:`saturation`."""

    never_saturates = False

    @abstractmethod
    def saturation(self, state: ClusterState) -> float:
        """Saturation of the cluster's routable instances; ≥ 1 = saturated."""


@register("saturation", "never")
class Never(SaturationDetector):
    """Never saturated (0)."""

    name = "never"
    never_saturates = True

    def saturation(self, state: ClusterState) -> float:
        return 0.0


def utilization(state: ClusterState, queue_depth_threshold: float, kv_threshold: float) -> float:
    """``mean_i max(QD_i / qd_thr, KV_i / kv_thr)`` over the instances; no instance → 1."""
    snapshots = state.snapshots
    if not snapshots:
        return 1.0
    total = 0.0
    for s in snapshots:
        q = s.queue_depth / queue_depth_threshold
        k = s.kv_utilization / kv_threshold
        total += q if q > k else k
    return total / len(snapshots)


@register("saturation", "utilization")
class Utilization(SaturationDetector):
    """GAIE's detector: ``mean_i max(QD_i / queue_depth_threshold, KV_i / kv_utilization_threshold)``
    (defaults 5 and 0.8); no routable instance → 1."""

    name = "utilization"

    def __init__(self, queue_depth_threshold: float = 5.0, kv_utilization_threshold: float = 0.8):
        self.queue_depth_threshold = queue_depth_threshold
        self.kv_utilization_threshold = kv_utilization_threshold

    def saturation(self, state: ClusterState) -> float:
        return utilization(state, self.queue_depth_threshold, self.kv_utilization_threshold)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> Utilization:
        return cls(*utilization_thresholds(params, ctx.path))


@register("saturation", "concurrency")
class Concurrency(SaturationDetector):
    """Requests in flight over capacity: ``Σ in_flight / (N · max_concurrency)`` (default 100 per
    instance); no routable instance → 1."""

    name = "concurrency"

    def __init__(self, max_concurrency: int = 100):
        self.max_concurrency = max_concurrency

    def saturation(self, state: ClusterState) -> float:
        snapshots = state.snapshots
        if not snapshots:
            return 1.0
        return sum(s.in_flight for s in snapshots) / (len(snapshots) * self.max_concurrency)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> Concurrency:
        check_keys(params, ["max_concurrency"], ctx.path)
        return cls(
            as_int(params.get("max_concurrency", 100), f"{ctx.path}.max_concurrency", minimum=1)
        )


def utilization_thresholds(params: Mapping[str, Any], path: str) -> tuple[float, float]:
    """``queue_depth_threshold`` (default 5) and ``kv_utilization_threshold`` (default 0.8),
    validated: what the utilization detector and gaie-legacy admission both take."""
    check_keys(params, ["queue_depth_threshold", "kv_utilization_threshold"], path)
    return (
        as_float(
            params.get("queue_depth_threshold", 5.0),
            f"{path}.queue_depth_threshold",
            exclusive_minimum=0,
        ),
        as_float(
            params.get("kv_utilization_threshold", 0.8),
            f"{path}.kv_utilization_threshold",
            exclusive_minimum=0,
            maximum=1,  # a utilisation: above 1 the KV signal could never saturate
        ),
    )
