"""Multi-turn sessions: closed-loop rounds that carry the conversation (INV-10, INV-11)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.audit import audit
from servesim.run import audit_input
from servesim.scenario import load_scenario
from servesim.simcore.errors import ScenarioError
from tests.conftest import run_scenario, scenario_dict


def sessions(rounds=3, think="200ms", context="accumulate", **kw):
    data = scenario_dict(
        requests=kw.pop("requests", 12),
        rate=kw.pop("rate", 5),
        input=kw.pop("input", {"type": "uniform", "min": 8, "max": 40}),
        output=kw.pop("output", {"type": "uniform", "min": 4, "max": 30}),
        kv_blocks=kw.pop("kv_blocks", 400),
        **kw,
    )
    data["workload"]["sessions"] = {"rounds": rounds, "think_time": think, "context": context}
    return data


def by_session(req):
    out = {}
    for i in np.argsort(req["id"]):
        out.setdefault(int(req["session_id"][i]), []).append(int(i))
    return {s: sorted(rows, key=lambda i: req["round_index"][i]) for s, rows in out.items()}


def test_each_round_arrives_a_think_time_after_the_previous_round_completed():
    results = run_scenario(sessions(kv_every_step=True))
    assert results.violations == []
    req = results.requests
    assert len(req["id"]) == 12 * 3
    for rows in by_session(req).values():
        assert [int(req["round_index"][i]) for i in rows] == [0, 1, 2]
        for a, b in zip(rows, rows[1:]):
            assert req["arrival_us"][b] == req["completion_us"][a] + 200_000


def test_accumulated_context_is_the_whole_conversation_and_hits_the_prefix_cache():
    results = run_scenario(sessions())
    req = results.requests
    for rows in by_session(req).values():
        for a, b in zip(rows, rows[1:]):
            context = req["prompt_tokens"][a] + req["output_tokens"][a]
            assert req["prompt_tokens"][b] > context  # plus a new user turn
            # the previous round's full blocks (4 tokens each) are found in the cache
            assert req["cached_tokens"][b] >= (context - 1) // 4 * 4 - 4
    assert results.summary["sessions"]["completed"] == 12


def test_without_accumulation_rounds_share_nothing():
    results = run_scenario(sessions(context="none"))
    req = results.requests
    later = req["round_index"] > 0
    assert (req["cached_tokens"][later] == 0).all()


def test_sessions_end_in_exactly_one_state():
    drained = run_scenario(sessions())
    assert set(drained.record.sessions.values()) == {"completed"}
    bounded = run_scenario(sessions(horizon="1s"))
    assert bounded.violations == []
    assert "interrupted" in set(bounded.record.sessions.values())
    # a conversation that outgrows max_model_len is dropped, which cancels the session
    cancelled = run_scenario(sessions(rounds=6, max_model_len=90))
    assert cancelled.violations == []
    assert "cancelled" in set(cancelled.record.sessions.values())
    s = cancelled.summary["sessions"]
    assert s["completed"] + s["cancelled"] + s["interrupted"] == s["count"] == 12


def test_the_auditor_catches_a_round_that_arrives_too_early():
    results = run_scenario(sessions())
    data = audit_input(results.record)
    req = dict(data.requests)
    arrival = req["arrival_us"].copy()
    late = int(np.flatnonzero(req["round_index"] == 1)[0])
    arrival[late] -= 100_001  # before the previous round's completion + think time
    req["arrival_us"] = arrival
    data.requests = req
    assert any(v.invariant == "INV-10" for v in audit(data))


@pytest.mark.parametrize(
    "value, field",
    [
        ({"think_time": "1s"}, "rounds"),
        ({"rounds": 0}, "rounds"),
        ({"rounds": 2, "context": "all"}, "context"),
    ],
)
def test_bad_session_settings_name_the_field(value, field):
    data = sessions()
    data["workload"]["sessions"] = value
    with pytest.raises(ScenarioError, match=f"workload.sessions.{field}"):
        load_scenario(data)


def test_closed_loop_users_never_have_more_than_one_request_each_in_the_system():
    data = scenario_dict(requests=150, input=16, output={"type": "uniform", "min": 2, "max": 12})
    data["workload"].pop("rate")
    data["workload"].pop("arrival")
    data["workload"]["sessions"] = {"users": 5, "think_time": "20ms"}
    results = run_scenario(data)
    assert results.violations == []
    req = results.requests
    assert len(req["id"]) == 150 and (req["status"] == 0).all()
    assert set(results.record.sessions.values()) == {"exhausted"}
    # at every arrival, at most 5 requests are between arrival and completion (one per user)
    events = sorted(
        [(int(a), 1) for a in req["arrival_us"]] + [(int(c), -1) for c in req["completion_us"]]
    )
    in_system = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        in_system += delta
        peak = max(peak, in_system)
    assert peak <= 5
    # users start staggered over one think time, then pace themselves
    firsts = np.sort(req["arrival_us"][req["round_index"] == 0])
    assert list(firsts) == [0, 4000, 8000, 12000, 16000]


def test_closed_loop_users_take_no_arrival_rate():
    data = scenario_dict(requests=10)
    data["workload"]["sessions"] = {"users": 2}
    with pytest.raises(ScenarioError, match="workload.rate"):
        load_scenario(data)
