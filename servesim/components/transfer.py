"""KV-transfer links for prefill/decode disaggregation: one SimPy process per link.

A link moves KV caches (a number of bytes) from a prefill instance to a decode instance. A
transfer started at ``start`` first waits the link's ``base_latency_us`` (setup and propagation;
it uses no bandwidth), *joins* the link at ``join = start + base`` and then shares the link's
``bandwidth`` (bytes per µs) with the other joined, unfinished transfers until its bytes are moved
at the real-valued instant ``finish``. It is *delivered* (its event succeeds with the end time, the
log row is written) at the integer microsecond ``end = ceil(finish - 1e-9)``.

Sharing rules:

* ``"processor-sharing"`` (exact): the link serves the ``n`` active transfers simultaneously,
  each at ``bandwidth / n``; rates change whenever a transfer joins or finishes. The schedule is
  kept exactly in real-valued time: when the link advances to integer time ``T`` it processes, in
  time order, every completion whose finish is at or before ``T`` (each one raises the others'
  rates from that instant on), then the joins at ``T``. A lone transfer takes exactly
  ``base + ceil(bytes / bandwidth)`` µs.
* ``"at-start"`` (BLIS): a transfer joining while ``k`` others are active gets the fixed rate
  ``bandwidth / (k + 1)`` for its whole life (``finish = join + bytes / rate``); the others'
  rates are not revised, so the rates of the active transfers can add up to more than the
  bandwidth. Kept for comparison with BLIS.

Exact processor sharing without per-transfer updates: under equal shares every active transfer
receives the same service, so the link keeps one number ``S``, the bytes each active transfer has
received since the link was last idle, and a heap of thresholds ``S_join + bytes``; a transfer's
remaining bytes are ``threshold - S``. The next completion is the smallest threshold, reached
after ``(threshold - S) * n / bandwidth`` µs. Each join or completion costs O(log n). ``S`` is
reset when the link goes idle.

Time is kept as an integer microsecond plus a fraction in [0, 1), so a finish time is as precise
far into a run as at its start. When the link wakes at integer time ``T`` it processes everything
delivered at ``T``: the completions with ``finish <= T + 1e-9``, in exact time order with the
joins due by then. A transfer that joins at ``T`` after the link has already processed such a
completion (a start at ``T`` later in the same instant) joins at that completion's instant, at
most 1e-9 µs late: the link's clock never goes back.

The link process sleeps on one plain event until its next delivery or its next pending join. The
wake-up is either triggered directly (a join at the current instant) or by a timeout whose
callback carries a generation number; timeouts overtaken by an earlier wake-up are ignored.
Transfer events are NORMAL-priority events, so completions at an instant are seen before any
instance forms its batch at that instant. Deliveries at one instant succeed in join order.

:class:`TransferLog` keeps what every link did (one row per delivered transfer, one row per rate
change); the auditor's ``servesim.audit.transfer_schedule.check_transfers`` recomputes the
schedule's invariants from those rows alone.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import simpy
from simpy.events import Event

from servesim.simcore.describe import describe_fields

__all__ = [
    "AT_START",
    "CHANGE_COLUMNS",
    "INFO_COLUMNS",
    "IN_FLIGHT_COLUMNS",
    "PROCESSOR_SHARING",
    "SHARING_RULES",
    "TRANSFER_COLUMNS",
    "TransferLink",
    "TransferLog",
    "ceil_us",
]

PROCESSOR_SHARING = "processor-sharing"
AT_START = "at-start"
SHARING_RULES = (PROCESSOR_SHARING, AT_START)

# A transfer finishing at most this many µs after an integer is delivered at that integer.
DELIVERY_SLACK_US = 1e-9

TRANSFER_INT_COLUMNS = (
    "id",  # the caller's transfer id
    "link",  # link index
    "start_us",  # when start() was called
    "join_us",  # start_us + the link's base latency: when it began to use bandwidth
    "end_us",  # when it was delivered: ceil(finish_us - 1e-9)
    "uncontended_us",  # base + ceil(bytes / bandwidth): its duration on an otherwise idle link
)
TRANSFER_FLOAT_COLUMNS = (
    "finish_us",  # exact (real-valued) instant its last byte was moved
    "bytes",  # bytes moved
    "rate",  # at-start: its fixed rate in bytes/µs; processor-sharing: 0
)
TRANSFER_COLUMNS = TRANSFER_INT_COLUMNS + TRANSFER_FLOAT_COLUMNS + ("info",)
# What a disaggregated cluster passes as a transfer's ``info``; when every row's info is a tuple of
# that many integers, :meth:`TransferLog.as_arrays` also returns them as these int64 columns.
INFO_COLUMNS = ("request", "prefill_instance", "decode_instance", "blocks")

CHANGE_INT_COLUMNS = (
    "link",  # link index
    "active",  # joined, unfinished transfers after the change
)
CHANGE_FLOAT_COLUMNS = (
    "time_us",  # exact instant of the change
    "rate",  # processor-sharing: bytes/µs per transfer; at-start: sum of the active fixed rates
)
CHANGE_COLUMNS = CHANGE_INT_COLUMNS + CHANGE_FLOAT_COLUMNS

IN_FLIGHT_COLUMNS = ("id", "link", "start_us", "join_us", "joined", "rate")


def ceil_us(x: float) -> int:
    """``ceil(x - 1e-9)``: the delivery rule for a real-valued duration or instant."""
    return math.ceil(x - DELIVERY_SLACK_US)


class _Transfer:
    """One transfer's bookkeeping while it is in flight."""

    __slots__ = ("id", "seq", "start", "join", "nbytes", "info", "event", "rate", "fi", "ff")

    def __init__(self, tid: int, seq: int, start: int, join: int, nbytes: float, info, event):
        self.id = tid
        self.seq = seq  # join order on its link (starts are in time order, base is fixed)
        self.start = start
        self.join = join
        self.nbytes = nbytes
        self.info = info
        self.event = event
        self.rate = 0.0  # at-start fixed rate
        self.fi = 0  # finish instant: integer part ...
        self.ff = 0.0  # ... and fraction in [0, 1)


class TransferLog:
    """What every link of a run did, in flat typed columns shared by all links.

    Transfers: one row per delivered transfer, appended at delivery (columns
    :data:`TRANSFER_COLUMNS`; ``info`` is the caller's opaque tuple, kept in a list, and also
    unpacked into ``info_columns`` when it is a tuple of that many integers).
    Change points: one row per instant at which a link's set of active transfers changed (columns
    :data:`CHANGE_COLUMNS`); changes of one link at one instant are merged into one row when no
    other link logged in between (a checker keeps the last row of a link at an instant).
    """

    __slots__ = ("_ints", "_floats", "info", "info_columns", "_change_ints", "_change_floats")

    _int_width = len(TRANSFER_INT_COLUMNS)
    _float_width = len(TRANSFER_FLOAT_COLUMNS)

    def __init__(self, info_columns: Sequence[str] = INFO_COLUMNS) -> None:
        self.info_columns = tuple(info_columns)
        self._ints = array("q")
        self._floats = array("d")
        self.info: list = []
        self._change_ints = array("q")
        self._change_floats = array("d")

    def __len__(self) -> int:
        return len(self.info)

    @property
    def n_changes(self) -> int:
        return len(self._change_floats) // 2

    def delivered(self, row_ints: tuple, row_floats: tuple, info) -> None:
        """Append one transfer row (ints in :data:`TRANSFER_INT_COLUMNS` order, then floats)."""
        self._ints.extend(row_ints)
        self._floats.extend(row_floats)
        self.info.append(info)

    def change(self, link: int, time_us: float, active: int, rate: float) -> int:
        """Append one change point; returns its row number."""
        self._change_ints.extend((link, active))
        self._change_floats.extend((time_us, rate))
        return len(self._change_floats) // 2 - 1

    def rewrite_last_change(self, active: int, rate: float) -> None:
        """Replace the state of the last change point (a later change at the same instant)."""
        self._change_ints[-1] = active
        self._change_floats[-1] = rate

    def as_arrays(self) -> dict[str, np.ndarray]:
        """The transfer rows by column name, in delivery order.

        :data:`TRANSFER_COLUMNS` (``info`` as an object array), plus ``info_columns`` as int64
        columns if every row's info is a tuple of that many integers.
        """
        n = len(self.info)
        ints = np.frombuffer(self._ints, dtype=np.int64).reshape(n, self._int_width)
        floats = np.frombuffer(self._floats, dtype=np.float64).reshape(n, self._float_width)
        out = {name: ints[:, i].copy() for i, name in enumerate(TRANSFER_INT_COLUMNS)}
        out.update({name: floats[:, i].copy() for i, name in enumerate(TRANSFER_FLOAT_COLUMNS)})
        info = np.empty(n, dtype=object)
        for i, item in enumerate(self.info):
            info[i] = item
        out["info"] = info
        k = len(self.info_columns)
        if k and all(type(item) is tuple and len(item) == k for item in self.info):
            unpacked = np.array(self.info).reshape(n, k)
            if n == 0 or unpacked.dtype.kind in "iu":
                unpacked = unpacked.astype(np.int64)
                out.update(
                    {name: unpacked[:, i].copy() for i, name in enumerate(self.info_columns)}
                )
        return out

    def changes_as_arrays(self) -> dict[str, np.ndarray]:
        """The change points by column name (:data:`CHANGE_COLUMNS`), in log order."""
        n = self.n_changes
        ints = np.frombuffer(self._change_ints, dtype=np.int64).reshape(n, 2)
        floats = np.frombuffer(self._change_floats, dtype=np.float64).reshape(n, 2)
        out = {name: ints[:, i].copy() for i, name in enumerate(CHANGE_INT_COLUMNS)}
        out.update({name: floats[:, i].copy() for i, name in enumerate(CHANGE_FLOAT_COLUMNS)})
        return out

    @staticmethod
    def in_flight(links: Iterable[TransferLink]) -> dict[str, np.ndarray]:
        """Transfers started but not delivered (columns :data:`IN_FLIGHT_COLUMNS`).

        ``joined`` is 1 for a transfer already sharing its link (then ``rate`` is its at-start
        fixed rate, 0 under processor sharing), 0 for one still in its base latency.
        """
        rows = []
        for link in links:
            for tr, joined in link.in_flight_transfers():
                rows.append((tr.id, link.index, tr.start, tr.join, int(joined), tr.rate))
        ints = np.array([r[:5] for r in rows], dtype=np.int64).reshape(-1, 5)
        out = {name: ints[:, i].copy() for i, name in enumerate(IN_FLIGHT_COLUMNS[:5])}
        out["rate"] = np.array([r[5] for r in rows], dtype=np.float64)
        return out


class TransferLink:
    """A link between a prefill and a decode instance, driven by one SimPy process.

    ``bandwidth`` is in bytes per µs, ``base_latency_us`` a fixed delay before a transfer starts
    to use bandwidth, ``sharing`` one of :data:`SHARING_RULES`. Counters: ``active`` (joined,
    unfinished transfers), ``peak`` (most at once), ``started``, ``completed``, ``bytes_moved``.
    """

    __slots__ = (
        "env",
        "index",
        "name",
        "bandwidth",
        "base_latency_us",
        "sharing",
        "log",
        "peak",
        "started",
        "completed",
        "bytes_moved",
        "process",
        "_ps",
        "_seq",
        "_pending",
        "_heap",
        "_ip",
        "_frac",
        "_service",
        "_rate_sum",
        "_wake",
        "_wake_at",
        "_gen",
        "_last_row",
        "_last_ip",
        "_last_frac",
        "_last_active",
        "_last_rate",
    )

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        name: str,
        bandwidth: float,
        base_latency_us: int = 0,
        sharing: str = PROCESSOR_SHARING,
        log: TransferLog | None = None,
    ):
        bandwidth = float(bandwidth)
        if not (bandwidth > 0 and math.isfinite(bandwidth)):
            raise ValueError(f"link {name!r}: bandwidth must be a positive number of bytes/µs")
        if int(base_latency_us) != base_latency_us or base_latency_us < 0:
            raise ValueError(f"link {name!r}: base_latency_us must be a non-negative integer")
        if sharing not in SHARING_RULES:
            raise ValueError(f"link {name!r}: sharing must be one of {SHARING_RULES}")
        self.env = env
        self.index = int(index)
        self.name = name
        self.bandwidth = bandwidth
        self.base_latency_us = int(base_latency_us)
        self.sharing = sharing
        self.log = log if log is not None else TransferLog()
        self.peak = 0
        self.started = 0
        self.completed = 0
        self.bytes_moved = 0.0
        self._ps = sharing == PROCESSOR_SHARING
        self._seq = 0
        self._pending: deque[_Transfer] = deque()  # started, not joined (join times ascending)
        # processor-sharing: (threshold, seq, transfer); at-start: (finish int, finish frac, seq, t)
        self._heap: list = []
        self._ip = int(env.now)  # the link's clock: integer µs ...
        self._frac = 0.0  # ... plus a fraction in [0, 1)
        self._service = 0.0  # bytes received by each active transfer since the link was idle
        self._rate_sum = 0.0  # at-start: sum of the active fixed rates
        self._wake = Event(env)
        self._wake_at: int | None = None
        self._gen = 0
        self._last_row = -1
        self._last_ip = -1
        self._last_frac = 0.0
        self._last_active = 0
        self._last_rate = 0.0
        self.process = env.process(self._run())

    @property
    def active(self) -> int:
        """Joined, unfinished transfers."""
        return len(self._heap)

    def describe(self) -> dict[str, Any]:
        """The link's parameters as :func:`check_transfers` takes them."""
        return describe_fields(self, ("index", "name", "bandwidth", "base_latency_us", "sharing"))

    def in_flight_transfers(self) -> list[tuple[_Transfer, bool]]:
        """Started, undelivered transfers in join order, each with whether it has joined."""
        joined = sorted((entry[-1] for entry in self._heap), key=_by_seq)
        return [(tr, True) for tr in joined] + [(tr, False) for tr in self._pending]

    def start(self, transfer_id: int, nbytes: float, info: tuple = ()) -> Event:
        """Start a transfer now; the event succeeds with its end time (µs) when it is delivered."""
        nbytes = float(nbytes)
        if not (nbytes >= 0 and math.isfinite(nbytes)):
            raise ValueError(f"transfer {transfer_id}: bytes must be finite and non-negative")
        env = self.env
        now = env.now
        tr = _Transfer(
            transfer_id, self._seq, now, now + self.base_latency_us, nbytes, info, Event(env)
        )
        self._seq += 1
        self.started += 1
        self._pending.append(tr)
        self._request_wake(tr.join)
        return tr.event

    # ------------------------------------------------------------------ wake-ups

    def _request_wake(self, t: int) -> None:
        wake_at = self._wake_at
        if wake_at is not None and wake_at <= t:
            return
        self._gen += 1
        self._wake_at = t
        env = self.env
        delay = t - env.now
        if delay <= 0:
            if not self._wake.triggered:
                self._wake.succeed()
            return
        timer = env.timeout(delay, self._gen)
        timer.callbacks.append(self._on_timer)

    def _on_timer(self, timer: Event) -> None:
        if timer._value == self._gen and not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        env = self.env
        while True:
            yield self._wake
            self._wake = Event(env)
            self._wake_at = None
            self._advance(env.now)
            t = None
            finish = self._next_finish()
            if finish is not None:
                t = finish[0] + (1 if finish[1] > DELIVERY_SLACK_US else 0)
            pending = self._pending
            if pending and (t is None or pending[0].join < t):
                t = pending[0].join
            if t is not None:
                self._request_wake(t)

    # ------------------------------------------------------------------ the schedule

    def _next_finish(self) -> tuple[int, float] | None:
        """The next completion instant as (integer µs, fraction), or None if the link is idle."""
        heap = self._heap
        if not heap:
            return None
        if not self._ps:
            head = heap[0]
            return (head[0], head[1])
        d = (heap[0][0] - self._service) * len(heap) / self.bandwidth
        x = self._frac + (d if d > 0.0 else 0.0)
        i = math.floor(x)
        return (self._ip + i, x - i)

    def _advance(self, now: int) -> None:
        """Process, in time order, every completion delivered by ``now`` and every join due."""
        pending = self._pending
        done: list[_Transfer] = []
        while True:
            finish = self._next_finish()
            if finish is not None and (
                finish[0] > now or (finish[0] == now and finish[1] > DELIVERY_SLACK_US)
            ):
                finish = None
            if pending and pending[0].join <= now:
                join = pending[0].join
                if finish is None or (join, 0.0) < finish:
                    if join > self._ip:  # else it is late (see above): join now
                        self._move(join, 0.0)
                    while pending and pending[0].join == join:
                        self._join(pending.popleft(), done)
                    self._record()
                    continue
            if finish is None:
                break
            self._move(finish[0], finish[1])
            self._complete(done)
            self._record()
        if done:
            self._deliver(done)

    def _move(self, ip: int, frac: float) -> None:
        """Advance the link's clock to ``ip + frac``, serving the active transfers meanwhile."""
        if self._ps:
            n = len(self._heap)
            if n:
                elapsed = (ip - self._ip) - self._frac + frac
                self._service += elapsed * self.bandwidth / n
        self._ip = ip
        self._frac = frac

    def _join(self, tr: _Transfer, done: list[_Transfer]) -> None:
        heap = self._heap
        nbytes = tr.nbytes
        if self._ps:
            if nbytes <= 0.0:
                tr.fi, tr.ff = self._ip, self._frac
                done.append(tr)
                return
            heapq.heappush(heap, (self._service + nbytes, tr.seq, tr))
        else:
            rate = self.bandwidth / (len(heap) + 1)
            tr.rate = rate
            if nbytes <= 0.0:
                tr.fi, tr.ff = self._ip, self._frac
                done.append(tr)
                return
            x = self._frac + nbytes / rate
            i = math.floor(x)
            heapq.heappush(heap, (self._ip + i, x - i, tr.seq, tr))
            self._rate_sum += rate
        if len(heap) > self.peak:
            self.peak = len(heap)

    def _complete(self, done: list[_Transfer]) -> None:
        """Finish every transfer due at the link's current instant."""
        heap = self._heap
        ip, frac = self._ip, self._frac
        if self._ps:
            threshold = heap[0][0]
            self._service = threshold
            while heap and heap[0][0] <= threshold:
                tr = heapq.heappop(heap)[2]
                tr.fi, tr.ff = ip, frac
                done.append(tr)
            if not heap:
                self._service = 0.0
        else:
            while heap and heap[0][0] == ip and heap[0][1] == frac:
                tr = heapq.heappop(heap)[3]
                tr.fi, tr.ff = ip, frac
                self._rate_sum -= tr.rate
                done.append(tr)
            if not heap:
                self._rate_sum = 0.0

    def _record(self) -> None:
        """Log the link's state after the changes at its current instant (merged per instant)."""
        n = len(self._heap)
        if self._ps:
            rate = self.bandwidth / n if n else 0.0
        else:
            rate = self._rate_sum if n else 0.0
        ip, frac = self._ip, self._frac
        log = self.log
        same_instant = self._last_ip == ip and self._last_frac == frac
        if same_instant and self._last_row == log.n_changes - 1:
            log.rewrite_last_change(n, rate)
        elif n != self._last_active or rate != self._last_rate:
            self._last_row = log.change(self.index, ip + frac, n, rate)
            self._last_ip, self._last_frac = ip, frac
        else:
            return
        self._last_active, self._last_rate = n, rate

    def _deliver(self, done: list[_Transfer]) -> None:
        if len(done) > 1:
            done.sort(key=_by_seq)
        log = self.log
        index = self.index
        bandwidth = self.bandwidth
        base = self.base_latency_us
        for tr in done:
            end = tr.fi + (1 if tr.ff > DELIVERY_SLACK_US else 0)
            nbytes = tr.nbytes
            log.delivered(
                (tr.id, index, tr.start, tr.join, end, base + ceil_us(nbytes / bandwidth)),
                (tr.fi + tr.ff, nbytes, tr.rate),
                tr.info,
            )
            self.completed += 1
            self.bytes_moved += nbytes
            tr.event.succeed(end)


def _by_seq(tr: _Transfer) -> int:
    return tr.seq
