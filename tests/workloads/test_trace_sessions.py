"""Closed-loop replay of a trace's recorded sessions (``workload.session_mode: closed-loop``).

Most runs use a clock that is easy to follow: every engine step takes exactly 1 ms (blackbox
``beta: [1000, 0, 0]``, ``alpha: 0``), a step gives each running request one token, and a request
alone on the instance starts its first step when it arrives. So a request arriving at ``t`` with
``n`` output tokens completes at ``t + n`` ms, whatever else runs beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.cli import main as cli_main
from servesim.components.record import STATUS_COMPLETED
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from servesim.workloads.traces import TraceWorkload
from tests.conftest import run_scenario, scenario_dict

COLUMNS = "request_id,session_id,round_index,input_tokens,output_tokens,arrival_time_us"
ACCUMULATE = "trace_version: 3\ntime_unit: microseconds\nsession_context_growth: accumulate\n"


def write_v2(tmp_path: Path, rows: list[str], columns: str = COLUMNS, header: str = "") -> str:
    """A TraceV2 pair ``run.yaml`` + ``run.csv``; the path of the header."""
    (tmp_path / "run.csv").write_text("\n".join([columns, *rows]) + "\n", encoding="utf-8")
    (tmp_path / "run.yaml").write_text(header or "trace_version: 3\n", encoding="utf-8")
    return str(tmp_path / "run.yaml")


def replay(trace: str, mode: str = "closed-loop", **kw) -> dict:
    """A scenario replaying ``trace`` on the 1-ms-per-step instance (``kw``: scenario_dict's)."""
    kw.setdefault("kv_blocks", 400)
    workload = {"trace": trace, "session_mode": mode, **kw.pop("workload", {})}
    data = scenario_dict(beta=(1000, 0, 0), **kw)
    data["workload"] = workload
    return data


def rows_by_id(results) -> list[dict[str, int]]:
    req = results.requests
    keys = ("session_id", "round_index", "arrival_us", "completion_us", "think_us", "status")
    return [{k: int(req[k][i]) for k in keys} for i in np.argsort(req["id"])]


def arrivals(results) -> list[tuple[int, int, int]]:
    """(session, round, arrival µs) of every request, by arrival."""
    return sorted((r["arrival_us"], r["session_id"], r["round_index"]) for r in rows_by_id(results))


SLOW_FIRST_ROUND = [
    "0,a,0,8,50,0",
    "1,a,1,8,10,20000",
    "2,b,0,8,5,100000",
    "3,b,1,8,5,200000",
]


def test_closed_loop_delays_the_round_after_a_slow_answer(tmp_path):
    """Session a: round 0 at 0 with 50 output tokens; round 1 recorded at 20 ms. Session b:
    round 0 at 100 ms (5 tokens), round 1 recorded at 200 ms. No timings were observed, so the
    think times are the recorded arrival gaps: 20 ms (a) and 100 ms (b).

    Closed loop: a0 completes at 0 + 50 ms = 50 ms, so a1 arrives at 50 + 20 = 70 ms (not 20);
    b0 completes at 105 ms, so b1 arrives at 105 + 100 = 205 ms. Fixed: the recorded times."""
    trace = write_v2(tmp_path, SLOW_FIRST_ROUND)
    closed = run_scenario(replay(trace))
    assert arrivals(closed) == [(0, 0, 0), (70_000, 0, 1), (100_000, 1, 0), (205_000, 1, 1)]
    rows = rows_by_id(closed)
    assert [r["completion_us"] for r in rows] == [
        50_000,
        80_000,
        105_000,
        210_000,
    ]  # ids: by arrival
    assert [r["think_us"] for r in rows] == [0, 20_000, 0, 100_000]
    assert set(closed.record.sessions.values()) == {"completed"}
    assert closed.summary["sessions"]["count"] == 2
    assert closed.summary["sessions"]["completed"] == 2
    d = TraceWorkload.from_config({"trace": trace, "session_mode": "closed-loop"}).describe()
    assert d["sessions"]["think_time_from"] == {"recorded": 0, "observed": 0, "arrival_gap": 2}

    fixed = run_scenario(replay(trace, "fixed"))
    assert [a for a, _, _ in arrivals(fixed)] == [0, 20_000, 100_000, 200_000]
    assert (fixed.requests["session_id"] == -1).all()  # fixed: plain requests, as before
    assert fixed.record.sessions is None


def test_think_times_come_from_the_trace_and_are_clamped_at_zero(tmp_path):
    """a1 has a recorded think time (2 ms); a2 follows a1's observed answer (recorded at 50 ms)
    but was sent at 40 ms, so its think time is 40 − 50 < 0, clamped to 0; b1 has neither, so its
    think time is the arrival gap 130 − 100 = 30 ms.

    Closed loop: a0 (5 tokens) completes at 5 ms; a1 arrives at 5 + 2 = 7 ms and completes at
    12 ms; a2 arrives at 12 ms. b0 completes at 105 ms, b1 arrives at 135 ms."""
    columns = COLUMNS + ",last_chunk_time_us,think_time_us"
    trace = write_v2(
        tmp_path,
        [
            "0,a,0,8,5,0,0,",
            "1,a,1,8,5,10000,50000,2000",
            "2,a,2,8,5,40000,0,",
            "3,b,0,8,5,100000,,",
            "4,b,1,8,5,130000,,",
        ],
        columns,
    )
    results = run_scenario(replay(trace))
    assert [a for a, _, _ in arrivals(results)] == [0, 7_000, 12_000, 100_000, 135_000]
    d = TraceWorkload.from_config({"trace": trace, "session_mode": "closed-loop"}).describe()
    assert d["session_mode"] == "closed-loop"
    s = d["sessions"]
    assert s["think_time_from"] == {"recorded": 1, "observed": 1, "arrival_gap": 1}
    assert s["think_times_clamped_to_0"] == 1
    assert (s["sessions"], s["rounds"], s["max_rounds"]) == (2, 5, 3)
    # think times are recorded durations: time_scale stretches them like every recorded time
    slow = run_scenario(replay(trace, workload={"time_scale": 2}))
    assert sorted(int(t) for t in slow.requests["think_us"]) == [0, 0, 0, 4_000, 60_000]


def test_a_refused_round_ends_its_session(tmp_path):
    """Round a1's prompt (200 tokens) exceeds max_model_len (100): it is dropped, which cancels
    session a, so a2 is never sent; session b completes. Each request that arrived is counted
    once: 4 of the trace's 5 rows."""
    trace = write_v2(
        tmp_path,
        ["0,a,0,8,5,0", "1,a,1,200,5,1000", "2,a,2,8,5,2000", "3,b,0,8,5,0", "4,b,1,8,5,500"],
    )
    results = run_scenario(replay(trace, max_model_len=100))
    assert results.record.arrived == 4 == len(results.requests["id"])
    assert results.record.sessions == {0: "cancelled", 1: "completed"}
    s = results.summary["sessions"]
    assert (s["count"], s["completed"], s["cancelled"]) == (2, 1, 1)
    cancelled = [r for r in rows_by_id(results) if r["session_id"] == 0]
    assert [r["round_index"] for r in cancelled] == [0, 1]
    assert cancelled[-1]["status"] != STATUS_COMPLETED


def test_a_round_due_after_the_horizon_interrupts_its_session(tmp_path):
    trace = write_v2(tmp_path, SLOW_FIRST_ROUND)
    results = run_scenario(replay(trace, horizon="150ms"))
    # b1 would arrive at 205 ms (the first test), after the horizon
    assert results.record.sessions == {0: "completed", 1: "interrupted"}
    assert results.record.arrived == 3


def test_rounds_that_hold_the_conversation_hit_the_prefix_cache(tmp_path):
    """With ``session_context_growth: accumulate`` a1's recorded prompt (40 + 10 + 20 = 70 tokens)
    holds a0's prompt (40) and answer (10): it is sent as that conversation plus a 20-token turn,
    so its 12 full 4-token blocks of context are found in the cache. a2's recorded prompt (30) is
    shorter than the conversation: it is sent as recorded and shares nothing."""
    rows = ["0,a,0,40,10,0", "1,a,1,70,10,1000", "2,a,2,30,5,2000"]
    results = run_scenario(replay(write_v2(tmp_path, rows, header=ACCUMULATE)))
    req = results.requests
    order = np.argsort(req["arrival_us"])
    assert req["prompt_tokens"][order].tolist() == [40, 70, 30]
    assert req["cached_tokens"][order].tolist() == [0, 48, 0]
    d = TraceWorkload.from_config({"trace": str(tmp_path / "run"), "session_mode": "closed-loop"})
    assert d.describe()["sessions"]["rounds_holding_the_conversation"] == 1
    # without the header, rounds are sent with their recorded prompts: no context, no hits
    plain = run_scenario(replay(write_v2(tmp_path, rows)))
    assert (plain.requests["cached_tokens"] == 0).all()


def test_requests_select_the_same_rows_in_both_modes(tmp_path):
    trace = write_v2(tmp_path, SLOW_FIRST_ROUND)
    for mode in ("fixed", "closed-loop"):
        results = run_scenario(replay(trace, mode, workload={"requests": 3}))
        assert results.record.arrived == 3  # a0, a1, b0: b1 is outside the selection
    closed = run_scenario(replay(trace, workload={"requests": 3}))
    assert closed.record.sessions == {0: "completed", 1: "completed"}
    assert closed.summary["sessions"]["count"] == 2


def test_requests_outside_sessions_keep_their_recorded_times(tmp_path):
    trace = write_v2(tmp_path, ["0,a,0,8,50,0", "1,,0,8,5,3000", "2,a,1,8,5,4000"])
    results = run_scenario(replay(trace))
    plain = [r for r in rows_by_id(results) if r["session_id"] < 0]
    assert [r["arrival_us"] for r in plain] == [3000]
    assert arrivals(results)[-1] == (54_000, 0, 1)  # a0 done at 50 ms, think 4 ms


def test_the_cli_flag_sets_the_session_mode(tmp_path, capsys):
    trace = write_v2(tmp_path, SLOW_FIRST_ROUND)
    out = tmp_path / "out"
    args = ["run", "--trace", trace, "--session-mode", "closed-loop", "--out", str(out)]
    assert cli_main([*args, "--set", "latency.model=blackbox"]) in (0, 3)
    assert "closed-loop" in (out / "summary.json").read_text(encoding="utf-8")
    s = load_scenario(None, ["workload={trace: " + trace + "}", "workload.session_mode=fixed"])
    assert s.workload.session_mode == "fixed"


# ---------------------------------------------------------------------------- refusals


def test_a_format_without_session_ids_is_refused_with_the_fix(tmp_path):
    jsonl = tmp_path / "conv.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    for trace in (str(jsonl), "azure-code"):
        with pytest.raises(ScenarioError, match="workload.session_mode") as err:
            TraceWorkload.from_config({"trace": trace, "session_mode": "closed-loop"})
        assert "session_mode: fixed" in str(err.value) and "session_id" in str(err.value)
    no_sessions = write_v2(
        tmp_path, ["0,8,5,0"], "request_id,input_tokens,output_tokens,arrival_time_us"
    )
    with pytest.raises(ScenarioError, match="has no session ids"):
        TraceWorkload.from_config({"trace": no_sessions, "session_mode": "closed-loop"})
    empty = write_v2(tmp_path, ["0,,0,8,5,0"])
    with pytest.raises(ScenarioError, match="has no row in a session"):
        TraceWorkload.from_config({"trace": empty, "session_mode": "closed-loop"})


@pytest.mark.parametrize(
    "rows, line, what",
    [
        (["0,a,0,8,5,0", "1,a,2,8,5,10"], 3, "consecutive"),
        (["0,a,0,8,5,0", "1,a,0,8,5,10"], 3, "consecutive"),
        (["0,a,1,8,5,0", "1,a,0,8,5,10"], 2, "recorded before the round it follows"),
    ],
)
def test_rounds_that_cannot_replay_closed_loop_name_the_line(tmp_path, rows, line, what):
    trace = write_v2(tmp_path, rows)
    with pytest.raises(ScenarioError, match=f"run.csv:{line}.*{what}.*session_mode: fixed"):
        TraceWorkload.from_config({"trace": trace, "session_mode": "closed-loop"})
    assert len(TraceWorkload.from_config({"trace": trace})) == 2  # a fixed replay takes them


def test_bad_session_columns_and_modes_name_the_field(tmp_path):
    trace = write_v2(tmp_path, SLOW_FIRST_ROUND)
    with pytest.raises(ScenarioError, match="workload.session_mode.*fixed, closed-loop"):
        TraceWorkload.from_config({"trace": trace, "session_mode": "closed"})
    half = write_v2(
        tmp_path, ["0,a,8,5,0"], "request_id,session_id,input_tokens,output_tokens,arrival_time_us"
    )
    with pytest.raises(ScenarioError, match="session_id and round_index go together"):
        TraceWorkload.from_config({"trace": half})
    missing = write_v2(tmp_path, ["0,a,,8,5,0"])
    with pytest.raises(ScenarioError, match="run.csv:2.*round_index"):
        TraceWorkload.from_config({"trace": missing})
    with pytest.raises(ScenarioError, match="workload.session_mode"):
        load_scenario(scenario_dict(), ["workload.session_mode=closed-loop"])  # not a trace


# ---------------------------------------------------------------------------- property


@st.composite
def traced_sessions(draw):
    """A small TraceV2 of a few sessions (1-4 rounds), some requests outside them, recorded gaps
    and sometimes observed completions, sometimes accumulating prompts."""
    rows, t, line = [], 0, 0
    for s in range(draw(st.integers(1, 4))):
        prompt = draw(st.integers(1, 40))
        start = t = t + draw(st.integers(0, 30_000))
        for r in range(draw(st.integers(1, 4))):
            output = draw(st.integers(1, 12))
            done = t + draw(st.sampled_from([0, 1, 5_000, 60_000]))
            rows.append(f"{line},s{s},{r},{prompt},{output},{t},{done if done > t else 0}")
            line += 1
            t += draw(st.integers(0, 40_000))
            prompt = prompt + output + draw(st.integers(-5, 20))
            prompt = max(prompt, 1)
        t = start
    for _ in range(draw(st.integers(0, 3))):
        rows.append(
            f"{line},,0,{draw(st.integers(1, 30))},{draw(st.integers(1, 8))},"
            f"{draw(st.integers(0, 100_000))},0"
        )
        line += 1
    header = ACCUMULATE if draw(st.booleans()) else ""
    engine = {
        "kv_blocks": draw(st.sampled_from([30, 400])),
        "max_model_len": draw(st.sampled_from([60, 100])),
        "horizon": draw(st.sampled_from([None, "80ms"])),
    }
    return rows, header, engine


PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def run_case(tmp_path_factory, case, **extra):
    """Replay a drawn trace closed loop."""
    rows, header, engine = case
    columns = COLUMNS + ",last_chunk_time_us"
    trace = write_v2(tmp_path_factory.mktemp("t"), rows, columns, header=header)
    return run_scenario(replay(trace, **engine, **extra))


def check_closed_loop_rules(results, n_rows: int) -> None:
    """Every round counted once, rounds in order, each later round sent its think time after the
    previous one completed, and end states that agree with the rounds."""
    req = results.requests
    assert results.record.arrived == len(req["id"]) <= n_rows
    assert len(set(req["id"].tolist())) == len(req["id"])
    states = results.record.sessions
    for sid, state in states.items():
        members = np.flatnonzero(req["session_id"] == sid)
        members = members[np.argsort(req["round_index"][members])]
        assert req["round_index"][members].tolist() == list(range(len(members)))
        for a, b in zip(members, members[1:]):
            assert req["arrival_us"][b] == req["completion_us"][a] + req["think_us"][b]
        done = req["status"][members] == STATUS_COMPLETED
        if state == "completed":
            assert done.all() and len(members) == results.record.session_rounds[sid]
        elif state == "cancelled":
            assert not done[-1]
        else:
            assert state == "interrupted" and results.record.horizon_us is not None


@PROPERTY
@given(traced_sessions())
def test_random_traced_sessions_obey_the_closed_loop_rules(tmp_path_factory, case):
    check_closed_loop_rules(run_case(tmp_path_factory, case), len(case[0]))


@PROPERTY
@given(traced_sessions())
def test_random_traced_sessions_pass_the_audit(tmp_path_factory, case):
    assert run_case(tmp_path_factory, case, kv_every_step=True).violations == []


def test_converting_a_trace_with_sessions_refuses_to_drop_them_silently(tmp_path):
    from servesim.workloads.traces import convert

    trace = write_v2(tmp_path, [*SLOW_FIRST_ROUND, "4,,0,8,5,300000"])
    with pytest.raises(ScenarioError, match="4 rows belong to recorded sessions.*--lossy"):
        convert(trace, tmp_path / "out.csv")
    result = convert(trace, tmp_path / "out.csv", strict=False)
    assert result["dropped"] == {"sessions": 4} and result["rows"] == 5
