"""SimEnvironment.run processes events itself (no step() call per event): the same events in the
same order as SimPy's own run, the same end on a failure, and ``until`` as in SimPy."""

from __future__ import annotations

import random
from array import array

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.components.record import STEP_COLUMNS, STEP_ROW, RequestTable
from servesim.simcore.env import SimEnvironment, StepEvent


def _world(env: simpy.Environment, seed: int, log: list) -> None:
    """Processes that sleep, wait on each other's events and interrupt each other, logging
    (time, who, what) at every resume."""
    rng = random.Random(seed)
    shared = [env.event() for _ in range(3)]

    def worker(name: int):
        for k in range(rng.randint(1, 6)):
            choice = rng.random()
            try:
                if choice < 0.5:
                    yield env.timeout(rng.randint(0, 5))
                elif choice < 0.7:
                    yield StepEvent(env, rng.randint(0, 3), 2 + name)
                else:
                    event = shared[rng.randrange(3)]
                    if not event.triggered and rng.random() < 0.5:
                        event.succeed(name)
                    yield env.timeout(1)
            except simpy.Interrupt:
                log.append((env.now, name, "interrupted"))
            log.append((env.now, name, k))

    processes = [env.process(worker(i)) for i in range(rng.randint(1, 5))]

    def interrupter():
        yield env.timeout(rng.randint(0, 4))
        target = processes[rng.randrange(len(processes))]
        if target.is_alive:
            target.interrupt()

    env.process(interrupter())


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_same_events_in_the_same_order_as_simpy(seed: int) -> None:
    ours: list = []
    theirs: list = []
    env = SimEnvironment()
    _world(env, seed, ours)
    env.run()
    reference = simpy.Environment(initial_time=0)
    _world(reference, seed, theirs)
    reference.run()
    assert ours == theirs
    assert env.now == reference.now


def test_an_unhandled_failure_ends_the_run_as_in_simpy() -> None:
    env = SimEnvironment()

    def failing():
        yield env.timeout(3)
        raise ValueError("bad step", 7)

    env.process(failing())
    with pytest.raises(ValueError) as caught:
        env.run()
    assert caught.value.args == ("bad step", 7)
    assert isinstance(caught.value.__cause__, ValueError)  # SimPy's copy, caused by the original
    assert env.now == 3


def test_until_still_stops_the_run() -> None:
    env = SimEnvironment()
    seen = []

    def ticker():
        while True:
            seen.append(env.now)
            yield env.timeout(10)

    env.process(ticker())
    env.run(until=25)
    assert seen == [0, 10, 20] and env.now == 25


def test_packed_rows_hold_the_same_bytes_as_extended_ones() -> None:
    values = tuple(range(-3, len(STEP_COLUMNS) - 3))
    packed = array("q")
    packed.frombytes(STEP_ROW(*values))
    assert packed == array("q", values)
    table = RequestTable()
    row = tuple(range(1, table.width + 1))
    table.append(row)
    assert table.rows == array("q", row)


def test_a_request_row_of_the_wrong_width_is_refused() -> None:
    table = RequestTable()
    with pytest.raises(Exception, match=str(table.width)):
        table.append(tuple(range(table.width - 1)))


def test_a_reused_step_event_wakes_its_process_at_each_sleep() -> None:
    env = SimEnvironment()
    woke = []

    def server():
        step = StepEvent.unscheduled(env)
        assert not env._queue  # made without being scheduled
        for dt in (3, 0, 5):
            yield step.again(dt, 2)
            woke.append(env.now)

    env.process(server())
    env.run()
    assert woke == [3, 3, 8]
