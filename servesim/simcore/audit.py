"""The post-run auditor: invariant checks over what a run recorded.

It reads plain arrays (a per-request table and one step log per server), so it can check a run
that just finished or one saved to disk (``servesim audit DIR``). Each check is a function that
yields :class:`Violation` s naming the invariant, the request or server, and the time.

Invariants (numbering follows the spec, §8.1):

* INV-1 request conservation — every arrived request is in exactly one bucket
  (completed / queued / running / dropped / in transit), and the buckets add up.
* INV-2 lifecycle — each bucket's timeline fields are set exactly as its state implies.
* INV-3 clock monotonicity — steps of one server have positive durations and never overlap.
* INV-4 KV-block conservation — used blocks within [0, capacity] at every step, plus the
  independent block recount the engine performs (``notes``).
* INV-5 causality — arrival ≤ enqueue ≤ first scheduled ≤ first token ≤ completion.
* INV-8 work conservation — a server with work left after a step starts the next step at once,
  and a request reaching an idle server starts a step in the same instant.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import attrs
import numpy as np

from servesim.simcore.errors import AuditError

COMPLETED, QUEUED, RUNNING, DROPPED, IN_TRANSIT = 0, 1, 2, 3, 4
REJECTED, SHED, EXPIRED, GATEWAY = 5, 6, 7, 8
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
    # routing decisions' oldest-snapshot ages (µs) and the freshness they must respect (INV-7)
    snapshot_ages: Sequence[int] = ()
    snapshot_interval: int = 0
    # sessions: id -> "completed" | "cancelled" | "interrupted" | "exhausted", rounds per session
    sessions: Mapping[int, str] | None = None
    session_rounds: int = 0


def audit(data: AuditInput) -> list[Violation]:
    """Run every check; return all violations (empty list = the run is sound)."""
    found: list[Violation] = []
    for check in CHECKS:
        found.extend(_limited(check(data)))
    return found


def audit_or_raise(data: AuditInput) -> None:
    violations = audit(data)
    if violations:
        raise AuditError(violations)


def _limited(violations: Iterator[Violation]) -> list[Violation]:
    out = []
    for v in violations:
        out.append(v)
        if len(out) >= MAX_REPORTED_PER_CHECK:
            break
    return out


def _first_bad(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask)[:MAX_REPORTED_PER_CHECK]


def check_conservation(data: AuditInput) -> Iterator[Violation]:
    r = data.requests
    ids = r["id"]
    status = r["status"]
    if len(ids) != data.arrived:
        yield Violation(
            "INV-1",
            f"{data.arrived} requests arrived but {len(ids)} are accounted for "
            f"(completed + queued + running + dropped + in transit)",
        )
        # request ids are 0 .. arrived-1: name the ones that vanished
        missing = np.setdiff1d(np.arange(data.arrived), ids)[:MAX_REPORTED_PER_CHECK]
        for request in missing:
            yield Violation("INV-1", "arrived but is in no terminal bucket", request=int(request))
    unique, counts = np.unique(ids, return_counts=True)
    for i in _first_bad(counts > 1):
        yield Violation(
            "INV-1",
            f"request appears {counts[i]} times in the terminal buckets",
            request=int(unique[i]),
        )
    for i in _first_bad((status < COMPLETED) | (status > GATEWAY)):
        yield Violation("INV-1", f"unknown terminal status {status[i]}", request=int(ids[i]))
    if not data.bounded:
        for i in _first_bad((status != COMPLETED) & ~np.isin(status, NEVER_SERVED)):
            yield Violation(
                "INV-1",
                "run drained (no horizon) but the request never finished",
                request=int(ids[i]),
            )


def check_lifecycle(data: AuditInput) -> Iterator[Violation]:
    r = data.requests
    status, ids = r["status"], r["id"]
    done = status == COMPLETED
    rules = (
        (done & (r["first_scheduled_us"] < 0), "completed but never scheduled"),
        (done & (r["first_token_us"] < 0), "completed without a first token"),
        (done & (r["completion_us"] < 0), "completed without a completion time"),
        (done & (r["output_tokens"] < 1), "completed with no output token"),
        ((status == QUEUED) & (r["completion_us"] >= 0), "still queued but has a completion time"),
        ((status == RUNNING) & (r["first_scheduled_us"] < 0), "running but never scheduled"),
        ((status == DROPPED) & (r["first_scheduled_us"] >= 0), "dropped after being scheduled"),
        ((status == IN_TRANSIT) & (r["enqueue_us"] >= 0), "in transit but already enqueued"),
        (
            np.isin(status, (REJECTED, SHED, EXPIRED, GATEWAY)) & (r["enqueue_us"] >= 0),
            "never dispatched but enqueued at an instance",
        ),
    )
    for mask, message in rules:
        for i in _first_bad(mask):
            yield Violation("INV-2", message, request=int(ids[i]), server=int(r["instance"][i]))


def check_causality(data: AuditInput) -> Iterator[Violation]:
    r = data.requests
    ids = r["id"]
    chain = ("arrival_us", "enqueue_us", "first_scheduled_us", "first_token_us", "completion_us")
    for earlier, later in zip(chain, chain[1:]):
        a, b = r[earlier], r[later]
        for i in _first_bad((a >= 0) & (b >= 0) & (b < a)):
            yield Violation(
                "INV-5",
                f"{later} ({b[i]}) precedes {earlier} ({a[i]})",
                request=int(ids[i]),
                server=int(r["instance"][i]),
                time_us=int(b[i]),
            )
    for i in _first_bad(r["arrival_us"] < 0):
        yield Violation(
            "INV-5", "negative arrival time", request=int(ids[i]), time_us=int(r["arrival_us"][i])
        )


def check_clock(data: AuditInput) -> Iterator[Violation]:
    for server, steps in enumerate(data.steps):
        start, dt = steps["start_us"], steps["dt_us"]
        if not len(start):
            continue
        for i in _first_bad(dt < 1):
            yield Violation(
                "INV-3", f"step {i} lasts {dt[i]} µs (< 1)", server=server, time_us=int(start[i])
            )
        if start[0] < 0:
            yield Violation(
                "INV-3", "first step starts before time 0", server=server, time_us=int(start[0])
            )
        ends = start + dt
        for i in _first_bad(start[1:] < ends[:-1]):
            yield Violation(
                "INV-3",
                f"step {i + 1} starts at {start[i + 1]} before step {i} ends at {ends[i]}",
                server=server,
                time_us=int(start[i + 1]),
            )


def check_kv(data: AuditInput) -> Iterator[Violation]:
    for note in data.notes:
        yield Violation("INV-4", note)
    for server, steps in enumerate(data.steps):
        used = steps["kv_used"]
        total = data.capacity[server]
        for i in _first_bad((used < 0) | (used > total)):
            yield Violation(
                "INV-4",
                f"step {i} uses {used[i]} of {total} KV blocks",
                server=server,
                time_us=int(steps["start_us"][i]),
            )


def check_work_conservation(data: AuditInput) -> Iterator[Violation]:
    r = data.requests
    for server, steps in enumerate(data.steps):
        start, dt, pending = steps["start_us"], steps["dt_us"], steps["pending_after"]
        if len(start):
            ends = start + dt
            gap = start[1:] != ends[:-1]
            for i in _first_bad(gap & (pending[:-1] > 0)):
                yield Violation(
                    "INV-8",
                    f"{pending[i]} requests were waiting or running after step {i}, "
                    f"but the next step started {start[i + 1] - ends[i]} µs later",
                    server=server,
                    time_us=int(ends[i]),
                )
            if pending[-1] > 0 and not data.bounded:
                yield Violation(
                    "INV-8",
                    f"{pending[-1]} requests left after the last step of a drained run",
                    server=server,
                    time_us=int(ends[-1]),
                )
        # a request enqueued while the server was idle must start a step in that instant
        mine = (
            (r["instance"] == server) & (r["enqueue_us"] >= 0) & ~np.isin(r["status"], NEVER_SERVED)
        )
        enq = r["enqueue_us"][mine]
        if not len(enq):
            continue
        if not len(start):
            if not data.bounded:
                yield Violation(
                    "INV-8",
                    "requests were enqueued but the instance never ran a step",
                    server=server,
                )
            continue
        idx = np.searchsorted(start, enq, side="right") - 1
        ends = start + dt
        busy = (idx >= 0) & (enq < ends[np.maximum(idx, 0)])
        starts_now = np.isin(enq, start)
        if data.bounded:
            # the horizon may fall between an enqueue and the step it starts
            horizon_edge = enq >= ends[-1]
            bad = ~busy & ~starts_now & ~horizon_edge
        else:
            bad = ~busy & ~starts_now
        ids = r["id"][mine]
        for i in _first_bad(bad):
            yield Violation(
                "INV-8",
                "enqueued at an idle instance, but no step started in that instant",
                request=int(ids[i]),
                server=server,
                time_us=int(enq[i]),
            )


def check_signal_freshness(data: AuditInput) -> Iterator[Violation]:
    """INV-7: no routing decision read a snapshot older than the refresh interval allows."""
    if not len(data.snapshot_ages):
        return
    ages = np.asarray(data.snapshot_ages)
    limit = data.snapshot_interval
    for i in _first_bad(ages > max(limit, 0) if limit > 0 else ages > 0):
        yield Violation(
            "INV-7", f"routing decision {i} read a snapshot {ages[i]} µs old (interval {limit} µs)"
        )


def check_sessions(data: AuditInput) -> Iterator[Violation]:
    """INV-10 (round n+1 arrives no earlier than round n's completion + think time) and INV-11
    (every session ends in exactly one of completed / cancelled / interrupted / exhausted (a
    closed-loop user out of request budget), consistently with its rounds)."""
    if data.sessions is None:
        return
    r = data.requests
    sid = r["session_id"]
    rows = np.flatnonzero(sid >= 0)
    order = rows[np.lexsort((r["round_index"][rows], sid[rows]))]
    by_session: dict[int, list[int]] = {}
    for i in order.tolist():
        by_session.setdefault(int(sid[i]), []).append(i)
    if set(by_session) != set(data.sessions):
        missing = sorted(set(by_session) ^ set(data.sessions))[:5]
        yield Violation("INV-11", f"sessions without exactly one end state: {missing}")
    for session, members in by_session.items():
        rounds = r["round_index"][members]
        if list(rounds) != list(range(len(members))):
            yield Violation(
                "INV-11",
                f"session {session} has rounds {list(rounds)}",
                request=int(r["id"][members[0]]),
            )
            continue
        for a, b in zip(members, members[1:]):
            done = r["completion_us"][a]
            earliest = done + r["think_us"][b]
            if done < 0 or r["arrival_us"][b] < earliest:
                yield Violation(
                    "INV-10",
                    f"round {r['round_index'][b]} of session {session} arrived at {r['arrival_us'][b]} µs, "
                    f"before round {r['round_index'][a]} completed + think ({earliest} µs)",
                    request=int(r["id"][b]),
                    time_us=int(r["arrival_us"][b]),
                )
        state = data.sessions.get(session)
        completed = r["status"][members] == COMPLETED
        if state == "completed" and (len(members) != data.session_rounds or not completed.all()):
            yield Violation(
                "INV-11",
                f"session {session} is 'completed' with {int(completed.sum())} of {data.session_rounds} rounds completed",
            )
        elif state == "cancelled" and completed[-1]:
            yield Violation(
                "INV-11", f"session {session} is 'cancelled' but its last round completed"
            )
        elif state == "exhausted" and not completed.all():
            yield Violation(
                "INV-11", f"session {session} ended for lack of budget with an unfinished round"
            )
        elif state == "interrupted" and not data.bounded:
            yield Violation(
                "INV-11", f"session {session} was interrupted in a run without a horizon"
            )


CHECKS = (
    check_conservation,
    check_lifecycle,
    check_causality,
    check_clock,
    check_kv,
    check_work_conservation,
    check_signal_freshness,
    check_sessions,
)
