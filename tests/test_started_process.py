"""StartedProcess: a SimPy process whose first segment runs at its creation (simcore/env.py).

The workload source starts each request's process this way instead of ``env.process`` (which
schedules an Initialize event). These tests pin what the source relies on: the first segment runs
at once, in the creator's instant; the creator stays the active process; afterwards the process is
an ordinary SimPy process (waits, interrupts, its end is an event); and a source built either way
produces the same event order.
"""

from __future__ import annotations

import simpy

from servesim.simcore.env import SimEnvironment, StartedProcess


def test_first_segment_runs_at_creation_and_the_creator_stays_active():
    env = SimEnvironment()
    seen: list = []

    def child(tag):
        seen.append((tag, env.now, env.active_process))
        yield env.timeout(5)
        seen.append((tag, env.now, "resumed"))
        return tag

    def creator():
        yield env.timeout(3)
        me = env.active_process
        proc = StartedProcess(env, child("c"))
        # the child's first segment already ran, with itself as the active process
        assert seen == [("c", 3, proc)]
        assert env.active_process is me
        value = yield proc  # its end is an ordinary event
        seen.append(("creator", env.now, value))

    env.process(creator())
    env.run()
    assert seen[1:] == [("c", 8, "resumed"), ("creator", 8, "c")]


def test_a_started_process_can_be_interrupted_after_its_first_segment():
    env = SimEnvironment()
    log: list = []

    def child():
        try:
            yield env.timeout(100)
        except simpy.Interrupt as exc:
            log.append((env.now, exc.cause))

    def creator():
        proc = StartedProcess(env, child())
        yield env.timeout(7)
        proc.interrupt("stop")

    env.process(creator())
    env.run()
    assert log == [(7, "stop")]


def _source_trace(start) -> list:
    """A source that makes processes at arrival times (two at one instant) beside another
    process with events at the same instants: the global order of what happens. With
    ``env.process`` the source calls it at each creation; with StartedProcess it starts the
    processes made at an instant when it is about to yield, after scheduling its next wake-up
    (what the workload source does)."""
    env = SimEnvironment()
    order: list = []

    def request(i):
        order.append(("start", i, env.now))
        yield env.timeout(2)
        order.append(("done", i, env.now))

    def other():
        for t in (4, 6):
            yield env.timeout(t - env.now)
            order.append(("other", env.now))

    def source():
        made = []
        for i, at in enumerate((1, 4, 4, 6, 9)):
            if at > env.now:
                timer = env.timeout(at - env.now)
                for gen in made:
                    StartedProcess(env, gen)
                made.clear()
                yield timer
            order.append(("made", i, env.now))
            if start is None:
                made.append(request(i))
            else:
                start(env, request(i))
        for gen in made:
            StartedProcess(env, gen)

    env.process(other())
    env.process(source())
    env.run()
    return order


def test_the_order_is_the_same_as_with_env_process():
    """Same-instant events (the request's timeout vs the source's next wake-up at 6; two
    requests made at 4) come out in the same order either way."""
    assert _source_trace(None) == _source_trace(lambda env, gen: env.process(gen))


def test_starting_at_creation_would_change_the_order():
    """Why the source starts its processes just before it yields: started at creation, a
    request's first event is scheduled before the source's next wake-up and overtakes it at a
    shared instant (request 1's end and request 3's arrival, both at 6)."""
    assert _source_trace(StartedProcess) != _source_trace(lambda env, gen: env.process(gen))
