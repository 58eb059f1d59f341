"""Autoscaling invariants, recomputed from the fleet's log (``cluster.autoscaling`` runs).

* INV-AS-1 lifecycle — every instance's state changes follow cold → loading → warming → ready →
  draining → stopped (→ loading again), each at a time no earlier than the one before; at the
  end an instance that was ever started is stopped or still up (loading, warming, ready or
  draining), never back to cold.
* INV-AS-2 routing — every routing decision chose an instance that was ready at that moment
  (its state after the changes logged before the decision).
* INV-AS-3 no work while down — every step of an instance runs while it is ready or draining
  (from the time it became ready to the time it stopped).

The fleet's log (see :meth:`servesim.components.autoscaler.Fleet.close`) is ``events``, int64
rows (time, instance, new state), and ``routed``, rows (request, time, instance, number of
state changes logged before the decision). State codes: 0 cold, 1 loading, 2 warming, 3 ready,
4 draining, 5 stopped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from servesim.audit.base import Violation

__all__ = ["check_autoscaling", "check_fleet"]

COLD, LOADING, WARMING, READY, DRAINING, STOPPED = range(6)
_NEXT = {COLD: LOADING, LOADING: WARMING, WARMING: READY, READY: DRAINING, DRAINING: STOPPED}
_NAMES = ("cold", "loading", "warming", "ready", "draining", "stopped")


def check_autoscaling(data) -> Iterator[Violation]:
    """The auditor's entry: nothing to check unless the run was autoscaled (``data.fleet``)."""
    fleet = getattr(data, "fleet", None)
    if fleet is None:
        return iter(())
    return check_fleet(fleet, data.steps)


def check_fleet(
    fleet: Mapping[str, np.ndarray], steps: Sequence[Mapping[str, np.ndarray]]
) -> Iterator[Violation]:
    """INV-AS-1…3 over one run's fleet log and its instances' step logs."""
    events = np.asarray(fleet["events"], dtype=np.int64).reshape(-1, 3)
    n = len(steps)
    state = [COLD] * n
    last = [0] * n
    serving: list[list[list[int]]] = [[] for _ in range(n)]  # per instance: [ready, stop] spans
    for t, k, new in events.tolist():
        was = state[k]
        allowed = LOADING if was == STOPPED else _NEXT.get(was)
        # the instances ready from the start have no earlier change
        if new != allowed and not (was == COLD and new == READY and t == 0):
            yield Violation(
                "INV-AS-1",
                f"changed from {_NAMES[was]} to {_NAMES[new]}",
                server=k,
                time_us=t,
            )
        if t < last[k]:
            yield Violation("INV-AS-1", "state changes out of time order", server=k, time_us=t)
        state[k], last[k] = new, t
        if new == READY:
            serving[k].append([t, -1])
        elif new == STOPPED and serving[k]:
            serving[k][-1][1] = t
    yield from _check_routing(np.asarray(fleet["routed"], dtype=np.int64).reshape(-1, 4), events)
    for k, log in enumerate(steps):
        yield from _check_steps(k, log, serving[k])


def _check_routing(routed: np.ndarray, events: np.ndarray) -> Iterator[Violation]:
    """INV-AS-2: replay the state changes in log order, and check each decision in between."""
    state: dict[int, int] = {}
    done = 0
    for rid, t, k, before in routed[np.argsort(routed[:, 3], kind="stable")].tolist():
        while done < before:
            _, j, new = events[done].tolist()
            state[j] = new
            done += 1
        if state.get(k, COLD) != READY:
            yield Violation(
                "INV-AS-2",
                f"routed to an instance that was {_NAMES[state.get(k, COLD)]}, not ready",
                request=rid,
                server=k,
                time_us=t,
            )


def _check_steps(k: int, log: Mapping[str, np.ndarray], serving: list[list[int]]) -> Iterator:
    """INV-AS-3: each step of instance ``k`` lies inside one of its serving spans."""
    starts = np.asarray(log["start_us"], dtype=np.int64)
    if not len(starts):
        return
    ends = starts + np.asarray(log["dt_us"], dtype=np.int64)
    spans = np.array([[a, b if b >= 0 else np.iinfo(np.int64).max] for a, b in serving])
    if not len(spans):
        yield Violation(
            "INV-AS-3", "ran steps but was never ready", server=k, time_us=int(starts[0])
        )
        return
    which = np.searchsorted(spans[:, 0], starts, side="right") - 1
    inside = (which >= 0) & (ends <= spans[np.maximum(which, 0), 1])
    for i in np.flatnonzero(~inside)[:20]:
        yield Violation(
            "INV-AS-3",
            f"a step ran from {int(starts[i])} to {int(ends[i])} µs while the instance was down",
            server=k,
            time_us=int(starts[i]),
        )
