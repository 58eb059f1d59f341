"""Workload specs: several clients, rate fractions, stages (segments, ramps, spikes, diurnal),
exact time-varying arrivals, independence of clients, determinism and config errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.spec import WorkloadSpec, workload_from_config
from servesim.workloads.stages import RateSchedule
from servesim.workloads.synthetic import SyntheticWorkload
from servesim.workloads.traces import TraceWorkload


def build(**section):
    return WorkloadSpec.from_config(section)


def take(workload, seed=7, n=None):
    gen = workload.requests(RandomStreams(seed))
    return list(gen if n is None else itertools.islice(gen, n))


def times_s(specs, client=None):
    return np.array([s.arrival_us for s in specs if client in (None, s.client)]) / 1e6


def rows(specs):
    return [
        (
            s.id,
            s.arrival_us,
            s.prompt_tokens,
            s.output_tokens,
            s.prefix_group,
            s.slo_class,
            s.client,
            s.tenant,
        )
        for s in specs
    ]


def within_poisson(count, expected, sigmas=5.0):
    """A Poisson count is within ``sigmas`` standard deviations of its mean."""
    return abs(count - expected) <= sigmas * math.sqrt(expected)


CHAT = {"id": "chat", "preset": "chatbot"}
DOCS = {"id": "docs", "preset": "summarization"}


# --- clients and rate fractions ------------------------------------------------------------------


def test_rate_fractions_split_the_aggregate_rate():
    w = build(
        rate=100,
        duration="60s",
        clients=[{**CHAT, "rate_fraction": 3}, {**DOCS, "rate_fraction": 1}],
    )
    specs = take(w)
    assert within_poisson(len(times_s(specs, "chat")), 4500)
    assert within_poisson(len(times_s(specs, "docs")), 1500)
    assert [c["share"] for c in w.describe()["clients"]] == [0.75, 0.25]
    assert w.expected_requests() == pytest.approx(6000)


def test_merged_stream_is_in_arrival_order_with_ids_renumbered():
    specs = take(
        build(rate=50, requests=3000, clients=[CHAT, DOCS, {"id": "x", "preset": "multidoc"}])
    )
    assert [s.id for s in specs] == list(range(3000))
    t = [s.arrival_us for s in specs]
    assert t == sorted(t) and t[0] > 0
    assert {s.client for s in specs} == {"chat", "docs", "x"}


def test_each_client_keeps_its_own_lengths_slo_class_and_tenant():
    specs = take(
        build(
            rate=20,
            requests=2000,
            clients=[
                {
                    "id": "a",
                    "input": 100,
                    "output": {"preset": "chatbot"},
                    "slo_class": "critical",
                    "tenant": "acme",
                },
                {
                    "id": "b",
                    "input": {"preset": "multidoc"},
                    "output": 7,
                    "slo_class": {"batch": 1, "background": 1},
                    "max_output_tokens": 0,
                },
            ],
        )
    )
    a = [s for s in specs if s.client == "a"]
    b = [s for s in specs if s.client == "b"]
    assert {s.prompt_tokens for s in a} == {100} and {(s.slo_class, s.tenant) for s in a} == {
        ("critical", "acme")
    }
    assert all(1 <= s.output_tokens <= 1024 for s in a)
    assert {s.output_tokens for s in b} == {7} and {s.max_output_tokens for s in b} == {0}
    assert {s.slo_class for s in b} == {"batch", "background"}
    assert np.mean([s.prompt_tokens for s in b]) == pytest.approx(10240, rel=0.05)


def test_prefix_groups_of_different_clients_never_coincide():
    w = build(
        rate=40,
        requests=2000,
        clients=[
            {**CHAT, "prefix": {"tokens": 64, "groups": 3}},
            {"id": "plain", "preset": "chatbot"},
            {**DOCS, "prefix": {"tokens": 500, "groups": 2}},
        ],
    )
    specs = take(w)
    groups = {
        c: {s.prefix_group for s in specs if s.client == c} for c in ("chat", "plain", "docs")
    }
    assert groups == {"chat": {0, 1, 2}, "plain": {-1}, "docs": {3, 4}}
    assert {s.prefix_tokens for s in specs if s.client == "docs"} == {500}
    described = [c["prefix"] for c in w.describe()["clients"]]
    assert described[0]["group_ids"] == [0, 3] and described[1] is None
    assert described[2]["group_ids"] == [3, 5]


# --- stages --------------------------------------------------------------------------------------


def test_segment_stages_set_the_rate_in_each_window_and_end_the_run():
    w = build(
        clients=[CHAT, DOCS],
        stages=[
            {"duration": "100s", "rate": 20},
            {"duration": "50s", "rate": 0},
            {"duration": "100s", "rate": 60},
        ],
    )
    t = times_s(take(w))
    for lo, hi, rate in [(0, 100, 20), (100, 150, 0), (150, 250, 60)]:
        count = int(((t >= lo) & (t < hi)).sum())
        assert within_poisson(count, rate * (hi - lo)) if rate else count == 0, (lo, hi, count)
    assert t.max() < 250
    assert w.expected_requests() == pytest.approx(20 * 100 + 60 * 100)


def test_stage_transitions_happen_at_the_stage_boundaries():
    # Constant arrivals make the boundary visible exactly: the gap changes at 10 s.
    w = build(
        start="5s",
        clients=[{**CHAT, "arrival": "constant"}],
        stages=[{"duration": "10s", "rate": 10}, {"duration": "10s", "rate": 100}],
    )
    t = times_s(take(w))
    gaps = np.diff(t)
    before, after = gaps[t[1:] <= 14.95], gaps[t[1:] > 15.05]
    assert np.allclose(before, 0.1, atol=2e-6) and np.allclose(after, 0.01, atol=2e-6)
    assert len(t) == 100 + 1000 and t[0] == pytest.approx(5.1) and t[-1] <= 25


def test_ramp_integral_and_counts():
    w = build(
        clients=[CHAT],
        stages=[{"ramp": {"from": 10, "to": 110, "duration": "100s"}}],
    )
    s = w.schedule
    assert s.integral(100e6) == pytest.approx(6000)  # (10 + 110) / 2 · 100
    assert s.integral(50e6) == pytest.approx(10 * 50 + 0.5 * 1.0 * 50**2)  # slope 1 req/s²
    assert s.rate(25e6) == pytest.approx(35)
    t = times_s(take(w))
    for lo in range(0, 100, 20):
        expected = float(s.integral((lo + 20) * 1e6) - s.integral(lo * 1e6))
        assert within_poisson(((t >= lo) & (t < lo + 20)).sum(), expected)


def test_ramp_from_defaults_to_the_previous_rate():
    w = build(
        clients=[CHAT],
        stages=[{"duration": "1s", "rate": 8}, {"ramp": {"to": 2, "duration": "2s"}}],
    )
    assert w.schedule.rate([0.5e6, 1e6, 2e6, 2.999e6]) == pytest.approx([8, 8, 5, 2.003])


def test_diurnal_stage_keeps_the_mean_and_has_the_peak_to_trough_ratio():
    w = build(
        rate=10,
        duration="2h",
        clients=[CHAT],
        stages=[{"diurnal": {"period": "1h", "peak_to_trough": 4, "peak_at": "15min"}}],
    )
    s = w.schedule
    hour = 3600e6
    assert s.integral(hour) == pytest.approx(10 * 3600)  # mean 1 over a whole period
    assert s.integral(2 * hour) == pytest.approx(2 * 10 * 3600)
    peak, trough = s.rate(0.25 * hour), s.rate(0.75 * hour)
    assert (
        peak / trough == pytest.approx(4)
        and peak == pytest.approx(16)
        and trough == pytest.approx(4)
    )
    # Λ against a fine numerical quadrature of r over a partial period
    grid = np.linspace(0, 0.6 * hour, 200_001)
    r = s.rate(grid)
    numeric = np.sum((r[1:] + r[:-1]) / 2 * np.diff(grid)) / 1e6
    assert s.integral(0.6 * hour) == pytest.approx(numeric, rel=1e-9)
    t = times_s(take(w))
    near_peak = ((t > 600) & (t < 1200)).sum()  # around 15 min
    near_trough = ((t > 2400) & (t < 3000)).sum()  # around 45 min
    assert near_peak / near_trough == pytest.approx(
        float((s.integral(1200e6) - s.integral(600e6)) / (s.integral(3000e6) - s.integral(2400e6))),
        rel=0.1,
    )


def test_spike_multiplies_the_rate_in_its_window():
    w = build(
        rate=20,
        duration="60s",
        clients=[CHAT],
        stages=[{"spike": {"at": "20s", "duration": "10s", "multiplier": 5}}],
    )
    t = times_s(take(w))
    assert within_poisson(((t >= 20) & (t < 30)).sum(), 1000)
    assert within_poisson(((t >= 0) & (t < 20)).sum(), 400)
    assert within_poisson(((t >= 30) & (t < 60)).sum(), 600)
    assert w.expected_requests() == pytest.approx(20 * 60 + 4 * 20 * 10)


def test_modulators_combine_with_segments():
    w = build(
        clients=[CHAT],
        stages=[
            {"duration": "1h", "rate": 10},
            {"ramp": {"to": 40, "duration": "2h"}},
            {"spike": {"at": "30min", "duration": "10min", "multiplier": 2}},
            {"diurnal": {"period": "3h", "peak_to_trough": 4, "peak_at": "1h"}},
        ],
    )
    s = w.schedule
    grid = np.linspace(0, 3 * 3600e6, 1_000_001)
    grid = np.union1d(grid, [1800e6, 2400e6])  # the spike edges, so the quadrature is exact there
    r = s.rate(grid)
    numeric = np.sum((r[1:] + r[:-1]) / 2 * np.diff(grid)) / 1e6
    assert s.total == pytest.approx(numeric, rel=1e-6)
    tau = np.linspace(0, s.total * (1 - 1e-9), 20_001)
    x = s.invert(tau)
    assert np.abs(s.integral(x) - tau).max() < 1e-6 and (np.diff(x) >= 0).all()
    assert s.invert([s.total]) == pytest.approx([3 * 3600e6])
    assert np.isinf(s.invert([s.total * (1 + 1e-9)])).all()


def test_time_varying_poisson_arrivals_are_exactly_time_rescaled():
    # For a non-homogeneous Poisson process, share·Λ(t_k) has Exp(1) increments (mean 1, CV 1).
    w = build(
        clients=[CHAT, {**DOCS, "rate_fraction": 2}],
        stages=[
            {"ramp": {"from": 5, "to": 200, "duration": "60s"}},
            {"diurnal": {"period": "20s", "peak_to_trough": 8}},
        ],
    )
    specs = take(w)
    for client, share in (("chat", 1 / 3), ("docs", 2 / 3)):
        t = np.array([s.arrival_us for s in specs if s.client == client], dtype=float)
        incr = np.diff(share * w.schedule.integral(t))
        assert incr.mean() == pytest.approx(1, abs=0.05)
        assert incr.std() / incr.mean() == pytest.approx(1, abs=0.05)


def test_bursty_clients_keep_their_cv_at_a_constant_rate():
    w = build(rate=50, requests=20000, clients=[{**CHAT, "arrival": {"process": "gamma", "cv": 3}}])
    gaps = np.diff(times_s(take(w)))
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3, rel=0.1)


def test_duration_and_request_limits_end_the_run_whichever_comes_first():
    assert len(take(build(rate=100, requests=50, duration="1h", clients=[CHAT]))) == 50
    t = times_s(take(build(rate=100, requests=10**6, duration="2s", start="3s", clients=[CHAT])))
    assert t.min() > 3 and t.max() <= 5 and within_poisson(len(t), 200)
    staged = build(requests=50, clients=[CHAT], stages=[{"duration": "10s", "rate": 100}])
    assert len(take(staged)) == 50


# --- determinism and independence -----------------------------------------------------------------


def test_same_seed_same_requests_and_iterating_twice_is_the_same():
    w = build(
        rate=30,
        requests=500,
        clients=[CHAT, DOCS],
        stages=[{"diurnal": {"period": "10s", "peak_to_trough": 3}}],
    )
    assert rows(take(w, seed=3)) == rows(take(w, seed=3))
    assert rows(take(w, seed=3)) != rows(take(w, seed=4))


def test_adding_a_client_does_not_change_another_clients_requests():
    one = build(
        rate=10,
        duration="100s",
        clients=[{**CHAT, "rate_fraction": 1}, {**DOCS, "rate_fraction": 1}],
    )
    two = build(
        rate=10,
        duration="100s",
        clients=[
            {**CHAT, "rate_fraction": 2},
            {**DOCS, "rate_fraction": 1},
            {"id": "new", "preset": "multidoc", "rate_fraction": 1},
        ],
    )  # chat keeps 5 req/s in both

    def chat(specs):
        return [
            (s.arrival_us, s.prompt_tokens, s.output_tokens) for s in specs if s.client == "chat"
        ]

    assert chat(take(one)) == chat(take(two))


def test_each_client_uses_its_own_named_streams():
    class Recorder(RandomStreams):
        names: list[str] = []

        def fresh(self, name):
            self.names.append(name)
            return super().fresh(name)

    streams = Recorder(1)
    list(itertools.islice(build(rate=5, requests=10, clients=[CHAT, DOCS]).requests(streams), 10))
    assert {"workload/chat/arrival", "workload/chat/input", "workload/docs/output"} <= set(
        streams.names
    )


# --- configuration --------------------------------------------------------------------------------


def test_single_client_shorthand_with_stages():
    w = workload_from_config(
        {"preset": "chatbot", "requests": 100, "stages": [{"duration": "10s", "rate": 30}]}
    )
    assert isinstance(w, WorkloadSpec) and [c["id"] for c in w.describe()["clients"]] == ["default"]
    assert len(take(w)) == 100


def test_workload_from_config_picks_the_workload_kind():
    assert isinstance(
        workload_from_config({"preset": "chatbot", "rate": 1, "requests": 3}), SyntheticWorkload
    )
    assert isinstance(workload_from_config({"trace": "azure-code", "requests": 3}), TraceWorkload)
    assert isinstance(
        workload_from_config({"rate": 1, "requests": 3, "clients": [CHAT]}), WorkloadSpec
    )


def test_describe_is_json_ready_and_complete():
    import json

    w = build(
        clients=[CHAT, {**DOCS, "arrival": {"process": "weibull", "cv": 0.5}}],
        stages=[
            {"duration": "1min", "rate": 10},
            {"spike": {"at": "10s", "duration": "5s", "multiplier": 2}},
        ],
    )
    d = json.loads(json.dumps(w.describe()))
    assert d["kind"] == "spec" and d["horizon_us"] == 60e6
    assert d["expected_requests"] == pytest.approx(650)
    assert d["clients"][1]["arrival"] == {"process": "weibull", "cv": pytest.approx(0.5)}
    assert [next(iter(s)) for s in d["stages"]] == ["segment", "spike"]


@pytest.mark.parametrize(
    "section,path",
    [
        ({"rate": 1, "requests": 5, "clients": []}, "workload.clients"),
        ({"rate": 1, "requests": 5, "clients": [{"preset": "chatbot"}]}, "workload.clients[0].id"),
        ({"rate": 1, "requests": 5, "clients": [CHAT, CHAT]}, "workload.clients[1].id"),
        ({"rate": 1, "requests": 5, "clients": [{**CHAT, "rate": 3}]}, "workload.clients[0].rate"),
        (
            {"rate": 1, "requests": 5, "clients": [{**CHAT, "rate_fraction": 0}]},
            "workload.clients[0].rate_fraction",
        ),
        (
            {"rate": 1, "requests": 5, "clients": [{**CHAT, "input": {"preset": "nope"}}]},
            "workload.clients[0].input.preset",
        ),
        (
            {"rate": 1, "requests": 5, "clients": [{"id": "x", "input": 5}]},
            "workload.clients[0].output",
        ),
        (
            {
                "rate": 1,
                "requests": 5,
                "clients": [{**CHAT, "arrival": {"process": "gamma", "shape": 2, "scale": 1}}],
            },
            "workload.clients[0].arrival.shape",
        ),
        ({"rate": 1, "clients": [CHAT]}, "workload.requests"),
        ({"requests": 5, "clients": [CHAT]}, "workload.rate"),
        (
            {"rate": 1, "clients": [CHAT], "stages": [{"duration": "1s", "rate": 2}]},
            "workload.rate",
        ),
        ({"rate": 1, "requests": 5, "clients": [CHAT], "stages": {"ramp": {}}}, "workload.stages"),
        (
            {"clients": [CHAT], "stages": [{"ramp": {"to": 3, "duration": "1s"}}]},
            "workload.stages[0].ramp.from",
        ),
        ({"clients": [CHAT], "stages": [{"duration": "1s"}]}, "workload.stages[0].rate"),
        (
            {"clients": [CHAT], "stages": [{"duration": "1s", "rate": -1}]},
            "workload.stages[0].rate",
        ),
        ({"clients": [CHAT], "stages": [{"duration": "1s", "rate": 0}]}, "workload.stages"),
        (
            {"rate": 1, "requests": 5, "clients": [CHAT], "stages": [{"spike": {"at": "1s"}}]},
            "workload.stages[0].spike.duration",
        ),
        (
            {
                "rate": 1,
                "requests": 5,
                "clients": [CHAT],
                "stages": [
                    {"spike": {"at": "1s", "duration": "1s", "multiplier": 2}, "diurnal": {}}
                ],
            },
            "workload.stages[0]",
        ),
        (
            {
                "clients": [CHAT],
                "stages": [
                    {"duration": "1s", "rate": 1},
                    {"spike": {"at": "2s", "duration": "1s", "multiplier": 2}},
                ],
            },
            "workload.stages[1].spike.at",
        ),
        (
            {
                "rate": 1,
                "requests": 5,
                "clients": [CHAT],
                "stages": [
                    {"diurnal": {"period": "1h", "peak_to_trough": 2}},
                    {"diurnal": {"period": "1h", "peak_to_trough": 3}},
                ],
            },
            "workload.stages[1].diurnal",
        ),
        (
            {
                "rate": 1,
                "requests": 5,
                "clients": [CHAT],
                "stages": [{"diurnal": {"period": "1h", "peak_to_trough": 0.5}}],
            },
            "workload.stages[0].diurnal.peak_to_trough",
        ),
        (
            {"rate": 1, "requests": 5, "clients": [CHAT], "stages": [{"rampp": {}}]},
            "workload.stages[0].rampp",
        ),
        ({"rate": 1, "requests": 5, "clientz": [CHAT]}, "workload.clientz"),
    ],
)
def test_config_errors_name_the_path(section, path):
    with pytest.raises(ScenarioError) as info:
        WorkloadSpec.from_config(section)
    assert info.value.path == path, str(info.value)


def test_schedule_without_stages_is_the_constant_rate():
    s = RateSchedule([(0.0, math.inf, 4.0, 0.0)])
    assert s.integral(10e6) == pytest.approx(40) and s.invert([40.0]) == pytest.approx([10e6])
    assert math.isinf(s.end_us) and math.isinf(s.total)
