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
    """Steps of one instance last at least 1 µs, start at or after time 0 and never overlap (the
    log read a slice at a time)."""
    for server, steps in enumerate(data.steps):
        short: list[Violation] = []
        overlaps: list[Violation] = []
        first_start = None
        for first, s, carried in _consecutive(steps, ("start_us", "dt_us")):
            start, dt = s["start_us"], s["dt_us"]
            if first_start is None:
                first_start = int(start[0])
            own = int(carried)  # the carried row was judged with its own slice
            for i in _first_bad(dt[own:] < 1)[: MAX_REPORTED_PER_CHECK - len(short)]:
                short.append(
                    Violation(
                        "INV-3",
                        f"step {first + own + i} lasts {dt[own + i]} µs (< 1)",
                        server=server,
                        time_us=int(start[own + i]),
                    )
                )
            ends = start + dt
            for i in _first_bad(start[1:] < ends[:-1])[: MAX_REPORTED_PER_CHECK - len(overlaps)]:
                overlaps.append(
                    Violation(
                        "INV-3",
                        f"step {first + i + 1} starts at {start[i + 1]} before step {first + i} "
                        f"ends at {ends[i]}",
                        server=server,
                        time_us=int(start[i + 1]),
                    )
                )
        yield from short
        if first_start is not None and first_start < 0:
            yield Violation(
                "INV-3", "first step starts before time 0", server=server, time_us=first_start
            )
        yield from overlaps


def _consecutive(
    steps: Mapping[str, np.ndarray], names: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, np.ndarray], bool]]:
    """Slices of one step log with the previous slice's last step put in front, so that checks
    of consecutive steps also see the pair across each slice edge: (index of the slice's first
    row, its columns, whether that first row is the carried one)."""
    previous: dict[str, np.ndarray] | None = None
    for offset, chunk in chunks(steps, names):
        if not len(chunk[names[0]]):
            continue
        if previous is None:
            yield offset, chunk, False
        else:
            joined = {n: np.concatenate((previous[n], chunk[n])) for n in names}
            yield offset - 1, joined, True
        previous = {n: chunk[n][-1:] for n in names}


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
    last = None  # (end, requests left) of the last step
    for first, s, _ in _consecutive(steps, ("start_us", "dt_us", "pending_after")):
        start, pending = s["start_us"], s["pending_after"]
        ends = start + s["dt_us"]
        last = (int(ends[-1]), int(pending[-1]))
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
    if last is not None and last[1] > 0 and not data.bounded:
        yield Violation(
            "INV-8",
            f"{last[1]} requests left after the last step of a drained run",
            server=server,
            time_us=last[0],
        )


class _StepSpans:
    """Every server's steps as (start, end) pairs keyed by start, and when its last step ended:
    what says whether an instant finds a server busy."""

    def __init__(self, data: AuditInput, blocked: list[np.ndarray]) -> None:
        self.sizes = np.array([rows(steps) for steps in data.steps], dtype=np.int64)
        self.last_end = np.full(len(data.steps), -1, dtype=np.int64)
        top = max([int(b.max()) for b in blocked if len(b)] + [0])
        for steps in data.steps:
            for _, chunk in chunks(steps, ("start_us",)):
                if len(chunk["start_us"]):
                    top = max(top, int(chunk["start_us"].max()))
        self.starts = ServerInstants(self.sizes.tolist(), self._spans(data), top)
        self.blocked = ServerInstants(
            [len(b) for b in blocked], lambda server: iter([(blocked[server], None)]), top
        )

    def _spans(self, data: AuditInput):
        def spans(server: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            for _, chunk in chunks(data.steps[server], ("start_us", "dt_us")):
                ends = chunk["start_us"] + chunk["dt_us"]
                if len(ends):
                    self.last_end[server] = ends[-1]
                yield chunk["start_us"], ends

        return spans

    def idle_without_start(self, servers: np.ndarray, times: np.ndarray, bounded: bool):
        """Whether each (server, instant) found the server idle (within no step) and no step
        (or blocked formation) started then; a bounded run's instants after a server's last
        step are not judged (the horizon may fall between an enqueue and its step)."""
        after, at, starts_now = self.starts.at_or_before(servers, times)
        ends = self.starts.values
        busy = after & (times < ends[at]) if ends is not None else after
        starts_now |= self.blocked.contains(servers, times)
        bad = ~busy & ~starts_now & (self.sizes[servers] > 0)
        if bounded:
            bad &= times < self.last_end[servers]
        return bad


def _idle_arrivals(data: AuditInput, blocked: list[np.ndarray]) -> list[list[Violation]]:
    """Per server, the requests that reached it while it was idle and started no step in that
    instant (at most the reporting limit; first its queue's arrivals in id order, then, with
    disaggregation, the split requests reaching it for their decode), or that it never ran a
    step although requests reached it."""
    n_servers = len(data.steps)
    spans = _StepSpans(data, blocked)
    found: list[list[list[Violation]]] = [[[], []] for _ in range(n_servers)]
    reached = np.zeros(n_servers, dtype=bool)
    for _, r in chunks(data.requests, _arrival_columns(data)):
        for phase, (servers, times, ids) in enumerate(_queue_arrivals(data, r)):
            known = (servers >= 0) & (servers < n_servers)
            servers, times, ids = servers[known], times[known], ids[known]
            reached[servers] = True
            bad = np.flatnonzero(spans.idle_without_start(servers, times, data.bounded))
            for i in _first_per_server(servers[bad], [f[phase] for f in found]):
                found[servers[bad[i]]][phase].append(
                    Violation(
                        "INV-8",
                        "enqueued at an idle instance, but no step started in that instant",
                        request=int(ids[bad[i]]),
                        server=int(servers[bad[i]]),
                        time_us=int(times[bad[i]]),
                    )
                )
    out = []
    for server in range(n_servers):
        if reached[server] and not spans.sizes[server] and not data.bounded:
            never = Violation(
                "INV-8", "requests were enqueued but the instance never ran a step", server=server
            )
            out.append([never])
        else:
            out.append((found[server][0] + found[server][1])[:MAX_REPORTED_PER_CHECK])
    return out


def _first_per_server(servers: np.ndarray, reported: list[list]) -> list[int]:
    """Positions of the first entries of each server in ``servers`` (in order) that still fit
    under the reporting limit, given what each server has ``reported`` already."""
    taken = [len(r) for r in reported]
    keep = []
    for i, server in enumerate(servers.tolist()):
        if taken[server] < MAX_REPORTED_PER_CHECK:
            taken[server] += 1
            keep.append(i)
        elif min(taken) >= MAX_REPORTED_PER_CHECK:
            break
    return keep


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
