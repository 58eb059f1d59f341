"""Run verdicts and fitness scores: one word for a person reading a run, one number for a search.

**The verdict** classes a run as STABLE, BACKLOGGED or OVERLOADED from the trend of its backlog
— the number of requests in the system, ``N(t) = arrived by t − left by t`` (waiting, running or
in transfer; a request leaves when it completes, and at its arrival when it is rejected, shed,
expired or dropped, since refused load builds no queue). ``N`` is evaluated exactly at 41 evenly
spaced instants between the first and the last arrival. Then:

* ``g`` = the least-squares slope of ``N`` over the second half of that window (requests/s), and
  ``r = g / λ`` with ``λ`` the mean arrival rate over the window: the fraction of the offered
  load that piles up instead of being served.
* **OVERLOADED** when ``r ≥ 0.10``: the servers fall behind by at least a tenth of the offered
  load, so the queue (and TTFT) grows for as long as the load lasts; a longer run is worse.
* **BACKLOGGED** when ``0.02 ≤ r < 0.10`` (a slow drift), or when the backlog at the last arrival
  is at least ``3·N̄ + 10`` with ``N̄`` the mean backlog over the first half (a queue built up
  late, e.g. by a spike), or when requests were still unfinished at a fixed horizon.
* **STABLE** otherwise: the backlog fluctuates around a level the servers keep up with.

The thresholds trade noise for sensitivity: a stable queue's backlog wanders, and over a short
window its fitted slope can reach a few percent of ``λ`` by chance. So a trend counts only when
the backlog's fitted rise over the second half, ``g · T/2``, is at least
``max(10, 3·√(N̄ + 1))`` requests (``N̄`` the mean backlog over the window: a stationary queue's
backlog varies by about its square root), and the 2% band keeps slow wandering out of the drift
class. Fewer than 20 arrivals are too few for a trend: the verdict is STABLE with that
reason. When admission control refused more than 1% of the arrivals, the reason says so — a run
can be stable *because* it sheds load.

**The fitness** of a run is a weighted mean of per-metric scores in (0, 1]: a metric where lower is
better (``*_ms`` latencies, ``*_requests`` that were refused, cost) scores ``1 / (1 + x / ref)``;
one where higher is better (throughputs, attainment, goodput) scores ``x / (x + ref)``; fractions
in [0, 1] (``*_attainment``, ``cache_hit_rate``) score ``x`` itself. ``ref`` is the value that
scores 0.5: give your own targets (``{ttft_p99_ms: {weight: 3, ref: 500}}``); the defaults
(:data:`DEFAULT_REFS`) are round numbers, not recommendations. Weights are relative (any
non-negative numbers, not all zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import numpy as np

from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_REJECTED,
    STATUS_SHED,
)
from servesim.simcore.config import as_float, check_keys
from servesim.simcore.describe import Field, describe_fields
from servesim.simcore.errors import ScenarioError

STABLE, BACKLOGGED, OVERLOADED = "STABLE", "BACKLOGGED", "OVERLOADED"
VERDICTS = (STABLE, BACKLOGGED, OVERLOADED)
OVERLOAD_GROWTH = 0.10
DRIFT_GROWTH = 0.02
MIN_ARRIVALS = 20
_POINTS = 41


@attrs.frozen
class Verdict:
    """A run's class and the numbers it was read from."""

    verdict: str
    reason: str
    growth_per_s: float  # g: the backlog's slope over the second half of the arrivals
    relative_growth: float  # r = g / λ
    backlog_at_last_arrival: int

    #: summary.json's verdict keys, in their order, and the attribute each one reports.
    SUMMARY_FIELDS: ClassVar[tuple[Field, ...]] = (
        ("run_verdict", "verdict"),
        ("run_verdict_reason", "reason"),
        ("backlog_growth_per_s", "growth_per_s"),
        ("backlog_relative_growth", "relative_growth"),
        "backlog_at_last_arrival",
    )

    def as_summary(self) -> dict[str, Any]:
        return describe_fields(self, self.SUMMARY_FIELDS)


def classify_run(
    arrival_us: np.ndarray,
    left_us: np.ndarray,
    *,
    refused: int = 0,
    unfinished_at_horizon: int = 0,
) -> Verdict:
    """The verdict (module docstring) for requests that arrived at ``arrival_us`` and left the
    system at ``left_us`` (−1: still in it at the end of the run). ``refused``: how many of them
    admission control turned away; ``unfinished_at_horizon``: how many a fixed horizon cut off."""
    arrival = np.sort(np.asarray(arrival_us, dtype=np.int64))
    left = np.asarray(left_us, dtype=np.int64)
    left = np.sort(left[left >= 0])
    n = arrival.size
    notes = []
    if n and refused > 0.01 * n:
        notes.append(f"admission control refused {refused} of {n} arrivals ({refused / n:.0%})")
    if n < MIN_ARRIVALS or arrival[-1] <= arrival[0]:
        reason = f"{n} arrival(s): too few to see a trend"
        return Verdict(STABLE, "; ".join([reason, *notes]), 0.0, 0.0, 0)
    t = np.linspace(arrival[0], arrival[-1], _POINTS)
    backlog = np.searchsorted(arrival, t, side="right") - np.searchsorted(left, t, side="right")
    half = _POINTS // 2
    seconds = (t[half:] - t[0]) / 1e6
    growth = float(np.polyfit(seconds, backlog[half:], 1)[0])
    rate = (n - 1) / ((arrival[-1] - arrival[0]) / 1e6)
    relative = growth / rate
    first_mean = float(backlog[: half + 1].mean())
    end = int(backlog[-1])
    trend = (
        f"backlog grows {growth:+.3g} req/s over the second half of the arrivals "
        f"({relative:+.1%} of the {rate:.3g} req/s arrival rate)"
    )
    rise = growth * float(seconds[-1] - seconds[0])
    noise = max(10.0, 3.0 * math.sqrt(float(backlog.mean()) + 1.0))
    verdict = STABLE  # a rise below the noise is a stationary queue's wandering
    if rise >= noise and relative >= OVERLOAD_GROWTH:
        verdict = OVERLOADED
    elif rise >= noise and relative >= DRIFT_GROWTH:
        verdict = BACKLOGGED
    elif end >= 3 * first_mean + 10:
        verdict = BACKLOGGED
        trend = (
            f"{end} requests in the system at the last arrival, {end / max(first_mean, 1):.1f}x "
            f"the first half's mean {first_mean:.1f}; {trend}"
        )
    if unfinished_at_horizon and verdict == STABLE:
        verdict = BACKLOGGED
        notes.append(f"{unfinished_at_horizon} request(s) unfinished at the horizon")
    return Verdict(verdict, "; ".join([trend, *notes]), growth, relative, end)


# ---------------------------------------------------------------------------------------------
# Fitness

#: The value of a metric that scores 0.5 when a fitness weight gives no ``ref``.
DEFAULT_REFS: dict[str, float] = {
    "cost_per_million_tokens": 1.0,  # USD
    "cost_per_hour": 10.0,  # USD
    "throughput_per_gpu": 1000.0,  # output tokens/s per GPU
    "ttft": 1000.0,  # ms
    "e2e": 10_000.0,  # ms
    "itl": 100.0,  # ms
    "tpot": 100.0,  # ms
    "sched_delay": 1000.0,  # ms
    "tokens_per_sec": 1000.0,
    "output_tokens_per_sec": 1000.0,
    "input_tokens_per_sec": 10_000.0,
    "responses_per_sec": 10.0,
    "throughput_rps": 10.0,
    "goodput": 10.0,
    "cost": 1.0,
    "requests": 1.0,
}
_HIGHER = ("tokens_per_sec", "responses_per_sec", "throughput", "goodput", "completed")
_FRACTIONS = ("attainment", "cache_hit_rate", "hit_rate", "busy_fraction")


@attrs.frozen
class Objective:
    metric: str
    weight: float
    ref: float | None = None

    def direction(self) -> str:
        """``lower``, ``higher`` or ``fraction`` (module docstring)."""
        m = self.metric
        if any(k in m for k in _FRACTIONS):
            return "fraction"
        if any(k in m for k in _HIGHER):
            return "higher"
        return "lower"

    def reference(self) -> float:
        if self.ref is not None:
            return self.ref
        for prefix, value in DEFAULT_REFS.items():
            if self.metric.startswith(prefix) or self.metric.endswith(prefix):
                return value
        return 1.0

    def score(self, value: float) -> float:
        way = self.direction()
        if way == "fraction":
            return min(max(value, 0.0), 1.0)
        x = max(value, 0.0)
        ref = self.reference()
        return ref / (ref + x) if way == "lower" else x / (x + ref)


def parse_fitness(value: Any, path: str = "fitness") -> tuple[Objective, ...]:
    """Objectives from ``{metric: weight}`` / ``{metric: {weight, ref}}`` or the CLI's
    ``"metric:weight,metric:weight"`` text."""
    if isinstance(value, str):
        items: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            name, sep, weight = part.partition(":")
            if not sep:
                raise ScenarioError(path, value, f"{part!r}: expected metric:weight")
            items[name.strip()] = weight.strip()
        value = items
    if not isinstance(value, Mapping) or not value:
        raise ScenarioError(path, value, "expected {metric: weight, ...}, e.g. ttft_p99_ms: 3")
    objectives = []
    for name, spec in value.items():
        where = f"{path}.{name}"
        ref = None
        if isinstance(spec, Mapping):
            check_keys(spec, ("weight", "ref"), where)
            if spec.get("ref") is not None:
                ref = as_float(spec["ref"], f"{where}.ref", exclusive_minimum=0.0)
            spec = spec.get("weight", 1.0)
        weight = as_float(spec, f"{where}" if ref is None else f"{where}.weight", minimum=0.0)
        objectives.append(Objective(str(name), weight, ref))
    if not any(o.weight > 0 for o in objectives):
        raise ScenarioError(path, value, "give at least one positive weight")
    return tuple(objectives)


def fitness(summary: Mapping[str, Any], objectives: tuple[Objective, ...]) -> float:
    """The weighted mean score of ``summary``'s metrics (module docstring), in (0, 1]."""
    missing = [o.metric for o in objectives if not _is_number(summary.get(o.metric))]
    if missing:
        known = sorted(k for k, v in summary.items() if _is_number(v))
        raise ScenarioError(
            "fitness",
            missing[0],
            f"not a numeric summary metric; choose from {', '.join(known[:40])}, ...",
        )
    total = sum(o.weight for o in objectives)
    return sum(o.weight * o.score(float(summary[o.metric])) for o in objectives) / total


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def verdict_of_run(req: Mapping[str, np.ndarray], unfinished_at_horizon: int) -> Verdict:
    """:func:`classify_run` on a run's request columns (``status``, ``arrival_us``,
    ``completion_us``; one row per arrived request): completed requests leave at completion,
    refused ones at arrival, the rest are still in the system."""
    status = req["status"]
    refused = np.isin(status, (STATUS_REJECTED, STATUS_SHED, STATUS_EXPIRED, STATUS_DROPPED))
    left = np.where(
        status == STATUS_COMPLETED,
        req["completion_us"],
        np.where(refused, req["arrival_us"], -1),
    )
    return classify_run(
        req["arrival_us"],
        left,
        refused=int(refused.sum()),
        unfinished_at_horizon=unfinished_at_horizon,
    )
