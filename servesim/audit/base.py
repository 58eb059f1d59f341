"""What the auditor reads and what it reports: :class:`AuditInput`, :class:`Violation`, the
terminal status codes of the request table, and the helpers every check shares."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

__all__ = [
    "COMPLETED",
    "DROPPED",
    "EXPIRED",
    "GATEWAY",
    "IN_TRANSIT",
    "MAX_REPORTED_PER_CHECK",
    "NEVER_SERVED",
    "QUEUED",
    "REJECTED",
    "RUNNING",
    "SHED",
    "TRANSFERRING",
    "AuditInput",
    "Violation",
]
"""The auditor's public names (``servesim.audit`` exports them); the helpers stay private."""

COMPLETED, QUEUED, RUNNING, DROPPED, IN_TRANSIT = 0, 1, 2, 3, 4
REJECTED, SHED, EXPIRED, GATEWAY, TRANSFERRING = 5, 6, 7, 8, 9
NEVER_SERVED = (DROPPED, REJECTED, SHED, EXPIRED)  # terminal states that end before any service
MAX_REPORTED_PER_CHECK = 20


@attrs.frozen
class Violation:
    invariant: str
    message: str
    request: int | None = None
    server: int | None = None
    time_us: int | None = None

    def __str__(self) -> str:
        where = []
        if self.request is not None:
            where.append(f"request {self.request}")
        if self.server is not None:
            where.append(f"instance {self.server}")
        if self.time_us is not None:
            where.append(f"t={self.time_us} µs")
        suffix = f" ({', '.join(where)})" if where else ""
        return f"{self.invariant}: {self.message}{suffix}"


@attrs.define
class AuditInput:
    """What the auditor reads. Request columns are int64 arrays of equal length; -1 = unset."""

    requests: Mapping[str, np.ndarray]
    arrived: int
    steps: Sequence[Mapping[str, np.ndarray]]
    capacity: Sequence[int]
    notes: Sequence[str] = ()
    bounded: bool = False
    # traced routing decisions (INV-7), int64 columns: time_us, request, chosen, age_us (the
    # age the cluster reported) and taken_us (when the oldest snapshot it read was taken);
    # None: decisions were not traced. ``snapshot_interval``: the freshness they must respect
    decisions: Mapping[str, np.ndarray] | None = None
    snapshot_interval: int = 0
    # sessions: id -> "completed" | "cancelled" | "interrupted" | "exhausted", rounds per session
    sessions: Mapping[int, str] | None = None
    # rounds per session: one number for all (generated sessions) or per session id (recorded
    # sessions, a trace replayed closed loop)
    session_rounds: int | Mapping[int, int] = 0
    # disaggregated serving: roles (at start and end), counters, transfer log and its checker
    pd: Mapping[str, object] | None = None
    # preemption by swapping, per server: swap space (blocks), peak use, blocks out and in, use
    # at the end, swap-outs, swap-ins (empty: no server swaps)
    swap: Sequence[Mapping[str, int]] = ()
    # per server, for the cross-checks against the step log (empty: not known, e.g. a saved run):
    # its per-token output overhead α2 and post-decode overhead (µs), its context window, and the
    # tokens whose gap to the previous one spans several steps (the log's irregular gaps)
    alpha2_us: Sequence[int] = ()
    post_decode_us: Sequence[int] = ()
    max_model_len: Sequence[int] = ()
    irregular_tokens: Sequence[int] = ()
    # multimodal: the encode log and the workload's media book (servesim.audit.encode); None:
    # the run had no encoder
    encode: Mapping[str, Any] | None = None
    # autoscaling: the fleet's log (servesim.audit.autoscaling); None: not autoscaled
    fleet: Mapping[str, Any] | None = None
    # LoRA adapters / several models: the adapter books (servesim.audit.adapters); None: neither
    lora: Mapping[str, Any] | None = None


def _limited(violations: Iterator[Violation]) -> list[Violation]:
    out = []
    for v in violations:
        out.append(v)
        if len(out) >= MAX_REPORTED_PER_CHECK:
            break
    return out


def _first_bad(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask)[:MAX_REPORTED_PER_CHECK]


_PDCheck = Callable[
    ["AuditInput", Mapping[str, object], Mapping[str, np.ndarray]], Iterator["Violation"]
]


def _disaggregated_only(check: _PDCheck) -> Callable[[AuditInput], Iterator[Violation]]:
    """A check of disaggregated serving as the auditor calls it: ``check(data, pd, requests)``
    runs on a run's disaggregation record (``data.pd``) and its request table, and a run served
    without disaggregation (``data.pd`` None) has nothing for it to check."""

    @functools.wraps(check)
    def run(data: AuditInput) -> Iterator[Violation]:
        if data.pd is None:
            return iter(())
        return check(data, data.pd, data.requests)

    return run
