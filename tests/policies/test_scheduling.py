"""Instance schedulers (spec §4.6) and preemption victims (spec §2.4) as pure functions of
request lists."""

from __future__ import annotations

from collections import deque

import pytest

from servesim.policies.preemption import LastAdmitted, LowestPriority
from servesim.policies.scheduling import PriorityFCFS, ReversePriority, ShortestJobFirst
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext
from servesim.testing import ProbeRequest


def r(i, arrival_us=0, prompt_tokens=100, priority=3):
    return ProbeRequest(i, arrival_us=arrival_us, prompt_tokens=prompt_tokens, priority=priority)


def ids(queue):
    return [x.id for x in queue]


def test_priority_fcfs_serves_the_most_important_class_first_then_by_arrival():
    waiting = deque(
        [
            r(0, 10, priority=3),
            r(1, 5, priority=-1),
            r(2, 20, priority=4),
            r(3, 1, priority=3),
            r(4, 0, priority=4),
        ]
    )
    same = waiting
    PriorityFCFS().order(waiting)
    assert waiting is same  # reordered in place
    assert ids(waiting) == [4, 2, 3, 0, 1]


def test_priority_fcfs_breaks_equal_arrivals_by_id():
    waiting = deque([r(7, 5), r(2, 5), r(9, 5), r(1, 6)])
    PriorityFCFS().order(waiting)
    assert ids(waiting) == [2, 7, 9, 1]


def test_priority_fcfs_keeps_an_ordered_queue_unchanged():
    waiting = deque([r(0, 0, priority=4), r(1, 1, priority=3), r(2, 2, priority=3)])
    PriorityFCFS().order(waiting)
    assert ids(waiting) == [0, 1, 2]


def test_sjf_serves_the_shortest_prompt_first_then_by_arrival_and_id():
    waiting = deque(
        [r(0, 0, 500), r(1, 1, 20), r(2, 2, 500), r(3, 3, 20), r(5, 0, 500), r(4, 0, 500)]
    )
    ShortestJobFirst().order(waiting)
    assert ids(waiting) == [1, 3, 0, 4, 5, 2]


def test_reverse_priority_serves_the_least_important_first():
    waiting = deque([r(0, 0, priority=4), r(1, 1, priority=-3), r(2, 2, priority=3)])
    ReversePriority().order(waiting)
    assert ids(waiting) == [1, 2, 0]


def test_reordering_schedulers_are_registered_and_marked_as_reordering():
    for name in ("priority-fcfs", "sjf", "reverse-priority"):
        cls = registry.get("scheduler", name)
        assert cls.reorders and cls.name == name
        with pytest.raises(ScenarioError):
            cls.from_config({"x": 1}, PluginContext("policies.scheduler"))


# ------------------------------------------------------------------ preemption victims


def test_priority_victim_is_the_least_important_request():
    running = [r(0, 0, priority=3), r(1, 1, priority=-2), r(2, 2, priority=4), r(3, 3, priority=3)]
    assert LowestPriority().victim(running) == 1


def test_priority_victim_among_the_least_important_is_the_latest_arrival():
    running = [
        r(0, 0, priority=-1),
        r(1, 9, priority=-1),
        r(2, 4, priority=-1),
        r(3, 20, priority=4),
    ]
    assert LowestPriority().victim(running) == 1


def test_priority_victim_ties_go_to_the_tail_like_fcfs():
    running = [r(0, 5), r(1, 5), r(2, 5)]
    assert LowestPriority().victim(running) == 2 == LastAdmitted().victim(running)
    running = [
        r(0, 5, priority=-1),
        r(1, 5, priority=-1),
        r(2, 1, priority=-1),
        r(3, 9, priority=0),
    ]
    assert LowestPriority().victim(running) == 1


def test_priority_victim_with_one_running_request():
    assert LowestPriority().victim([r(0)]) == 0


def test_priority_preemption_is_registered():
    assert registry.get("preemption", "priority") is LowestPriority
