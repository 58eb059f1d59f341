"""KV-transfer links: closed forms, hand-computed schedules, BLIS at-start sharing, the checker.

Links are driven by tiny SimPy processes: each waits until its start time, calls ``link.start``,
yields the returned event and records ``env.now``. ``check_transfers`` is exercised both on clean
logs (it must find nothing) and on logs with seeded faults (it must name the culprit).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.audit.transfer_schedule import check_links, check_transfers
from servesim.components.transfer import (
    AT_START,
    INFO_COLUMNS,
    PROCESSOR_SHARING,
    SHARING_RULES,
    TRANSFER_COLUMNS,
    TransferLink,
    TransferLog,
)
from servesim.simcore.env import STEP_BASE, SimEnvironment, StepEvent


def closed_form(nbytes: float, bandwidth: float, base: int) -> int:
    """A lone transfer's duration: base + ceil(bytes / bandwidth), with the 1e-9 µs rule."""
    return base + math.ceil(nbytes / bandwidth - 1e-9)


class Run:
    """One simulation: links sharing a log, and transfers (link, start, bytes) fired at them."""

    def __init__(self, links, transfers, until=None):
        self.env = env = SimEnvironment()
        self.log = TransferLog()
        self.links = [
            TransferLink(env, i, f"link{i}", bw, base, sharing, self.log)
            for i, (bw, base, sharing) in enumerate(links)
        ]
        self.ends: dict[int, int] = {}
        self.values: dict[int, int] = {}
        self.resumed: list[int] = []
        for tid, (link, start, nbytes) in enumerate(transfers):
            env.process(self._transfer(tid, link, start, nbytes))
        env.run(until=until)

    def _transfer(self, tid, link, start, nbytes):
        yield self.env.timeout(start)
        value = yield self.links[link].start(tid, nbytes, ("req", tid))
        self.values[tid] = value
        self.ends[tid] = self.env.now
        self.resumed.append(tid)

    def check(self) -> list[str]:
        return check_links(self.log, self.links)

    def arrays(self):
        return {"transfers": self.log.as_arrays(), "changes": self.log.changes_as_arrays()}

    def specs(self):
        return [link.describe() for link in self.links]


def one_link(transfers, bw=10.0, base=0, sharing=PROCESSOR_SHARING, until=None) -> Run:
    return Run([(bw, base, sharing)], [(0, start, nbytes) for start, nbytes in transfers], until)


# ---------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("sharing", SHARING_RULES)
@pytest.mark.parametrize(
    ("nbytes", "bw", "base"),
    [
        (100, 10.0, 0),
        (100, 10.0, 7),
        (101, 10.0, 3),  # 10.1 µs -> 11
        (1, 3.0, 0),  # 1/3 µs -> 1
        (12.5, 2.5, 2),  # exactly 5 µs
        (1e9, 7.3, 11),  # non-integer quotient, large
        (0.3, 0.1, 0),  # 0.3/0.1 = 2.9999999999999996 in floats: 3 µs by the 1e-9 rule
        (0, 10.0, 4),  # zero bytes: done at the join
    ],
)
def test_a_lone_transfer_takes_the_closed_form(sharing, nbytes, bw, base):
    run = one_link([(13, nbytes)], bw=bw, base=base, sharing=sharing)
    expected = 13 + closed_form(nbytes, bw, base)
    assert run.ends == {0: expected}
    assert run.values == {0: expected}
    t = run.log.as_arrays()
    assert t["end_us"].tolist() == [expected]
    assert t["uncontended_us"].tolist() == [expected - 13]
    assert t["join_us"].tolist() == [13 + base]
    assert t["info"][0] == ("req", 0)
    assert run.check() == []
    link = run.links[0]
    assert (link.started, link.completed, link.active) == (1, 1, 0)
    assert link.bytes_moved == nbytes


# ---------------------------------------------------------------------- processor sharing by hand


def test_two_transfers_share_the_link():
    # bw 10: A alone 0-5 (50 B left), both at 5 B/µs, A done at 15, B (50 B left) alone to 20
    run = one_link([(0, 100), (5, 100)])
    assert run.ends == {0: 15, 1: 20}
    c = run.log.changes_as_arrays()
    assert c["time_us"].tolist() == [0, 5, 15, 20]
    assert c["active"].tolist() == [1, 2, 1, 0]
    assert c["rate"].tolist() == [10, 5, 10, 0]
    assert run.links[0].peak == 2
    assert run.check() == []


def test_three_transfers_with_base_latency_by_hand():
    # bw 10 B/µs, base 2 µs.  A = 100 B starts 0 (joins 2), B = 60 B starts 3 (joins 5),
    # C = 25 B starts 5 (joins 7).
    #  2-5:    A alone at 10          -> A 70 left
    #  5-7:    A, B at 5              -> A 60, B 50 left
    #  7-14.5: A, B, C at 10/3: C's 25 B take 7.5 µs -> A 35, B 25 left; C delivered at 15
    #  14.5-19.5: A, B at 5: B's 25 B take 5 µs      -> A 10 left; B delivered at 20
    #  19.5-20.5: A alone at 10                      -> A delivered at 21
    run = one_link([(0, 100), (3, 60), (5, 25)], base=2)
    assert run.ends == {0: 21, 1: 20, 2: 15}
    t = run.log.as_arrays()
    assert t["id"].tolist() == [2, 1, 0]  # rows in delivery order
    assert t["finish_us"].tolist() == [14.5, 19.5, 20.5]
    assert t["uncontended_us"].tolist() == [5, 8, 12]
    c = run.log.changes_as_arrays()
    assert c["time_us"].tolist() == [2, 5, 7, 14.5, 19.5, 20.5]
    assert c["active"].tolist() == [1, 2, 3, 2, 1, 0]
    assert c["rate"].tolist() == pytest.approx([10, 5, 10 / 3, 5, 10, 0])
    assert run.check() == []


def test_a_busy_link_is_work_conserving():
    sizes = [70, 130, 45.5, 300, 12]
    run = one_link([(0, b) for b in sizes], bw=8.0)
    assert max(run.ends.values()) == math.ceil(sum(sizes) / 8.0)
    # equal shares: the smaller a transfer, the earlier it is delivered
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    assert [run.ends[i] for i in order] == sorted(run.ends.values())
    assert run.check() == []


def test_simultaneous_deliveries_succeed_in_join_order():
    # A = 100 B at 0, B = 50 B at 5: both have 50 B left at 5 and finish together at 15
    run = one_link([(0, 100), (5, 50)])
    assert run.ends == {0: 15, 1: 15}
    assert run.resumed == [0, 1]
    assert run.log.as_arrays()["id"].tolist() == [0, 1]
    assert run.check() == []


def test_completions_come_before_batch_formation_at_the_same_instant():
    env = SimEnvironment()
    link = TransferLink(env, 0, "l", 10.0, 0, PROCESSOR_SHARING, TransferLog())
    seen = []
    done = link.start(0, 150)
    done.callbacks.append(lambda ev: seen.append(("transfer", env.now)))
    step = StepEvent(env, 15, STEP_BASE)
    step.callbacks.append(lambda ev: seen.append(("step", env.now)))
    env.run()
    assert seen == [("transfer", 15), ("step", 15)]


def test_zero_byte_transfers_complete_at_their_join():
    run = one_link([(0, 100), (4, 0), (4, 0)], base=3)
    assert run.ends == {0: 13, 1: 7, 2: 7}
    assert run.log.changes_as_arrays()["active"].tolist() == [1, 0]
    assert run.check() == []


def test_a_start_at_an_instant_already_processed_joins_at_once():
    # A (1 B/µs) finishes at 10 + 5e-10 µs and is delivered at 10; B, started at 10 by A's
    # delivery, joins a link whose clock is already past 10: it joins then (5e-10 µs late).
    env = SimEnvironment()
    log = TransferLog()
    link = TransferLink(env, 0, "l", 1.0, 0, PROCESSOR_SHARING, log)
    ends = {}

    def chain():
        ends["A"] = yield link.start(0, 10 + 5e-10)
        ends["B"] = yield link.start(1, 10)

    env.process(chain())
    env.run()
    assert ends == {"A": 10, "B": 20}
    c = log.changes_as_arrays()
    # A's completion and B's join are one change point
    assert c["time_us"].tolist() == pytest.approx([0, 10 + 5e-10, 20 + 5e-10], abs=1e-12)
    assert c["active"].tolist() == [1, 1, 0]
    assert check_links(log, [link]) == []


def test_cluster_info_is_unpacked_into_columns():
    env = SimEnvironment()
    log = TransferLog()
    link = TransferLink(env, 0, "l", 10.0, 0, PROCESSOR_SHARING, log)
    link.start(7, 100, (7, 0, 2, 12))  # (request, prefill instance, decode instance, blocks)
    link.start(9, 50, (9, 1, 3, 6))
    env.run()
    t = log.as_arrays()
    assert t["id"].tolist() == [9, 7]
    assert t["request"].tolist() == [9, 7]
    assert t["prefill_instance"].tolist() == [1, 0]
    assert t["decode_instance"].tolist() == [3, 2]
    assert t["blocks"].tolist() == [6, 12]
    assert t["info"].tolist() == [(9, 1, 3, 6), (7, 0, 2, 12)]
    assert set(t) == set(TRANSFER_COLUMNS) | set(INFO_COLUMNS)
    empty = TransferLog().as_arrays()
    assert empty["prefill_instance"].dtype == np.int64 and len(empty["prefill_instance"]) == 0
    other = one_link([(0, 10)]).log.as_arrays()  # info ("req", 0): kept as objects only
    assert set(other) == set(TRANSFER_COLUMNS)


def test_bad_parameters_are_refused():
    env = SimEnvironment()
    log = TransferLog()
    with pytest.raises(ValueError):
        TransferLink(env, 0, "l", 0.0, 0, PROCESSOR_SHARING, log)
    with pytest.raises(ValueError):
        TransferLink(env, 0, "l", 1.0, -1, PROCESSOR_SHARING, log)
    with pytest.raises(ValueError):
        TransferLink(env, 0, "l", 1.0, 0, "fair", log)
    link = TransferLink(env, 0, "l", 1.0, 0, AT_START, log)
    with pytest.raises(ValueError):
        link.start(0, -5)


# ---------------------------------------------------------------------- at-start (BLIS)


def test_at_start_halves_the_second_of_two_concurrent_transfers():
    run = one_link([(0, 100), (0, 100)], sharing=AT_START)
    assert run.ends == {0: 10, 1: 20}  # the second got bw/2 for its whole life
    assert run.log.as_arrays()["rate"].tolist() == [10, 5]
    ps = one_link([(0, 100), (0, 100)])
    assert ps.ends == {0: 20, 1: 20}
    assert run.check() == [] and ps.check() == []


def test_at_start_by_hand():
    # bw 10. A = 100 B at 0: alone, rate 10, done at 10.  B = 100 B at 5: A active, rate 5 fixed,
    # done at 25 (processor sharing would give 20).  C = 30 B at 12: only B active, rate 5,
    # done at 18.  Rate sums: 10, 15 (above the bandwidth: the BLIS approximation), 5, 10, 5, 0.
    run = one_link([(0, 100), (5, 100), (12, 30)], sharing=AT_START)
    assert run.ends == {0: 10, 1: 25, 2: 18}
    t = run.log.as_arrays()
    assert dict(zip(t["id"].tolist(), t["rate"].tolist())) == {0: 10, 1: 5, 2: 5}
    c = run.log.changes_as_arrays()
    assert c["time_us"].tolist() == [0, 5, 10, 12, 18, 25]
    assert c["active"].tolist() == [1, 2, 1, 2, 1, 0]
    assert c["rate"].tolist() == [10, 15, 5, 10, 5, 0]
    assert run.check() == []


# ---------------------------------------------------------------------- property


transfer_lists = st.lists(
    st.tuples(
        st.integers(0, 1),  # link
        st.integers(0, 200),  # start
        st.one_of(
            st.just(0.0),
            st.integers(1, 5000).map(float),
            st.floats(0.001, 5000.0),
            st.floats(1e-9, 1e-6),  # finishes within a nanosecond or so of its join
        ),
    ),
    min_size=1,
    max_size=30,
)
link_params = st.tuples(
    st.one_of(st.sampled_from([1.0, 2.5, 3.0, 10.0, 64.0]), st.floats(0.3, 100.0)),
    st.integers(0, 20),
)


@settings(max_examples=100, deadline=None)
@given(transfers=transfer_lists, params=st.lists(link_params, min_size=2, max_size=2))
def test_contention_never_shortens_a_transfer(transfers, params):
    for sharing in SHARING_RULES:
        run = Run([(bw, base, sharing) for bw, base in params], transfers)
        assert len(run.ends) == len(transfers)
        for tid, (link, start, nbytes) in enumerate(transfers):
            bw, base = params[link]
            assert run.values[tid] == run.ends[tid]
            assert run.ends[tid] >= start + closed_form(nbytes, bw, base)
        assert run.check() == [], sharing
        assert sum(link.active for link in run.links) == 0
        assert sum(link.completed for link in run.links) == len(transfers)


# ---------------------------------------------------------------------- the checker


def tampered(run: Run, table: str, column: str, row: int, value) -> list[str]:
    data = run.arrays()
    data[table] = {name: col.copy() for name, col in data[table].items()}
    data[table][column][row] = value
    return check_transfers(**data, links=run.specs(), started=len(run.ends), in_flight=0)


def row_of(run: Run, tid: int) -> int:
    return run.log.as_arrays()["id"].tolist().index(tid)


@pytest.fixture
def hand_run() -> Run:
    run = one_link([(0, 100), (3, 60), (5, 25)], base=2)
    assert run.check() == []
    return run


def test_the_checker_catches_a_tampered_rate(hand_run):
    c = hand_run.log.changes_as_arrays()
    row = c["time_us"].tolist().index(7.0)
    problems = tampered(hand_run, "changes", "rate", row, 4.0)
    assert any("link 0 at 7 µs" in p and "rate" in p for p in problems), problems
    # the transfers active across it no longer integrate to their bytes
    assert any(p.startswith("transfer 2 (link 0)") and "integrates" in p for p in problems)


def test_the_checker_catches_a_tampered_byte_count(hand_run):
    problems = tampered(hand_run, "transfers", "bytes", row_of(hand_run, 1), 65.0)
    assert problems and all("transfer 1 (link 0)" in p for p in problems), problems
    assert any("integrates" in p for p in problems)


def test_the_checker_catches_a_tampered_end_time(hand_run):
    problems = tampered(hand_run, "transfers", "end_us", row_of(hand_run, 2), 14)
    assert problems == [
        "transfer 2 (link 0): delivered at 14, but its finish 14.5 rounds up to 15"
    ], problems


def test_the_checker_catches_a_dropped_transfer(hand_run):
    data = hand_run.arrays()
    keep = data["transfers"]["id"] != 1
    data["transfers"] = {name: col[keep] for name, col in data["transfers"].items()}
    problems = check_transfers(**data, links=hand_run.specs(), started=3, in_flight=0)
    assert any(p.startswith("conservation: 3 transfers started") for p in problems), problems
    assert any(p.startswith("link 0 at 5 µs: 2 transfers active") for p in problems)


def test_the_checker_catches_a_broken_blis_rate():
    run = one_link([(0, 100), (5, 100), (12, 30)], sharing=AT_START)
    row = row_of(run, 1)
    # a rate consistent with its duration, but not bandwidth / (transfers active + 1)
    data = run.arrays()
    t = data["transfers"]
    t["rate"][row] = 10.0
    t["finish_us"][row] = 15.0
    t["end_us"][row] = 15
    problems = check_transfers(**data, links=run.specs(), started=3, in_flight=0)
    assert any("transfer 1 (link 0): fixed rate 10 = bandwidth / 1" in p for p in problems)


def test_the_checker_catches_a_transfer_faster_than_the_link():
    run = one_link([(0, 100)])
    problems = tampered(run, "transfers", "bytes", 0, 1000.0)
    assert any("faster than the bandwidth" in p for p in problems), problems


def test_in_flight_transfers_are_accounted_for():
    for sharing in SHARING_RULES:
        run = one_link([(0, 100), (5, 100), (6, 10), (12, 30)], base=3, sharing=sharing, until=14)
        flight = run.log.in_flight(run.links)
        assert sorted(flight["id"].tolist()) == sorted(set(range(4)) - set(run.ends))
        assert len(run.ends) + len(flight["id"]) == 4
        assert flight["joined"].tolist() == [1] * (len(flight["id"]) - 1) + [0]  # 3 joins at 15
        assert run.check() == []
        data = run.arrays()
        n = len(flight["id"])
        assert check_transfers(**data, links=run.specs(), started=4, in_flight=n) == []
        wrong = check_transfers(**data, links=run.specs(), started=4, in_flight=n - 1)
        assert any(p.startswith("conservation") for p in wrong)


def test_two_identical_runs_log_identically():
    rng = np.random.default_rng(7)
    transfers = [
        (int(rng.integers(0, 3)), int(rng.integers(0, 2000)), float(rng.lognormal(6, 1)))
        for _ in range(300)
    ]
    links = [(12.5, 4, PROCESSOR_SHARING), (7.0, 0, AT_START), (30.0, 9, PROCESSOR_SHARING)]
    first, second = Run(links, transfers), Run(links, transfers)
    a, b = first.arrays(), second.arrays()
    for table in ("transfers", "changes"):
        assert a[table].keys() == b[table].keys()
        for name in a[table]:
            assert np.array_equal(a[table][name], b[table][name]), (table, name)
    assert set(a["transfers"]) == set(TRANSFER_COLUMNS)
    assert first.resumed == second.resumed
    assert first.check() == []


def test_the_checker_is_fast_on_a_large_log():
    # 200k transfers over 4 processor-sharing links, each alone: joins every 10 µs on its link
    n, bw = 200_000, 10.0
    i = np.arange(n)
    join = (i // 4) * 10
    finish = join + 4.5
    transfers = {
        "id": i,
        "link": i % 4,
        "start_us": join,
        "join_us": join,
        "end_us": join + 5,
        "uncontended_us": np.full(n, 5),
        "finish_us": finish.astype(float),
        "bytes": np.full(n, 45.0),
        "rate": np.zeros(n),
    }
    times = np.column_stack([join, finish]).ravel().astype(float)
    changes = {
        "link": np.repeat(i % 4, 2),
        "time_us": times,
        "active": np.tile([1, 0], n),
        "rate": np.tile([bw, 0.0], n),
    }
    links = [
        {"index": k, "bandwidth": bw, "base_latency_us": 0, "sharing": PROCESSOR_SHARING}
        for k in range(4)
    ]
    problems = check_transfers(transfers, changes, links, started=n, in_flight=0)
    assert problems == []
    changes["rate"][2 * 1000] = 9.0
    assert check_transfers(transfers, changes, links, started=n, in_flight=0)


def test_the_auditor_restates_the_links_rules_exactly():
    """The transfer checker restates the link's delivery rule and vocabulary instead of importing
    them (the auditor imports nothing that made the run): they must stay equal."""
    from servesim.audit import transfer_schedule as audit_side
    from servesim.components import transfer as link_side

    assert audit_side.PROCESSOR_SHARING == link_side.PROCESSOR_SHARING
    assert audit_side.DELIVERY_SLACK_US == link_side.DELIVERY_SLACK_US
    assert audit_side.CHANGE_COLUMNS == link_side.CHANGE_COLUMNS
    for x in (0.0, 1.0, 1.0 + 5e-10, 1.0 + 2e-9, 7.5):
        assert audit_side.ceil_us(x) == link_side.ceil_us(x)
