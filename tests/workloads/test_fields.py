"""The workload fields a synthetic stream, a workload spec and a trace replay share: one parser,
so the same value is accepted or refused the same way in all three."""

from __future__ import annotations

import pytest

from servesim.simcore.errors import ScenarioError
from servesim.workloads.fields import (
    MIN_DURATION_US,
    ORACLE,
    SHARED_FIELDS,
    read_shared_fields,
    require_bound,
)
from servesim.workloads.spec import WorkloadSpec, workload_from_config
from servesim.workloads.synthetic import SyntheticWorkload
from servesim.workloads.traces import TraceWorkload


@pytest.fixture
def trace_file(tmp_path):
    file = tmp_path / "t.csv"
    file.write_text("arrival_s,input_tokens,output_tokens\n0,5,2\n0.5,6,3\n2,7,4\n")
    return str(file)


def sections(trace_file):
    """A minimal valid section of each workload kind."""
    return {
        "synthetic": {"rate": 10, "requests": 5, "input": 10, "output": 10},
        "spec": {"rate": 10, "requests": 5, "stages": [], "input": 10, "output": 10},
        "trace": {"trace": trace_file, "requests": 5},
    }


KINDS = {"synthetic": SyntheticWorkload, "spec": WorkloadSpec, "trace": TraceWorkload}

BAD = [
    ("requests", 0),
    ("requests", 10**11),
    ("duration", 0),
    ("duration", "0s"),
    ("duration", "0.4us"),
    ("start", "-1s"),
    ("slo_class", "vip"),
    ("max_output_tokens", -1),
    ("max_output_tokens", "all"),
]


def refusal(section):
    with pytest.raises(ScenarioError) as info:
        workload_from_config(section)
    return info.value


@pytest.mark.parametrize(("field", "value"), BAD)
def test_a_bad_shared_field_is_refused_with_the_same_message_by_every_workload_kind(
    trace_file, field, value
):
    errors = {
        kind: refusal({**section, field: value}) for kind, section in sections(trace_file).items()
    }
    assert {e.path for e in errors.values()} == {f"workload.{field}"}
    assert len({str(e) for e in errors.values()}) == 1, errors


def test_the_rate_is_parsed_alike_by_synthetic_workloads_and_specs(trace_file):
    s = sections(trace_file)
    for value in (0, -1, 2e6, "fast"):
        errors = [refusal({**s[kind], "rate": value}) for kind in ("synthetic", "spec")]
        assert errors[0].path == errors[1].path == "workload.rate"
        assert str(errors[0]) == str(errors[1])


def test_a_duration_must_be_at_least_one_microsecond_for_every_kind(trace_file):
    assert MIN_DURATION_US == 1
    for kind, section in sections(trace_file).items():
        workload = workload_from_config({**section, "duration": "1us"})
        assert isinstance(workload, KINDS[kind])
        assert workload.duration_us == 1
        assert "at least 1 µs" in str(refusal({**section, "duration": 0}))


def test_good_shared_fields_mean_the_same_in_every_kind(trace_file):
    fields = {"start": "2s", "slo_class": "batch", "max_output_tokens": 7, "duration": "1min"}
    for section in sections(trace_file).values():
        workload = workload_from_config({**section, **fields})
        assert workload.start_us == 2_000_000
        assert workload.duration_us == 60_000_000
    synthetic = workload_from_config({**sections(trace_file)["synthetic"], **fields})
    trace = workload_from_config({**sections(trace_file)["trace"], **fields})
    for w in (synthetic, trace):
        assert (w.slo_class, w.max_output_tokens) == ("batch", 7)
    assert {(s.slo_class, s.max_output_tokens) for s in trace.requests()} == {("batch", 7)}
    spec = workload_from_config({**sections(trace_file)["spec"], **fields})
    client = spec.clients[0].workload
    assert (client.slo_class, client.max_output_tokens) == ("batch", 7)


def test_a_trace_replay_refuses_an_slo_class_mix_that_a_synthetic_stream_draws_from(trace_file):
    mix = {"critical": 1, "batch": 3}
    s = sections(trace_file)
    assert workload_from_config({**s["synthetic"], "slo_class": mix}).slo_class == {
        "critical": 1.0,
        "batch": 3.0,
    }
    err = refusal({**s["trace"], "slo_class": mix})
    assert err.path == "workload.slo_class"
    assert "one class" in err.fix


def test_absent_or_null_shared_fields_are_none_and_each_kind_keeps_its_default(trace_file):
    parsed = read_shared_fields({"requests": None}, "workload")
    assert all(getattr(parsed, name) is None for name in parsed.__slots__)
    assert set(SHARED_FIELDS) == {
        "requests",
        "duration",
        "rate",
        "start",
        "slo_class",
        "max_output_tokens",
    }
    synthetic = workload_from_config(sections(trace_file)["synthetic"])
    assert (synthetic.start_us, synthetic.max_output_tokens) == (0, ORACLE)
    trace = workload_from_config(sections(trace_file)["trace"])
    assert (trace.start_us, trace.max_output_tokens, trace.slo_class) == (None, None, None)


def test_a_workload_needs_requests_or_a_duration_alike_in_synthetic_streams_and_specs(trace_file):
    s = sections(trace_file)
    errors = []
    for kind in ("synthetic", "spec"):
        section = {k: v for k, v in s[kind].items() if k != "requests"}
        errors.append(refusal(section))
    assert {e.path for e in errors} == {"workload.requests"}
    assert all("give requests (a count), duration (e.g. 10min), or both" in e.fix for e in errors)


def test_require_bound_names_the_requests_field_and_the_alternatives():
    require_bound(5, None, "workload")
    require_bound(None, 1, "workload")
    with pytest.raises(ScenarioError) as err:
        require_bound(None, None, "workload.clients[0]", " (or stages)")
    assert err.value.path == "workload.clients[0].requests"
    assert err.value.fix.endswith(
        "give requests (a count), duration (e.g. 10min), or both (or stages)"
    )


def test_a_workload_built_in_code_is_refused_with_the_scenario_parsers_words():
    from servesim.workloads.arrivals import arrival_from_config
    from servesim.workloads.lengths import ConstantLength

    def build(**kw):
        arrival = arrival_from_config(None, 1.0)
        one = ConstantLength(1)
        return SyntheticWorkload(rate=1.0, arrival=arrival, input=one, output=one, **kw)

    with pytest.raises(ScenarioError, match="give requests .a count., duration .e.g. 10min."):
        build()
    with pytest.raises(ScenarioError) as err:
        build(requests=3, max_output_tokens=-1)
    assert err.value.path == "workload.max_output_tokens"
    assert build(requests=3, max_output_tokens=7).max_output_tokens == 7
    assert build(requests=3).max_output_tokens == ORACLE
