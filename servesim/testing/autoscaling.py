"""The contract check of the autoscaler kind: :func:`check_autoscaler`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from servesim.policies.autoscaling import FleetSignals
from servesim.testing.policies import _call, _deterministic
from servesim.testing.probes import _failer, _is_int

_SAMPLES = 200


def _signals(seed: int) -> list[FleetSignals]:
    """Random fleet samples, one interval (10 s) apart: idle fleets, loaded ones, fleets with
    instances starting and draining, samples where no request ended and where all missed."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(_SAMPLES):
        ready = int(rng.integers(1, 9))
        finished = int(rng.integers(0, 50)) if rng.random() < 0.8 else 0
        out.append(
            FleetSignals(
                now_us=i * 10_000_000,
                ready=ready,
                starting=int(rng.integers(0, 3)),
                draining=int(rng.integers(0, 2)),
                queue_depth=int(rng.integers(0, 60)) if rng.random() < 0.7 else 0,
                in_flight=int(rng.integers(0, 400)),
                kv_utilization=float(rng.random()),
                finished=finished,
                attained=int(rng.integers(0, finished + 1)),
            )
        )
    return out


def _fields(signals: FleetSignals) -> tuple:
    return attrs.astuple(signals)


def check_autoscaler(factory: Callable[[], Any], seed: int = 0) -> None:
    """``desired(signals)`` returns an int ≥ 0, leaves the signals unchanged and is
    deterministic (two fresh policies fed the same samples answer alike); a policy that sets
    ``needs_ttft`` has a positive integer ``ttft_target_us``."""
    fail = _failer("check_autoscaler", factory)

    def run(policy: Any, cases: list[FleetSignals]) -> list[int]:
        if getattr(policy, "needs_ttft", False):
            target = getattr(policy, "ttft_target_us", None)
            if not _is_int(target) or target <= 0:
                raise fail(
                    "a policy with needs_ttft has a positive int ttft_target_us", f"{target!r}"
                )
        answers = [answer(policy, signals) for signals in cases]
        for wanted, signals in zip(answers, cases):
            if not _is_int(wanted) or wanted < 0:
                raise fail(
                    "desired() returns an int >= 0",
                    f"returned {wanted!r} ({type(wanted).__name__}) for {signals!r}",
                )
        return [int(wanted) for wanted in answers]

    def answer(policy: Any, signals: FleetSignals) -> Any:
        before = _fields(signals)
        wanted = _call(fail, "desired()", lambda: policy.desired(signals))
        if _fields(signals) != before:
            raise fail("desired() leaves the signals unchanged", f"at {signals!r}")
        return wanted

    cases = _signals(seed)
    _deterministic(fail, "desired()", run(factory(), cases), run(factory(), cases), "same samples")
