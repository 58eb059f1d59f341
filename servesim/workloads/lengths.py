"""Token-length distributions for prompts and outputs: vectorised, integer, always at least 1.

A distribution is configured from a scenario mapping ``{type: gaussian, mean: 512, ...}`` (or a bare
integer, shorthand for ``{type: constant, value: N}``) and asked for ``n`` lengths at a time from a
numpy Generator the caller owns. Continuous distributions are clamped to ``[min, max]`` and then
rounded to the nearest integer (BLIS §6.4); ``min`` defaults to 1 and ``max`` to :data:`TOKEN_CAP`.

Built-ins (plugin kind ``length``): ``constant``, ``uniform``, ``gaussian``, ``lognormal``,
``exponential``, ``empirical``. ``mean`` is the expected length, used for docs and load estimates:
exact for the discrete distributions; for the continuous ones it is the mean of the clamped
distribution before rounding, which rounding moves by a small fraction of a token.

``empirical`` may read a file. Relative file paths are resolved against the context's ``base_dir``
(:meth:`LengthDistribution.from_config`; the scenario loader passes the scenario file's
directory), or against the working directory when it is ``None``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from servesim.simcore.config import as_float, as_int, check_keys, expect_mapping
from servesim.simcore.csvcells import BadCell, cell_number, cell_whole
from servesim.simcore.errors import ScenarioError
from servesim.simcore.paths import existing_file
from servesim.simcore.registry import PluginContext, get, register, registry
from servesim.workloads.keys import either_keys, require_keys

TOKEN_CAP = 2**31 - 1
"""Largest length any distribution returns (the default ``max``); keeps int64 math far from overflow."""

PathArg = str | PathLike[str] | None


class LengthDistribution(ABC):
    """Base class of token-length distributions (plugin kind ``length``).

    Subclasses set ``name`` and ``fields``, implement :meth:`from_config` and :meth:`sample`, and
    override :attr:`mean` when it is known.
    """

    name: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> LengthDistribution:
        """Build from a scenario mapping; ``ctx.path`` names it in errors, ``ctx.base_dir``
        resolves relative files."""

    @classmethod
    def check_params(cls, params: Mapping[str, Any] | None, path: str) -> dict[str, Any]:
        """Validate the mapping's keys against ``fields``; return it without the ``type`` key."""
        params = expect_mapping(params, path)
        check_keys(params, ("type", *cls.fields), path)
        return {k: v for k, v in params.items() if k != "type"}

    @abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths as an int64 array, each at least 1."""

    @property
    def mean(self) -> float | None:
        """Expected length, or ``None`` when the distribution cannot say."""
        return None

    def describe(self) -> dict[str, Any]:
        """JSON-ready parameters (for summary.json)."""
        return {"type": self.name, "expected_mean": self.mean}


def _norm_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _norm_pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _bounds(p: Mapping[str, Any], path: str) -> tuple[int, int]:
    """Optional ``min`` (default 1) and ``max`` (default TOKEN_CAP), with min <= max."""
    lo = as_int(p.get("min", 1), f"{path}.min", minimum=1, maximum=TOKEN_CAP)
    hi = as_int(p.get("max", TOKEN_CAP), f"{path}.max", minimum=1, maximum=TOKEN_CAP)
    if lo > hi:
        raise ScenarioError(f"{path}.min", lo, f"min must not exceed max ({hi})")
    return lo, hi


def _require(p: Mapping[str, Any], key: str, path: str, what: str) -> Any:
    require_keys(p, (key,), path, what)
    return p[key]


def _clamp_round(draws: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Clamp continuous draws to [lo, hi], round to nearest, return int64 (BLIS: clamp then round)."""
    np.clip(draws, lo, hi, out=draws)
    np.rint(draws, out=draws)
    return draws.astype(np.int64)


def _bounds_describe(lo: int, hi: int) -> dict[str, Any]:
    return {"min": lo, "max": None if hi == TOKEN_CAP else hi}


class _ClampedLength(LengthDistribution):
    """Base of the continuous distributions: draws clamped to ``[min, max]`` and then rounded
    (BLIS §6.4); ``min == max`` gives ``min`` without drawing (and as the mean). Subclasses give
    the draws (:meth:`_draw`), the clamped mean when ``min < max`` (:meth:`_clamped_mean`) and
    their own parameters for :meth:`describe` (:meth:`_parameters`)."""

    def __init__(self, min: int, max: int):
        self.min, self.max = int(min), int(max)

    @abstractmethod
    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` continuous draws (float64), before clamping and rounding."""

    @abstractmethod
    def _parameters(self) -> dict[str, Any]:
        """The distribution's own parameters, as :meth:`describe` shows them."""

    @abstractmethod
    def _clamped_mean(self) -> float:
        """The mean of the draws clamped to ``[min, max]`` (called only when ``min < max``)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.min == self.max:
            return np.full(n, self.min, dtype=np.int64)
        return _clamp_round(self._draw(rng, n), self.min, self.max)

    @property
    def mean(self) -> float:
        """``min`` when ``min == max`` (as :meth:`sample` returns it without drawing), else the
        subclass's clamped mean."""
        if self.min == self.max:
            return float(self.min)
        return self._clamped_mean()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self._parameters(), **_bounds_describe(self.min, self.max)}


@register("length", "constant")
class ConstantLength(LengthDistribution):
    """Every request gets ``value`` tokens."""

    name = "constant"
    fields = ("value",)

    def __init__(self, value: int):
        self.value = int(value)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> ConstantLength:
        path = ctx.path
        p = cls.check_params(params, path)
        value = _require(p, "value", path, "constant lengths need value: <tokens>")
        return cls(as_int(value, f"{path}.value", minimum=1, maximum=TOKEN_CAP))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.value)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "value": self.value}


@register("length", "uniform")
class UniformLength(LengthDistribution):
    """Integers uniformly from ``min`` to ``max``, both inclusive."""

    name = "uniform"
    fields = ("min", "max")

    def __init__(self, min: int, max: int):
        self.min, self.max = int(min), int(max)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> UniformLength:
        path = ctx.path
        p = cls.check_params(params, path)
        require_keys(p, ("min", "max"), path, "uniform lengths need min and max (inclusive)")
        return cls(*_bounds(p, path))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max, n, dtype=np.int64, endpoint=True)

    @property
    def mean(self) -> float:
        return 0.5 * (self.min + self.max)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "min": self.min, "max": self.max}


@register("length", "gaussian")
class GaussianLength(_ClampedLength):
    """Normal(mean, std_dev) clamped to [min, max] then rounded; min == max gives min (no draw)."""

    name = "gaussian"
    fields = ("mean", "std_dev", "min", "max")

    def __init__(self, mean: float, std_dev: float, min: int = 1, max: int = TOKEN_CAP):
        super().__init__(min, max)
        self.mu, self.std_dev = float(mean), float(std_dev)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> GaussianLength:
        path = ctx.path
        p = cls.check_params(params, path)
        need = "gaussian lengths need mean and std_dev (min and max optional)"
        mean = as_float(_require(p, "mean", path, need), f"{path}.mean")
        std = as_float(_require(p, "std_dev", path, need), f"{path}.std_dev", minimum=0.0)
        return cls(mean, std, *_bounds(p, path))

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(self.mu, self.std_dev, n)

    def _clamped_mean(self) -> float:
        a, b, mu, sd = self.min, self.max, self.mu, self.std_dev
        if sd == 0.0:
            return float(round(min(max(mu, a), b)))
        alpha, beta = (a - mu) / sd, (b - mu) / sd
        # Mean of a normal clamped (censored) to [a, b].
        return (
            a * _norm_cdf(alpha)
            + b * (1.0 - _norm_cdf(beta))
            + mu * (_norm_cdf(beta) - _norm_cdf(alpha))
            + sd * (_norm_pdf(alpha) - _norm_pdf(beta))
        )

    def _parameters(self) -> dict[str, Any]:
        return {"mean": self.mu, "std_dev": self.std_dev}


@register("length", "lognormal")
class LognormalLength(_ClampedLength):
    """exp(Normal(mu, sigma)) clamped to [min, max] then rounded.

    Give ``mu`` and ``sigma`` (of the underlying normal), or ``mean`` and ``std_dev`` of the lengths
    themselves, converted exactly: sigma² = ln(1 + std_dev²/mean²), mu = ln(mean) − sigma²/2.
    """

    name = "lognormal"
    fields = ("mu", "sigma", "mean", "std_dev", "min", "max")

    def __init__(self, mu: float, sigma: float, min: int = 1, max: int = TOKEN_CAP):
        super().__init__(min, max)
        self.mu, self.sigma = float(mu), float(sigma)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> LognormalLength:
        path = ctx.path
        p = cls.check_params(params, path)
        _, moments = either_keys(
            p,
            ("mu", "sigma"),
            ("mean", "std_dev"),
            path,
            "give either mu and sigma or mean and std_dev, not both",
        )
        if moments:
            need = "lognormal by moments needs both mean and std_dev"
            mean = as_float(_require(p, "mean", path, need), f"{path}.mean", exclusive_minimum=0.0)
            std = as_float(_require(p, "std_dev", path, need), f"{path}.std_dev", minimum=0.0)
            sigma2 = math.log1p((std / mean) ** 2)
            mu, sigma = math.log(mean) - 0.5 * sigma2, math.sqrt(sigma2)
        else:
            need = "lognormal lengths need mu and sigma (or mean and std_dev)"
            mu = as_float(_require(p, "mu", path, need), f"{path}.mu")
            sigma = as_float(_require(p, "sigma", path, need), f"{path}.sigma", minimum=0.0)
        return cls(mu, sigma, *_bounds(p, path))

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        with np.errstate(over="ignore"):
            return rng.lognormal(self.mu, self.sigma, n)

    def _clamped_mean(self) -> float:
        a, b, mu, s = self.min, self.max, self.mu, self.sigma
        if s == 0.0:
            return float(b if mu >= math.log(b) else round(max(math.exp(mu), a)))
        za, zb = (math.log(a) - mu) / s, (math.log(b) - mu) / s
        # E[clamp(X, a, b)] = a·F(a) + ∫_a^b x f(x) dx + b·(1 − F(b)); the partial expectation of a
        # lognormal is e^{mu+s²/2}·[Φ(zb − s) − Φ(za − s)], taken in logs: e^{mu+s²/2} alone
        # overflows for a far-off mu or sigma although the clamped mean is at most b.
        mass = _norm_cdf(zb - s) - _norm_cdf(za - s)
        partial = math.exp(mu + 0.5 * s * s + math.log(mass)) if mass > 0.0 else 0.0
        return a * _norm_cdf(za) + partial + b * (1.0 - _norm_cdf(zb))

    def _parameters(self) -> dict[str, Any]:
        return {"mu": self.mu, "sigma": self.sigma}


@register("length", "exponential")
class ExponentialLength(_ClampedLength):
    """Exponential with the given ``mean``, clamped to [min, max] then rounded."""

    name = "exponential"
    fields = ("mean", "min", "max")

    def __init__(self, mean: float, min: int = 1, max: int = TOKEN_CAP):
        super().__init__(min, max)
        self.scale = float(mean)

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> ExponentialLength:
        path = ctx.path
        p = cls.check_params(params, path)
        mean = _require(p, "mean", path, "exponential lengths need mean (min and max optional)")
        return cls(as_float(mean, f"{path}.mean", exclusive_minimum=0.0), *_bounds(p, path))

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.scale, n)

    def _clamped_mean(self) -> float:
        a, b, m = self.min, self.max, self.scale
        # E[clamp(X, a, b)] = a + ∫_a^b P(X > x) dx for X >= 0.
        return a + m * (math.exp(-a / m) - math.exp(-b / m))

    def _parameters(self) -> dict[str, Any]:
        return {"mean": self.scale}


@register("length", "empirical")
class EmpiricalLength(LengthDistribution):
    """Lengths drawn from an observed distribution, given inline or read from a file.

    ``values`` is a mapping ``{tokens: probability}`` (weights, normalised here) or a list of
    observed lengths. ``file`` is a text file with one length per line, or a CSV with a header
    ``tokens,prob`` (or ``tokens,weight``) and one ``tokens,prob`` row per line. Blank lines and
    lines starting with ``#`` are skipped. Sampling inverts the normalised CDF.
    """

    name = "empirical"
    fields = ("values", "file")

    def __init__(self, tokens: np.ndarray, weights: np.ndarray, source: str | None = None):
        tokens = np.asarray(tokens, dtype=np.int64)
        weights = np.asarray(weights, dtype=np.float64)
        # Merge duplicates and sort, so the distribution does not depend on the listing order.
        support, inverse = np.unique(tokens, return_inverse=True)
        merged = np.bincount(inverse.ravel(), weights=weights, minlength=len(support))
        keep = merged > 0
        self.tokens = support[keep]
        self.probs = merged[keep] / merged[keep].sum()
        self._cdf = np.cumsum(self.probs)
        self._cdf[-1] = 1.0
        self.source = source

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> EmpiricalLength:
        path = ctx.path
        p = cls.check_params(params, path)
        if ("values" in p) == ("file" in p):
            raise ScenarioError(
                path, dict(p), "empirical lengths need exactly one of values or file"
            )
        if "values" in p:
            tokens, weights = _inline_values(p["values"], f"{path}.values")
            source = None
        else:
            file = resolve_path(p["file"], f"{path}.file", ctx.base_dir)
            tokens, weights = read_empirical_file(file, f"{path}.file")
            source = str(file)
        return cls(tokens, weights, source)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # side="right": u in [cdf[i-1], cdf[i]) picks i, so entry i has probability probs[i].
        return self.tokens[np.searchsorted(self._cdf, rng.random(n), side="right")]

    @property
    def mean(self) -> float:
        return float(np.dot(self.tokens, self.probs))

    def describe(self) -> dict[str, Any]:
        d = {
            **super().describe(),
            "support": int(len(self.tokens)),
            "min": int(self.tokens[0]),
            "max": int(self.tokens[-1]),
        }
        if self.source is not None:
            d["file"] = self.source
        return d


def _inline_values(values: Any, path: str) -> tuple[np.ndarray, np.ndarray]:
    """``{tokens: prob}`` or a list of observed lengths -> (tokens, weights)."""
    if isinstance(values, Mapping):
        if not values:
            raise ScenarioError(path, values, "expected at least one tokens: probability entry")
        tokens = [as_int(k, f"{path}.{k}", minimum=1, maximum=TOKEN_CAP) for k in values]
        weights = [as_float(v, f"{path}.{k}", minimum=0.0) for k, v in values.items()]
    elif isinstance(values, (list, tuple)):
        if not values:
            raise ScenarioError(path, values, "expected at least one length")
        tokens = [
            as_int(v, f"{path}[{i}]", minimum=1, maximum=TOKEN_CAP) for i, v in enumerate(values)
        ]
        weights = [1.0] * len(tokens)
    else:
        raise ScenarioError(
            path, values, "expected a mapping {tokens: probability} or a list of lengths"
        )
    if not sum(weights) > 0:
        raise ScenarioError(
            path,
            dict(values) if isinstance(values, Mapping) else values,
            "probabilities must sum to a positive number",
        )
    return np.array(tokens, dtype=np.int64), np.array(weights, dtype=np.float64)


def resolve_path(value: Any, path: str, base_dir: PathArg) -> Path:
    """An existing file named by a scenario field; relative paths resolve against ``base_dir``."""
    if not isinstance(value, (str, PathLike)) or not str(value):
        raise ScenarioError(path, value, "expected a file path")
    return existing_file(value, path, base_dir, shown=str(value))


_WEIGHT_HEADERS = ("prob", "probability", "weight", "count")


def _parse_length(text: str) -> int:
    """A lengths file's token cell: a whole number from 1 to :data:`TOKEN_CAP`, read by the one
    CSV cell reader (:func:`~servesim.simcore.csvcells.cell_whole`); raises :class:`BadCell`."""
    value = cell_whole(text, "tokens", minimum=1)
    if value > TOKEN_CAP:
        raise BadCell("tokens", text, f"must be at most {TOKEN_CAP}")
    return value


def read_empirical_file(file: Path, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Parse a lengths file (one length per line, or ``tokens,prob`` CSV); errors give file:line."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, str(file), f"cannot read the file ({exc})") from None
    tokens: list[int] = []
    weights: list[float] = []
    columns = 0
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        where = f"{file}:{lineno}"
        if columns == 0:
            columns = len(cells)
            if columns not in (1, 2):
                raise ScenarioError(
                    where,
                    raw,
                    f"expected one length per line or tokens,prob rows (read for {path})",
                )
            header = [c.lower() for c in cells]
            if header[0] == "tokens" and (columns == 1 or header[1] in _WEIGHT_HEADERS):
                continue
        if len(cells) != columns:
            raise ScenarioError(
                where, raw, f"expected {columns} column(s) like the first row (read for {path})"
            )
        try:
            tokens.append(_parse_length(cells[0]))
        except BadCell:
            raise ScenarioError(
                where,
                raw,
                f"expected a whole number of tokens from 1 to {TOKEN_CAP} (read for {path})",
            ) from None
        if columns == 2:
            try:
                weights.append(cell_number(cells[1], "prob", minimum=0.0))
            except BadCell:
                raise ScenarioError(
                    where, raw, f"expected a finite probability >= 0 (read for {path})"
                ) from None
        else:
            weights.append(1.0)
    if not tokens:
        raise ScenarioError(path, str(file), "the file lists no lengths")
    if not sum(weights) > 0:
        raise ScenarioError(
            path, str(file), "the file's probabilities must sum to a positive number"
        )
    return np.array(tokens, dtype=np.int64), np.array(weights, dtype=np.float64)


def length_from_config(value: Any, path: str, *, base_dir: PathArg = None) -> LengthDistribution:
    """Build the distribution a scenario names: ``{type: ..., <params>}``, or an integer (constant).

    An unknown or missing ``type`` is an error listing the registered length distributions.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return ConstantLength.from_config({"value": value}, PluginContext(path))
    params = expect_mapping(value, path)
    if not params:
        raise ScenarioError(
            path, value, "expected {type: <distribution>, ...} or a constant length"
        )
    if "type" not in params:
        known = ", ".join(registry("length").names())
        raise ScenarioError(
            f"{path}.type", None, f"missing; give a length distribution type, one of: {known}"
        )
    cls = get("length", params["type"], f"{path}.type")
    return cls.from_config(params, PluginContext(path, base_dir=base_dir))
