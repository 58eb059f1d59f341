"""The aggregate arrival rate of a workload spec over time: its ``stages`` and their closed forms.

Stages come in two kinds. *Segments* — ``{duration, rate}`` and ``ramp`` (rates in req/s) — run
one after another from ``start`` and set the base rate; arrivals stop when the last one ends, and
``workload.rate`` must then be left out. Without segments the base rate is ``workload.rate``, for
ever (so ``requests`` or ``duration`` must bound the run). *Modulators* multiply the base rate
wherever they are in the list: ``spike`` by ``multiplier`` (>= 0) during ``[at, at + duration)``
(``at`` measured from ``start``); ``diurnal`` (at most one) by ``1 + a·cos(2π(t − peak_at)/period)``
with ``a = (R − 1)/(R + 1)`` for ``peak_to_trough`` R >= 1, whose mean over a period is 1 (so the
average rate is unchanged) and whose peak is R times its trough; ``peak_at`` defaults to half a
period (the run starts in the trough).

:class:`RateSchedule` gives the cumulative rate in closed form and inverts it, vectorised.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from servesim.simcore.config import as_float, check_keys, expect_mapping, parse_duration_us
from servesim.simcore.errors import ScenarioError
from servesim.workloads.keys import require_keys

_BISECTION_STEPS = 64


class RateSchedule:
    """The aggregate arrival rate ``r(t)`` in requests/s over ``t`` in µs since the workload start,
    piecewise ``c·(α + β·(t − t0))·D(t)`` with an optional diurnal factor ``D``.

    :meth:`integral` gives ``Λ(t) = ∫₀ᵗ r`` (expected requests) in closed form and :meth:`invert`
    its inverse, both vectorised. ``end_us`` is where arrivals stop (``inf`` if never).
    """

    def __init__(
        self,
        segments: list[tuple[float, float, float, float]],
        spikes: Sequence[tuple[float, float, float]] = (),
        diurnal: tuple[float, float, float] | None = None,
    ):
        """``segments``: consecutive ``(t0, t1, rate at t0, slope per µs)`` from 0 (the last may
        end at ``inf``); ``spikes``: ``(t0, t1, multiplier)``; ``diurnal``: ``(a, period_us,
        peak_at_us)``."""
        self.segments = list(segments)
        self.spikes = list(spikes)
        self.end_us = float(segments[-1][1])
        points = {0.0, self.end_us}
        for t0, t1, *_ in self.segments:
            points.update((t0, t1))
        for t0, t1, _ in self.spikes:
            points.update(p for p in (t0, t1) if 0 <= p < self.end_us)
        bounds = sorted(points)
        t0s, lens, alphas, betas, mults = [], [], [], [], []
        for lo, hi in itertools.pairwise(bounds):
            seg = next(s for s in self.segments if s[0] <= lo < s[1])
            mult = 1.0
            for s0, s1, m in self.spikes:
                if s0 <= lo < s1:
                    mult *= m
            t0s.append(lo)
            lens.append(hi - lo)
            alphas.append(seg[2] + seg[3] * (lo - seg[0]))
            betas.append(seg[3])
            mults.append(mult)
        self.t0 = np.array(t0s)
        self.length = np.array(lens)
        self.alpha = np.array(alphas)
        self.beta = np.array(betas)
        self.mult = np.array(mults)
        if diurnal is None:
            self.amp, self.omega, self.peak_us = 0.0, 0.0, 0.0
        else:
            self.amp = float(diurnal[0])
            self.omega = 2 * math.pi / float(diurnal[1])
            self.peak_us = float(diurnal[2])
        finite = np.isfinite(self.length)
        whole = np.zeros(len(self.t0))
        idx = np.flatnonzero(finite)
        whole[idx] = self._piece_integral(idx, self.length[idx])
        whole[~finite] = np.inf
        self.start_integral = np.concatenate(([0.0], np.cumsum(whole)[:-1]))
        self.total = float(self.start_integral[-1] + whole[-1])

    # -- the pieces --------------------------------------------------------------------------

    def _piece_integral(self, k: np.ndarray, x: np.ndarray) -> np.ndarray:
        """∫ r over ``[t0_k, t0_k + x]`` in expected requests (r in req/s, x in µs)."""
        a, b = self.alpha[k], self.beta[k]
        base = a * x + 0.5 * b * x * x
        if self.amp:
            w = self.omega
            s = self.t0[k] - self.peak_us
            half = np.sin(0.5 * w * x)
            # ∫₀ˣ (a + b·y)·cos(w(y + s)) dy, written with sin(w·x/2) factors so that it stays
            # accurate when w·x is small (no difference of nearly equal cosines).
            wave = (
                2 * a * np.cos(w * s + 0.5 * w * x) * half + b * x * np.sin(w * (x + s))
            ) / w - 2 * b * np.sin(w * s + 0.5 * w * x) * half / (w * w)
            base = base + self.amp * wave
        return self.mult[k] * base / 1e6

    def _piece_of(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.t0, t, side="right") - 1, 0, len(self.t0) - 1)

    # -- public ------------------------------------------------------------------------------

    def rate(self, t_us: Any) -> np.ndarray:
        """r(t) in requests/s (0 at and after ``end_us``)."""
        t = np.asarray(t_us, dtype=np.float64)
        k = self._piece_of(t)
        r = self.mult[k] * (self.alpha[k] + self.beta[k] * (t - self.t0[k]))
        if self.amp:
            r = r * (1 + self.amp * np.cos(self.omega * (t - self.peak_us)))
        return np.where((t >= 0) & (t < self.end_us), r, 0.0)

    def integral(self, t_us: Any) -> np.ndarray:
        """Λ(t) = expected requests in ``[0, t]``."""
        t = np.clip(np.asarray(t_us, dtype=np.float64), 0.0, self.end_us)
        k = self._piece_of(t)
        x = t - self.t0[k]
        return self.start_integral[k] + self._piece_integral(k, x)

    def invert(self, tau: Any) -> np.ndarray:
        """The earliest time t (µs, float) with Λ(t) = ``tau``; ``inf`` where ``tau > total``
        (an arrival exactly at the end of the stages is kept, like one at the duration)."""
        tau = np.asarray(tau, dtype=np.float64)
        out = np.full(tau.shape, np.inf)
        inside = tau <= self.total if math.isfinite(self.total) else tau < math.inf
        if not inside.any():
            return out
        tv = tau[inside]
        k = np.searchsorted(self.start_integral, tv, side="right") - 1
        mult = self.mult[k]
        # Δ: what the piece must integrate to, in (req/s)·µs at multiplier 1.
        delta = (tv - self.start_integral[k]) * 1e6 / mult
        a, b = self.alpha[k], self.beta[k]
        # Solves a·x + b·x²/2 = Δ; the rationalised root is exact for b = 0 and never divides
        # by a difference of nearly equal numbers.
        denominator = a + np.sqrt(np.maximum(a * a + 2 * b * delta, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(delta > 0, 2 * delta / denominator, 0.0)
        if self.amp:
            lo = np.zeros_like(x)
            length = self.length[k]
            # On an unbounded piece (b = 0) the rate is at least a·(1 − amp).
            with np.errstate(divide="ignore", invalid="ignore"):
                hi = np.where(np.isfinite(length), length, delta / (a * (1 - self.amp)) + 1.0)
            target = tv - self.start_integral[k]
            x = np.clip(x, lo, hi)  # the diurnal-free root is a good first guess
            # Newton's method kept inside a shrinking bracket (a step that leaves it bisects
            # instead), until every root is within a nanosecond.
            for _ in range(_BISECTION_STEPS):
                f = self._piece_integral(k, x) - target
                below = f < 0
                lo = np.where(below, x, lo)
                hi = np.where(below, hi, x)
                slope = self.rate(self.t0[k] + x) / 1e6
                with np.errstate(divide="ignore", invalid="ignore"):
                    step = x - f / slope
                outside = ~((step >= lo) & (step <= hi))
                new = np.where(outside, 0.5 * (lo + hi), step)
                done = np.abs(new - x) < 1e-3
                x = new
                if done.all():
                    break
        if np.isfinite(self.length).any():
            x = np.minimum(x, self.length[k])
        out[inside] = self.t0[k] + x
        return out


def _stage_schedule(
    stages: Any, rate: float | None, path: str, duration_us: int | None = None
) -> tuple[RateSchedule, list[dict[str, Any]]]:
    """Parse ``stages`` (see the module docstring) into a schedule and their descriptions."""
    if stages is None:
        stages = []
    if not isinstance(stages, list):
        raise ScenarioError(f"{path}.stages", stages, "expected a list of stages")
    segments: list[tuple[float, float, float, float]] = []
    spikes: list[tuple[float, float, float]] = []
    spike_paths: list[str] = []
    diurnal = None
    described: list[dict[str, Any]] = []
    t = 0.0
    last_rate: float | None = None
    forms = (
        "{duration: 5min, rate: 10}, {ramp: {from: 10, to: 40, duration: 10min}}, "
        "{spike: {at: 20min, duration: 1min, multiplier: 3}} or "
        "{diurnal: {period: 24h, peak_to_trough: 4}}"
    )
    for i, stage in enumerate(stages):
        sp = f"{path}.stages[{i}]"
        st = expect_mapping(stage, sp)
        kinds = [k for k in ("ramp", "spike", "diurnal") if k in st]
        if len(kinds) > 1 or (kinds and len(st) != 1):
            raise ScenarioError(sp, dict(st), f"one stage per list item; write each as {forms}")
        if not kinds:
            if not st or set(st) - {"duration", "rate"}:
                check_keys(st, ("duration", "rate"), sp)
                raise ScenarioError(sp, dict(st), f"expected one of {forms}")
            require_keys(st, ("duration", "rate"), sp, "a segment has both")
            d = parse_duration_us(st["duration"], f"{sp}.duration", minimum=1)
            r = as_float(st["rate"], f"{sp}.rate", minimum=0.0)
            segments.append((t, t + d, r, 0.0))
            described.append({"segment": {"start_us": t, "duration_us": d, "rate": r}})
            t += d
            last_rate = r
            continue
        kind = kinds[0]
        kp = f"{sp}.{kind}"
        body = expect_mapping(st[kind], kp)
        if kind == "ramp":
            check_keys(body, ("from", "to", "duration"), kp)
            require_keys(body, ("to", "duration"), kp, "a ramp needs to and duration")
            if "from" in body:
                r0 = as_float(body["from"], f"{kp}.from", minimum=0.0)
            elif last_rate is not None:
                r0 = last_rate
            else:
                raise ScenarioError(
                    f"{kp}.from", None, "missing; the first segment stage must give its from rate"
                )
            r1 = as_float(body["to"], f"{kp}.to", minimum=0.0)
            d = parse_duration_us(body["duration"], f"{kp}.duration", minimum=1)
            segments.append((t, t + d, r0, (r1 - r0) / d))
            described.append({"ramp": {"start_us": t, "duration_us": d, "from": r0, "to": r1}})
            t += d
            last_rate = r1
        elif kind == "spike":
            check_keys(body, ("at", "duration", "multiplier"), kp)
            require_keys(
                body,
                ("at", "duration", "multiplier"),
                kp,
                "a spike needs at, duration and multiplier",
            )
            at = parse_duration_us(body["at"], f"{kp}.at", minimum=0)
            d = parse_duration_us(body["duration"], f"{kp}.duration", minimum=1)
            m = as_float(body["multiplier"], f"{kp}.multiplier", minimum=0.0)
            spikes.append((at, at + d, m))
            spike_paths.append(f"{kp}.at")
            described.append({"spike": {"at_us": at, "duration_us": d, "multiplier": m}})
        else:
            if diurnal is not None:
                raise ScenarioError(kp, dict(body), "give at most one diurnal stage")
            check_keys(body, ("period", "peak_to_trough", "peak_at"), kp)
            require_keys(
                body,
                ("period", "peak_to_trough"),
                kp,
                "a diurnal stage needs period and peak_to_trough",
            )
            period = parse_duration_us(body["period"], f"{kp}.period", minimum=1)
            ratio = as_float(body["peak_to_trough"], f"{kp}.peak_to_trough", minimum=1.0)
            peak = period / 2
            if body.get("peak_at") is not None:
                peak = parse_duration_us(body["peak_at"], f"{kp}.peak_at", minimum=0)
            amp = (ratio - 1) / (ratio + 1)
            diurnal = (amp, float(period), float(peak))
            described.append(
                {
                    "diurnal": {
                        "period_us": period,
                        "peak_to_trough": ratio,
                        "peak_at_us": peak,
                        "amplitude": amp,
                    }
                }
            )
    if segments:
        if rate is not None:
            raise ScenarioError(
                f"{path}.rate",
                rate,
                "the segment stages set the rate; leave workload.rate out (spike and diurnal "
                "stages scale the rate the segments set)",
            )
    else:
        if rate is None:
            raise ScenarioError(
                f"{path}.rate", None, "missing; give the aggregate rate in requests per second"
            )
        segments = [(0.0, math.inf, rate, 0.0)]
    end = min(segments[-1][1], math.inf if duration_us is None else float(duration_us))
    for (spike_at, _, _), sp in zip(spikes, spike_paths):
        if spike_at >= end:
            raise ScenarioError(
                sp, spike_at, f"the spike starts after the workload ends ({end:.0f} µs after start)"
            )
    schedule = RateSchedule(segments, spikes, diurnal)
    if not schedule.total > 0:
        raise ScenarioError(f"{path}.stages", None, "the stages never have a positive rate")
    return schedule, described
