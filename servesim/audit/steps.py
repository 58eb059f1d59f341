"""Step-log invariants of each instance: clock monotonicity (INV-3) and work conservation (INV-8)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from servesim.audit.base import NEVER_SERVED, AuditInput, Violation, _first_bad


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


def _queue_arrivals(data: AuditInput) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """(enqueue times, request ids) per server. A split request (PD) reaches two servers: its
    prefill instance at ``enqueue_us`` and its decode instance at ``decode_enqueue_us``."""
    r = data.requests
    served = (r["enqueue_us"] >= 0) & ~np.isin(r["status"], NEVER_SERVED)
    servers, times, ids = [r["instance"][served]], [r["enqueue_us"][served]], [r["id"][served]]
    if data.pd is not None:
        split = served & (r["prefill_instance"] >= 0)
        servers[0] = np.where(split, r["prefill_instance"], r["instance"])[served]
        decoded = r["decode_enqueue_us"] >= 0
        servers.append(r["instance"][decoded])
        times.append(r["decode_enqueue_us"][decoded])
        ids.append(r["id"][decoded])
    server_all, time_all, id_all = (np.concatenate(x) for x in (servers, times, ids))
    out = {}
    for server in np.unique(server_all).tolist():
        mine = server_all == server
        out[server] = (time_all[mine], id_all[mine])
    return out


def check_work_conservation(data: AuditInput) -> Iterator[Violation]:
    arrivals = _queue_arrivals(data)
    for server, steps in enumerate(data.steps):
        start, dt, pending = steps["start_us"], steps["dt_us"], steps["pending_after"]
        # instants at which the server formed an empty batch because its queue head waited for
        # KV held by transfers in flight (disaggregated serving): it idled with work, legitimately
        blocked = np.asarray(steps.get("blocked_us", ()), dtype=np.int64)
        if len(start):
            ends = start + dt
            gap = start[1:] != ends[:-1]
            if len(blocked):
                # a blocked formation within the gap [end of step i, start of step i+1)
                first = np.searchsorted(blocked, ends[:-1], side="left")
                gap &= ~(
                    (first < len(blocked))
                    & (blocked[np.minimum(first, len(blocked) - 1)] < start[1:])
                )
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
        enq, ids = arrivals[server] if server in arrivals else (np.zeros(0, np.int64), None)
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
        starts_now = np.isin(enq, start) | np.isin(enq, blocked)
        if data.bounded:
            # the horizon may fall between an enqueue and the step it starts
            horizon_edge = enq >= ends[-1]
            bad = ~busy & ~starts_now & ~horizon_edge
        else:
            bad = ~busy & ~starts_now
        for i in _first_bad(bad):
            yield Violation(
                "INV-8",
                "enqueued at an idle instance, but no step started in that instant",
                request=int(ids[i]),
                server=server,
                time_us=int(enq[i]),
            )
