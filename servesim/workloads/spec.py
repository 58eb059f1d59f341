"""Workload specs: several client streams sharing one aggregate rate that changes over time.

Scenario schema (the ``workload:`` section)::

    rate: 20                     # aggregate requests per second (unless stages set it, below)
    requests: 5000               # stop after this many requests in all (>= 1)
    duration: 30min              # and/or stop arrivals after start + duration (inclusive)
    start: 0s                    # time origin of the stages; the first arrival follows it
    clients:
      - id: chat                 # names the client's random streams: workload/chat/arrival ...
        rate_fraction: 3         # share of the rate = rate_fraction / sum of all (> 0; default 1)
        arrival: poisson         # or {process: gamma, cv: 2} (cv only: the rate comes from above)
        preset: chatbot          # supplies input and output unless they are given
        input: {type: lognormal, mean: 900, std_dev: 600}   # or {preset: summarization}
        output: {preset: chatbot}
        prefix: {tokens: 512, groups: 4}
        slo_class: critical      # or {critical: 1, standard: 3} drawn per request
        tenant: acme             # or {acme: 1, initech: 1}
        max_output_tokens: oracle
      - {id: batch, rate_fraction: 1, preset: summarization, slo_class: batch}
    stages:                      # optional: the aggregate rate over time
      - {duration: 5min, rate: 10}                  # 10 req/s for 5 min
      - {ramp: {from: 10, to: 40, duration: 10min}} # linear ramp (from: defaults to the last rate)
      - {duration: 15min, rate: 40}
      - {spike: {at: 20min, duration: 1min, multiplier: 3}}   # ×3 from 20 to 21 min
      - {diurnal: {period: 24h, peak_to_trough: 4, peak_at: 12h}}

Stages come in two kinds. *Segments* — ``{duration, rate}`` and ``ramp`` (rates in req/s) — run
one after another from ``start`` and set the base rate; arrivals stop when the last one ends, and
``workload.rate`` must then be left out. Without segments the base rate is ``workload.rate``, for
ever (so ``requests`` or ``duration`` must bound the run). *Modulators* multiply the base rate
wherever they are in the list: ``spike`` by ``multiplier`` (>= 0) during ``[at, at + duration)``
(``at`` measured from ``start``); ``diurnal`` (at most one) by ``1 + a·cos(2π(t − peak_at)/period)``
with ``a = (R − 1)/(R + 1)`` for ``peak_to_trough`` R >= 1, whose mean over a period is 1 (so the
average rate is unchanged) and whose peak is R times its trough; ``peak_at`` defaults to half a
period (the run starts in the trough).

Time-varying rate, exactly: each client draws its stationary renewal process (its ``arrival``
process at 1 req/s, so CV and burstiness are kept) and maps its k-th arrival, at operational time
τ_k (in expected arrivals), through the inverse of the client's cumulative rate Λ_i(t) =
share_i·∫ r. For Poisson arrivals this *is* the non-homogeneous Poisson process with rate
share_i·r(t) (time-rescaling theorem). Λ has a closed form on every piece of the schedule and is
inverted in vectorised chunks: in closed form where there is no diurnal term, by bisection to below
a nanosecond where there is. Arrivals are then rounded to the µs and kept at least 1 µs apart within
a client, like synthetic workloads.

Randomness: client ``c`` draws from its own named streams (``workload/c/arrival``,
``workload/c/input``, ``workload/c/output``, ``workload/c/prefix``, ...) in fixed chunks, so adding,
removing or editing one client never changes another client's draws. Clients are merged lazily by
arrival time (ties: in client order) and ids are renumbered 0, 1, ... in arrival order. Prefix
groups of different clients never coincide: each client's groups are offset past the previous
clients' groups (``describe()`` lists each client's range).

:func:`workload_from_config` picks the workload class a ``workload:`` section describes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from operator import attrgetter
from os import PathLike
from typing import Any, ClassVar

import numpy as np

from servesim.simcore.config import (
    as_float,
    as_str,
    check_keys,
    expect_mapping,
    parse_duration_us,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.arrivals import as_rate
from servesim.workloads.base import RequestSpec, as_request_count
from servesim.workloads.presets import PRESETS, preset_names
from servesim.workloads.synthetic import SyntheticWorkload

PathArg = str | PathLike[str] | None

_CHUNK = 4096
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
            for key in ("duration", "rate"):
                if key not in st:
                    raise ScenarioError(f"{sp}.{key}", None, "missing; a segment has both")
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
            for key in ("to", "duration"):
                if key not in body:
                    raise ScenarioError(
                        f"{kp}.{key}", None, "missing; a ramp needs to and duration"
                    )
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
            for key in ("at", "duration", "multiplier"):
                if key not in body:
                    raise ScenarioError(
                        f"{kp}.{key}", None, "missing; a spike needs at, duration and multiplier"
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
            for key in ("period", "peak_to_trough"):
                if key not in body:
                    raise ScenarioError(
                        f"{kp}.{key}",
                        None,
                        "missing; a diurnal stage needs period and peak_to_trough",
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


class _Client:
    """One client of a spec: its synthetic stream (drawn at 1 req/s) and its share of the rate."""

    __slots__ = ("id", "rate_fraction", "share", "workload", "group_offset")

    def __init__(self, id: str, rate_fraction: float, workload: SyntheticWorkload):
        self.id = id
        self.rate_fraction = rate_fraction
        self.share = 0.0
        self.workload = workload
        self.group_offset = 0


class WorkloadSpec:
    """Several clients sharing a time-varying aggregate rate; :meth:`requests` merges their
    streams lazily in arrival order. Build it with :meth:`from_config` (module docstring)."""

    fields: ClassVar[tuple[str, ...]] = (
        "clients",
        "rate",
        "requests",
        "duration",
        "start",
        "stages",
    )
    client_fields: ClassVar[tuple[str, ...]] = (
        "id",
        "rate_fraction",
        "preset",
        "arrival",
        "input",
        "output",
        "prefix",
        "slo_class",
        "tenant",
        "max_output_tokens",
    )

    def __init__(
        self,
        clients: list[_Client],
        schedule: RateSchedule,
        *,
        rate: float | None = None,
        requests: int | None = None,
        duration_us: int | None = None,
        start_us: int = 0,
        stages: list[dict[str, Any]] | None = None,
    ):
        if requests is None and duration_us is None and not math.isfinite(schedule.end_us):
            raise ScenarioError(
                "workload.requests",
                None,
                "give requests (a count), duration, or both (or segment stages that end)",
            )
        self.clients = clients
        self.schedule = schedule
        self.rate = rate
        self.num_requests = requests
        self.duration_us = duration_us
        self.start_us = int(start_us)
        self.stages = stages or []
        total = sum(c.rate_fraction for c in clients)
        offset = 0
        for c in clients:
            c.share = c.rate_fraction / total
            c.group_offset = offset
            if c.workload.prefix_tokens > 0:
                offset += c.workload.prefix_groups
        end = schedule.end_us
        if duration_us is not None:
            end = min(end, float(duration_us))
        self.horizon_us = end  # arrivals stop after start + horizon (inclusive)

    @classmethod
    def from_config(
        cls,
        section: Mapping[str, Any],
        path: str = "workload",
        base_dir: PathArg = None,
    ) -> WorkloadSpec:
        """Validate a ``workload:`` section with ``clients`` (and/or ``stages``) and build it.

        Without ``clients``, the section's own client fields (preset, input, output, arrival, ...)
        describe a single client ``default``. Every error names the field path.
        """
        s = expect_mapping(section, path)
        single = "clients" not in s
        client_keys = [k for k in cls.client_fields if k not in ("id", "rate_fraction")]
        check_keys(s, (*cls.fields, *client_keys) if single else cls.fields, path)
        rate = None
        if s.get("rate") is not None:
            rate = as_rate(s["rate"], f"{path}.rate")
        requests = None
        if s.get("requests") is not None:
            requests = as_request_count(s["requests"], f"{path}.requests")
        duration_us = None
        if s.get("duration") is not None:
            duration_us = parse_duration_us(s["duration"], f"{path}.duration", minimum=1)
        start_us = 0
        if s.get("start") is not None:
            start_us = parse_duration_us(s["start"], f"{path}.start", minimum=0)
        schedule, described = _stage_schedule(s.get("stages"), rate, path, duration_us)
        if requests is None and duration_us is None and not math.isfinite(schedule.end_us):
            raise ScenarioError(
                f"{path}.requests",
                None,
                "missing; give requests (a count), duration (e.g. 10min), or both "
                "(or segment stages, which end)",
            )
        if single:
            config = {k: s[k] for k in client_keys if k in s}
            clients = [_client_from_config({"id": "default", **config}, path, base_dir)]
        else:
            raw = s["clients"]
            if not isinstance(raw, list) or not raw:
                raise ScenarioError(f"{path}.clients", raw, "expected a non-empty list of clients")
            clients = []
            seen: dict[str, int] = {}
            for i, entry in enumerate(raw):
                cp = f"{path}.clients[{i}]"
                client = _client_from_config(entry, cp, base_dir)
                if client.id in seen:
                    raise ScenarioError(
                        f"{cp}.id", client.id, f"already used by clients[{seen[client.id]}]"
                    )
                seen[client.id] = i
                clients.append(client)
        return cls(
            clients,
            schedule,
            rate=rate,
            requests=requests,
            duration_us=duration_us,
            start_us=start_us,
            stages=described,
        )

    def requests(self, streams: RandomStreams) -> Iterator[RequestSpec]:
        """Yield every client's requests merged in arrival order, ids 0, 1, 2, ...

        Lazy: each client holds one chunk of requests at a time. Each call restarts the named
        streams, so iterating twice gives the same requests.
        """
        gens = [self._client_requests(c, streams) for c in self.clients]
        limit = self.num_requests
        for i, spec in enumerate(heapq.merge(*gens, key=attrgetter("arrival_us"))):
            if limit is not None and i >= limit:
                return
            spec.id = i
            yield spec

    def _client_requests(self, client: _Client, streams: RandomStreams) -> Iterator[RequestSpec]:
        """One client's requests: its synthetic stream (times in µs at 1 req/s) time-rescaled."""
        inner = client.workload.requests(streams)
        start = self.start_us
        horizon = self.horizon_us
        offset = client.group_offset
        # Operational time τ (client's expected arrivals) -> aggregate expected arrivals τ/share.
        scale = 1.0 / (1e6 * client.share)
        previous = start  # last arrival; the next is at least 1 µs later
        invert = self.schedule.invert
        while True:
            batch = list(itertools.islice(inner, _CHUNK))
            if not batch:
                return
            reference = np.fromiter((s.arrival_us for s in batch), np.float64, len(batch))
            x = invert(reference * scale)
            stop = len(x)
            if not np.isfinite(x[-1]):
                stop = int(np.argmin(np.isfinite(x)))
            x = x[:stop]
            if math.isfinite(horizon):
                stop = int(np.searchsorted(x, horizon, side="right"))
                x = x[:stop]
            if stop == 0:
                return
            t = np.rint(x).astype(np.int64) + start
            # At least 1 µs apart: y_k = max(t_k, y_{k-1} + 1), as a running maximum of t_k − k.
            k = np.arange(stop, dtype=np.int64)
            t = np.maximum.accumulate(np.maximum(t - k, previous + 1)) + k
            previous = int(t[-1])
            for spec, arrival in zip(batch, t.tolist()):
                spec.arrival_us = arrival
                if spec.prefix_group >= 0:
                    spec.prefix_group += offset
                yield spec
            if stop < len(batch):
                return

    def expected_requests(self) -> float | None:
        """Expected number of arrivals before the horizon (``None`` if the run is only bounded by
        ``requests``); ignores the ``requests`` limit."""
        if not math.isfinite(self.horizon_us):
            return None
        return float(self.schedule.integral(self.horizon_us))

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for summary.json."""
        expected = self.expected_requests()
        horizon = self.horizon_us if math.isfinite(self.horizon_us) else None
        clients = []
        for c in self.clients:
            w = c.workload
            d = w.describe()
            arrival = w.arrival.describe()
            clients.append(
                {
                    "id": c.id,
                    "rate_fraction": c.rate_fraction,
                    "share": c.share,
                    "preset": w.preset,
                    "arrival": {"process": arrival["process"], "cv": arrival["cv"]},
                    "input": d["input"],
                    "output": d["output"],
                    "prefix": (
                        {
                            "tokens": w.prefix_tokens,
                            "groups": w.prefix_groups,
                            "group_ids": [c.group_offset, c.group_offset + w.prefix_groups],
                        }
                        if w.prefix_tokens > 0
                        else None
                    ),
                    "slo_class": d["slo_class"],
                    "tenant": d["tenant"],
                    "max_output_tokens": d["max_output_tokens"],
                    "expected_mean_tokens": d["expected_mean_tokens"],
                    "expected_requests": None if expected is None else expected * c.share,
                }
            )
        return {
            "kind": "spec",
            "rate": self.rate,
            "requests": self.num_requests,
            "duration_us": self.duration_us,
            "start_us": self.start_us,
            "stages": self.stages,
            "horizon_us": horizon,
            "expected_requests": expected,
            "mean_rate": expected / horizon * 1e6 if expected is not None and horizon else None,
            "clients": clients,
        }

    def __repr__(self) -> str:
        ids = ", ".join(c.id for c in self.clients)
        return (
            f"WorkloadSpec(clients=[{ids}], rate={self.rate}, requests={self.num_requests}, "
            f"duration_us={self.duration_us}, stages={len(self.stages)})"
        )


def _client_from_config(entry: Any, path: str, base_dir: PathArg) -> _Client:
    c = expect_mapping(entry, path)
    check_keys(c, WorkloadSpec.client_fields, path)
    if c.get("id") is None:
        raise ScenarioError(f"{path}.id", None, "missing; give the client a name")
    cid = as_str(str(c["id"]) if isinstance(c["id"], int) else c["id"], f"{path}.id")
    if "/" in cid:
        raise ScenarioError(f"{path}.id", cid, "a client id cannot contain '/'")
    fraction = 1.0
    if c.get("rate_fraction") is not None:
        fraction = as_float(c["rate_fraction"], f"{path}.rate_fraction", exclusive_minimum=0.0)
    arrival = c.get("arrival")
    if isinstance(arrival, Mapping):
        for key in ("shape", "scale"):
            if key in arrival:
                raise ScenarioError(
                    f"{path}.arrival.{key}",
                    arrival[key],
                    "in a workload spec the rate comes from workload.rate × rate_fraction (and "
                    "the stages); give the burstiness as cv instead",
                )
    config: dict[str, Any] = {k: c[k] for k in WorkloadSpec.client_fields[2:] if k in c}
    for side in ("input", "output"):
        value = config.get(side)
        if isinstance(value, Mapping) and "preset" in value:
            if len(value) != 1:
                raise ScenarioError(
                    f"{path}.{side}", dict(value), "give either {preset: NAME} or a distribution"
                )
            name = as_str(value["preset"], f"{path}.{side}.preset", choices=preset_names())
            config[side] = PRESETS[name][side]
    # Drawn at a reference rate of 1 req/s: the spec rescales time (module docstring).
    workload = SyntheticWorkload.from_config(
        {**config, "rate": 1.0, "requests": 1}, path, base_dir=base_dir
    )
    workload.num_requests = None  # unbounded: the spec decides where the stream stops
    workload.client = cid
    workload.stream_prefix = f"workload/{cid}"
    return _Client(cid, fraction, workload)


def workload_from_config(
    section: Mapping[str, Any], path: str = "workload", base_dir: PathArg = None
) -> Any:
    """The workload a ``workload:`` section describes: a trace replay (``trace:``), a workload
    spec (``clients:`` or ``stages:``) or a single synthetic stream (anything else)."""
    from servesim.workloads.traces import TraceWorkload

    s = expect_mapping(section, path)
    if "trace" in s:
        return TraceWorkload.from_config(s, path, base_dir)
    if "clients" in s or "stages" in s:
        return WorkloadSpec.from_config(s, path, base_dir)
    return SyntheticWorkload.from_config(s, path, base_dir)
