"""Routing-signal freshness (INV-7), recomputed rather than taken on trust.

The cluster reports each traced decision's oldest-snapshot age; the auditor recomputes it from the
decision's instant and the instant that snapshot was taken, and ties each decision to its
request's row (routed after it arrived, before it was enqueued, to the instance it ran on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from servesim.audit.base import NEVER_SERVED, AuditInput, Violation, _first_bad


def check_signal_freshness(data: AuditInput) -> Iterator[Violation]:
    """INV-7: no routing decision read a snapshot older than the refresh interval allows."""
    d = data.decisions
    if d is None or not len(d["time_us"]):
        return
    now, reported = d["time_us"], d["age_us"]
    limit = max(data.snapshot_interval, 0)
    requests = d["request"]

    def violations(bad: np.ndarray, says: Callable[[int], str]) -> Iterator[Violation]:
        """INV-7 for each of the first decisions in ``bad``, described by ``says(i)``."""
        for i in _first_bad(bad):
            yield Violation("INV-7", says(i), request=int(requests[i]), time_us=int(now[i]))

    taken = d.get("taken_us")
    if taken is not None:
        age = now - taken
        yield from violations(
            taken > now,
            lambda i: f"routing decision {i} read a snapshot taken at {taken[i]} µs, after it",
        )
        yield from violations(
            reported != age,
            lambda i: (
                f"routing decision {i} reports a snapshot {reported[i]} µs old, but the "
                f"snapshot was taken at {taken[i]} µs: {age[i]} µs old"
            ),
        )
    else:
        age = reported
    yield from violations(
        age > limit,
        lambda i: f"routing decision {i} read a snapshot {age[i]} µs old (interval {limit} µs)",
    )
    yield from _decisions_against_requests(data, d)


def _decisions_against_requests(data: AuditInput, d) -> Iterator[Violation]:
    """Each decision happened between its request's arrival and enqueue, and (without pools) the
    request ran on the instance chosen for it."""
    r = data.requests
    ids = r["id"]
    if not len(ids):
        return
    rows = np.minimum(np.searchsorted(ids, d["request"]), len(ids) - 1)
    known = ids[rows] == d["request"]
    for i in _first_bad(~known):
        yield Violation("INV-7", f"routing decision {i} is for an unknown request")
    now = d["time_us"]
    arrival, enqueue = r["arrival_us"][rows], r["enqueue_us"][rows]
    early = known & (now < arrival)
    late = known & (enqueue >= 0) & (now > enqueue)
    for i in _first_bad(early | late):
        yield Violation(
            "INV-7",
            f"routed at {now[i]} µs, outside [arrival {arrival[i]}, enqueue {enqueue[i]}] µs",
            request=int(d["request"][i]),
            time_us=int(now[i]),
        )
    if data.pd is None:
        served = known & (r["instance"][rows] >= 0) & ~np.isin(r["status"][rows], NEVER_SERVED)
        wrong = served & (r["instance"][rows] != d["chosen"])
        for i in _first_bad(wrong):
            yield Violation(
                "INV-7",
                f"routed to instance {d['chosen'][i]} but recorded on another",
                request=int(d["request"][i]),
                server=int(r["instance"][rows[i]]),
                time_us=int(now[i]),
            )
