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
  independent block recount the engine performs (``notes``); with preemption by swapping, the
  CPU swap space's books too (``swap``): never over its capacity, every block swapped out was
  swapped back in or is still there, nothing left in CPU memory after a drained run.
* INV-5 causality — arrival ≤ enqueue ≤ first scheduled ≤ first token ≤ completion.
* INV-8 work conservation — a server with work left after a step starts the next step at once,
  and a request reaching an idle server starts a step in the same instant.

Disaggregated runs (``AuditInput.pd``) add §8.2's INV-PD-1…5 and the transfer checks: transfer
conservation (started = completed + in flight), byte conservation (∫ rate dt = bytes for every
transfer) and fair share (at every change point the active transfers on a link have equal rates
summing to at most its bandwidth). The transfer checks are an independent recomputation from the
logged transfers and link change points, supplied by the caller as ``pd["check_transfers"]``
(simcore knows nothing about what a transfer carries).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import attrs
import numpy as np

from servesim.simcore.errors import AuditError

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
    # routing decisions' oldest-snapshot ages (µs) and the freshness they must respect (INV-7)
    snapshot_ages: Sequence[int] = ()
    snapshot_interval: int = 0
    # sessions: id -> "completed" | "cancelled" | "interrupted" | "exhausted", rounds per session
    sessions: Mapping[int, str] | None = None
    session_rounds: int = 0
    # disaggregated serving: roles (at start and end), counters, transfer log and its checker
    pd: Mapping[str, object] | None = None
    # preemption by swapping, per server: swap space (blocks), peak use, blocks out and in, use
    # at the end, swap-outs, swap-ins (empty: no server swaps)
    swap: Sequence[Mapping[str, int]] = ()


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


def check_swap(data: AuditInput) -> Iterator[Violation]:
    """INV-4 across GPU and CPU memory for servers that preempt by swapping."""
    for server, books in enumerate(data.swap):
        if not books:
            continue
        space, peak = books["space"], books["peak"]
        out, back, left = books["out_blocks"], books["in_blocks"], books["used_end"]
        if peak > space:
            yield Violation(
                "INV-4", f"swap space held {peak} blocks, over its {space}", server=server
            )
        if out - back != left or left < 0:
            yield Violation(
                "INV-4",
                f"{out} blocks swapped out, {back} swapped in, but {left} in CPU memory",
                server=server,
            )
        if books["ins"] > books["outs"]:
            yield Violation(
                "INV-4",
                f"{books['ins']} swap-ins but only {books['outs']} swap-outs",
                server=server,
            )
        if left and not data.bounded:
            yield Violation(
                "INV-4", f"{left} blocks left in CPU memory after a drained run", server=server
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


def check_pd(data: AuditInput) -> Iterator[Violation]:
    """INV-PD-1…5 over the request table, then the transfer log's own checks."""
    pd = data.pd
    if pd is None:
        return
    r = data.requests
    ids = r["id"]
    roles = np.array(pd["roles"])
    prefill = r["prefill_instance"]
    split = prefill >= 0
    chain = (
        "arrival_us",
        "enqueue_us",
        "prefill_end_us",
        "transfer_start_us",
        "transfer_end_us",
        "decode_enqueue_us",
        "completion_us",
    )
    # INV-PD-1: the decode part is enqueued exactly when its KV has arrived, never before
    te, de = r["transfer_end_us"], r["decode_enqueue_us"]
    for i in _first_bad(split & ((te >= 0) != (de >= 0)) | ((de >= 0) & (de < te))):
        yield Violation(
            "INV-PD-1",
            f"decode enqueue {de[i]} µs vs transfer end {te[i]} µs",
            request=int(ids[i]),
            server=int(r["instance"][i]),
        )
    # INV-PD-2: prefill parts on prefill-capable pods, everything decoded on decode-capable pods
    prefill_ok = np.isin(roles, ("prefill", "mixed"))
    decode_ok = np.isin(roles, ("decode", "mixed"))
    inst = r["instance"]
    for i in _first_bad(split & ~prefill_ok[np.maximum(prefill, 0)]):
        yield Violation(
            "INV-PD-2",
            f"prefill ran on a {roles[prefill[i]]} instance",
            request=int(ids[i]),
            server=int(prefill[i]),
        )
    decoded_here = (inst >= 0) & (r["first_scheduled_us"] >= 0) & (~split | (de >= 0))
    for i in _first_bad(decoded_here & ~decode_ok[np.maximum(inst, 0)]):
        yield Violation(
            "INV-PD-2",
            f"decoded on a {roles[inst[i]]} instance",
            request=int(ids[i]),
            server=int(inst[i]),
        )
    for server in np.flatnonzero(roles == "none").tolist():
        if len(data.steps[server]["start_us"]):
            yield Violation("INV-PD-2", "an instance in no pool ran steps", server=server)
    # INV-PD-3: transfer conservation, on the counters and on the request table
    started, completed = int(pd["transfers_started"]), int(pd["transfers_completed"])
    in_flight = int(pd["in_flight"])
    if started != completed + in_flight:
        yield Violation(
            "INV-PD-3",
            f"{started} transfers started, {completed} completed, {in_flight} in flight",
        )
    if started != int((r["transfer_start_us"] >= 0).sum()) or completed != int((te >= 0).sum()):
        yield Violation(
            "INV-PD-3",
            f"the request table shows {int((r['transfer_start_us'] >= 0).sum())} transfers "
            f"started and {int((te >= 0).sum())} completed; the counters {started} and {completed}",
        )
    if not data.bounded and in_flight:
        yield Violation("INV-PD-3", f"{in_flight} transfers in flight after a drained run")
    # INV-PD-4: phase causality along the split request's chain
    for earlier, later in zip(chain, chain[1:]):
        a, b = r[earlier], r[later]
        for i in _first_bad(split & (a >= 0) & (b >= 0) & (b < a)):
            yield Violation(
                "INV-PD-4",
                f"{later} ({b[i]}) precedes {earlier} ({a[i]})",
                request=int(ids[i]),
                time_us=int(b[i]),
            )
    # INV-PD-5: pool membership fixed for the run
    if tuple(pd["roles"]) != tuple(pd["roles_at_end"]):
        yield Violation(
            "INV-PD-5", f"pools changed: {list(pd['roles'])} -> {list(pd['roles_at_end'])}"
        )
    checker = pd.get("check_transfers")
    if checker is not None:
        for problem in checker():
            yield Violation("INV-PD-3" if "conservation" in problem else "TRANSFER", problem)


CHECKS = (
    check_conservation,
    check_lifecycle,
    check_causality,
    check_clock,
    check_kv,
    check_swap,
    check_work_conservation,
    check_signal_freshness,
    check_sessions,
    check_pd,
)
