"""``check_router`` and ``check_scorer``: the routing contracts."""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from servesim.testing.probes import OracleReadError, _is_int, _policy_cases, _snapshot_fields


def check_router(router_factory: Callable[[], Any], seed: int = 0) -> None:
    """Assert that the routers ``router_factory()`` builds meet the routing contract.

    Checked, over random decision sequences (all instances or a subset of them): ``route``
    returns the ``index`` of one of the snapshots it was given, as an int; it never reads a
    request's output length (the requests are :class:`ProbeRequest`); it does not modify the
    snapshots; and two routers built by the factory and bound with equally seeded generators
    make identical decisions (all randomness comes from the ``rng`` given to ``bind``). The
    router process's call order is followed: ``bind(n, rng)`` once, then ``route`` and
    ``observe(request, chosen)`` per request.
    """
    who = "check_router"

    def fail(prop: str, detail: str) -> AssertionError:
        return AssertionError(f"{who}({name}): {prop}: {detail}")

    def run(router: Any, num_instances: int, cases: list) -> list[int]:
        router.bind(num_instances, np.random.default_rng(seed))
        observe = getattr(router, "observe", None)
        decisions = []
        for request, snapshots in cases:
            before = [_snapshot_fields(s) for s in snapshots]
            try:
                chosen = router.route(request, snapshots)
            except OracleReadError as exc:
                raise fail(
                    "route() never reads a request's output length (INV-9)", str(exc)
                ) from exc
            except Exception as exc:  # a contract check reports, it does not crash
                raise fail(
                    "route() works on valid snapshots",
                    f"route({request!r}, {snapshots!r}) raised {exc!r}",
                ) from exc
            if not _is_int(chosen):
                raise fail(
                    "route() returns an int",
                    f"route({request!r}, ...) returned {chosen!r} ({type(chosen).__name__})",
                )
            present = [s.index for s in snapshots]
            if chosen not in present:
                raise fail(
                    "route() returns the index of a given snapshot",
                    f"returned {chosen} for candidates {present} (of {num_instances} instances)",
                )
            if [_snapshot_fields(s) for s in snapshots] != before:
                raise fail("route() leaves the snapshots unchanged", f"at request {request!r}")
            if observe is not None:
                try:
                    observe(request, int(chosen))
                except OracleReadError as exc:
                    raise fail(
                        "observe() never reads a request's output length (INV-9)", str(exc)
                    ) from exc
            decisions.append(int(chosen))
        return decisions

    first = router_factory()
    name = type(first).__name__
    for num_instances in (1, 2, 5):
        cases = _policy_cases(seed + num_instances, num_instances, 150)
        one = run(first if num_instances == 1 else router_factory(), num_instances, cases)
        two = run(router_factory(), num_instances, cases)
        _check_same(
            one,
            two,
            num_instances,
            fail,
            "decisions are deterministic for a given rng seed",
            lambda a, b: f"two routers bound with default_rng({seed}) chose {a} and {b}",
        )


def check_scorer(scorer: Any, seed: int = 0) -> None:
    """Assert that ``scorer`` meets the scorer contract of the weighted router.

    Checked, over random decision sequences: ``score`` returns one finite number in [0, 1] per
    snapshot; it never reads a request's output length (:class:`ProbeRequest`) nor modifies the
    snapshots; ``observe(request, chosen_index)`` accepts each decision; and, when the scorer
    can be deep-copied, a copy fed the same decisions gives the same scores (determinism).
    """
    name = type(scorer).__name__

    def fail(prop: str, detail: str) -> AssertionError:
        return AssertionError(f"check_scorer({name}): {prop}: {detail}")

    try:
        twin = copy.deepcopy(scorer)
    except Exception:  # not copyable: skip the determinism comparison
        twin = None

    def run(target: Any, cases: list) -> list[list[float]]:
        rng = np.random.default_rng(seed)
        out = []
        for request, snapshots in cases:
            before = [_snapshot_fields(s) for s in snapshots]
            try:
                scores = list(target.score(request, snapshots))
            except OracleReadError as exc:
                raise fail(
                    "score() never reads a request's output length (INV-9)", str(exc)
                ) from exc
            except Exception as exc:
                raise fail(
                    "score() works on valid snapshots",
                    f"score({request!r}, {snapshots!r}) raised {exc!r}",
                ) from exc
            if len(scores) != len(snapshots):
                raise fail(
                    "score() returns one score per snapshot",
                    f"{len(scores)} scores for {len(snapshots)} snapshots",
                )
            for value, s in zip(scores, snapshots):
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
                if not ok or not math.isfinite(value) or not 0.0 <= value <= 1.0:
                    raise fail(
                        "scores are finite numbers in [0, 1]",
                        f"score({request!r}, ...) gave {value!r} for {s!r}",
                    )
            if [_snapshot_fields(s) for s in snapshots] != before:
                raise fail("score() leaves the snapshots unchanged", f"at request {request!r}")
            chosen = snapshots[int(rng.integers(len(snapshots)))].index
            try:
                target.observe(request, chosen)
            except OracleReadError as exc:
                raise fail(
                    "observe() never reads a request's output length (INV-9)", str(exc)
                ) from exc
            out.append([float(v) for v in scores])
        return out

    for num_instances in (1, 2, 5):
        cases = _policy_cases(seed + num_instances, num_instances, 150)
        first = run(scorer, cases)
        if twin is not None:
            second = run(twin, cases)
            _check_same(
                first,
                second,
                num_instances,
                fail,
                "scores are deterministic",
                lambda a, b: f"a copy fed the same decisions scored {b} instead of {a}",
            )
            twin = copy.deepcopy(scorer) if num_instances < 5 else None


def _check_same(
    one: list,
    two: list,
    num_instances: int,
    fail: Callable[[str, str], AssertionError],
    prop: str,
    differ: Callable[[Any, Any], str],
) -> None:
    """Two runs of the same decisions must agree: where they first disagree, raise
    ``fail(prop, ...)`` naming both results (``differ``), the decision and the cluster size."""
    if one == two:
        return
    at = next((i for i, (a, b) in enumerate(zip(one, two)) if a != b), min(len(one), len(two)))
    raise fail(prop, f"{differ(one[at], two[at])} at decision {at} ({num_instances} instances)")
