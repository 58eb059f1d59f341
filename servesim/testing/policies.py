"""Contract checks for the one-method control-plane policies: admission, scheduler, preemption,
saturation detector and disaggregation decider.

Each ``check_<kind>(factory, seed=0)`` takes a zero-argument callable that builds the policy (a
class whose parameters all have defaults will do, or ``lambda: MyPolicy(3)``), feeds two fresh
policies the same random inputs and raises ``AssertionError("check_<kind>(Name): property:
detail")`` on the first broken property. Requests are :class:`~servesim.testing.ProbeRequest`, so
a policy that reads a request's output length fails (INV-9).
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from servesim.policies.snapshot import ClusterState
from servesim.testing.probes import (
    OracleReadError,
    ProbeRequest,
    _failer,
    _is_int,
    _policy_cases,
    _snapshot_fields,
)

_INSTANCE_COUNTS = (0, 1, 2, 5)
_DECISIONS = 120


def _call(fail: Callable[[str, str], AssertionError], method: str, call: Callable[[], Any]) -> Any:
    """Run one policy call, turning an output-length read or a crash into a named failure."""
    try:
        return call()
    except OracleReadError as exc:
        raise fail(f"{method} never reads a request's output length (INV-9)", str(exc)) from exc
    except AssertionError:
        raise
    except Exception as exc:  # a contract check reports, it does not crash
        raise fail(f"{method} works on valid inputs", f"raised {exc!r}") from exc


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _deterministic(fail, method: str, one: list, two: list, where: str) -> None:
    if one != two:
        at = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
        raise fail(
            "decisions are deterministic",
            f"two fresh policies fed the same inputs gave {one[at]!r} and {two[at]!r} from "
            f"{method} at call {at} ({where})",
        )


def _states(seed: int, num_instances: int) -> list[tuple[ProbeRequest, ClusterState]]:
    return [
        (request, ClusterState(request.arrival_us, snapshots, max_num_seqs=4))
        for request, snapshots in _policy_cases(seed + num_instances, num_instances, _DECISIONS)
        if snapshots or num_instances == 0
    ]


def check_admission(factory: Callable[[], Any], seed: int = 0) -> None:
    """``admit(request, state)`` returns a bool, reads no output length, leaves the cluster state
    unchanged, and two fresh policies admit identically (state such as a token bucket's level
    evolves deterministically with the requests and their arrival times)."""
    fail = _failer("check_admission", factory)

    def run(policy: Any, cases: list) -> list[bool]:
        out = []
        for request, state in cases:
            before = [_snapshot_fields(s) for s in state.snapshots]
            admitted = _call(fail, "admit()", lambda: policy.admit(request, state))  # noqa: B023
            if not _is_bool(admitted):
                raise fail(
                    "admit() returns a bool",
                    f"admit({request!r}, ...) returned {admitted!r} ({type(admitted).__name__})",
                )
            if [_snapshot_fields(s) for s in state.snapshots] != before:
                raise fail("admit() leaves the cluster state unchanged", f"at {request!r}")
            out.append(bool(admitted))
        return out

    for n in _INSTANCE_COUNTS[1:]:
        cases = _states(seed, n)
        _deterministic(
            fail, "admit()", run(factory(), cases), run(factory(), cases), f"{n} instances"
        )


def check_saturation(factory: Callable[[], Any], seed: int = 0) -> None:
    """``saturation(state)`` returns a finite number ≥ 0 (≥ 1 = saturated), also for a cluster
    with no routable instance; a detector marked ``never_saturates`` always returns 0; it leaves
    the state unchanged and is deterministic."""
    fail = _failer("check_saturation", factory)

    def run(detector: Any, cases: list) -> list[float]:
        out = []
        for _, state in cases:
            before = [_snapshot_fields(s) for s in state.snapshots]
            value = _call(fail, "saturation()", lambda: detector.saturation(state))  # noqa: B023
            real = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not real or not math.isfinite(value) or value < 0:
                raise fail(
                    "saturation() returns a finite number >= 0",
                    f"got {value!r} for {len(state.snapshots)} instances at {state.now_us} us",
                )
            if getattr(detector, "never_saturates", False) and value != 0:
                raise fail("a detector that never_saturates returns 0", f"got {value!r}")
            if [_snapshot_fields(s) for s in state.snapshots] != before:
                raise fail("saturation() leaves the cluster state unchanged", f"at {state.now_us}")
            out.append(float(value))
        return out

    for n in _INSTANCE_COUNTS:
        cases = _states(seed, n)
        one, two = run(factory(), cases), run(factory(), cases)
        _deterministic(fail, "saturation()", one, two, f"{n} instances")


def check_decider(factory: Callable[[], Any], seed: int = 0) -> None:
    """``disaggregate(request, decode_snapshot)`` returns a bool, reads no output length, leaves
    the snapshot unchanged, and two fresh deciders decide identically."""
    fail = _failer("check_decider", factory)

    def run(decider: Any, cases: list) -> list[bool]:
        out = []
        for request, snapshots in cases:
            decode = snapshots[request.id % len(snapshots)]
            before = _snapshot_fields(decode)
            split = _call(
                fail,
                "disaggregate()",
                lambda: decider.disaggregate(request, decode),  # noqa: B023
            )
            if not _is_bool(split):
                raise fail(
                    "disaggregate() returns a bool",
                    f"disaggregate({request!r}, ...) returned {split!r} ({type(split).__name__})",
                )
            if _snapshot_fields(decode) != before:
                raise fail("disaggregate() leaves the snapshot unchanged", f"at {request!r}")
            out.append(bool(split))
        return out

    for n in _INSTANCE_COUNTS[1:]:
        cases = _policy_cases(seed + n, n, _DECISIONS)
        _deterministic(fail, "disaggregate()", run(factory(), cases), run(factory(), cases), f"{n}")


class RunningProbe(ProbeRequest):
    """A :class:`ProbeRequest` with the progress an instance tracks: what a scheduler or a
    preemption policy may also read."""

    __slots__ = ("num_computed", "num_generated", "preemptions")

    def __init__(
        self,
        id: int,
        *args: Any,
        num_computed: int = 0,
        num_generated: int = 0,
        preemptions: int = 0,
        **kwargs: Any,
    ):
        super().__init__(id, *args, **kwargs)
        self.num_computed = num_computed
        self.num_generated = num_generated
        self.preemptions = preemptions


def _queues(seed: int) -> list[list[ProbeRequest]]:
    """Random wait queues in arrival order: mixed SLO classes and prompt lengths, many ties."""
    rng = np.random.default_rng(seed)
    classes = ["critical", "standard", "batch", "sheddable"]
    queues = []
    next_id = 0
    for size in (0, 1, 2, 3, 8, 20, 50):
        queue = []
        for i in range(size):
            slo = classes[int(rng.integers(len(classes)))]
            prompt = int(rng.choice([16, 64, 64, 512, 2048]))
            generated = int(rng.integers(0, 3)) * int(rng.integers(0, 40))
            queue.append(
                RunningProbe(
                    next_id,
                    arrival_us=1000 * (i // 2),  # pairs share an arrival instant
                    prompt_tokens=prompt,
                    slo_class=slo,
                    num_computed=(prompt + generated)
                    if generated
                    else int(rng.integers(0, 2)) * prompt,
                    num_generated=generated,
                    preemptions=int(rng.integers(0, 2)),
                )
            )
            next_id += 1
        queues.append(queue)
    return queues


def check_scheduler(factory: Callable[[], Any], seed: int = 0) -> None:
    """``order(waiting)`` reorders the deque in place: the same requests, each once (a
    permutation), none read for its output length; a scheduler with ``reorders = False`` leaves
    the queue as it is (the engine then skips the call); two fresh schedulers order identically.
    """
    fail = _failer("check_scheduler", factory)

    def run(scheduler: Any) -> list[list[int]]:
        out = []
        for queue in _queues(seed):
            waiting = deque(queue)
            result = _call(fail, "order()", lambda: scheduler.order(waiting))  # noqa: B023
            if result is not None:
                raise fail("order() reorders in place and returns None", f"returned {result!r}")
            if not isinstance(waiting, deque):
                raise fail("order() keeps the deque", f"got {type(waiting).__name__}")
            ids = [r.id for r in waiting]
            if sorted(ids) != [r.id for r in queue] or len(waiting) != len(queue):
                raise fail(
                    "order() returns a permutation of the waiting requests",
                    f"queue {[r.id for r in queue]} became {ids}",
                )
            if any(
                a is not b for a, b in zip(sorted(waiting, key=lambda r: r.id), queue, strict=True)
            ):
                raise fail("order() keeps the same request objects", "a request was replaced")
            if not getattr(scheduler, "reorders", True) and ids != [r.id for r in queue]:
                raise fail(
                    "a scheduler with reorders = False keeps arrival order",
                    f"queue {[r.id for r in queue]} became {ids}",
                )
            out.append(ids)
        return out

    _deterministic(fail, "order()", run(factory()), run(factory()), "same queues")


def check_preemption(factory: Callable[[], Any], seed: int = 0) -> None:
    """``victim(running)`` returns the index (an int) of one running request, reads no output
    length, leaves the batch unchanged, and two fresh policies pick identically."""
    fail = _failer("check_preemption", factory)

    def run(policy: Any) -> list[int]:
        out = []
        for queue in _queues(seed + 1):
            if not queue:
                continue
            running = list(queue)
            chosen = _call(fail, "victim()", lambda: policy.victim(running))  # noqa: B023
            if not _is_int(chosen):
                raise fail(
                    "victim() returns an int",
                    f"returned {chosen!r} ({type(chosen).__name__}) for {len(running)} requests",
                )
            if not 0 <= chosen < len(running):
                raise fail(
                    "victim() returns the index of a running request",
                    f"returned {chosen} for a batch of {len(running)}",
                )
            if running != queue:
                raise fail("victim() leaves the running batch unchanged", f"of {len(queue)}")
            out.append(int(chosen))
        return out

    _deterministic(fail, "victim()", run(factory()), run(factory()), "same batches")
