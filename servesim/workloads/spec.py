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

Stages are described in :mod:`servesim.workloads.stages` (and docs/reference/scenario.md).

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
from collections.abc import Iterator, Mapping
from operator import attrgetter
from os import PathLike
from typing import Any, ClassVar

import numpy as np

from servesim.simcore.config import (
    as_float,
    as_str,
    check_keys,
    expect_mapping,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.base import RequestSpec
from servesim.workloads.fields import read_shared_fields, require_bound
from servesim.workloads.multimodal import has_media, with_media
from servesim.workloads.prefix import PrefixGroups
from servesim.workloads.presets import PRESETS, preset_names
from servesim.workloads.stages import RateSchedule, _stage_schedule
from servesim.workloads.synthetic import SyntheticWorkload

PathArg = str | PathLike[str] | None

_CHUNK = 4096
_STAGES_BOUND = " (or segment stages, which end)"
"""The third bound a workload spec accepts besides requests and duration."""


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
        if not math.isfinite(schedule.end_us):
            require_bound(requests, duration_us, "workload", _STAGES_BOUND)
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
        shared = read_shared_fields(s, path)  # slo_class, max_output_tokens: the clients use them
        rate, requests, duration_us = shared.rate, shared.requests, shared.duration_us
        start_us = 0 if shared.start_us is None else shared.start_us
        schedule, described = _stage_schedule(s.get("stages"), rate, path, duration_us)
        if not math.isfinite(schedule.end_us):
            shared.require_bound(path, _STAGES_BOUND)
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
        spec = cls(
            clients,
            schedule,
            rate=rate,
            requests=requests,
            duration_us=duration_us,
            start_us=start_us,
            stages=described,
        )
        spec._solve_prefix_targets(path, single)
        return spec

    def _solve_prefix_targets(self, path: str, single: bool) -> None:
        """Solve each client's ``prefix.hit_rate`` target for its expected request count (its
        share of ``requests``, or of the schedule's expected arrivals when only time bounds it)."""
        expected = math.inf if self.num_requests is None else float(self.num_requests)
        if math.isfinite(self.horizon_us):
            expected = min(expected, float(self.schedule.integral(self.horizon_us)))
        for i, c in enumerate(self.clients):
            target = c.workload.prefix_hit_rate
            if target is not None:
                where = f"{path}.prefix" if single else f"{path}.clients[{i}].prefix"
                c.workload.solve_prefix_for_hit_rate(target, c.share * expected, where)

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
                    "prefix": d["prefix"]
                    and {
                        **d["prefix"],
                        "group_ids": [c.group_offset, c.group_offset + w.prefix_groups],
                    },
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
    # A hit-rate target is solved once the client's share of the requests is known (the spec).
    target = PrefixGroups.from_config(config.get("prefix"), f"{path}.prefix").hit_rate
    if target is not None:
        config["prefix"] = {k: v for k, v in config["prefix"].items() if k != "hit_rate"}
        config["prefix"]["tokens"] = 1  # a placeholder until the spec solves it
    # Drawn at a reference rate of 1 req/s: the spec rescales time (module docstring).
    workload = SyntheticWorkload.from_config(
        {**config, "rate": 1.0, "requests": 1}, path, base_dir=base_dir
    )
    workload.prefix_hit_rate = target
    workload.num_requests = None  # unbounded: the spec decides where the stream stops
    workload.client = cid
    workload.stream_prefix = f"workload/{cid}"
    return _Client(cid, fraction, workload)


def workload_from_config(
    section: Mapping[str, Any], path: str = "workload", base_dir: PathArg = None
) -> Any:
    """The workload a ``workload:`` section describes: a trace replay (``trace:``), a workload
    spec (``clients:`` or ``stages:``) or a single synthetic stream (anything else)."""
    s = expect_mapping(section, path)
    # LoRA adapters / several models: requests name them, on top of any workload (lora.py)
    from servesim.workloads.lora import has_lora_mix, with_lora_mix

    if has_lora_mix(s):
        return with_lora_mix(s, path, lambda rest: workload_from_config(rest, path, base_dir))
    if has_media(s):  # media on top of any kind of workload (or of a spec's clients)
        return with_media(s, path, lambda rest: workload_from_config(rest, path, base_dir))
    if "trace" in s:
        from servesim.workloads.traces import TraceWorkload  # the trace readers, when needed

        return TraceWorkload.from_config(s, path, base_dir)
    if "clients" in s or "stages" in s:
        return WorkloadSpec.from_config(s, path, base_dir)
    return SyntheticWorkload.from_config(s, path, base_dir)
