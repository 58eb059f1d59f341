"""Arrival processes: inter-arrival times (IATs) in integer microseconds, drawn in vectorised chunks.

A process is configured from a rate (requests per second) and its own parameters, then asked for
``n`` IATs at a time from a numpy Generator the caller owns (one named stream per workload, see
:mod:`servesim.simcore.rng`). Every IAT is an ``int64`` of at least 1 µs: continuous draws are
truncated toward zero, then floored at 1 (BLIS §6.3), so two requests never share an arrival instant
within one stream.

Built-ins (plugin kind ``arrival``): ``poisson``, ``constant``, ``gamma``, ``weibull``. A scenario
writes ``arrival: poisson`` or a mapping ``{process: gamma, cv: 2}``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from servesim.simcore.config import MAX_TIME_US, as_float, check_keys, expect_mapping
from servesim.simcore.describe import describe_fields
from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger
from servesim.simcore.registry import PluginContext, get, register
from servesim.workloads.keys import either_keys

# Draws above this are clipped before the cast to int64 (about 146,000 years in µs), so a
# pathological heavy tail can never overflow.
_MAX_IAT_US = float(MAX_TIME_US)

# The discriminator key of an arrival mapping. ``name`` is accepted as an alias because
# ``--set workload.arrival.cv=2`` promotes ``arrival: gamma`` to ``{name: gamma, cv: 2}``.
_PROCESS_KEYS = ("process", "name")


class ArrivalProcess(ABC):
    """Base class of arrival processes (plugin kind ``arrival``).

    Subclasses set ``name`` and ``fields`` (their parameter names), implement
    :meth:`sample_iats_us` and, if they take parameters, :meth:`from_config`. ``mean_iat_us`` is the
    mean of the continuous IAT before truncation (the truncated mean is lower by under 1 µs).
    """

    name: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, mean_iat_us: float):
        self.mean_iat_us = float(mean_iat_us)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> ArrivalProcess:
        """Build from a scenario mapping; ``ctx.path`` names it in errors, ``ctx.rate`` is the
        mean rate in requests/s."""
        path = ctx.path
        cls.check_params(params, path)
        return cls(mean_iat_us=1e6 / check_rate(ctx.rate, path))

    @classmethod
    def check_params(cls, params: Mapping[str, Any] | None, path: str) -> dict[str, Any]:
        """Validate the mapping's keys against ``fields``; return it without the process key."""
        params = expect_mapping(params, path)
        key = "name" if "name" in params else "process"
        check_keys(params, (key, *cls.fields), path)
        return {k: v for k, v in params.items() if k not in _PROCESS_KEYS}

    @abstractmethod
    def sample_iats_us(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` inter-arrival times as an int64 array, each at least 1 µs."""

    @property
    def rate(self) -> float:
        """The effective rate in requests per second (from the mean IAT)."""
        return 1e6 / self.mean_iat_us

    @property
    def cv(self) -> float | None:
        """Coefficient of variation of the continuous IAT, where known."""
        return None

    def describe(self) -> dict[str, Any]:
        """JSON-ready parameters (for summary.json)."""
        return describe_fields(self, (("process", "name"), "rate", "mean_iat_us", "cv"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean_iat_us={self.mean_iat_us:g})"


MIN_RATE = 1e6 / MAX_TIME_US
"""The lowest rate (requests/s) whose mean gap fits the simulated clock (2**62 µs)."""
MAX_RATE = 1e6
"""The highest rate: a mean gap of 1 µs, the clock's resolution (faster streams would be
silently slowed by the 1 µs gap floor)."""


def as_rate(value: Any, path: str) -> float:
    """A request rate in requests/s, between :data:`MIN_RATE` and :data:`MAX_RATE`."""
    rate = as_float(value, path, exclusive_minimum=0.0)
    if rate < MIN_RATE:
        raise ScenarioError(
            path,
            value,
            f"one request every {1 / rate:.3g} s never arrives within the simulated clock "
            f"(2**62 µs, about 146,000 years); give a rate of at least {MIN_RATE:.3g} requests/s",
        )
    if rate > MAX_RATE:
        raise ScenarioError(
            path,
            value,
            f"more than {MAX_RATE:.0f} requests/s means gaps under 1 µs, the clock's resolution; "
            "simulate a slower stream on more clients, or scale the time (workload.time_scale)",
        )
    return rate


def check_rate(rate: Any, path: str) -> float:
    """:func:`as_rate`, with errors naming the sibling ``rate`` field of ``path``."""
    rate_path = f"{path.rsplit('.', 1)[0]}.rate" if "." in path else "rate"
    return as_rate(rate, rate_path)


FLOOR_WARNING_SHARE = 0.01
"""Warn when more than this share of a stream's gaps were raised to the 1 µs floor."""


def to_iats_us(draws: np.ndarray, owner: object | None = None) -> np.ndarray:
    """Truncate continuous IATs (µs) toward zero and floor them at 1 µs (BLIS §6.3).

    The clock has no sub-µs gaps, so a gap below 1 µs becomes 1 µs, which slows a very fast or
    very bursty stream. With ``owner`` (the arrival process), once more than
    :data:`FLOOR_WARNING_SHARE` of its gaps so far (over at least 1,000) were raised, a warning
    says so, once per process; a gap past the clock's end (2**62 µs) is an error."""
    if len(draws) and draws.max() >= _MAX_IAT_US:
        raise ScenarioError(
            "workload.arrival",
            float(draws.max()),
            "an inter-arrival gap past the simulated clock's end (2**62 µs) was drawn; "
            "use a lighter-tailed arrival process or a higher rate",
        )
    iats = draws.astype(np.int64)
    if owner is not None:
        raised = int(np.count_nonzero(iats < 1))
        counts = owner.__dict__.setdefault("_floor_counts", [0, 0, 0])  # raised, drawn, warned
        counts[0] += raised
        counts[1] += len(iats)
        if not counts[2] and counts[1] >= 1000 and counts[0] > FLOOR_WARNING_SHARE * counts[1]:
            counts[2] = 1
            get_logger("servesim.workloads").warning(
                f"{counts[0] / counts[1]:.1%} of the arrival gaps drawn so far were under 1 µs "
                "and were raised to 1 µs (the clock's resolution): the stream arrives more "
                "slowly and more evenly than asked; lower the rate or the burstiness (cv)"
            )
    np.maximum(iats, 1, out=iats)
    return iats


@register("arrival", "poisson")
class PoissonArrivals(ArrivalProcess):
    """Exponential IATs with mean 1e6/rate µs (a Poisson process); CV = 1."""

    name = "poisson"

    def sample_iats_us(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return to_iats_us(rng.exponential(self.mean_iat_us, n), self)

    @property
    def cv(self) -> float:
        return 1.0


@register("arrival", "constant")
class ConstantArrivals(ArrivalProcess):
    """Evenly spaced arrivals, IAT = trunc(1e6/rate) µs; draws nothing from the stream."""

    name = "constant"

    def __init__(self, mean_iat_us: float):
        super().__init__(mean_iat_us)
        self.iat_us = max(1, int(mean_iat_us))

    def sample_iats_us(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.iat_us, dtype=np.int64)

    @property
    def cv(self) -> float:
        return 0.0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "iat_us": self.iat_us}


def _shape_scale_or_cv(
    cls: type[ArrivalProcess], params: Mapping[str, Any], ctx: PluginContext
) -> tuple[dict[str, Any], float, float | None, float | None, float | None]:
    """A shape/scale process's parameters: the validated mapping, the rate, then either ``cv``
    or both ``shape`` and ``scale`` (seconds) as ``(shape, scale, cv)``, rejecting a mix."""
    path, process = ctx.path, cls.name
    params = cls.check_params(params, path)
    rate = check_rate(ctx.rate, path)
    cv, explicit = either_keys(
        params,
        ("cv",),
        ("shape", "scale"),
        path,
        "give either cv (with the workload rate) or shape and scale, not both",
    )
    if not cv and not explicit:
        raise ScenarioError(
            path, dict(params), f"{process} arrivals need cv, or shape and scale (scale in seconds)"
        )
    if cv:
        return params, rate, None, None, as_float(params["cv"], f"{path}.cv", exclusive_minimum=0.0)
    for key in ("shape", "scale"):
        if key not in params:
            raise ScenarioError(
                f"{path}.{key}", None, f"explicit {process} arrivals need both shape and scale"
            )
    shape = as_float(params["shape"], f"{path}.shape", exclusive_minimum=0.0)
    scale = as_float(params["scale"], f"{path}.scale", exclusive_minimum=0.0)
    return params, rate, shape, scale, None


@register("arrival", "gamma")
class GammaArrivals(ArrivalProcess):
    """Gamma IATs: bursty (cv > 1) or regular (cv < 1) traffic at a given mean rate.

    From ``cv``: shape = 1/cv², scale = cv²·mean. Explicit ``shape`` and ``scale`` (seconds) fix the
    mean IAT at shape·scale, so the workload rate is then not used. As in BLIS, a shape below 0.01
    (cv above 10) falls back to exponential IATs with the same mean; ``describe()`` says so.
    """

    name = "gamma"
    fields = ("cv", "shape", "scale")
    MIN_SHAPE: ClassVar[float] = 0.01

    def __init__(self, shape: float, scale_us: float):
        super().__init__(shape * scale_us)
        self.shape = float(shape)
        self.scale_us = float(scale_us)
        self.fallback_to_poisson = self.shape < self.MIN_SHAPE

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> GammaArrivals:
        _, rate, shape, scale, cv = _shape_scale_or_cv(cls, params, ctx)
        if cv is not None:
            mean_us = 1e6 / rate
            return cls(shape=1.0 / cv**2, scale_us=cv**2 * mean_us)
        assert shape is not None and scale is not None
        return cls(shape=shape, scale_us=scale * 1e6)

    def sample_iats_us(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.fallback_to_poisson:
            return to_iats_us(rng.exponential(self.mean_iat_us, n), self)
        return to_iats_us(rng.gamma(self.shape, self.scale_us, n), self)

    @property
    def cv(self) -> float:
        return 1.0 if self.fallback_to_poisson else 1.0 / math.sqrt(self.shape)

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "shape": self.shape, "scale_us": self.scale_us}
        if self.fallback_to_poisson:
            d["fallback"] = "poisson (shape < 0.01)"
        return d


def weibull_cv(k: float) -> float:
    """CV of a Weibull distribution with shape ``k``: sqrt(Γ(1+2/k)/Γ(1+1/k)² − 1)."""
    return math.sqrt(math.expm1(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)))


def weibull_shape_for_cv(cv: float) -> float:
    """The Weibull shape ``k`` whose CV is ``cv``, by bisection (the CV falls as ``k`` grows).

    BLIS bisects on [0.1, 100] to a tolerance of 0.001; the bracket here is wider (so cv = 0.01,
    which needs k ≈ 128, is reached exactly) and the bisection runs to machine precision.
    """
    lo, hi = 0.05, 500.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if weibull_cv(mid) > cv:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * mid:
            break
    return 0.5 * (lo + hi)


@register("arrival", "weibull")
class WeibullArrivals(ArrivalProcess):
    """Weibull IATs: ``cv`` in [0.01, 10.4] sets the shape k (scale = mean/Γ(1+1/k)), or explicit
    ``shape`` and ``scale`` (seconds), which fix the mean at scale·Γ(1+1/k) and ignore the rate."""

    name = "weibull"
    fields = ("cv", "shape", "scale")
    CV_RANGE: ClassVar[tuple[float, float]] = (0.01, 10.4)

    def __init__(self, shape: float, scale_us: float):
        mean = scale_us * math.exp(math.lgamma(1 + 1 / shape))
        super().__init__(mean)
        self.shape = float(shape)
        self.scale_us = float(scale_us)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> WeibullArrivals:
        p, rate, shape, scale, cv = _shape_scale_or_cv(cls, params, ctx)
        path = ctx.path
        if cv is not None:
            lo, hi = cls.CV_RANGE
            if not lo <= cv <= hi:
                raise ScenarioError(f"{path}.cv", p["cv"], f"weibull cv must be in [{lo}, {hi}]")
            k = weibull_shape_for_cv(cv)
            return cls(shape=k, scale_us=(1e6 / rate) / math.exp(math.lgamma(1 + 1 / k)))
        assert shape is not None and scale is not None
        if shape < 0.05:
            raise ScenarioError(f"{path}.shape", p["shape"], "weibull shape must be at least 0.05")
        return cls(shape=shape, scale_us=scale * 1e6)

    def sample_iats_us(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return to_iats_us(self.scale_us * rng.weibull(self.shape, n), self)

    @property
    def cv(self) -> float:
        return weibull_cv(self.shape)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "shape": self.shape, "scale_us": self.scale_us}


def arrival_from_config(value: Any, rate: float, path: str = "workload.arrival") -> ArrivalProcess:
    """Build the arrival process a scenario names: ``"poisson"``, ``{process: gamma, cv: 2}``, or
    ``None`` (Poisson). An unknown process is an error listing the registered ones."""
    if value is None:
        value = "poisson"
    if isinstance(value, str):
        cls = get("arrival", value, path)
        try:
            return cls.from_config({}, PluginContext(path, rate=rate))
        except ScenarioError as exc:
            if not exc.path.startswith(path):
                raise
            # e.g. `arrival: gamma` without its cv: say how to give the parameter
            raise ScenarioError(
                path,
                value,
                f"{exc.fix}; write it as a mapping, e.g. {{process: {value}, cv: 2}} "
                f"(or --set {path}.cv=2)",
            ) from None
    params = expect_mapping(value, path)
    if "process" in params and "name" in params:
        raise ScenarioError(f"{path}.name", params["name"], "give the process once, as process:")
    key = "name" if "name" in params else "process"
    name = params.get(key, "poisson")
    if not isinstance(name, str):
        raise ScenarioError(f"{path}.{key}", name, "expected the name of an arrival process")
    cls = get("arrival", name, f"{path}.{key}")
    return cls.from_config(params, PluginContext(path, rate=rate))
