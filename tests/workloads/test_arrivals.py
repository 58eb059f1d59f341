"""Arrival processes: IAT means and CVs against theory, integer microseconds, config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.simcore.errors import ScenarioError, UnknownPluginError
from servesim.simcore.registry import registry
from servesim.workloads.arrivals import (
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
    WeibullArrivals,
    arrival_from_config,
    weibull_cv,
    weibull_shape_for_cv,
)

N = 200_000
RATE = 10.0  # req/s -> mean IAT 100,000 µs, so truncation to whole µs is negligible
MEAN_US = 1e6 / RATE


def draw(config, rate=RATE, seed=7, n=N):
    process = arrival_from_config(config, rate, "workload.arrival")
    iats = process.sample_iats_us(np.random.default_rng(seed), n)
    return process, iats


def mean_cv(iats):
    x = iats.astype(np.float64)
    return x.mean(), x.std() / x.mean()


def test_builtin_processes_are_registered():
    assert {"poisson", "constant", "gamma", "weibull"} <= set(registry("arrival").names())


def test_poisson_iats_have_the_rate_mean_and_cv_one():
    process, iats = draw("poisson")
    mean, cv = mean_cv(iats)
    assert isinstance(process, PoissonArrivals)
    assert mean == pytest.approx(MEAN_US, rel=0.01)
    assert cv == pytest.approx(1.0, rel=0.02)


def test_missing_arrival_means_poisson():
    assert isinstance(arrival_from_config(None, RATE, "workload.arrival"), PoissonArrivals)


def test_constant_iats_are_the_truncated_period_and_draw_nothing():
    rng = np.random.default_rng(1)
    before = rng.bit_generator.state
    process = arrival_from_config("constant", 3.0, "workload.arrival")
    iats = process.sample_iats_us(rng, 1000)
    assert rng.bit_generator.state == before
    assert isinstance(process, ConstantArrivals)
    assert (iats == 333_333).all()  # trunc(1e6 / 3)
    assert mean_cv(iats)[1] == 0.0


def test_constant_iat_is_at_least_one_microsecond_at_the_highest_rate():
    _, iats = draw("constant", rate=1e6, n=10)
    assert (iats == 1).all()


@pytest.mark.parametrize("rate", [5e6, 1e-300])
def test_rates_the_clock_cannot_represent_are_refused(rate):
    # Above 1e6/s the 1 µs gap floor would silently slow the stream; below 1e6/2**62 no
    # request arrives before the clock ends.
    with pytest.raises(ScenarioError, match="rate"):
        draw("constant", rate=rate, n=10)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_iats_match_the_requested_mean_and_cv(cv):
    process, iats = draw({"process": "gamma", "cv": cv})
    mean, got_cv = mean_cv(iats)
    assert process.shape == pytest.approx(1 / cv**2)
    assert process.cv == pytest.approx(cv)
    assert mean == pytest.approx(MEAN_US, rel=0.02 * max(1.0, cv))
    assert got_cv == pytest.approx(cv, rel=0.03 * max(1.0, cv))


def test_gamma_with_explicit_shape_and_scale_takes_its_mean_from_them():
    process, iats = draw({"process": "gamma", "shape": 2.0, "scale": 0.025})  # scale in seconds
    assert process.mean_iat_us == pytest.approx(50_000)
    assert process.rate == pytest.approx(20.0)
    mean, cv = mean_cv(iats)
    assert mean == pytest.approx(50_000, rel=0.01)
    assert cv == pytest.approx(1 / math.sqrt(2), rel=0.02)


def test_gamma_with_tiny_shape_falls_back_to_poisson_like_blis():
    process, iats = draw({"process": "gamma", "cv": 20})  # shape 0.0025 < 0.01
    assert isinstance(process, GammaArrivals)
    assert process.fallback_to_poisson
    assert "fallback" in process.describe()
    mean, cv = mean_cv(iats)
    assert mean == pytest.approx(MEAN_US, rel=0.01)
    assert cv == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.01, 0.3, 1.0, 2.0, 4.0])
def test_weibull_iats_match_the_requested_mean_and_cv(cv):
    process, iats = draw({"process": "weibull", "cv": cv})
    mean, got_cv = mean_cv(iats)
    assert isinstance(process, WeibullArrivals)
    assert process.cv == pytest.approx(cv, rel=1e-9)
    assert mean == pytest.approx(MEAN_US, rel=0.02 * max(1.0, cv))
    assert got_cv == pytest.approx(cv, rel=0.05 * max(1.0, cv))


def test_weibull_with_explicit_shape_and_scale_takes_its_mean_from_them():
    process, iats = draw({"process": "weibull", "shape": 2.0, "scale": 0.1})
    expected = 0.1e6 * math.gamma(1.5)
    assert process.mean_iat_us == pytest.approx(expected)
    assert mean_cv(iats)[0] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("cv", [0.01, 0.05, 0.5, 1.0, 3.0, 10.4])
def test_weibull_shape_bisection_inverts_the_cv_formula(cv):
    assert weibull_cv(weibull_shape_for_cv(cv)) == pytest.approx(cv, rel=1e-9)


def test_weibull_with_cv_one_is_exponential():
    assert weibull_shape_for_cv(1.0) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize(
    "config",
    ["poisson", "constant", {"process": "gamma", "cv": 5}, {"process": "weibull", "cv": 5}],
)
def test_iats_are_int64_and_at_least_one_microsecond(config):
    # At 100k req/s the mean IAT is 10 µs, so bursty processes truncate many draws to 0 -> 1.
    _, iats = draw(config, rate=1e5, n=50_000)
    assert iats.dtype == np.int64
    assert iats.min() >= 1


def test_same_seed_gives_same_iats():
    a = draw({"process": "gamma", "cv": 2}, seed=3, n=1000)[1]
    b = draw({"process": "gamma", "cv": 2}, seed=3, n=1000)[1]
    c = draw({"process": "gamma", "cv": 2}, seed=4, n=1000)[1]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_name_is_an_alias_of_process_for_set_overrides():
    process = arrival_from_config({"name": "gamma", "cv": 2}, RATE, "workload.arrival")
    assert isinstance(process, GammaArrivals)


def test_describe_is_plain_data():
    for config in (
        "poisson",
        "constant",
        {"process": "gamma", "cv": 2},
        {"process": "weibull", "cv": 2},
    ):
        d = arrival_from_config(config, RATE, "workload.arrival").describe()
        assert d["rate"] == pytest.approx(RATE)
        assert all(isinstance(v, (str, int, float, type(None))) for v in d.values())


# --- configuration errors -----------------------------------------------------------------------


def test_unknown_field_names_its_path_and_the_allowed_fields():
    with pytest.raises(ScenarioError) as err:
        arrival_from_config({"process": "gamma", "cvv": 2}, RATE, "workload.arrival")
    msg = str(err.value)
    assert err.value.path == "workload.arrival.cvv"
    assert "workload.arrival.cvv" in msg and "'cv'" in msg and "shape" in msg and "scale" in msg


def test_poisson_takes_no_parameters():
    with pytest.raises(ScenarioError, match=r"workload\.arrival\.cv"):
        arrival_from_config({"process": "poisson", "cv": 2}, RATE, "workload.arrival")


def test_unknown_process_lists_the_known_ones():
    with pytest.raises(UnknownPluginError) as err:
        arrival_from_config({"process": "bursty"}, RATE, "workload.arrival")
    msg = str(err.value)
    assert "workload.arrival.process" in msg
    for name in ("constant", "gamma", "poisson", "weibull"):
        assert name in msg
    with pytest.raises(ScenarioError, match="workload.arrival"):
        arrival_from_config("bursty", RATE, "workload.arrival")


@pytest.mark.parametrize("rate", [0, -1.0, float("nan"), float("inf"), "fast"])
def test_bad_rate_is_an_error_naming_the_rate_field(rate):
    with pytest.raises(ScenarioError, match=r"^workload\.rate"):
        arrival_from_config("poisson", rate, "workload.arrival")


def test_gamma_rejects_mixing_cv_with_shape_and_scale():
    with pytest.raises(ScenarioError, match=r"workload\.arrival\.shape.*not both"):
        arrival_from_config(
            {"process": "gamma", "cv": 2, "shape": 1, "scale": 1}, RATE, "workload.arrival"
        )


@pytest.mark.parametrize("process", ["gamma", "weibull"])
def test_explicit_form_needs_both_shape_and_scale(process):
    with pytest.raises(ScenarioError, match=r"workload\.arrival\.scale"):
        arrival_from_config({"process": process, "shape": 2}, RATE, "workload.arrival")


@pytest.mark.parametrize("process", ["gamma", "weibull"])
def test_cv_or_shape_is_required(process):
    with pytest.raises(ScenarioError, match=r"workload\.arrival.*cv"):
        arrival_from_config({"process": process}, RATE, "workload.arrival")


@pytest.mark.parametrize("cv", [0, -1, float("nan")])
def test_gamma_cv_must_be_positive_and_finite(cv):
    with pytest.raises(ScenarioError, match=r"workload\.arrival\.cv"):
        arrival_from_config({"process": "gamma", "cv": cv}, RATE, "workload.arrival")


@pytest.mark.parametrize("cv", [0.005, 10.5])
def test_weibull_cv_must_be_in_range(cv):
    with pytest.raises(ScenarioError, match=r"workload\.arrival\.cv.*0\.01, 10\.4"):
        arrival_from_config({"process": "weibull", "cv": cv}, RATE, "workload.arrival")


def test_arrival_must_be_a_name_or_mapping():
    with pytest.raises(ScenarioError, match="workload.arrival"):
        arrival_from_config(3, RATE, "workload.arrival")


def test_gaps_raised_to_the_one_microsecond_floor_are_said_once(capsys):
    from types import SimpleNamespace

    from servesim.workloads.arrivals import to_iats_us

    owner = SimpleNamespace()  # the arrival process whose stream the counts belong to
    draws = np.full(2000, 0.5)  # every gap under the clock's resolution
    assert (to_iats_us(draws, owner) == 1).all()
    to_iats_us(draws, owner)
    err = capsys.readouterr().err
    assert err.count("were raised to 1 µs") == 1 and "100.0%" in err
    quiet = SimpleNamespace()
    to_iats_us(np.full(2000, 50.0), quiet)
    assert "raised" not in capsys.readouterr().err


def test_a_gap_past_the_clocks_end_is_an_error_not_a_clip():
    from servesim.workloads.arrivals import to_iats_us

    with pytest.raises(ScenarioError, match="2\\*\\*62"):
        to_iats_us(np.array([10.0, 2.0**63]))
