"""A synthetic workload: one client stream of requests from an arrival process and two length
distributions, generated lazily in arrival order.

Scenario schema (the ``workload:`` section; everything optional except ``rate`` and one of
``requests`` / ``duration``)::

    preset: chatbot            # one of PRESETS; supplies input/output unless they are given
    rate: 10                   # requests per second, finite, > 0
    requests: 1000             # stop after this many requests (>= 1)
    duration: 10min            # stop arrivals after start + duration (bare number = seconds)
    arrival: poisson           # or {process: gamma, cv: 2}; default poisson
    input: {type: gaussian, mean: 512, std_dev: 128, min: 2, max: 4096}
    output: {type: constant, value: 256}    # a bare integer also means constant
    prefix: {tokens: 64, groups: 4}   # or {hit_rate: 0.5, groups: 4}; popularity: {zipf: 1.1}
    max_output_tokens: oracle  # or 0 (server fills max_model_len - prompt) or a fixed budget
    slo_class: standard
    start: 0s                  # the first arrival is at start + the first IAT

With both ``requests`` and ``duration``, generation stops at whichever is reached first; an arrival
exactly at start + duration is included.

Shared prefixes: with ``prefix``, every request joins one of ``groups`` prefix groups, chosen
uniformly at random (or by a Zipf popularity law; :mod:`servesim.workloads.prefix` also solves the
prefix length for a target hit rate), and its prompt is the group's ``tokens``-long shared prefix
followed by the sampled input length, so ``prompt_tokens = tokens + input``. Requests of one group
share their first ``tokens`` tokens (what a prefix cache can reuse); different groups share
nothing.

Randomness: IATs, input lengths, output lengths and prefix groups each come from their own named
stream (``workload/arrival``, ``workload/input``, ``workload/output``, ``workload/prefix``), drawn
in fixed-size chunks. So changing one part (say, adding a prefix) never changes the others, and a
workload of N requests is exactly the first N requests of a longer one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from os import PathLike
from typing import Any, ClassVar

import attrs
import numpy as np

from servesim.simcore.config import (
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    parse_duration_us,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.arrivals import ArrivalProcess, arrival_from_config
from servesim.workloads.base import RequestSpec
from servesim.workloads.fields import (
    ORACLE,
    as_max_output_tokens,
    as_mix,
    read_shared_fields,
    require_bound,
)
from servesim.workloads.lengths import LengthDistribution, length_from_config
from servesim.workloads.prefix import PrefixGroups
from servesim.workloads.presets import PRESETS, preset_names


class SyntheticWorkload:
    """One synthetic request stream; :meth:`requests` yields its :class:`RequestSpec` lazily.

    Build it from a scenario section with :meth:`from_config`, or directly from an arrival process
    and two length distributions. ``stream_prefix`` names the random streams
    (``<stream_prefix>/arrival`` ...) and ``client`` labels the requests, so several workloads can
    run side by side with independent randomness.
    """

    fields: ClassVar[tuple[str, ...]] = (
        "preset",
        "rate",
        "requests",
        "duration",
        "arrival",
        "input",
        "output",
        "prefix",
        "max_output_tokens",
        "slo_class",
        "tenant",
        "start",
        "sessions",
    )
    chunk_size: ClassVar[int] = 4096
    """How many values each stream draws at a time; fixed, so results never depend on it."""

    def __init__(
        self,
        *,
        rate: float,
        arrival: ArrivalProcess,
        input: LengthDistribution,
        output: LengthDistribution,
        requests: int | None = None,
        duration_us: int | None = None,
        prefix_tokens: int = 0,
        prefix_groups: int = 1,
        prefix_zipf: float | None = None,
        max_output_tokens: int | str = ORACLE,
        slo_class: str | Mapping[str, float] = "standard",
        tenant: str | Mapping[str, float] = "",
        start_us: int = 0,
        sessions: Sessions | None = None,
        preset: str | None = None,
        client: str = "default",
        stream_prefix: str = "workload",
    ):
        require_bound(requests, duration_us, "workload")
        max_output_tokens = as_max_output_tokens(max_output_tokens, "workload.max_output_tokens")
        self.rate = float(rate)
        self.arrival = arrival
        self.input = input
        self.output = output
        self.num_requests = requests
        self.duration_us = duration_us
        self.prefix_tokens = int(prefix_tokens)
        self.prefix_groups = int(prefix_groups)
        self.prefix_zipf = prefix_zipf  # None: groups drawn uniformly
        self.prefix_hit_rate: float | None = None  # the target prefix_tokens was solved for
        self.max_output_tokens = max_output_tokens
        self.slo_class = slo_class  # a class, or {class: weight} drawn per request
        self.tenant = tenant  # a tenant, or {tenant: weight} drawn per request
        self.start_us = int(start_us)
        self.sessions = sessions  # None: every request is independent
        self.preset = preset
        self.client = client
        self.stream_prefix = stream_prefix

    @classmethod
    def from_config(
        cls,
        section: Mapping[str, Any],
        path: str = "workload",
        base_dir: str | PathLike[str] | None = None,
    ) -> SyntheticWorkload:
        """Validate a ``workload:`` section (see the module docstring) and build the workload.

        ``base_dir`` resolves relative file paths (e.g. an empirical length file); pass the
        scenario file's directory. Every error is a :class:`ScenarioError` naming the field path.
        """
        s = expect_mapping(section, path)
        check_keys(s, cls.fields, path)

        preset = None
        if s.get("preset") is not None:
            preset = as_str(s["preset"], f"{path}.preset", choices=preset_names())

        closed_loop = isinstance(s.get("sessions"), Mapping) and "users" in s["sessions"]
        if s.get("rate") is None and not closed_loop:
            raise ScenarioError(
                f"{path}.rate",
                None,
                "missing; give the arrival rate in requests per second (or sessions.users for "
                "closed-loop virtual users)",
            )
        if closed_loop and s.get("rate") is not None:
            raise ScenarioError(
                f"{path}.rate",
                s["rate"],
                "closed-loop users set their own pace; remove rate or sessions.users",
            )
        shared = read_shared_fields(s, path)
        rate = 1.0 if shared.rate is None else shared.rate  # None only for closed-loop users
        requests, duration_us = shared.requests, shared.duration_us
        shared.require_bound(path)

        arrival = arrival_from_config(s.get("arrival"), rate, f"{path}.arrival")

        lengths: dict[str, LengthDistribution] = {}
        for side in ("input", "output"):
            if s.get(side) is not None:
                lengths[side] = length_from_config(s[side], f"{path}.{side}", base_dir=base_dir)
            elif preset is not None:
                lengths[side] = length_from_config(PRESETS[preset][side], f"{path}.{side}")
            else:
                raise ScenarioError(
                    f"{path}.{side}",
                    None,
                    f"missing; give a length distribution such as {{type: constant, value: 256}}, "
                    f"or a preset ({', '.join(preset_names())})",
                )

        prefix = PrefixGroups.from_config(s.get("prefix"), f"{path}.prefix")
        max_out = ORACLE if shared.max_output_tokens is None else shared.max_output_tokens
        slo_class = "standard" if shared.slo_class is None else shared.slo_class
        tenant: str | dict[str, float] = ""
        if s.get("tenant") is not None:
            if isinstance(s["tenant"], Mapping):
                tenant = as_mix(s["tenant"], f"{path}.tenant")
            else:
                tenant = as_str(str(s["tenant"]), f"{path}.tenant")

        start_us = 0 if shared.start_us is None else shared.start_us
        sessions = Sessions.from_config(s.get("sessions"), f"{path}.sessions")

        workload = cls(
            rate=rate,
            arrival=arrival,
            input=lengths["input"],
            output=lengths["output"],
            requests=requests,
            duration_us=duration_us,
            prefix_tokens=prefix.tokens,
            prefix_groups=prefix.groups,
            prefix_zipf=prefix.zipf,
            max_output_tokens=max_out,
            slo_class=slo_class,
            tenant=tenant,
            start_us=start_us,
            sessions=sessions,
            preset=preset,
        )
        if prefix.hit_rate is not None:
            n = requests if requests is not None else rate * duration_us / 1e6
            if closed_loop and requests is None:
                n = float("inf")
            workload.solve_prefix_for_hit_rate(prefix.hit_rate, n, f"{path}.prefix")
        return workload

    def requests(self, streams: RandomStreams) -> Iterator[RequestSpec]:
        """Yield the requests in arrival order, with ids 0, 1, 2, ...

        A generator: nothing is drawn until the first request is asked for, and memory stays at one
        chunk per stream however many requests there are. Each call starts the named streams from
        their beginning, so iterating twice gives the same requests.
        """
        prefix = self.stream_prefix
        rng_arrival = streams.fresh(f"{prefix}/arrival")
        rng_input = streams.fresh(f"{prefix}/input")
        rng_output = streams.fresh(f"{prefix}/output")
        rng_prefix = streams.fresh(f"{prefix}/prefix")

        chunk = self.chunk_size
        limit = self.num_requests
        end_us = None if self.duration_us is None else self.start_us + self.duration_us
        has_prefix = self.prefix_tokens > 0
        prefix_tokens = self.prefix_tokens if has_prefix else 0
        prefix_spec = self.prefix
        cdf = prefix_spec.cdf()
        oracle = self.max_output_tokens == ORACLE
        client = self.client
        classes = _labels(self.slo_class)
        tenants = _labels(self.tenant)
        rng_class = streams.fresh(f"{prefix}/class") if len(classes[0]) > 1 else None
        rng_tenant = streams.fresh(f"{prefix}/tenant") if len(tenants[0]) > 1 else None

        t = self.start_us
        produced = 0
        users = self.sessions.users if self.sessions is not None else 0
        if users:
            limit = users if limit is None else min(users, limit)
        while limit is None or produced < limit:
            # Every stream draws a full chunk every time, so the values of request i never depend
            # on how many requests (or how long a duration) the workload asks for.
            if users:
                # virtual user u opens its loop at u * think_time / users (no arrival process)
                times = (
                    self.start_us
                    + (np.arange(produced, produced + chunk) * self.sessions.think_time_us) // users
                )
            else:
                times = t + np.cumsum(self.arrival.sample_iats_us(rng_arrival, chunk))
            prompts = self.input.sample(rng_input, chunk)
            outputs = self.output.sample(rng_output, chunk)
            if not has_prefix:
                groups = np.full(chunk, -1, dtype=np.int64)
            else:
                groups = prefix_spec.draw(rng_prefix, chunk, cdf)

            class_idx = _draw(rng_class, classes, chunk)
            tenant_idx = _draw(rng_tenant, tenants, chunk)

            m = chunk
            if end_us is not None:
                m = int(np.searchsorted(times, end_us, side="right"))
            if limit is not None:
                m = min(m, limit - produced)
            prompts = prompts[:m] + prefix_tokens
            budgets = outputs[:m] if oracle else np.full(m, self.max_output_tokens, dtype=np.int64)

            class_names, tenant_names = classes[0], tenants[0]
            for i, (arrival_us, prompt, output, group, budget, c, tn) in enumerate(
                zip(
                    times[:m].tolist(),
                    prompts.tolist(),
                    outputs[:m].tolist(),
                    groups[:m].tolist(),
                    budgets.tolist(),
                    class_idx[:m].tolist(),
                    tenant_idx[:m].tolist(),
                    strict=True,
                ),
                start=produced,
            ):
                yield RequestSpec(
                    i,
                    arrival_us,
                    prompt,
                    output,
                    group,
                    prefix_tokens,
                    budget,
                    class_names[c],
                    client,
                    tenant_names[tn],
                )
            produced += m
            if m < chunk:
                return
            t = int(times[-1])

    def follow_ups(self, streams: RandomStreams) -> Iterator[tuple[int, int]]:
        """(new-turn input tokens, output tokens) for session follow-up rounds, in the order the
        simulator asks for them (their own streams, so round 0 draws are never disturbed)."""
        rng_input = streams.fresh(f"{self.stream_prefix}/session-input")
        rng_output = streams.fresh(f"{self.stream_prefix}/session-output")
        chunk = self.chunk_size
        while True:
            inputs = self.input.sample(rng_input, chunk).tolist()
            outputs = self.output.sample(rng_output, chunk).tolist()
            yield from zip(inputs, outputs, strict=True)

    @property
    def prefix(self) -> PrefixGroups:
        """The stream's shared-prefix groups (length, count, popularity, the target solved for)."""
        return PrefixGroups(
            self.prefix_tokens, self.prefix_groups, self.prefix_zipf, self.prefix_hit_rate
        )

    def solve_prefix_for_hit_rate(self, hit_rate: float, requests: float, path: str) -> None:
        """Set the prefix length so the stream's ideal prefix-cache hit rate over ``requests``
        requests is ``hit_rate`` (:meth:`PrefixGroups.solved_for`)."""
        target = attrs.evolve(self.prefix, hit_rate=hit_rate)
        self.prefix_tokens = target.solved_for(self.input.mean, requests, path).tokens
        self.prefix_hit_rate = hit_rate

    def expected_mean_tokens(self) -> tuple[float | None, float | None]:
        """(mean prompt tokens including the shared prefix, mean output tokens); None if unknown.

        With a fixed ``max_output_tokens`` budget the realised outputs may be shorter than this.
        """
        mean_in = self.input.mean
        mean_out = self.output.mean
        return (
            None if mean_in is None else mean_in + self.prefix_tokens,
            None if mean_out is None else float(mean_out),
        )

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for summary.json."""
        mean_in, mean_out = self.expected_mean_tokens()
        return {
            "kind": "synthetic",
            "client": self.client,
            "preset": self.preset,
            "rate": self.rate,
            "requests": self.num_requests,
            "duration_us": self.duration_us,
            "start_us": self.start_us,
            "arrival": self.arrival.describe(),
            "input": self.input.describe(),
            "output": self.output.describe(),
            "prefix": self.prefix.describe(),
            "max_output_tokens": self.max_output_tokens,
            "slo_class": dict(self.slo_class)
            if isinstance(self.slo_class, Mapping)
            else self.slo_class,
            "tenant": dict(self.tenant) if isinstance(self.tenant, Mapping) else self.tenant,
            "expected_mean_tokens": {"input": mean_in, "output": mean_out},
            "sessions": None if self.sessions is None else self.sessions.describe(),
        }

    def __repr__(self) -> str:
        return (
            f"SyntheticWorkload(rate={self.rate:g}, requests={self.num_requests}, "
            f"duration_us={self.duration_us}, arrival={self.arrival!r}, preset={self.preset!r})"
        )


class Sessions:
    """Multi-turn sessions: every generated request opens a session of ``rounds`` rounds.

    Round n+1 arrives ``think_time`` after round n's last token reached the client (closed loop);
    its prompt is a new user turn (drawn from the workload's ``input`` distribution) appended, with
    ``context: accumulate``, to the whole conversation so far, so its leading blocks are the
    previous round's prompt and answer and can be prefix-cache hits. A round that is dropped,
    rejected, shed or expired cancels the rest of its session.
    """

    FIELDS = ("rounds", "think_time", "context", "users")

    def __init__(self, rounds: int, think_time_us: int, accumulate: bool = True, users: int = 0):
        self.rounds = rounds
        self.think_time_us = think_time_us
        self.accumulate = accumulate
        # closed-loop virtual users: ``users`` sessions run side by side, each sending its next
        # request a think time after the previous one completed, until the workload's request
        # budget is spent (no arrival rate; round 0 of user u starts at u * think_time / users)
        self.users = users

    @classmethod
    def from_config(cls, value: Any, path: str) -> Sessions | None:
        if value is None or value is False:
            return None
        section = expect_mapping(value, path)
        check_keys(section, cls.FIELDS, path)
        users = 0
        if "users" in section:
            users = as_int(section["users"], f"{path}.users", minimum=1, maximum=1_000_000)
        if "rounds" not in section and not users:
            raise ScenarioError(
                f"{path}.rounds", None, "missing; give the number of rounds per session, e.g. 4"
            )
        default_rounds = 1_000_000_000 if users else None
        rounds = as_int(section.get("rounds", default_rounds), f"{path}.rounds", minimum=1)
        think = parse_duration_us(section.get("think_time", 0), f"{path}.think_time", minimum=0)
        context = as_str(
            section.get("context", "none" if users else "accumulate"),
            f"{path}.context",
            choices=("accumulate", "none"),
        )
        return cls(rounds, think, context == "accumulate", users)

    def describe(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "think_time_us": self.think_time_us,
            "context": "accumulate" if self.accumulate else "none",
            "users": self.users,
        }


def _labels(value: str | Mapping[str, float]) -> tuple[list[str], np.ndarray | None]:
    if isinstance(value, Mapping):
        names = list(value)
        weights = np.array([value[n] for n in names], dtype=float)
        return names, weights / weights.sum()
    return [value], None


def _draw(
    rng: np.random.Generator | None, labels: tuple[list[str], np.ndarray | None], n: int
) -> np.ndarray:
    if rng is None:
        return np.zeros(n, dtype=np.int64)
    return rng.choice(len(labels[0]), size=n, p=labels[1])
