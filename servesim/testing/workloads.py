"""Contract checks for the workload samplers: arrival processes and token-length distributions.

Both take a built object, e.g.
``check_arrival(GammaArrivals.from_config({"cv": 2}, PluginContext("arrival", rate=10.0)))``,
and draw from seeded numpy Generators, the only randomness a sampler may use.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from servesim.testing.probes import _failer
from servesim.workloads.lengths import TOKEN_CAP

_SIZES = (0, 1, 7, 1000)
_LARGE = 50_000


def _draws(fail, method: str, draw, seed: int) -> list[np.ndarray]:
    out = []
    for n in _SIZES:
        try:
            values = draw(np.random.default_rng(seed), n)
        except AssertionError:
            raise
        except Exception as exc:  # a contract check reports, it does not crash
            raise fail(f"{method} works", f"{method}(rng, {n}) raised {exc!r}") from exc
        if not isinstance(values, np.ndarray) or values.dtype != np.int64:
            kind = getattr(values, "dtype", type(values).__name__)
            raise fail(f"{method} returns an int64 array", f"{method}(rng, {n}) gave {kind}")
        if values.shape != (n,):
            raise fail(
                f"{method} returns n values", f"{method}(rng, {n}) gave shape {values.shape}"
            )
        out.append(values)
    again = [draw(np.random.default_rng(seed), n) for n in _SIZES]
    for n, a, b in zip(_SIZES, out, again, strict=True):
        if not np.array_equal(a, b):
            raise fail(
                "draws are deterministic for a given rng seed (no global randomness)",
                f"two default_rng({seed}) generators gave different {method}(rng, {n})",
            )
    return out


def _describes(fail, target: Any) -> None:
    describe = getattr(target, "describe", None)
    if describe is None:
        return
    try:
        json.dumps(describe())
    except Exception as exc:
        raise fail("describe() is a JSON-serialisable dict", repr(exc)) from exc


def _mean_close(fail, what: str, expected: float, sample: np.ndarray, tolerance: float) -> None:
    actual = float(sample.mean())
    if not math.isclose(actual, expected, rel_tol=tolerance, abs_tol=1.0):
        raise fail(
            f"the sample mean matches {what}",
            f"{expected:.6g} declared, {actual:.6g} over {sample.size} draws (±{tolerance:.0%})",
        )


def check_arrival(process: Any, seed: int = 0) -> None:
    """``sample_iats_us(rng, n)`` returns ``n`` int64 inter-arrival times, each ≥ 1 µs, the same
    for equally seeded generators; ``rate`` is positive and finite; the mean of many draws
    matches ``mean_iat_us`` (within 15%); ``describe()`` is JSON-serialisable."""
    fail = _failer("check_arrival", process)
    for values in _draws(fail, "sample_iats_us", process.sample_iats_us, seed):
        if values.size and int(values.min()) < 1:
            raise fail("inter-arrival times are at least 1 us", f"got {int(values.min())}")
    rate = process.rate
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise fail("rate is a positive finite number of requests/s", f"got {rate!r}")
    sample = process.sample_iats_us(np.random.default_rng(seed), _LARGE)
    _mean_close(fail, "mean_iat_us", float(process.mean_iat_us), sample, 0.15)
    _describes(fail, process)


def check_length(distribution: Any, seed: int = 0) -> None:
    """``sample(rng, n)`` returns ``n`` int64 lengths in [1, 2**31 - 1], the same for equally
    seeded generators; a declared ``mean`` is finite, positive and matches many draws (within
    15%); ``describe()``, when present, is JSON-serialisable."""
    fail = _failer("check_length", distribution)
    for values in _draws(fail, "sample", distribution.sample, seed):
        if values.size and (int(values.min()) < 1 or int(values.max()) > TOKEN_CAP):
            raise fail(
                "lengths are in [1, 2**31 - 1]", f"got {int(values.min())}..{int(values.max())}"
            )
    mean = distribution.mean
    if mean is not None:
        if not (isinstance(mean, (int, float)) and math.isfinite(mean) and mean > 0):
            raise fail("mean is None or a positive finite number", f"got {mean!r}")
        sample = distribution.sample(np.random.default_rng(seed), _LARGE)
        _mean_close(fail, "the declared mean", float(mean), sample, 0.15)
    _describes(fail, distribution)
