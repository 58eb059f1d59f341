"""Closed-loop replay of a trace's recorded sessions (``workload.session_mode: closed-loop``).

A session's first replayed round arrives at its recorded time; each later round is sent a think
time after the round before it completed in the simulation, so a slow answer delays the rest of
the conversation, as it would a real user's. The think time before round ``i`` comes from the
trace, first found of:

1. ``recorded`` -- the row's own think time (TraceV2 ``think_time_us``);
2. ``observed`` -- the recorded gap after the previous round's answer: round ``i``'s arrival minus
   round ``i - 1``'s observed completion (TraceV2 ``last_chunk_time_us`` > 0), i.e. the arrival gap
   minus the previous round's recorded E2E;
3. ``arrival_gap`` -- the recorded arrival gap between the two rounds (no timings observed).

It is scaled like every recorded time (``time_scale / rate_scale``) and clamped at 0 (an observed
completion after the next round's send, from clock skew or a pipelined client, gives 0).

When the trace says its prompts accumulate the conversation (TraceV2 header
``session_context_growth: accumulate``), round ``i``'s new turn is its recorded prompt minus round
``i - 1``'s recorded prompt and output; when that is at least one token the round is sent as the
simulated conversation so far (the previous prompt and the answer actually generated) plus the
new turn, so the prefix cache sees the shared blocks. Otherwise a round is sent with its recorded
prompt (and its recorded prefix group, if any).

``requests`` and ``duration`` select the same rows as a fixed replay (by recorded arrival), so a
session keeps its rounds up to the selection's end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from servesim.simcore.errors import ScenarioError
from servesim.workloads.base import RecordedSessions, RequestSpec
from servesim.workloads.traces.table import TraceTable

THINK_SOURCES = ("recorded", "observed", "arrival_gap")


def check_sessions(table: TraceTable, path: str) -> None:
    """Refuse a trace that cannot be replayed closed loop, naming the fix: no session ids, rounds
    that are not consecutive, or a round recorded before the one it follows."""
    if not table.has_sessions:
        has = "has no session ids" if table.session is None else "has no row in a session"
        raise ScenarioError(
            f"{path}.session_mode",
            "closed-loop",
            f"the {table.format} trace {table.file} {has}; closed-loop replay needs each "
            "request's conversation (TraceV2 session_id and round_index columns): add them, or "
            "replay with session_mode: fixed",
        )
    rows = _by_session(table)
    session, rounds = table.session[rows], table.round_index[rows]
    position = _positions(table)[rows]
    same = session[1:] == session[:-1]
    for bad, what in (
        (same & (rounds[1:] != rounds[:-1] + 1), "its rounds must be consecutive (0, 1, 2, ...)"),
        (same & (position[1:] < position[:-1]), "it was recorded before the round it follows"),
    ):
        hit = np.flatnonzero(bad)
        if len(hit):
            a, b = int(rows[hit[0]]), int(rows[hit[0] + 1])
            name = table.session_names[int(table.session[b])]
            raise ScenarioError(
                f"{table.file}:{int(table.lines[b])}",
                f"round_index {int(table.round_index[b])}",
                f"session {name!r} (its previous round: line {int(table.lines[a])}, round "
                f"{int(table.round_index[a])}): {what}; fix the trace, or replay with "
                "session_mode: fixed",
            )


def plan_sessions(
    table: TraceTable,
    rows: np.ndarray,
    factor: float,
    make_specs: Callable[[np.ndarray], list[RequestSpec]],
) -> tuple[np.ndarray, np.ndarray, RecordedSessions]:
    """The closed-loop plan of the selected ``rows`` (in arrival order): ``(stream, tags,
    sessions)``, where ``stream`` are the positions in ``rows`` the request stream yields (first
    rounds and requests outside any session), ``tags`` their session ids (-1: none) and
    ``sessions`` the later rounds (``make_specs(rows)`` builds their specs)."""
    selected = np.zeros(len(table), dtype=bool)
    selected[rows] = True
    ordered = _by_session(table)
    ordered = ordered[selected[ordered]]  # by (session, round): each session's selected prefix
    session = table.session[ordered]
    opens = np.r_[True, session[1:] != session[:-1]] if len(ordered) else np.zeros(0, bool)
    starts = np.flatnonzero(opens)
    counts = np.diff(np.r_[starts, len(ordered)])
    # session ids in the order their first rounds arrive
    position = _positions(table)
    by_arrival = np.argsort(position[ordered[starts]], kind="stable")
    think, sources, clamped = _think_times(table, ordered, factor)
    turn, held = _new_turns(table, ordered)
    follow: list[int] = []
    follow_think: list[int] = []
    follow_turn: list[int] = []
    for k in by_arrival.tolist():
        a, b = int(starts[k]) + 1, int(starts[k] + counts[k])
        follow += ordered[a:b].tolist()
        follow_think += think[a:b].tolist()
        follow_turn += turn[a:b].tolist()
    tag_of_row = np.full(len(table), -1, dtype=np.int64)
    tag_of_row[ordered[starts[by_arrival]]] = np.arange(len(starts))
    later = np.zeros(len(table), dtype=bool)
    later[ordered[~opens]] = True
    stream = np.flatnonzero(~later[rows])
    tags = tag_of_row[rows[stream]]
    follow_rows = np.array(follow, dtype=np.int64)
    description = {
        "sessions": len(starts),
        "rounds": int(len(ordered)),
        "max_rounds": int(counts.max()) if len(counts) else 0,
        "requests_outside_sessions": int(len(rows) - len(ordered)),
        "think_time_from": dict(zip(THINK_SOURCES, sources)),
        "think_times_clamped_to_0": clamped,
        "context_growth": "accumulate" if _accumulates(table) else "none",
        "rounds_holding_the_conversation": held,
    }
    sessions = RecordedSessions(
        counts[by_arrival].tolist(),
        follow_think,
        follow_turn,
        lambda: make_specs(follow_rows),
        description,
    )
    return stream, tags, sessions


def _by_session(table: TraceTable) -> np.ndarray:
    """The rows in a session, sorted by (session, round index)."""
    rows = np.flatnonzero(table.session >= 0)
    return rows[np.lexsort((table.round_index[rows], table.session[rows]))]


def _positions(table: TraceTable) -> np.ndarray:
    """Each row's place in the replay's arrival order."""
    if table.order is None:
        return np.arange(len(table), dtype=np.int64)
    position = np.empty(len(table), dtype=np.int64)
    position[table.order] = np.arange(len(table))
    return position


def _think_times(
    table: TraceTable, ordered: np.ndarray, factor: float
) -> tuple[np.ndarray, list[int], int]:
    """Think time (µs, scaled, >= 0) before each of ``ordered``'s rows (0 for first rounds), how
    many came from each of THINK_SOURCES, and how many were clamped at 0."""
    n = len(ordered)
    think = np.zeros(n, dtype=np.int64)
    if n < 2:
        return think, [0, 0, 0], 0
    prev, cur = ordered[:-1], ordered[1:]
    follows = table.session[cur] == table.session[prev]
    recorded = table.think_us[cur]
    done = table.done_us[prev]
    arrival = table.arrival_us
    observed = (recorded < 0) & (done >= 0)
    gap = (recorded < 0) & (done < 0)
    raw = np.where(recorded >= 0, recorded, arrival[cur] - np.where(observed, done, arrival[prev]))
    if factor != 1.0:
        raw = np.rint(raw.astype(np.float64) * factor).astype(np.int64)
    clamped = int((follows & (raw < 0)).sum())
    think[1:] = np.where(follows, np.maximum(raw, 0), 0)
    sources = [int((follows & m).sum()) for m in (recorded >= 0, observed, gap)]
    return think, sources, clamped


def _accumulates(table: TraceTable) -> bool:
    return table.metadata.get("session_context_growth") == "accumulate"


def _new_turns(table: TraceTable, ordered: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's new turn when its prompt holds the conversation before it, else -1; and how
    many later rounds hold it."""
    turn = np.full(len(ordered), -1, dtype=np.int64)
    if len(ordered) < 2 or not _accumulates(table):
        return turn, 0
    prev, cur = ordered[:-1], ordered[1:]
    follows = table.session[cur] == table.session[prev]
    prompt, output = table.prompt_tokens, table.output_tokens
    new = prompt[cur] - prompt[prev] - output[prev]
    holds = follows & (new >= 1)
    turn[1:] = np.where(holds, new, -1)
    return turn, int(holds.sum())


def describe_mode(table: TraceTable, sessions: RecordedSessions | None) -> dict[str, Any]:
    """The session part of a trace replay's description."""
    if sessions is not None:
        return {"session_mode": "closed-loop", "sessions": sessions.describe()}
    count = len(table.session_names) if table.has_sessions else 0
    return {"session_mode": "fixed", "sessions": {"sessions": count} if count else None}
