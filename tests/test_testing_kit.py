"""servesim.testing: the plugin-author checks accept good models and name what a bad one breaks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from servesim.latency.base import BatchSummary, LatencyModel
from servesim.simcore.registry import PluginContext, registry
from servesim.testing import check_latency_model


class Linear(LatencyModel):
    """A well-behaved model: 100 µs + 2 µs/prefill token + 5 µs/decode + context cost."""

    name = "linear-test"
    output_token_time_us = 3

    def step_time_us(self, batch: BatchSummary) -> int:
        return (
            100
            + 2 * batch.prefill_tokens
            + 5 * batch.decode_requests
            + batch.decode_context // 1000
        )

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return 10 + prompt_tokens // 100


def test_a_well_behaved_model_passes_including_the_default_fast_forward():
    check_latency_model(Linear())


def test_every_registered_latency_model_that_builds_without_params_passes():
    from servesim.latency.base import LatencyContext

    for name in registry("latency").names():
        cls = registry("latency").get(name)
        try:
            model = cls.from_config({}, LatencyContext("qwen3-14b", "H100", 1))
        except Exception:  # needs parameters; covered by its own tests
            continue
        check_latency_model(model)


class NonDeterministic(Linear):
    def __init__(self):
        self._counter = itertools.count()

    def step_time_us(self, batch):
        return super().step_time_us(batch) + next(self._counter) % 2


class ReturnsFloat(Linear):
    def step_time_us(self, batch):
        return 100.5


class ReturnsZeroWhenIdle(Linear):
    def step_time_us(self, batch):
        return 0 if batch.batch_size == 0 else super().step_time_us(batch)


class FasterWithMorePrefill(Linear):
    def step_time_us(self, batch):
        return max(1, 10_000 - batch.prefill_tokens)


class FasterWithMoreDecodes(Linear):
    def step_time_us(self, batch):
        return 5000 + 2 * batch.prefill_tokens - 3 * batch.decode_requests


class NegativeQueueing(Linear):
    def queueing_time_us(self, prompt_tokens):
        return -1


class FloatOutputTokenTime(Linear):
    output_token_time_us = 2.5  # type: ignore[assignment]


class WrongFastForward(Linear):
    def decode_steps_us(self, decode_requests, decode_context, k):
        # Forgets that contexts grow by decode_requests every step.
        return np.full(
            k,
            self.step_time_us(BatchSummary(0, (), decode_requests, decode_context)),
            dtype=np.int64,
        )


class FastForwardWrongDtype(Linear):
    def decode_steps_us(self, decode_requests, decode_context, k):
        return super().decode_steps_us(decode_requests, decode_context, k).astype(np.float64)


class Undescribable(Linear):
    def describe(self):
        return {"model": self.name, "array": object()}


@pytest.mark.parametrize(
    "model, prop",
    [
        (NonDeterministic(), "deterministic"),
        (ReturnsFloat(), "step_time_us returns an int"),
        (ReturnsZeroWhenIdle(), "at least 1"),
        (FasterWithMorePrefill(), "non-decreasing in prefill tokens"),
        (FasterWithMoreDecodes(), "non-decreasing in decode requests"),
        (NegativeQueueing(), "queueing_time_us returns an int >= 0"),
        (FloatOutputTokenTime(), "output_token_time_us is an int >= 0"),
        (WrongFastForward(), "decode_steps_us equals step-by-step"),
        (FastForwardWrongDtype(), "int64 array"),
        (Undescribable(), "JSON-serialisable"),
    ],
)
def test_each_broken_property_is_reported_by_name(model, prop):
    with pytest.raises(AssertionError) as err:
        check_latency_model(model)
    message = str(err.value)
    assert message.startswith(f"check_latency_model({type(model).__name__})")
    assert prop in message


# ------------------------------------------------------------------ one check per plugin kind

from collections import deque  # noqa: E402

from servesim.policies.admission import AdmissionPolicy  # noqa: E402
from servesim.policies.disaggregation import Decider  # noqa: E402
from servesim.policies.preemption import PreemptionPolicy  # noqa: E402
from servesim.policies.routing import RoutingPolicy  # noqa: E402
from servesim.policies.saturation import SaturationDetector  # noqa: E402
from servesim.policies.scheduling import Scheduler  # noqa: E402
from servesim.policies.scorers import Scorer  # noqa: E402
from servesim.testing import (  # noqa: E402
    check_admission,
    check_arrival,
    check_decider,
    check_length,
    check_preemption,
    check_router,
    check_saturation,
    check_scheduler,
    check_scorer,
)
from servesim.workloads.arrivals import ArrivalProcess, arrival_from_config  # noqa: E402
from servesim.workloads.lengths import LengthDistribution, length_from_config  # noqa: E402

POLICY_CHECKS = {
    "admission": check_admission,
    "scheduler": check_scheduler,
    "preemption": check_preemption,
    "saturation": check_saturation,
    "disaggregation": check_decider,
}
ARRIVAL_PARAMS = {"gamma": {"cv": 2.0}, "weibull": {"cv": 1.5}}
LENGTH_PARAMS = {
    "constant": 128,
    "uniform": {"type": "uniform", "min": 10, "max": 500},
    "gaussian": {"type": "gaussian", "mean": 512, "std_dev": 100},
    "lognormal": {"type": "lognormal", "mean": 512, "std_dev": 200},
    "exponential": {"type": "exponential", "mean": 300},
    "empirical": {"type": "empirical", "values": {"100": 0.5, "900": 0.5}},
}


@pytest.mark.parametrize(
    "kind, name",
    [(kind, name) for kind in POLICY_CHECKS for name in registry(kind).names()],
)
def test_every_builtin_policy_passes_its_kinds_check(kind, name):
    cls = registry(kind).get(name)
    POLICY_CHECKS[kind](lambda: cls.from_config({}, PluginContext(f"policies.{kind}")))


@pytest.mark.parametrize("name", registry("arrival").names())
def test_every_builtin_arrival_process_passes_check_arrival(name):
    params = {"process": name, **ARRIVAL_PARAMS.get(name, {})}
    check_arrival(arrival_from_config(params, 20.0, "workload.arrival"))


@pytest.mark.parametrize("name", registry("length").names())
def test_every_builtin_length_distribution_passes_check_length(name):
    check_length(length_from_config(LENGTH_PARAMS[name], "workload.prompt_tokens"))


# Planted faults: one per kind, each a small subclass that breaks one promise.


class ReadsTheOutputLength(AdmissionPolicy):
    def admit(self, request, state):
        return request.oracle_output_tokens < 100


class AdmitsWithANumber(AdmissionPolicy):
    def admit(self, request, state):
        return 1


class DropsARequest(Scheduler):
    def order(self, waiting: deque) -> None:
        if len(waiting) > 2:
            waiting.pop()


class ClaimsArrivalOrderButSorts(Scheduler):
    reorders = False

    def order(self, waiting: deque) -> None:
        items = sorted(waiting, key=lambda r: r.prompt_tokens)
        waiting.clear()
        waiting.extend(items)


class VictimPastTheEnd(PreemptionPolicy):
    def victim(self, running):
        return len(running)


class NegativeSaturation(SaturationDetector):
    def saturation(self, state):
        return -1.0 if state.snapshots else 0.0


class CrashesWithNoInstance(SaturationDetector):
    def saturation(self, state):
        return max(s.queue_depth for s in state.snapshots) / 5


class RandomDecider(Decider):
    def __init__(self):
        self.rng = np.random.default_rng()  # unseeded: two deciders disagree

    def disaggregate(self, request, decode):
        return bool(self.rng.random() < 0.5)


class RoutesOutOfRange(RoutingPolicy):
    def route(self, request, snapshots):
        return len(snapshots) + 7


class RoutesByTheGlobalRng(RoutingPolicy):
    def route(self, request, snapshots):
        return snapshots[np.random.randint(len(snapshots))].index


class ScoresByTheGlobalRng(Scorer):
    name = "global-random"

    def score(self, request, snapshots):
        return [float(np.random.random()) for _ in snapshots]


class ScoresAboveOne(Scorer):
    name = "above-one"

    def score(self, request, snapshots):
        return [2.0 for _ in snapshots]


class FloatIats(ArrivalProcess):
    name = "float-iats"

    def sample_iats_us(self, rng, n):
        return rng.exponential(self.mean_iat_us, n)


class GlobalRandomIats(ArrivalProcess):
    name = "global-random"

    def sample_iats_us(self, rng, n):
        return np.maximum(1, np.random.exponential(self.mean_iat_us, n)).astype(np.int64)


class ZeroLengths(LengthDistribution):
    name = "zeros"

    @classmethod
    def from_config(cls, params, ctx):
        return cls()

    def sample(self, rng, n):
        return np.zeros(n, dtype=np.int64)


class WrongMean(LengthDistribution):
    name = "wrong-mean"

    @classmethod
    def from_config(cls, params, ctx):
        return cls()

    @property
    def mean(self):
        return 1000.0

    def sample(self, rng, n):
        return rng.integers(1, 100, n, dtype=np.int64)


@pytest.mark.parametrize(
    "check, target, prop",
    [
        (check_admission, ReadsTheOutputLength, "never reads a request's output length"),
        (check_admission, AdmitsWithANumber, "admit() returns a bool"),
        (check_scheduler, DropsARequest, "permutation of the waiting requests"),
        (check_scheduler, ClaimsArrivalOrderButSorts, "reorders = False keeps arrival order"),
        (check_preemption, VictimPastTheEnd, "index of a running request"),
        (check_saturation, NegativeSaturation, "finite number >= 0"),
        (check_saturation, CrashesWithNoInstance, "saturation() works on valid inputs"),
        (check_decider, RandomDecider, "deterministic"),
        (check_router, RoutesOutOfRange, "index of a given snapshot"),
        (check_router, RoutesByTheGlobalRng, "deterministic for a given rng seed"),
        (check_scorer, ScoresByTheGlobalRng(), "scores are deterministic"),
        (check_scorer, ScoresAboveOne(), "in [0, 1]"),
        (check_arrival, FloatIats(1000.0), "int64 array"),
        (check_arrival, GlobalRandomIats(1000.0), "deterministic"),
        (check_length, ZeroLengths(), "lengths are in [1, 2**31 - 1]"),
        (check_length, WrongMean(), "sample mean matches the declared mean"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", None) or type(v).__name__,
)
def test_each_kinds_check_catches_a_planted_fault(check, target, prop):
    with pytest.raises(AssertionError) as err:
        check(target)
    message = str(err.value)
    assert message.startswith(f"{check.__name__}("), message
    assert prop in message, message


def test_the_kit_has_one_check_per_plugin_kind():
    import servesim.testing as kit

    kinds = {
        "admission": "check_admission",
        "scheduler": "check_scheduler",
        "preemption": "check_preemption",
        "saturation": "check_saturation",
        "autoscaler": "check_autoscaler",
        "disaggregation": "check_decider",
        "scorer": "check_scorer",
        "routing": "check_router",
        "latency": "check_latency_model",
        "arrival": "check_arrival",
        "length": "check_length",
    }
    from servesim.simcore.registry import KINDS

    assert set(kinds) == set(KINDS) - {"trace_format"}  # trace readers have their own tests
    for check in kinds.values():
        assert callable(getattr(kit, check)), check
        assert check in kit.__all__


@pytest.mark.parametrize(
    "check, target, said",
    [
        (check_router, RoutesByTheGlobalRng, r"default_rng\(0\) chose \d+ and \d+ at decision \d+"),
        (check_scorer, ScoresByTheGlobalRng(), r"scored \[.*\] instead of \[.*\] at decision \d+"),
    ],
    ids=["router", "scorer"],
)
def test_a_nondeterministic_policy_is_told_where_two_runs_first_differ(check, target, said):
    with pytest.raises(AssertionError, match=said + r" \(\d instances\)"):
        check(target)
