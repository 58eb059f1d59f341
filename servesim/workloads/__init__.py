"""Where requests come from: arrival processes, length distributions, presets, synthetic streams.

Importing this package registers the built-in ``arrival`` and ``length`` plugins; the trace
readers (:mod:`servesim.workloads.traces`, the ``trace_format`` plugins) are imported when a
trace is first replayed or a format looked up, so a synthetic run does not load them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servesim.workloads.arrivals import (
    ArrivalProcess,
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
    WeibullArrivals,
    arrival_from_config,
)
from servesim.workloads.base import RequestSpec
from servesim.workloads.fields import ORACLE, SLO_CLASSES
from servesim.workloads.lengths import (
    TOKEN_CAP,
    ConstantLength,
    EmpiricalLength,
    ExponentialLength,
    GaussianLength,
    LengthDistribution,
    LognormalLength,
    UniformLength,
    length_from_config,
)
from servesim.workloads.presets import PRESETS, preset_names
from servesim.workloads.spec import WorkloadSpec, workload_from_config
from servesim.workloads.synthetic import SyntheticWorkload

if TYPE_CHECKING:
    from servesim.workloads.traces import TraceWorkload

__all__ = [
    "TraceWorkload",
    "WorkloadSpec",
    "workload_from_config",
    "PRESETS",
    "ORACLE",
    "SLO_CLASSES",
    "TOKEN_CAP",
    "ArrivalProcess",
    "ConstantArrivals",
    "ConstantLength",
    "EmpiricalLength",
    "ExponentialLength",
    "GammaArrivals",
    "GaussianLength",
    "LengthDistribution",
    "LognormalLength",
    "PoissonArrivals",
    "RequestSpec",
    "SyntheticWorkload",
    "UniformLength",
    "WeibullArrivals",
    "arrival_from_config",
    "length_from_config",
    "preset_names",
]


def __getattr__(name: str) -> Any:
    """``TraceWorkload`` (and the ``traces`` subpackage) on first use: see the module docstring."""
    if name in ("TraceWorkload", "traces"):
        import importlib

        traces = importlib.import_module("servesim.workloads.traces")  # sets .traces here
        return traces if name == "traces" else traces.TraceWorkload
    raise AttributeError(f"module 'servesim.workloads' has no attribute {name!r}")
