"""Request-table invariants: conservation (INV-1), lifecycle (INV-2), causality (INV-5) and
sessions (INV-10, INV-11)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from servesim.audit.base import (
    COMPLETED,
    DROPPED,
    EXPIRED,
    GATEWAY,
    IN_TRANSIT,
    MAX_REPORTED_PER_CHECK,
    NEVER_SERVED,
    QUEUED,
    REJECTED,
    RUNNING,
    SHED,
    TRANSFERRING,
    AuditInput,
    Violation,
    _first_bad,
)


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
    last = TRANSFERRING if data.pd is not None else GATEWAY
    for i in _first_bad((status < COMPLETED) | (status > last)):
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
        (
            (status == DROPPED)
            & (r["first_scheduled_us"] >= 0)
            & (r.get("prefill_end_us", -1) < 0),  # PD: refused by the decode instance after prefill
            "dropped after being scheduled",
        ),
        (
            (status == TRANSFERRING) & (r["first_token_us"] < 0),
            "between prefill and decode without a first token",
        ),
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
        rounds = data.session_rounds
        expected = rounds if isinstance(rounds, int) else rounds.get(session, 0)
        if state == "completed" and (len(members) != expected or not completed.all()):
            yield Violation(
                "INV-11",
                f"session {session} is 'completed' with {int(completed.sum())} of {expected} rounds completed",
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
