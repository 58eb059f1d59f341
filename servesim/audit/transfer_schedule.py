"""The independent check of a run's KV transfers: the link schedule recomputed from its log alone.

:func:`check_transfers` reads the columns a transfer log recorded
(:class:`~servesim.components.transfer.TransferLog`: one row per delivered transfer, one per
rate change, the transfers in flight at the end) and the links' descriptions, and reports every
broken invariant: conservation (every started transfer delivered or in flight), causality per
transfer, bytes moved equal to the rate integrated over its life, and fair share (processor
sharing: the active transfers' rates equal and summing to the bandwidth; at-start: each fixed
rate is the bandwidth over the transfers active when it joined). It lives with the auditor
because it is one: it runs after the run, through the run record (``pd["check_transfers"]``),
and shares no code or state with the link processes it checks — it restates the link's delivery
rule and sharing vocabulary below rather than importing them (a test keeps the two in step).
:func:`check_links` runs it on live links (tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["check_links", "check_transfers"]

MAX_REPORTED = 10  # problems of one kind listed one by one; the rest are counted
TIME_TOL_US = 1e-9  # absolute time tolerance (plus 1e-12 relative)
BYTE_RTOL = 1e-6
BYTE_ATOL = 1e-6
# A transfer can join up to DELIVERY_SLACK_US late (a start at an instant the link has already
# processed); its logged join is still start + base, so integrating the rate from there credits
# it with up to bandwidth × DELIVERY_SLACK_US bytes it never got: allowed on top of BYTE_ATOL,
# with margin.
LATE_JOIN_BYTES_US = 1e-8

# The link's rules, restated (servesim.components.transfer states them for the link itself).
PROCESSOR_SHARING = "processor-sharing"  # a link description's ``sharing``; the other is at-start
DELIVERY_SLACK_US = 1e-9  # a transfer finishing at most this far past an integer µs is due then
CHANGE_COLUMNS = ("link", "active", "time_us", "rate")  # the change log's columns


def ceil_us(x: float) -> int:
    """The delivery rule: a real-valued finish is delivered at ``ceil(x - 1e-9)``."""
    return math.ceil(x - DELIVERY_SLACK_US)


def _num(x) -> str:
    """A number for a problem message: up to 10 significant digits."""
    return f"{float(x):.10g}"


def _time_tol(t: np.ndarray) -> np.ndarray:
    return TIME_TOL_US + 1e-12 * np.abs(np.where(np.isfinite(t), t, 0.0))


def _report(problems: list[str], mask: np.ndarray, describe) -> None:
    where = np.flatnonzero(mask)
    for i in where[:MAX_REPORTED]:
        problems.append(describe(int(i)))
    if len(where) > MAX_REPORTED:
        problems.append(f"... and {len(where) - MAX_REPORTED} more like the above")


def _count_at(sorted_values: np.ndarray, t: np.ndarray) -> np.ndarray:
    """How many values are <= each t."""
    return np.searchsorted(sorted_values, t, side="right")


def check_transfers(
    transfers: Mapping[str, np.ndarray],
    changes: Mapping[str, np.ndarray],
    links: Sequence[Mapping[str, Any]],
    started: int,
    in_flight: int | Mapping[str, np.ndarray],
) -> list[str]:
    """Recompute a run's transfer schedule invariants from its log; returns the problems found.

    ``transfers`` and ``changes`` are :meth:`TransferLog.as_arrays` and
    :meth:`TransferLog.changes_as_arrays` columns (extra columns are ignored), ``links`` one
    ``{index, bandwidth, base_latency_us, sharing}`` dict per link, ``started`` the transfers the
    links accepted, ``in_flight`` either how many were not delivered or the
    :meth:`TransferLog.in_flight` table (which makes the per-instant counts exact; with a bare
    number the change-point counts may exceed the delivered rows by at most that many).

    Checks: (1) every started transfer is delivered or in flight; (2) per transfer,
    ``join = start + base <= finish``, ``end = ceil(finish - 1e-9)``, ``uncontended = base +
    ceil(bytes / bandwidth)``, ``end - start >= uncontended`` and no transfer outruns the link;
    (3) at each change point, the active count equals the transfers whose ``[join, finish)``
    covers it, and under processor sharing the per-transfer rate is ``bandwidth / n``; under
    at-start the logged sum equals the recomputed sum of fixed rates and each fixed rate is
    ``bandwidth / (k + 1)`` for the ``k`` transfers active when it joined; (4) bytes: the logged
    piecewise-constant rate integrated over ``[join, finish]`` (processor sharing) or the fixed
    rate times the duration (at-start) equals the transfer's bytes (relative 1e-6, absolute 1e-6
    bytes plus what the link moves in 1e-8 µs). Cost: a few sorts and searches per link.
    """
    problems: list[str] = []
    tid = np.asarray(transfers["id"], dtype=np.int64)
    tlink = np.asarray(transfers["link"], dtype=np.int64)
    delivered = len(tid)

    if isinstance(in_flight, Mapping):
        fl_link = np.asarray(in_flight["link"], dtype=np.int64)
        fl_join = np.asarray(in_flight["join_us"], dtype=np.float64)
        fl_joined = np.asarray(in_flight["joined"], dtype=bool)
        fl_rate = np.asarray(in_flight["rate"], dtype=np.float64)
        n_flight = len(fl_link)
        flight_known = True
    else:
        n_flight = int(in_flight)
        flight_known = False
    if started != delivered + n_flight:
        problems.append(
            f"conservation: {started} transfers started, but {delivered} delivered "
            f"+ {n_flight} in flight = {delivered + n_flight}"
        )

    ids, counts = np.unique(tid, return_counts=True)
    _report(problems, counts > 1, lambda i: f"transfer {ids[i]} was delivered {counts[i]} times")

    specs = {int(spec["index"]): spec for spec in links}
    known = np.array(sorted(specs), dtype=np.int64)
    stray = ~np.isin(tlink, known)
    _report(problems, stray, lambda i: f"transfer {tid[i]} is on unknown link {tlink[i]}")
    clink = np.asarray(changes["link"], dtype=np.int64)
    stray = ~np.isin(clink, known)
    _report(problems, stray, lambda i: f"change point {i} is on unknown link {clink[i]}")

    t_order = np.argsort(tlink, kind="stable")
    t_sorted = tlink[t_order]
    c_order = np.argsort(clink, kind="stable")
    c_sorted = clink[c_order]
    for index in known:
        spec = specs[int(index)]
        lo, hi = np.searchsorted(t_sorted, [index, index + 1])
        rows = {name: np.asarray(transfers[name])[t_order[lo:hi]] for name in _CHECKED_COLUMNS}
        lo, hi = np.searchsorted(c_sorted, [index, index + 1])
        crows = {name: np.asarray(changes[name])[c_order[lo:hi]] for name in CHANGE_COLUMNS}
        if flight_known:
            mine = (fl_link == index) & fl_joined
            flight = (fl_join[mine], fl_rate[mine], 0)
        else:
            flight = (np.zeros(0), np.zeros(0), n_flight)
        _check_link(problems, spec, rows, crows, flight)
    return problems


_CHECKED_COLUMNS = (
    "id",
    "start_us",
    "join_us",
    "end_us",
    "uncontended_us",
    "finish_us",
    "bytes",
    "rate",
)


def _check_link(problems, spec, rows, crows, flight) -> None:
    index = int(spec["index"])
    bw = float(spec["bandwidth"])
    base = int(spec["base_latency_us"])
    ps = spec.get("sharing", PROCESSOR_SHARING) == PROCESSOR_SHARING
    tid = rows["id"].astype(np.int64)
    start = rows["start_us"].astype(np.int64)
    join_i = rows["join_us"].astype(np.int64)
    end = rows["end_us"].astype(np.int64)
    unc = rows["uncontended_us"].astype(np.int64)
    finish = rows["finish_us"].astype(np.float64)
    nbytes = rows["bytes"].astype(np.float64)
    fixed = rows["rate"].astype(np.float64)
    join = join_i.astype(np.float64)
    tol = _time_tol(finish)
    name = f"link {index}"

    def who(i: int) -> str:
        return f"transfer {tid[i]} ({name})"

    # (2) causality per transfer
    _report(
        problems,
        join_i != start + base,
        lambda i: f"{who(i)}: joined at {join_i[i]}, not start {start[i]} + base {base}",
    )
    _report(
        problems,
        ~(finish >= join - tol),
        lambda i: f"{who(i)}: finished at {_num(finish[i])} before joining at {join_i[i]}",
    )
    rounded = finish - DELIVERY_SLACK_US  # delivered at ceil(finish - 1e-9)
    _report(
        problems,
        ~((rounded <= end + tol) & (rounded > end - 1 - tol)),
        lambda i: (
            f"{who(i)}: delivered at {end[i]}, but its finish {_num(finish[i])} rounds up "
            f"to {ceil_us(float(finish[i]))}"
        ),
    )
    _report(
        problems,
        ~((nbytes >= 0) & np.isfinite(nbytes)),
        lambda i: f"{who(i)}: invalid byte count {_num(nbytes[i])}",
    )
    alone = nbytes / bw
    slack = TIME_TOL_US + 1e-12 * alone
    unc_lo = base + np.ceil(alone - slack)
    unc_hi = base + np.ceil(alone + slack)
    _report(
        problems,
        (unc < unc_lo) | (unc > unc_hi),
        lambda i: (
            f"{who(i)}: uncontended_us {unc[i]} is not base + ceil(bytes/bandwidth) "
            f"= {base + ceil_us(float(alone[i]))}"
        ),
    )
    _report(
        problems,
        end - start < unc,
        lambda i: f"{who(i)}: took {end[i] - start[i]} µs, less than its uncontended {unc[i]} µs",
    )
    byte_tol = BYTE_RTOL * np.abs(nbytes) + BYTE_ATOL + LATE_JOIN_BYTES_US * bw
    _report(
        problems,
        (finish - join) * bw < nbytes - byte_tol,
        lambda i: (
            f"{who(i)}: moved {_num(nbytes[i])} bytes in {_num(finish[i] - join[i])} µs, faster "
            f"than the bandwidth {bw}"
        ),
    )

    # (3) change points: the log's own order, then the state after each instant
    c_time_raw = crows["time_us"].astype(np.float64)
    c_active_raw = crows["active"].astype(np.int64)
    c_rate_raw = crows["rate"].astype(np.float64)
    back = np.diff(c_time_raw) < -_time_tol(c_time_raw[1:])
    _report(
        problems,
        back,
        lambda i: (
            f"{name}: change log goes back in time at {_num(c_time_raw[i + 1])} "
            f"(after {_num(c_time_raw[i])})"
        ),
    )
    _report(
        problems,
        c_active_raw < 0,
        lambda i: f"{name} at {_num(c_time_raw[i])} µs: {c_active_raw[i]} transfers active",
    )
    order = np.argsort(c_time_raw, kind="stable")
    c_time = c_time_raw[order]
    c_active = c_active_raw[order]
    c_rate = c_rate_raw[order]

    # Every joined transfer as an interval [join, finish); in-flight ones never finish.
    fl_join, fl_rate, unknown_flight = flight
    all_join = np.concatenate([join, fl_join])
    all_finish = np.concatenate([np.maximum(finish, join), np.full(len(fl_join), np.inf)])
    all_rate = np.concatenate([fixed, fl_rate])
    j_order = np.argsort(all_join, kind="stable")
    f_order = np.argsort(all_finish, kind="stable")
    js = all_join[j_order]
    fs = all_finish[f_order]

    # The state after an instant: change points closer than the time tolerance are one instant
    # (its last row holds the state); count the intervals covering a point just after it.
    instant_end = np.ones(len(c_time), dtype=bool)
    instant_end[:-1] = np.diff(c_time) > _time_tol(c_time[1:])
    s_time = c_time[instant_end]
    s_active = c_active[instant_end]
    s_rate = c_rate[instant_end]
    gap = np.append(np.diff(s_time), np.inf)  # each instant's state holds until the next
    after = s_time + np.minimum(_time_tol(s_time), gap / 2)
    covering = _count_at(js, after) - _count_at(fs, after)
    surplus = s_active - covering  # in-flight transfers the rows cannot show
    _report(
        problems,
        (surplus < 0) | (surplus > unknown_flight),
        lambda i: (
            f"{name} at {_num(s_time[i])} µs: {s_active[i]} transfers active by the change "
            f"log, {covering[i]} by the transfer rows"
        ),
    )

    if ps:
        busy = c_active_raw > 0
        share = np.where(busy, bw / np.maximum(c_active_raw, 1), 0.0)
        _report(
            problems,
            np.abs(c_rate_raw - share) > 1e-9 * bw,
            lambda i: (
                f"{name} at {_num(c_time_raw[i])} µs: rate {_num(c_rate_raw[i])} per transfer "
                f"with {c_active_raw[i]} active, expected {_num(share[i])}"
            ),
        )
        _report(
            problems,
            c_rate_raw * np.maximum(c_active_raw, 1) > bw * (1 + 1e-9),
            lambda i: (
                f"{name} at {_num(c_time_raw[i])} µs: {c_active_raw[i]} × "
                f"{_num(c_rate_raw[i])} exceeds the bandwidth {bw}"
            ),
        )
        # (4) bytes = integral of the logged rate over [join, finish]: the rate after the last
        # change at an exact instant holds until the next change point
        last = np.ones(len(c_time), dtype=bool)
        last[:-1] = c_time[1:] != c_time[:-1]
        p_time, p_rate = c_time[last], c_rate[last]
        cumulative = np.zeros(len(p_time), dtype=np.longdouble)
        if len(p_time) > 1:
            segment = np.diff(p_time).astype(np.longdouble) * p_rate[:-1]
            cumulative[1:] = np.cumsum(segment)

        def integral(t: np.ndarray) -> np.ndarray:
            if not len(p_time):
                return np.zeros(len(t), dtype=np.longdouble)
            k = np.searchsorted(p_time, t, side="right") - 1
            kk = np.maximum(k, 0)
            value = cumulative[kk] + p_rate[kk] * (t - p_time[kk]).astype(np.longdouble)
            return np.where(k >= 0, value, 0)

        moved = (integral(finish) - integral(join)).astype(np.float64)
        _report(
            problems,
            ~(np.abs(moved - nbytes) <= byte_tol),
            lambda i: (
                f"{who(i)}: the link's logged rate integrates to {_num(moved[i])} bytes over "
                f"[{join_i[i]}, {_num(finish[i])}], but it moved {_num(nbytes[i])}"
            ),
        )
        return

    # at-start: the logged sum of fixed rates after each instant
    rate_by_join = np.concatenate([[0.0], np.cumsum(all_rate[j_order])])
    rate_by_finish = np.concatenate([[0.0], np.cumsum(all_rate[f_order])])
    recomputed = rate_by_join[_count_at(js, after)] - rate_by_finish[_count_at(fs, after)]
    _report(
        problems,
        (surplus == 0) & (np.abs(s_rate - recomputed) > 1e-7 * bw * np.maximum(s_active, 1)),
        lambda i: (
            f"{name} at {_num(s_time[i])} µs: logged rate sum {_num(s_rate[i])}, the active "
            f"transfers' fixed rates sum to {_num(recomputed[i])}"
        ),
    )
    # (4) bytes = fixed rate × duration
    moved = fixed * (finish - join)
    _report(
        problems,
        ~(np.abs(moved - nbytes) <= byte_tol),
        lambda i: (
            f"{who(i)}: fixed rate {_num(fixed[i])} × {_num(finish[i] - join[i])} µs = "
            f"{_num(moved[i])} bytes, but it moved {_num(nbytes[i])}"
        ),
    )
    # the BLIS rule: rate = bandwidth / (k + 1), k = transfers active when it joined
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = bw / fixed
    whole = np.round(shares)
    valid = (fixed > 0) & (fixed <= bw * (1 + 1e-9)) & (np.abs(shares - whole) <= 1e-6 * shares)
    _report(
        problems,
        ~valid,
        lambda i: (
            f"{who(i)}: fixed rate {_num(fixed[i])} is not the bandwidth {bw} over a whole "
            f"number of transfers"
        ),
    )
    k = whole - 1
    # Completions at an instant come before its joins: k counts the transfers that joined
    # earlier (join times are integers) and had not finished by the join. Bounds: those that
    # finished within the time tolerance of the join may or may not count (exact float order),
    # and so may the transfers with bytes to move that joined at the same instant before it
    # (join order is not logged).
    jtol = _time_tol(join)
    earlier = np.searchsorted(js, join, side="left")
    zero = all_finish <= all_join + _time_tol(all_join)  # joined and finished at one instant
    zero_joins = np.sort(all_join[zero])
    zero_here = _count_at(zero_joins, join) - np.searchsorted(zero_joins, join, side="left")
    k_low = earlier - _count_at(fs, join + jtol) + zero_here
    near = _count_at(fs, join + jtol) - _count_at(fs, join - jtol) - zero_here
    moving = np.concatenate([nbytes > 0, np.ones(len(fl_join), dtype=bool)])
    moving_joins = np.sort(all_join[moving])
    alongside = _count_at(moving_joins, join) - np.searchsorted(moving_joins, join, side="left")
    k_high = k_low + near + alongside - (nbytes > 0) + unknown_flight
    _report(
        problems,
        valid & ((k < k_low) | (k > k_high)),
        lambda i: (
            f"{who(i)}: fixed rate {_num(fixed[i])} = bandwidth / {int(whole[i])}, but "
            f"{k_low[i]}..{k_high[i]} transfers were active when it joined at {join_i[i]}"
        ),
    )


def check_links(log: Any, links: Sequence[Any]) -> list[str]:
    """:func:`check_transfers` on a finished (or interrupted) run of ``links`` logging to ``log``.

    ``log`` is a :class:`~servesim.components.transfer.TransferLog` and ``links`` its
    :class:`~servesim.components.transfer.TransferLink` s (not imported: the auditor never
    imports the code that made the run).
    """
    return check_transfers(
        log.as_arrays(),
        log.changes_as_arrays(),
        links=[link.describe() for link in links],
        started=sum(link.started for link in links),
        in_flight=log.in_flight(links),
    )
