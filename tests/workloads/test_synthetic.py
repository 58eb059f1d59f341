"""Synthetic workloads: presets, schema, lazy generation, determinism and config errors."""

from __future__ import annotations

import inspect
import itertools
import json
import tracemalloc

import numpy as np
import pytest

from servesim.simcore.errors import ScenarioError, UnknownPluginError
from servesim.simcore.rng import RandomStreams
from servesim.workloads import PRESETS, RequestSpec, SyntheticWorkload
from servesim.workloads.arrivals import GammaArrivals, PoissonArrivals
from servesim.workloads.lengths import ConstantLength, GaussianLength


def build(**section):
    return SyntheticWorkload.from_config(section)


def take(workload, n=None, seed=42, streams=None):
    gen = workload.requests(streams or RandomStreams(seed))
    return list(gen if n is None else itertools.islice(gen, n))


def rows(specs):
    return [
        (
            s.id,
            s.arrival_us,
            s.prompt_tokens,
            s.output_tokens,
            s.prefix_group,
            s.prefix_tokens,
            s.max_output_tokens,
            s.slo_class,
            s.client,
        )
        for s in specs
    ]


# --- presets ------------------------------------------------------------------------------------

SPEC_PRESETS = {  # blis_reference.md §6.1 item 2: input mean±sd [min,max] -> output ...
    "chatbot": ((256, 100, 2, 800), (256, 100, 1, 1024)),
    "contentgen": ((1024, 150, 10, 2048), (1024, 200, 10, 2048)),
    "summarization": ((4096, 500, 100, 8192), (512, 150, 10, 2048)),
    "multidoc": ((10240, 1200, 500, 20480), (1536, 300, 50, 4096)),
}


def test_presets_are_the_four_blis_mixes_exactly():
    assert set(PRESETS) == set(SPEC_PRESETS)
    for name, (inp, out) in SPEC_PRESETS.items():
        preset = PRESETS[name]
        assert isinstance(preset["description"], str) and preset["description"]
        for side, (mean, sd, lo, hi) in (("input", inp), ("output", out)):
            assert preset[side] == {
                "type": "gaussian",
                "mean": mean,
                "std_dev": sd,
                "min": lo,
                "max": hi,
            }


@pytest.mark.parametrize("name", sorted(SPEC_PRESETS))
def test_a_preset_supplies_gaussian_input_and_output(name):
    wl = build(preset=name, rate=5, requests=20_000)
    assert isinstance(wl.input, GaussianLength) and isinstance(wl.output, GaussianLength)
    (mean, sd, lo, hi), (omean, osd, olo, ohi) = SPEC_PRESETS[name]
    specs = take(wl)
    prompts = np.array([s.prompt_tokens for s in specs])
    outputs = np.array([s.output_tokens for s in specs])
    assert prompts.min() >= lo and prompts.max() <= hi
    assert outputs.min() >= olo and outputs.max() <= ohi
    assert prompts.mean() == pytest.approx(wl.expected_mean_tokens()[0], rel=0.01)
    assert outputs.mean() == pytest.approx(wl.expected_mean_tokens()[1], rel=0.01)


def test_explicit_lengths_override_the_preset():
    wl = build(preset="summarization", rate=1, requests=5, output={"type": "constant", "value": 7})
    assert isinstance(wl.output, ConstantLength)
    assert wl.input.mu == 4096
    assert all(s.output_tokens == 7 for s in take(wl))


# --- the schema ---------------------------------------------------------------------------------


def test_the_full_schema_example_builds():
    wl = build(
        preset="chatbot",
        rate=10,
        requests=1000,
        duration="10min",
        arrival={"process": "gamma", "cv": 2},
        input={"type": "gaussian", "mean": 512, "std_dev": 128, "min": 2, "max": 4096},
        output={"type": "constant", "value": 256},
        prefix={"tokens": 64, "groups": 4},
        max_output_tokens=0,
        slo_class="critical",
        start="0s",
    )
    assert isinstance(wl.arrival, GammaArrivals)
    assert wl.duration_us == 600_000_000
    specs = take(wl)
    assert len(specs) == 1000
    assert {s.slo_class for s in specs} == {"critical"}
    assert {s.max_output_tokens for s in specs} == {0}
    json.dumps(wl.describe())


def test_defaults_are_poisson_oracle_budget_standard_class_no_prefix():
    wl = build(rate=2, requests=3, input=100, output=20)
    assert isinstance(wl.arrival, PoissonArrivals)
    for s in take(wl):
        assert isinstance(s, RequestSpec)
        assert (s.prompt_tokens, s.output_tokens, s.max_output_tokens) == (100, 20, 20)
        assert (s.prefix_group, s.prefix_tokens) == (-1, 0)
        assert s.slo_class == "standard" and s.client == "default"


def test_ids_count_up_in_arrival_order_and_fields_are_python_ints():
    specs = take(
        build(
            rate=1000, requests=10_000, input=10, output=10, arrival={"process": "gamma", "cv": 3}
        )
    )
    assert [s.id for s in specs] == list(range(10_000))
    assert (np.diff([s.arrival_us for s in specs]) >= 1).all()  # IATs are >= 1 µs
    s = specs[-1]
    for value in (
        s.id,
        s.arrival_us,
        s.prompt_tokens,
        s.output_tokens,
        s.prefix_group,
        s.max_output_tokens,
    ):
        assert type(value) is int


def test_first_arrival_is_start_plus_one_iat():
    specs = take(build(rate=4, requests=3, arrival="constant", start="2s", input=1, output=1))
    assert [s.arrival_us for s in specs] == [2_250_000, 2_500_000, 2_750_000]


def test_duration_stops_arrivals_at_start_plus_duration_inclusive():
    specs = take(build(rate=10, duration=1, arrival="constant", input=1, output=1))
    assert len(specs) == 10
    assert specs[-1].arrival_us == 1_000_000
    later = take(
        build(rate=10, duration="1s", start="500ms", arrival="constant", input=1, output=1)
    )
    assert len(later) == 10 and later[-1].arrival_us == 1_500_000


def test_with_requests_and_duration_the_first_limit_reached_wins():
    assert (
        len(take(build(rate=10, requests=5, duration=10, arrival="constant", input=1, output=1)))
        == 5
    )
    assert (
        len(take(build(rate=10, requests=500, duration=10, arrival="constant", input=1, output=1)))
        == 100
    )


def test_a_long_duration_spans_many_chunks():
    wl = build(rate=1000, duration="30s", input=1, output=1)
    specs = take(wl)
    assert len(specs) == pytest.approx(30_000, rel=0.03)
    assert specs[-1].arrival_us <= 30_000_000
    assert len(specs) > 2 * SyntheticWorkload.chunk_size


def test_poisson_workload_has_the_configured_rate():
    specs = take(build(rate=50, requests=50_000, input=1, output=1))
    assert specs[-1].arrival_us / 1e6 == pytest.approx(1000, rel=0.02)


def test_shared_prefix_groups_are_uniform_and_prefix_the_prompt():
    wl = build(
        rate=10,
        requests=40_000,
        input={"type": "uniform", "min": 1, "max": 100},
        output=5,
        prefix={"tokens": 64, "groups": 4},
    )
    specs = take(wl)
    groups = np.array([s.prefix_group for s in specs])
    assert set(np.unique(groups).tolist()) == {0, 1, 2, 3}
    assert np.bincount(groups) / len(groups) == pytest.approx([0.25] * 4, abs=0.01)
    prompts = np.array([s.prompt_tokens for s in specs])
    assert prompts.min() == 65 and prompts.max() == 164
    assert all(s.prefix_tokens == 64 for s in specs)
    assert wl.expected_mean_tokens() == (pytest.approx(64 + 50.5), 5.0)


def test_a_single_prefix_group_is_group_zero():
    specs = take(build(rate=10, requests=10, input=5, output=5, prefix={"tokens": 16}))
    assert {(s.prefix_group, s.prompt_tokens) for s in specs} == {(0, 21)}


@pytest.mark.parametrize("budget, expected", [("oracle", None), (0, 0), (128, 128)])
def test_max_output_tokens(budget, expected):
    specs = take(build(rate=10, requests=50, preset="chatbot", max_output_tokens=budget))
    for s in specs:
        assert s.max_output_tokens == (s.output_tokens if expected is None else expected)


def test_describe_is_json_ready():
    wl = build(preset="chatbot", rate=10, requests=100, prefix={"tokens": 8, "groups": 2})
    d = json.loads(json.dumps(wl.describe()))
    assert d["preset"] == "chatbot" and d["rate"] == 10 and d["requests"] == 100
    assert d["arrival"]["process"] == "poisson"
    assert d["input"]["type"] == "gaussian"
    assert d["prefix"] == {"tokens": 8, "groups": 2}
    assert d["expected_mean_tokens"]["input"] == pytest.approx(8 + 256, abs=1)


# --- laziness and memory ------------------------------------------------------------------------


def test_requests_is_a_lazy_generator():
    wl = build(preset="chatbot", rate=10, requests=10_000_000)
    gen = wl.requests(RandomStreams(1))
    assert inspect.isgenerator(gen)
    import tracemalloc

    tracemalloc.start()
    first = list(itertools.islice(gen, 10))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # 10 million specs would take gigabytes; the first ten take a chunk of draws at most
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB allocated for 10 requests"
    assert [s.id for s in first] == list(range(10))


def test_memory_stays_flat_while_streaming():
    wl = build(preset="chatbot", rate=100, requests=60_000, prefix={"tokens": 8, "groups": 3})
    tracemalloc.start()
    try:
        count = 0
        for _ in wl.requests(RandomStreams(3)):
            count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 60_000
    assert peak < 4_000_000  # a few chunks of arrays, not 60k request objects


# --- determinism --------------------------------------------------------------------------------


GAMMA_WL = {
    "rate": 20,
    "requests": 9000,
    "arrival": {"process": "gamma", "cv": 2},
    "preset": "chatbot",
}


def test_same_seed_gives_the_same_requests_and_another_seed_does_not():
    wl = build(**GAMMA_WL)
    assert rows(take(wl, seed=9)) == rows(take(wl, seed=9))
    assert rows(take(wl, seed=9)) != rows(take(wl, seed=10))


def test_iterating_twice_over_one_streams_object_repeats_the_requests():
    wl = build(**GAMMA_WL)
    streams = RandomStreams(4)
    assert rows(take(wl, 100, streams=streams)) == rows(take(wl, 100, streams=streams))


def test_other_consumers_of_the_seed_do_not_shift_the_workload():
    wl = build(**GAMMA_WL)
    streams = RandomStreams(9)
    streams.stream("router").random(1000)
    streams.stream("workload/extra").random(10)
    assert rows(take(wl, streams=streams)) == rows(take(wl, seed=9))


def test_adding_a_prefix_changes_nothing_but_the_prefix_fields():
    plain = take(build(**GAMMA_WL))
    grouped = take(build(**GAMMA_WL, prefix={"tokens": 32, "groups": 5}))
    assert [s.arrival_us for s in plain] == [s.arrival_us for s in grouped]
    assert [s.output_tokens for s in plain] == [s.output_tokens for s in grouped]
    assert [s.prompt_tokens + 32 for s in plain] == [s.prompt_tokens for s in grouped]


def test_a_shorter_workload_is_a_prefix_of_a_longer_one():
    short = build(**{**GAMMA_WL, "requests": 5000})  # crosses a chunk boundary
    long = build(**{**GAMMA_WL, "requests": 12_000})
    assert rows(take(short)) == rows(take(long))[:5000]
    by_time = build(**{**GAMMA_WL, "requests": None, "duration": 100})
    timed = rows(take(by_time))
    assert timed == rows(take(long))[: len(timed)]


# --- configuration errors -----------------------------------------------------------------------


def error(**section) -> ScenarioError:
    with pytest.raises(ScenarioError) as err:
        SyntheticWorkload.from_config(section)
    return err.value


BASE = {"preset": "chatbot", "rate": 10, "requests": 10}


def test_unknown_field_names_it_and_suggests_the_closest():
    e = error(**BASE, reqests=5)
    assert e.path == "workload.reqests"
    assert "did you mean 'requests'" in str(e) and "max_output_tokens" in str(e)


@pytest.mark.parametrize("rate", [-1, 0, float("nan"), float("inf"), "ten"])
def test_rate_must_be_positive_and_finite(rate):
    e = error(**{**BASE, "rate": rate})
    assert e.path == "workload.rate"
    assert str(e).startswith("workload.rate:")


def test_rate_is_required():
    assert error(preset="chatbot", requests=10).path == "workload.rate"


def test_requests_or_duration_is_required():
    e = error(preset="chatbot", rate=10)
    assert e.path == "workload.requests" and "duration" in str(e)


@pytest.mark.parametrize(
    "field, value",
    [
        ("requests", 0),
        ("requests", 2.5),
        ("duration", "0s"),
        ("duration", "5 parsecs"),
        ("start", "-1s"),
    ],
)
def test_bad_counts_and_durations_name_the_field(field, value):
    assert error(**{**BASE, field: value}).path == f"workload.{field}"


def test_unknown_preset_lists_the_known_ones():
    e = error(**{**BASE, "preset": "chat"})
    assert e.path == "workload.preset"
    for name in SPEC_PRESETS:
        assert name in str(e)


def test_unknown_arrival_process_lists_the_known_ones():
    with pytest.raises(UnknownPluginError) as err:
        SyntheticWorkload.from_config({**BASE, "arrival": {"process": "hawkes"}})
    assert "workload.arrival.process" in str(err.value)
    assert "gamma" in str(err.value) and "weibull" in str(err.value)


def test_arrival_errors_name_their_nested_path():
    assert error(**BASE, arrival={"process": "gamma", "cvv": 2}).path == "workload.arrival.cvv"


@pytest.mark.parametrize("side", ["input", "output"])
def test_without_a_preset_input_and_output_are_required(side):
    section = {"rate": 10, "requests": 10, "input": 10, "output": 10}
    del section[side]
    e = error(**section)
    assert e.path == f"workload.{side}"
    assert "preset" in str(e)


def test_length_errors_name_their_nested_path():
    e = error(**BASE, input={"type": "uniform", "min": 9, "max": 3})
    assert e.path == "workload.input.min"


@pytest.mark.parametrize(
    "field, value, path",
    [
        ("prefix", {"tokens": 8, "group": 2}, "workload.prefix.group"),
        ("prefix", {"groups": 2}, "workload.prefix.tokens"),
        ("prefix", {"tokens": 8, "groups": 0}, "workload.prefix.groups"),
        ("prefix", 64, "workload.prefix"),
        ("max_output_tokens", -1, "workload.max_output_tokens"),
        ("max_output_tokens", "auto", "workload.max_output_tokens"),
        ("slo_class", "gold", "workload.slo_class"),
    ],
)
def test_other_fields_are_validated(field, value, path):
    assert error(**{**BASE, field: value}).path == path


def test_the_section_must_be_a_mapping():
    with pytest.raises(ScenarioError, match="^workload:"):
        SyntheticWorkload.from_config(["chatbot"])  # type: ignore[arg-type]


def test_relative_length_files_resolve_against_base_dir(tmp_path):
    (tmp_path / "out.txt").write_text("42\n")
    wl = SyntheticWorkload.from_config(
        {**BASE, "output": {"type": "empirical", "file": "out.txt"}}, base_dir=tmp_path
    )
    assert {s.output_tokens for s in take(wl)} == {42}
