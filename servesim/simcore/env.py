"""Simulation time and same-instant ordering on top of SimPy.

Time is an integer number of microseconds. SimPy orders events by (time, priority, insertion id);
servesim uses priority levels so that, at one instant,

1. every ordinary event (``NORMAL``: arrivals, hand-offs, completions, and what those trigger
   in the same instant) is processed first;
2. then the servers' step ends (``STEP_BASE + server index``: progress applied, finished work
   released — which may trigger more ``NORMAL`` events of this instant, processed before the
   next step end because they sort first);
3. then each server starts its next step (``FORM_BASE + server index``), after every other
   event of the instant.

Ties between servers go in index order at each level.
"""

from __future__ import annotations

from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL, URGENT, Event, Process

__all__ = [
    "URGENT",
    "NORMAL",
    "STEP_BASE",
    "FORM_BASE",
    "SimEnvironment",
    "StepEvent",
    "fire_at_step_priority",
    "StartedProcess",
]

STEP_BASE = 2
FORM_BASE = 1 << 40  # above STEP_BASE + any server index

US_PER_MS = 1_000
US_PER_S = 1_000_000


class SimEnvironment(simpy.Environment):
    """A SimPy environment whose clock counts integer microseconds from 0."""

    def __init__(self) -> None:
        super().__init__(initial_time=0)

    def run(self, until: int | Event | None = None):
        """:meth:`simpy.Environment.run`, with the processing of one event written into the loop.

        SimPy's ``run`` calls ``step()`` once per event; a run processes millions of events, and
        the call was about 1% of a run's time. The loop below does what ``step`` does, in the
        same order: take the next event off the queue, advance the clock, call its callbacks,
        and stop the run on an event that failed without anybody handling it. ``until`` works as
        in SimPy (a time or an event; SimPy's own ``run`` sets it up and processes the rest).
        """
        if until is not None:
            return super().run(until)
        queue = self._queue
        while queue:
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                _raise_failure(event)
        return None


class StepEvent(Event):
    """An event that fires after ``delay`` µs at a given (late) priority: a step boundary."""

    def __init__(self, env: simpy.Environment, delay: int, priority: int):
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        # env.schedule(self, priority, delay), inlined: once per server step
        heappush(env._queue, (env._now + delay, priority, next(env._eid), self))

    @classmethod
    def unscheduled(cls, env: simpy.Environment) -> StepEvent:
        """A step event not in the queue, as if processed: the first :meth:`again` schedules it."""
        event = cls.__new__(cls)
        event.env = env
        event.callbacks = None
        event._value = None
        event._ok = True
        return event

    def again(self, delay: int, priority: int) -> StepEvent:
        """This event, processed, scheduled once more ``delay`` µs from now: a server that
        sleeps step after step reuses one event instead of making one per step (a new event
        cost about as much as the rest of a step's sleep). Only for an event already processed
        that nothing else holds: a wait on it that was interrupted leaves it in the queue, so a
        sleep that may be interrupted takes a new event."""
        env = self.env
        self.callbacks = []
        heappush(env._queue, (env._now + delay, priority, next(env._eid), self))
        return self


def _raise_failure(event: Event) -> None:
    """SimPy's end of a run on a failed event nobody handled: raise a copy of its exception,
    caused by the original."""
    exc = type(event._value)(*event._value.args)
    exc.__cause__ = event._value
    raise exc


def fire_at_step_priority(env: simpy.Environment, event: Event, priority: int) -> None:
    """Trigger ``event`` now, but after every NORMAL event of this instant."""
    event._ok = True
    event._value = None
    env.schedule(event, priority, 0)


class _Start:
    """What a process's first segment is resumed with: an ok event carrying None."""

    __slots__ = ()
    _ok = True
    _value = None


_START = _Start()


class StartedProcess(Process):
    """A SimPy process whose first segment runs at once, inside its creator's step.

    ``env.process`` schedules an ``Initialize`` event (URGENT, at the current instant): the new
    process starts after its creator yields, ahead of every other event of the instant. A
    creator that makes one process per arrival pays one scheduled event per process for that.
    Started here, the first segment runs where the creator starts it; the event order is the
    same as with ``env.process`` when the creator starts its processes at the point where it
    would have yielded, after scheduling what it waits on next (the workload source does; see
    ``tests/test_started_process.py``). Everything after the first segment is an ordinary SimPy
    process: it waits on events, can be interrupted, and its end is an event.
    """

    def __init__(self, env: simpy.Environment, generator) -> None:
        self.env = env
        self.callbacks = []
        self._generator = generator
        creator = env._active_proc
        self._resume(_START)
        env._active_proc = creator  # _resume leaves no process active; the creator still runs
