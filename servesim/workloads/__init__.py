"""Where requests come from: arrival processes, length distributions, presets, synthetic streams.

Importing this package registers the built-in ``arrival``, ``length`` and ``trace_format``
plugins.
"""

from servesim.workloads import traces  # noqa: F401,E402  (registers the trace formats)
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
