"""The instance scheduler process: vLLM's engine loop as one SimPy process per instance.

Loop: form a batch (``Engine.form_batch``), sleep for the step time, apply its progress
(``Engine.end_step``); sleep on an idle event when there is no work (work conservation: an
enqueue wakes the instance in the same instant). At most one event per step; while the batch is
in steady decode the engine computes a whole window of steps and the process sleeps once
(fast-forward). An enqueue during a window truncates it at the first step boundary at or after
the enqueue instant, exactly where a step-by-step run would first see the new request. A change
to the instance's KV from outside (a reservation for an incoming transfer, a back-pressure
release) settles the window first: the steps that ended are applied and the step in flight is
formed, as they would be step by step. A boundary at the current instant counts as passed when
a later-priority instance's step at this instant has already run (the shared step mark).

Same instant (see :mod:`servesim.simcore.env`): a step ends at the instance's step priority and
its batch is formed at the (later) formation priority, after every other event of the instant —
so a request enqueued at the boundary joins the batch even when the enqueue was caused by this
very step (a completion that releases the gateway, or a session round with no think time). The
formation costs a second event only when something else is scheduled at that instant.
"""

from __future__ import annotations

import numpy as np
import simpy
from simpy.events import Event
from simpy.exceptions import Interrupt

from servesim.components.engine import Engine
from servesim.components.request import Request
from servesim.simcore.env import FORM_BASE, STEP_BASE, StepEvent, fire_at_step_priority

MAX_WINDOW_STEPS = 1 << 16
# A window costs a few numpy calls (~20 µs) and is cut short by the next arrival; a step costs
# ~10 µs. Shorter windows than this are simulated step by step (identical results, less work).
MIN_WINDOW_STEPS = 16


class Instance:
    """One serving instance: an :class:`Engine` driven by a SimPy process."""

    def __init__(self, env: simpy.Environment, engine: Engine, *, exact_steps: bool = False):
        self.env = env
        self.engine = engine
        self.index = engine.index
        self.exact_steps = exact_steps
        self.min_window_steps = MIN_WINDOW_STEPS
        self.priority = STEP_BASE + engine.index  # its step ends
        self.form_priority = FORM_BASE + engine.index  # its batch formations
        # form the next batch at the formation priority when other events share the step's end
        # instant; a cluster where no completion can cause an enqueue in its own instant (no
        # gateway, sessions or disaggregation) turns this off: the order would be the same
        self.defer_forming = True
        # whether the consequences of this instance's own step end (its completions' events) may
        # touch it in the same instant (enqueue here, reserve or release KV here, read its state
        # to route). When they cannot and no other event shares the instant, the next batch is
        # formed at once: nothing left in the instant could see the difference. The cluster
        # replaces this conservative default with what its configuration allows.
        self.touched_by_own_step = _always
        self._idle: Event | None = None
        self._window_ends: np.ndarray | None = None
        self._window_steps = 0
        self._target = 0  # end of the window's last step (it moves when the window is cut)
        self._mark = _step_mark(env)
        self._arrivals: list[int] = []  # requests queued inside the window: 2 t + passed
        self.windows = 0  # fast-forwarded windows taken (diagnostics)
        # disaggregated serving: called with this instance's index after a step that made room
        # for KV transfers waiting to start (the decode engine re-checks them after every step)
        self.on_room = None
        # autoscaling: called with this instance's index when it runs out of work (a draining
        # instance stops then); None: nobody asks
        self.on_idle = None
        self.process = env.process(self._run())

    @property
    def latency(self):
        return self.engine.latency

    def enqueue(self, req: Request) -> None:
        """A request reaches the instance's wait queue (after its α queueing delay)."""
        if self.engine.add_request(req, self.env.now):
            if self._window_ends is not None:
                self._note_arrival()
            self._wake()

    def reserve_remote(self, req: Request) -> int:
        """Disaggregated serving: reserve KV for ``req``'s prompt before it is transferred here
        (see :meth:`Engine.reserve_remote`). Settles a fast-forwarded window first: the steps
        that ended are applied and the step in flight is formed, so the reservation takes its
        blocks after theirs, as it does step by step."""
        now = self.env.now
        if self._window_ends is not None:
            self._settle_window(now)
        return self.engine.reserve_remote(req, now, self.engine.kv.free_count)

    def enqueue_remote(self, req: Request) -> None:
        """The transferred KV has arrived: ``req`` joins the wait queue to decode (no α delay)."""
        self.engine.add_remote(req, self.env.now)
        if self._window_ends is not None:
            self._note_arrival()
        self._wake()

    def release_held(self, req: Request) -> None:
        """Back-pressure: free the KV a finished prefill kept here (its transfer is done); a
        queue head waiting for room may now be admitted."""
        if self._window_ends is not None:
            self._settle_window(self.env.now)
        self.engine.release_held(req, self.env.now)
        self._wake()

    def _note_arrival(self) -> None:
        """A request joined the wait queue inside a window: remember when, as ``2 t + passed``,
        so that settling can tell which batch formations it was there for."""
        now = self.env.now
        self._arrivals.append(2 * now + self._boundary_passed(now))

    def _hide_arrivals_after(self, end: int) -> list[Request]:
        """Take off the queue's tail the requests a step-by-step formation at ``end`` did not
        see yet: those that arrived after ``end``, or at ``end`` after the boundary passed."""
        engine = self.engine
        waiting = engine.waiting
        arrivals = self._arrivals
        late = []
        while arrivals and arrivals[-1] > 2 * end:
            arrivals.pop()
            r = waiting.pop()
            if r.remote_kv:  # at `end` its KV was still being transferred into its reservation
                engine.reserved[r.id] = r
            late.append(r)
        return late

    def _restore_arrivals(self, late: list[Request]) -> None:
        engine = self.engine
        for r in reversed(late):
            if r.remote_kv:
                del engine.reserved[r.id]
            engine.waiting.append(r)

    def _boundary_passed(self, now: int) -> bool:
        """Whether a step boundary of this instance at ``now`` has been processed by now, as it
        would have been step by step: a later-priority instance's step at ``now`` has run."""
        mark = self._mark
        return mark.time == now and mark.priority > self.priority

    def _wake(self) -> None:
        if self._idle is not None:
            idle, self._idle = self._idle, None
            fire_at_step_priority(self.env, idle, self.form_priority)
        elif self._window_ends is not None:
            self._truncate_window(self.env.now)

    def kv_used_at(self, now: int) -> int:
        """KV blocks in use at ``now`` as a step-by-step run would show them to an event at ``now``.

        Inside a fast-forwarded window, the steps that began before ``now`` have allocated their
        blocks; a step beginning exactly at ``now`` has not yet (batch formation comes after
        every other event of the instant).
        """
        kv = self.engine.kv
        used = kv.total_blocks - kv.free_count
        ends = self._window_ends
        if ends is None:
            return used
        # step s+i starts at ends[i-1]; count the steps after s that started before now (or at
        # now, when this instance's step boundary at now has already passed)
        side = "right" if self._boundary_passed(now) else "left"
        started = int(np.searchsorted(ends[: self._window_steps - 1], now, side=side))
        if started:
            used += int(self.engine.window_needs[started - 1])
        return used

    def settle(self, now: int) -> None:
        """At the end of a run (horizon or interrupt): apply the window's steps that ended by ``now``.

        Leaves the engine exactly as a step-by-step run would: those steps applied and logged,
        and the step in flight at ``now`` formed (its KV allocated).
        """
        ends = self._window_ends
        if ends is None:
            return
        self._window_ends = None
        steps = min(int(np.searchsorted(ends, now, side="right")), self._window_steps)
        if steps == 0:
            return
        end = int(ends[steps - 1])
        engine = self.engine
        # requests that reached the queue after `end` were not there when those steps ended
        late = self._hide_arrivals_after(end)
        engine.end_step(end, steps, ends[:steps])
        if engine.has_work():
            engine.form_batch(end)
        self._restore_arrivals(late)

    def _truncate_window(self, now: int) -> None:
        # the step in flight at `now` is the last one of the window: the first that ends at or
        # after `now` (after `now`, when this instance's boundary at `now` has already passed)
        side = "right" if self._boundary_passed(now) else "left"
        steps = int(np.searchsorted(self._window_ends, now, side=side)) + 1
        if steps < self._window_steps:
            self._window_steps = steps
            self._target = int(self._window_ends[steps - 1])
            self.process.interrupt()

    def _settle_window(self, now: int) -> None:
        """Leave the fast-forwarded window at ``now`` as a step-by-step run would be at ``now``:
        the steps that ended are applied and logged, the step in flight is formed (its KV
        allocated), and the process ends that step as an ordinary one. Needed before anything
        outside changes this instance's KV (a reservation, a release): the window's steps must
        take their blocks, and log their use, before the change."""
        ends = self._window_ends
        passed = self._boundary_passed(now)
        in_flight = self._window_steps - 1
        m = int(np.searchsorted(ends[:in_flight], now, side="right" if passed else "left"))
        self._window_ends = None
        if m == 0:  # the window's first step (formed at its start) is the one in flight
            target = int(ends[0])
        else:
            end = int(ends[m - 1])
            engine = self.engine
            late = self._hide_arrivals_after(end)
            engine.end_step(end, m, ends[:m])
            target = end + engine.form_batch(end)
            self._restore_arrivals(late)
        if target != self._target:
            self._target = target
            self.process.interrupt()

    def _run(self):
        env = self.env
        engine = self.engine
        priority = self.priority
        form_priority = self.form_priority
        defer = self.defer_forming
        exact = self.exact_steps
        mark = self._mark
        queue = env._queue  # the event queue: `queue and queue[0][0]` is env.peek(), inlined
        # the event of the single steps and deferred formations, reused from one to the next:
        # nothing interrupts those sleeps (only a window's, which takes its own event)
        step = StepEvent.unscheduled(env)
        while True:
            if not engine.has_work():
                self._idle = Event(env)
                if self.on_idle is not None:
                    self.on_idle(self.index)
                yield self._idle
                mark.passed(env.now, priority)
                continue
            now = env.now
            dt = engine.form_batch(now)
            if not engine.running and engine.batch_empty():  # (empty needs nothing running)
                # the queue head waits for KV held by transfers in flight: sleep until one lands
                engine.cancel_step(now)
                self._idle = Event(env)
                yield self._idle
                mark.passed(env.now, priority)
                continue
            cumulative = None if exact else engine.window(MAX_WINDOW_STEPS, self.min_window_steps)
            if cumulative is None:
                yield step.again(dt, priority)
                end = now + dt
                # other events at this instant, not caused by this step (another instance's step
                # end, a deferred formation); read before end_step schedules this step's own
                shared = defer and bool(queue) and queue[0][0] == end
                if mark.time != end:  # mark.passed(end, priority), inlined on the hot path
                    mark.time = end
                    mark.priority = priority
                elif mark.priority < priority:
                    mark.priority = priority
                engine.end_step(end)
            else:
                ends = cumulative + now
                self._window_ends = ends
                self._arrivals.clear()
                self._window_steps = len(ends)
                self._target = int(ends[-1])
                self.windows += 1
                while True:
                    try:
                        yield StepEvent(env, self._target - env.now, priority)
                        break
                    except Interrupt:
                        pass  # the window was cut or settled: self._target moved
                mark.passed(env.now, priority)
                shared = defer and bool(queue) and queue[0][0] == env.now
                target = self._target
                if self._window_ends is None:  # settled: one ordinary step was left in flight
                    engine.end_step(target)
                else:
                    self._window_ends = None
                    steps = self._window_steps
                    engine.end_step(target, steps, ends[:steps])
            if engine.room_for_transfers:
                engine.room_for_transfers = False
                if self.on_room is not None:
                    self.on_room(self.index)
            if (
                defer
                and queue
                and queue[0][0] == env.now
                and engine.has_work()
                and (shared or self.touched_by_own_step())
            ):
                # something else happens at this boundary that may touch this instance (another
                # instance's step end, this step's completions): form the next batch after it
                yield step.again(0, form_priority)


def _always() -> bool:
    return True


class _StepMark:
    """The latest step-priority instant processed in one environment: (time, highest priority).

    Step boundaries inside a fast-forward window have no event; an instance tells from this mark
    whether its boundary at the current instant would already have been processed (a step of a
    later-priority instance at this instant has run), as the step-by-step run orders them.
    """

    __slots__ = ("time", "priority")

    def __init__(self) -> None:
        self.time = -1
        self.priority = 0

    def passed(self, now: int, priority: int) -> None:
        if now != self.time:
            self.time = now
            self.priority = priority
        elif priority > self.priority:
            self.priority = priority


def _step_mark(env: simpy.Environment) -> _StepMark:
    """The environment's step mark, shared by all its instances (created by the first one)."""
    mark = getattr(env, "_servesim_step_mark", None)
    if mark is None:
        mark = _StepMark()
        env._servesim_step_mark = mark
    return mark
