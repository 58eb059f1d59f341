"""Length distributions: bounds, means, clamping, empirical inputs, and config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.simcore.errors import ScenarioError, UnknownPluginError
from servesim.simcore.registry import registry
from servesim.workloads.lengths import (
    TOKEN_CAP,
    ConstantLength,
    EmpiricalLength,
    GaussianLength,
    LognormalLength,
    UniformLength,
    length_from_config,
)

N = 200_000
PATH = "workload.input"


def build(config, **kw):
    return length_from_config(config, PATH, **kw)


def draw(config, seed=11, n=N, **kw):
    dist = build(config, **kw)
    return dist, dist.sample(np.random.default_rng(seed), n)


def test_builtin_distributions_are_registered():
    expected = {"constant", "uniform", "gaussian", "lognormal", "exponential", "empirical"}
    assert expected <= set(registry("length").names())


EVERY_BUILTIN = [
    {"type": "constant", "value": 7},
    {"type": "uniform", "min": 1, "max": 3},
    {"type": "gaussian", "mean": 3, "std_dev": 10},
    {"type": "lognormal", "mu": 0.0, "sigma": 2.0},
    {"type": "exponential", "mean": 2.0},
    {"type": "empirical", "values": {1: 0.5, 9: 0.5}},
]


@pytest.mark.parametrize("config", EVERY_BUILTIN, ids=lambda c: c["type"])
def test_every_distribution_returns_int64_lengths_of_at_least_one(config):
    _, x = draw(config, n=20_000)
    assert x.dtype == np.int64
    assert x.shape == (20_000,)
    assert x.min() >= 1


@pytest.mark.parametrize("config", EVERY_BUILTIN, ids=lambda c: c["type"])
def test_same_seed_gives_same_lengths(config):
    assert np.array_equal(draw(config, seed=5, n=500)[1], draw(config, seed=5, n=500)[1])


def test_constant_and_its_integer_shorthand():
    dist, x = draw({"type": "constant", "value": 256}, n=10)
    assert (x == 256).all() and dist.mean == 256
    assert isinstance(build(128), ConstantLength) and build(128).value == 128


def test_uniform_is_inclusive_at_both_ends():
    dist, x = draw({"type": "uniform", "min": 10, "max": 14})
    assert isinstance(dist, UniformLength)
    assert set(np.unique(x).tolist()) == {10, 11, 12, 13, 14}
    assert x.mean() == pytest.approx(12, rel=0.005)
    assert dist.mean == 12


def test_gaussian_stays_within_bounds_and_matches_its_mean():
    dist, x = draw({"type": "gaussian", "mean": 512, "std_dev": 128, "min": 2, "max": 4096})
    assert x.min() >= 2 and x.max() <= 4096
    assert x.mean() == pytest.approx(512, rel=0.005)
    assert x.std() == pytest.approx(128, rel=0.01)
    assert dist.mean == pytest.approx(512, abs=0.01)  # the clamp at 2 lifts it by ~0.001


def test_gaussian_clamps_to_the_bounds_before_rounding():
    dist, x = draw({"type": "gaussian", "mean": 10, "std_dev": 100, "min": 5, "max": 20})
    assert x.min() == 5 and x.max() == 20
    # P(X <= 5) and P(X >= 20) for N(10, 100): both ends collect a large share of the draws.
    assert (x == 5).mean() == pytest.approx(0.5 * math.erfc(0.05 / math.sqrt(2)), abs=0.005)
    assert (x == 20).mean() == pytest.approx(0.5 * math.erfc(0.1 / math.sqrt(2)), abs=0.005)
    assert x.mean() == pytest.approx(dist.mean, rel=0.005)


def test_gaussian_with_min_equal_max_is_constant_and_draws_nothing():
    dist = build({"type": "gaussian", "mean": 100, "std_dev": 50, "min": 64, "max": 64})
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert (dist.sample(rng, 100) == 64).all()
    assert rng.bit_generator.state == before
    assert dist.mean == 64


@pytest.mark.parametrize(
    "config",
    [
        {"type": "gaussian", "mean": 100, "std_dev": 50},
        {"type": "lognormal", "mu": 9.0, "sigma": 2.0},
        {"type": "exponential", "mean": 3000},
    ],
)
def test_every_clamped_distribution_with_min_equal_max_has_that_mean(config):
    dist = build({**config, "min": 64, "max": 64})
    assert dist.mean == 64.0 and isinstance(dist.mean, float)
    assert (dist.sample(np.random.default_rng(0), 10) == 64).all()


def test_gaussian_mean_accounts_for_clamping():
    # Chatbot output: clamped at 1 and 1024, so the mean is above 256.
    dist, x = draw({"type": "gaussian", "mean": 256, "std_dev": 100, "min": 1, "max": 1024})
    assert dist.mean > 256
    assert x.mean() == pytest.approx(dist.mean, rel=0.003)


def test_lognormal_from_mu_sigma_matches_its_mean():
    dist, x = draw({"type": "lognormal", "mu": 6.0, "sigma": 0.5, "max": 2000})
    assert isinstance(dist, LognormalLength)
    assert x.max() <= 2000
    assert x.mean() == pytest.approx(dist.mean, rel=0.005)


@pytest.mark.parametrize("mu, sigma", [(800.0, 10.0), (800.0, 0.0), (-800.0, 3.0), (40.0, 25.0)])
def test_lognormal_mean_of_far_off_parameters_is_the_clamped_mean(mu, sigma):
    # e^{mu + sigma²/2} overflows a float here; the clamped mean is still within [min, max] and
    # equals the sample mean (draws clamp the same way).
    dist, x = draw({"type": "lognormal", "mu": mu, "sigma": sigma, "min": 1, "max": 4096})
    assert 1 <= dist.mean <= 4096
    assert x.mean() == pytest.approx(dist.mean, rel=0.02)


def test_lognormal_from_mean_and_std_dev_converts_exactly():
    dist, x = draw({"type": "lognormal", "mean": 1000, "std_dev": 500})
    assert math.exp(dist.mu + dist.sigma**2 / 2) == pytest.approx(1000, rel=1e-12)
    variance = (math.exp(dist.sigma**2) - 1) * math.exp(2 * dist.mu + dist.sigma**2)
    assert math.sqrt(variance) == pytest.approx(500, rel=1e-12)
    assert dist.mean == pytest.approx(1000, rel=1e-6)
    assert x.mean() == pytest.approx(1000, rel=0.01)
    assert x.std() == pytest.approx(500, rel=0.03)


def test_exponential_matches_its_mean_with_and_without_a_cap():
    dist, x = draw({"type": "exponential", "mean": 300})
    assert x.mean() == pytest.approx(dist.mean, rel=0.01)
    assert dist.mean == pytest.approx(300 + 1 - 300 * (1 - math.exp(-1 / 300)), rel=1e-9)
    capped, y = draw({"type": "exponential", "mean": 300, "min": 10, "max": 400})
    assert y.min() >= 10 and y.max() <= 400
    assert y.mean() == pytest.approx(capped.mean, rel=0.005)


def test_unbounded_distributions_are_capped():
    _, x = draw({"type": "lognormal", "mu": 0, "sigma": 40}, n=10_000)
    assert x.max() <= TOKEN_CAP


def test_empirical_from_an_inline_mapping():
    dist, x = draw({"type": "empirical", "values": {"100": 0.2, 300: 0.5, 50: 0.3, 999: 0}})
    assert isinstance(dist, EmpiricalLength)
    assert dist.tokens.tolist() == [50, 100, 300]  # sorted, zero-probability entry dropped
    freq = {v: (x == v).mean() for v in (50, 100, 300)}
    assert freq == pytest.approx({50: 0.3, 100: 0.2, 300: 0.5}, abs=0.005)
    assert 999 not in x
    assert dist.mean == pytest.approx(50 * 0.3 + 100 * 0.2 + 300 * 0.5)


def test_empirical_weights_need_not_sum_to_one():
    dist = build({"type": "empirical", "values": {10: 2, 20: 6}})
    assert dist.probs.tolist() == pytest.approx([0.25, 0.75])


def test_empirical_from_a_list_of_observations():
    dist = build({"type": "empirical", "values": [10, 20, 20, 30]})
    assert dist.mean == pytest.approx(20)
    assert dist.probs.tolist() == pytest.approx([0.25, 0.5, 0.25])


def test_empirical_from_a_file_with_one_length_per_line(tmp_path):
    (tmp_path / "lengths.txt").write_text("# observed prompt lengths\n100\n200\n\n200\n400\n")
    dist, x = draw({"type": "empirical", "file": "lengths.txt"}, base_dir=tmp_path)
    assert dist.tokens.tolist() == [100, 200, 400]
    assert dist.probs.tolist() == pytest.approx([0.25, 0.5, 0.25])
    assert set(np.unique(x).tolist()) == {100, 200, 400}
    assert dist.describe()["file"] == str(tmp_path / "lengths.txt")


def test_empirical_from_a_tokens_prob_csv(tmp_path):
    csv = tmp_path / "dist.csv"
    csv.write_text("tokens,prob\n128,0.25\n512,0.75\n")
    dist, x = draw({"type": "empirical", "file": str(csv)})  # absolute path, no base_dir
    assert dist.tokens.tolist() == [128, 512]
    assert (x == 512).mean() == pytest.approx(0.75, abs=0.005)


def test_empirical_relative_path_without_base_dir_uses_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "l.txt").write_text("5\n")
    monkeypatch.chdir(tmp_path)
    assert build({"type": "empirical", "file": "l.txt"}).mean == 5


# --- configuration errors -----------------------------------------------------------------------


def test_missing_file_names_the_field_and_the_path_tried(tmp_path):
    with pytest.raises(ScenarioError) as err:
        build({"type": "empirical", "file": "nope.csv"}, base_dir=tmp_path)
    assert err.value.path == "workload.input.file"
    assert str(tmp_path / "nope.csv") in str(err.value)


@pytest.mark.parametrize(
    "text, line",
    [
        ("tokens,prob\n10,0.5\n20,abc\n", 3),
        ("tokens,prob\n10,0.5\n20,-1\n", 3),
        ("10\n20\nfoo\n", 3),
        ("10\n0\n", 2),
        ("10\n12.5\n", 2),
        ("10\n20,0.5\n", 2),
        ("1,2,3\n", 1),
        ("tokens,prob\n10,nan\n", 2),
        ("tokens,prob\n10,inf\n", 2),
        (f"10\n{TOKEN_CAP + 1}\n", 2),
        ("10\ninf\n", 2),
    ],
)
def test_malformed_file_lines_name_the_file_and_line(tmp_path, text, line):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(ScenarioError) as err:
        build({"type": "empirical", "file": str(f)})
    assert err.value.path == f"{f}:{line}"
    assert "workload.input.file" in str(err.value)


@pytest.mark.parametrize(
    "text, fix",
    [
        ("10\n0\n", f"expected a whole number of tokens from 1 to {TOKEN_CAP}"),
        ("tokens,prob\n10,-1\n", "expected a finite probability >= 0"),
    ],
)
def test_malformed_file_cells_say_what_is_allowed(tmp_path, text, fix):
    # The cells are read by servesim.simcore.csvcells; the error keeps saying what a cell may be.
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(ScenarioError, match=fix):
        build({"type": "empirical", "file": str(f)})


def test_file_lengths_may_be_written_as_whole_floats(tmp_path):
    f = tmp_path / "l.csv"
    f.write_text("tokens,prob\n1e3,1\n12.0,3\n")
    dist = build({"type": "empirical", "file": str(f)})
    assert dist.tokens.tolist() == [12, 1000]
    assert dist.probs.tolist() == [0.75, 0.25]


def test_file_with_no_lengths_is_an_error(tmp_path):
    f = tmp_path / "empty.csv"
    f.write_text("tokens,prob\n")
    with pytest.raises(ScenarioError, match=r"workload\.input\.file.*no lengths"):
        build({"type": "empirical", "file": str(f)})


@pytest.mark.parametrize("values", [{10: 0, 20: 0}, {10: -1}, {10: float("nan")}, {}, [], "x"])
def test_empirical_values_must_be_valid_probabilities(values):
    with pytest.raises(ScenarioError, match=r"workload\.input\.values"):
        build({"type": "empirical", "values": values})


def test_empirical_needs_exactly_one_source(tmp_path):
    with pytest.raises(ScenarioError, match="exactly one of values or file"):
        build({"type": "empirical"})
    with pytest.raises(ScenarioError, match="exactly one of values or file"):
        build({"type": "empirical", "values": {1: 1}, "file": "x"})


@pytest.mark.parametrize(
    "config",
    [
        {"type": "uniform", "min": 10, "max": 5},
        {"type": "gaussian", "mean": 10, "std_dev": 1, "min": 10, "max": 5},
        {"type": "lognormal", "mu": 1, "sigma": 1, "min": 10, "max": 5},
        {"type": "exponential", "mean": 10, "min": 10, "max": 5},
    ],
    ids=lambda c: c["type"],
)
def test_min_above_max_is_an_error(config):
    with pytest.raises(ScenarioError, match=r"^workload\.input\.min.*must not exceed max"):
        build(config)


@pytest.mark.parametrize(
    "config, field",
    [
        ({"type": "constant", "value": 0}, "value"),
        ({"type": "constant", "value": -3}, "value"),
        ({"type": "constant"}, "value"),
        ({"type": "uniform", "min": 0, "max": 5}, "min"),
        ({"type": "uniform", "min": 1}, "max"),
        ({"type": "gaussian", "mean": 10, "std_dev": -1}, "std_dev"),
        ({"type": "gaussian", "mean": float("nan"), "std_dev": 1}, "mean"),
        ({"type": "gaussian", "std_dev": 1}, "mean"),
        ({"type": "lognormal", "mu": 1, "sigma": -0.5}, "sigma"),
        ({"type": "lognormal", "mean": -5, "std_dev": 1}, "mean"),
        ({"type": "lognormal", "mean": 5}, "std_dev"),
        ({"type": "lognormal", "mu": 1, "sigma": 1, "mean": 5}, "mean"),
        ({"type": "exponential", "mean": 0}, "mean"),
        ({"type": "exponential", "mean": float("inf")}, "mean"),
        ({"type": "exponential", "mean": 5, "max": TOKEN_CAP + 1}, "max"),
        ({"type": "gaussian", "mean": 5, "std_dev": 1, "sd": 3}, "sd"),
    ],
)
def test_invalid_parameters_name_the_field(config, field):
    with pytest.raises(ScenarioError) as err:
        build(config)
    assert err.value.path == f"{PATH}.{field}"
    assert str(err.value).startswith(f"{PATH}.{field}:")


def test_unknown_field_lists_the_allowed_ones():
    with pytest.raises(
        ScenarioError, match=r"workload\.input\.stddev.*did you mean 'std_dev'.*min, max"
    ):
        build({"type": "gaussian", "mean": 5, "stddev": 1})


def test_missing_type_lists_the_known_types():
    with pytest.raises(ScenarioError, match=r"workload\.input\.type.*constant.*gaussian"):
        build({"mean": 5})


def test_unknown_type_lists_the_known_types():
    with pytest.raises(
        UnknownPluginError, match=r"workload\.input\.type.*'zipf'.*empirical.*uniform"
    ):
        build({"type": "zipf"})


@pytest.mark.parametrize("value", [None, "gaussian", 2.5, True, [1, 2]])
def test_length_config_must_be_a_mapping_or_integer(value):
    with pytest.raises(ScenarioError, match=r"^workload\.input"):
        build(value)


def test_gaussian_describe_echoes_the_config_and_the_expected_mean():
    d = GaussianLength(256, 100, 2, 800).describe()
    assert d["type"] == "gaussian" and d["mean"] == 256 and d["std_dev"] == 100
    assert d["min"] == 2 and d["max"] == 800
    assert d["expected_mean"] == pytest.approx(256, abs=1)
