"""The ``workload:`` fields every kind of workload shares, parsed by one parser.

A synthetic stream, a workload spec and a trace replay all read ``requests``, ``duration``,
``start``, ``slo_class`` and ``max_output_tokens`` (and the first two ``rate``) with
:func:`read_shared_fields`, so the same value means the same thing, and is refused for the same
reason, whichever kind of workload it is in. Each kind then applies its own defaults (a trace
keeps its recorded times and budgets when a field is absent; a synthetic stream starts at 0 and
uses the oracle budget).

The rules:

* ``requests``: a whole number from 1 to :data:`MAX_REQUESTS`.
* ``duration``: at least 1 µs. A zero-length window would admit no arrival from a synthetic
  stream (its first arrival comes at least 1 µs after ``start``) and only the requests sharing the
  first recorded µs of a trace; ``requests: N`` is the way to take a handful of requests.
* ``start``: a duration >= 0.
* ``rate``: requests per second, between :data:`~servesim.workloads.arrivals.MIN_RATE` and
  :data:`~servesim.workloads.arrivals.MAX_RATE`.
* ``slo_class``: one of :data:`SLO_CLASSES`, or (where requests are generated) a mix
  ``{class: weight}`` with weights > 0 from which each request's class is drawn.
* ``max_output_tokens``: ``oracle`` (:data:`ORACLE`) or a whole number >= 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servesim.simcore.config import as_float, as_int, as_str, parse_duration_us
from servesim.simcore.errors import ScenarioError
from servesim.workloads.arrivals import as_rate

SLO_CLASSES = ("critical", "standard", "sheddable", "batch", "background")
"""The SLO classes a request may carry (BLIS §6.2)."""

ORACLE = "oracle"
"""``max_output_tokens: oracle``: the client's budget is the request's own output length."""

MAX_REQUESTS = 10**10
"""The most requests one run may ask for: at tens of thousands of simulated requests per second,
more would run for days."""

MIN_DURATION_US = 1
"""The shortest ``workload.duration`` (µs), for every kind of workload."""

SHARED_FIELDS = ("requests", "duration", "rate", "start", "slo_class", "max_output_tokens")
"""The ``workload:`` fields :func:`read_shared_fields` parses."""


def as_request_count(value: Any, path: str) -> int:
    """A workload's ``requests`` field: a whole number from 1 to :data:`MAX_REQUESTS`."""
    count = as_int(value, path, minimum=1)
    if count > MAX_REQUESTS:
        raise ScenarioError(
            path,
            value,
            f"more than {MAX_REQUESTS:,} requests would run for days (servesim simulates tens of "
            "thousands of requests per second); split the study into several runs or use "
            "workload.duration",
        )
    return count


def as_workload_duration(value: Any, path: str) -> int:
    """A workload's ``duration`` field in µs: at least :data:`MIN_DURATION_US`."""
    return parse_duration_us(value, path, minimum=MIN_DURATION_US)


def as_start(value: Any, path: str) -> int:
    """A workload's ``start`` field in µs: a duration >= 0."""
    return parse_duration_us(value, path, minimum=0)


def as_max_output_tokens(value: Any, path: str) -> int | str:
    """A ``max_output_tokens`` field: :data:`ORACLE` or a whole number >= 0."""
    if value == ORACLE:
        return ORACLE
    return as_int(value, path, minimum=0)


def as_slo_class(value: Any, path: str, *, mix: bool = True) -> str | dict[str, float]:
    """An ``slo_class`` field: one of :data:`SLO_CLASSES`, or with ``mix`` a ``{class: weight}``."""
    if isinstance(value, Mapping):
        if not mix:
            raise ScenarioError(
                path,
                dict(value),
                "a trace replay gives every request one class; give one of "
                f"{', '.join(SLO_CLASSES)} (or leave it out to keep the trace's)",
            )
        return as_mix(value, path, choices=SLO_CLASSES)
    return as_str(value, path, choices=SLO_CLASSES)


def as_mix(
    value: Mapping[str, Any], path: str, choices: tuple[str, ...] | None = None
) -> dict[str, float]:
    """``{label: weight}`` with positive finite weights (normalised when drawing)."""
    if not value:
        raise ScenarioError(path, dict(value), "give at least one label with a positive weight")
    out: dict[str, float] = {}
    for label, weight in value.items():
        if choices is not None and label not in choices:
            raise ScenarioError(
                f"{path}.{label}", label, f"unknown label; choose from {', '.join(choices)}"
            )
        out[str(label)] = as_float(weight, f"{path}.{label}", exclusive_minimum=0.0)
    return out


class SharedFields:
    """The shared fields of one ``workload:`` section; ``None`` where the section leaves one out."""

    __slots__ = ("requests", "duration_us", "rate", "start_us", "slo_class", "max_output_tokens")

    def __init__(
        self,
        requests: int | None = None,
        duration_us: int | None = None,
        rate: float | None = None,
        start_us: int | None = None,
        slo_class: str | dict[str, float] | None = None,
        max_output_tokens: int | str | None = None,
    ):
        self.requests = requests
        self.duration_us = duration_us
        self.rate = rate
        self.start_us = start_us
        self.slo_class = slo_class
        self.max_output_tokens = max_output_tokens

    def require_bound(self, path: str, alternative: str = "") -> None:
        """Raise unless ``requests`` or ``duration`` bounds the workload (see :func:`require_bound`)."""
        require_bound(self.requests, self.duration_us, path, alternative)


def require_bound(
    requests: int | None, duration_us: int | None, path: str, alternative: str = ""
) -> None:
    """Raise unless ``requests`` or ``duration`` bounds the workload (``alternative`` names
    another bound the caller accepts, e.g. segment stages).

    Shared by the section parser and the workload classes' constructors, so a workload built in
    code is refused with the same words as one read from a scenario."""
    if requests is None and duration_us is None:
        raise ScenarioError(
            f"{path}.requests",
            None,
            f"missing; give requests (a count), duration (e.g. 10min), or both{alternative}",
        )


def read_shared_fields(
    section: Mapping[str, Any], path: str, *, slo_mix: bool = True
) -> SharedFields:
    """Parse the :data:`SHARED_FIELDS` of a checked ``workload:`` mapping (a field given as
    ``null`` counts as absent). ``slo_mix``: whether ``slo_class`` may be a mix."""

    def given(key: str) -> bool:
        return section.get(key) is not None

    f = SharedFields()
    if given("requests"):
        f.requests = as_request_count(section["requests"], f"{path}.requests")
    if given("duration"):
        f.duration_us = as_workload_duration(section["duration"], f"{path}.duration")
    if given("rate"):
        f.rate = as_rate(section["rate"], f"{path}.rate")
    if given("start"):
        f.start_us = as_start(section["start"], f"{path}.start")
    if given("slo_class"):
        f.slo_class = as_slo_class(section["slo_class"], f"{path}.slo_class", mix=slo_mix)
    if given("max_output_tokens"):
        f.max_output_tokens = as_max_output_tokens(
            section["max_output_tokens"], f"{path}.max_output_tokens"
        )
    return f
