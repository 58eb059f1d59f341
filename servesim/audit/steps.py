"""Step-log invariants of each instance: clock monotonicity (INV-3) and work conservation (INV-8)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from servesim.audit.base import (
    MAX_REPORTED_PER_CHECK,
    NEVER_SERVED,
    AuditInput,
    Violation,
    _first_bad,
)
from servesim.audit.chunks import ServerInstants, chunks, rows


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


def check_work_conservation(data: AuditInput) -> Iterator[Violation]:
    """A server with work left after a step starts the next one at once, and a request reaching
    an idle server starts a step in that instant. The step logs and the request table are read a
    slice at a time; what is held whole is every step's start and end (16 bytes per step)."""
    blocked = [np.asarray(steps.get("blocked_us", ()), dtype=np.int64) for steps in data.steps]
    idle = _idle_arrivals(data, blocked)
    for server, steps in enumerate(data.steps):
        yield from _gaps_with_work(data, server, steps, blocked[server])
        yield from idle[server]


def _gaps_with_work(
    data: AuditInput, server: int, steps: Mapping[str, np.ndarray], blocked: np.ndarray
) -> Iterator[Violation]:
    """Gaps between consecutive steps while requests waited or ran (except at the instants the
    server formed an empty batch because its queue head waited for KV held by transfers in
    flight: it idled with work, legitimately), and work left after a drained run's last step."""
    found: list[Violation] = []
    previous = None  # the last step of the previous slice: (start, end, requests left)
    for offset, chunk in chunks(steps, ("start_us", "dt_us", "pending_after")):
        start, pending = chunk["start_us"], chunk["pending_after"]
        if not len(start):
            continue
        ends = start + chunk["dt_us"]
        first = offset
        if previous is not None:  # the gap between the slices is checked with this one
            start, ends, pending = (
                np.concatenate(([p], x)) for p, x in zip(previous, (start, ends, pending))
            )
            first -= 1
        previous = (start[-1], ends[-1], pending[-1])
        gap = start[1:] != ends[:-1]
        if len(blocked):
            # a blocked formation within the gap [end of step i, start of step i+1)
            at = np.searchsorted(blocked, ends[:-1], side="left")
            gap &= ~((at < len(blocked)) & (blocked[np.minimum(at, len(blocked) - 1)] < start[1:]))
        for i in _first_bad(gap & (pending[:-1] > 0))[: MAX_REPORTED_PER_CHECK - len(found)]:
            found.append(
                Violation(
                    "INV-8",
                    f"{pending[i]} requests were waiting or running after step {first + i}, "
                    f"but the next step started {start[i + 1] - ends[i]} µs later",
                    server=server,
                    time_us=int(ends[i]),
                )
            )
    yield from found
    if previous is not None and previous[2] > 0 and not data.bounded:
        yield Violation(
            "INV-8",
            f"{previous[2]} requests left after the last step of a drained run",
            server=server,
            time_us=int(previous[1]),
        )


def _idle_arrivals(data: AuditInput, blocked: list[np.ndarray]) -> list[list[Violation]]:
    """Per server, the requests that reached it while it was idle and started no step in that
    instant (at most the reporting limit; first its queue's arrivals in id order, then, with
    disaggregation, the split requests reaching it for their decode)."""
    n_servers = len(data.steps)
    sizes = [rows(steps) for steps in data.steps]
    last_end = np.full(n_servers, -1, dtype=np.int64)  # end of each server's last logged step

    def starts(server: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for _, chunk in chunks(data.steps[server], ("start_us", "dt_us")):
            ends = chunk["start_us"] + chunk["dt_us"]
            if len(ends):
                last_end[server] = ends[-1]
            yield chunk["start_us"], ends

    top = max([int(b.max()) for b in blocked if len(b)] + [0])
    for steps in data.steps:
        for _, chunk in chunks(steps, ("start_us",)):
            if len(chunk["start_us"]):
                top = max(top, int(chunk["start_us"].max()))
    steps_at = ServerInstants(sizes, starts, top)
    blocked_at = ServerInstants(
        [len(b) for b in blocked], lambda s: iter([(blocked[s], None)]), top
    )
    found: list[list[list[Violation]]] = [[[], []] for _ in range(n_servers)]
    reached = np.zeros(n_servers, dtype=bool)
    for _, r in chunks(data.requests, _arrival_columns(data)):
        for phase, (servers, times, ids) in enumerate(_queue_arrivals(data, r)):
            mine = (servers >= 0) & (servers < n_servers)
            servers, times, ids = servers[mine], times[mine], ids[mine]
            reached[servers] = True
            busy_from, at, starts_now = steps_at.at_or_before(servers, times)
            busy = (
                busy_from & (times < steps_at.values[at])
                if steps_at.values is not None
                else busy_from
            )
            starts_now |= blocked_at.contains(servers, times)
            bad = ~busy & ~starts_now
            if data.bounded:  # the horizon may fall between an enqueue and the step it starts
                bad &= times < last_end[servers]
            bad &= np.asarray(sizes)[servers] > 0
            for i in np.flatnonzero(bad):
                mine = found[servers[i]][phase]
                if len(mine) < MAX_REPORTED_PER_CHECK:
                    mine.append(
                        Violation(
                            "INV-8",
                            "enqueued at an idle instance, but no step started in that instant",
                            request=int(ids[i]),
                            server=int(servers[i]),
                            time_us=int(times[i]),
                        )
                    )
    out = []
    for server in range(n_servers):
        if reached[server] and not sizes[server] and not data.bounded:
            out.append(
                [
                    Violation(
                        "INV-8",
                        "requests were enqueued but the instance never ran a step",
                        server=server,
                    )
                ]
            )
        else:
            out.append((found[server][0] + found[server][1])[:MAX_REPORTED_PER_CHECK])
    return out


def _arrival_columns(data: AuditInput) -> tuple[str, ...]:
    names = ("id", "status", "instance", "enqueue_us")
    if data.pd is not None:
        names += ("prefill_instance", "decode_enqueue_us")
    return names


def _queue_arrivals(data: AuditInput, r: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, ...]]:
    """(servers, enqueue times, request ids) of the rows ``r``: their arrivals at a queue. A split
    request (PD) reaches two servers: its prefill instance at ``enqueue_us`` (first list) and its
    decode instance at ``decode_enqueue_us`` (second)."""
    served = (r["enqueue_us"] >= 0) & ~np.isin(r["status"], NEVER_SERVED)
    servers = r["instance"]
    if data.pd is not None:
        servers = np.where(r["prefill_instance"] >= 0, r["prefill_instance"], r["instance"])
    out = [(servers[served], r["enqueue_us"][served], r["id"][served])]
    if data.pd is not None:
        decoded = r["decode_enqueue_us"] >= 0
        out.append((r["instance"][decoded], r["decode_enqueue_us"][decoded], r["id"][decoded]))
    return out
