"""What a run records, compactly: a per-instance step log and a per-request table.

Both are flat int64 rows (``array('q')``): 192 bytes per request and 80 bytes per step. A long
run does not keep them all in memory: once :data:`SPILL_ROWS` request rows have accumulated, the
request rows (bucketed by id) and every instance's step rows move to a scratch directory
(:mod:`servesim.simcore.spill`), and readers get them back one column, or one slice of a column,
at a time. Runs shorter than that never touch the disk. They are what the auditor and the results
module read; nothing else about a run is kept.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterator

import numpy as np

from servesim.simcore.spill import ColumnFiles, KeyedRows, SpillDir

SPILL_ROWS = 1 << 18
"""Request rows held in memory before a run moves its rows to disk (about 50 MB of them)."""

BUCKET_IDS = 1 << 18
"""Request ids per on-disk bucket: the rows sorted in memory at once when a spilled table is
first read (at most this many, since ids are unique)."""

CHUNK_ROWS = 1 << 20
"""Rows per slice when a reader walks a table block by block (one slice of a few columns)."""

STEP_COLUMNS = (
    "start_us",  # when the step began
    "dt_us",  # its duration
    "prefill_tokens",  # prompt (or re-prefill) tokens computed
    "decode_tokens",  # decode tokens computed (one per decoding request)
    "regular_tokens",  # tokens whose inter-token gap is exactly this step (ITL weighting)
    "burst_tokens",  # tokens that arrived together with another of their request's (gap 0; speculation)
    "batch_size",  # requests that computed tokens
    "waiting",  # wait-queue length after batch formation
    "kv_used",  # KV blocks in use after this step's allocation
    "pending_after",  # waiting + running when the step ended (after completions)
)

STEP_ROW = struct.Struct(f"{len(STEP_COLUMNS)}q").pack
"""The bytes of one step row (its int64 values, native order, as the log's array holds them):
``log.rows.frombytes(STEP_ROW(...))`` appends a row. Once per step: packing the values in one C
call is about three times faster than ``array.extend`` of a tuple, which converts and appends
them one at a time."""


class StepLog:
    """One row per engine step of one instance, plus the inter-token gaps that span several steps.

    Rows are stored flat in one ``array('q')`` (one ``extend`` per step, no per-column calls).
    :meth:`spill` moves the rows recorded so far to column files; readers see the spilled rows
    followed by the ones still in memory, in step order either way.
    """

    __slots__ = ("rows", "irregular_gaps_us", "blocked_us", "_disk", "_last_end")
    width = len(STEP_COLUMNS)

    def __init__(self) -> None:
        self.rows = array("q")
        # Gaps between consecutive tokens of a request that were not produced in consecutive steps
        # (after a preemption or a step in which the request got no token), in µs without α2.
        self.irregular_gaps_us = array("q")
        # Instants at which the instance went idle with waiting work it could not admit: nothing
        # running and the queue head's KV held by transfers in flight (disaggregated serving).
        self.blocked_us = array("q")
        self._disk: ColumnFiles | None = None
        self._last_end = 0  # end of the last spilled step

    def __len__(self) -> int:
        return len(self.rows) // self.width + (self._disk.length if self._disk else 0)

    def extend(self, columns: dict[str, np.ndarray]) -> None:
        """Append many steps at once (a fast-forwarded window)."""
        block = np.column_stack(
            [np.asarray(columns[name], dtype=np.int64) for name in STEP_COLUMNS]
        )
        self.rows.frombytes(np.ascontiguousarray(block).tobytes())

    def spill(self, spill: SpillDir) -> None:
        """Move the rows held in memory to column files in ``spill``."""
        if not self.rows:
            return
        if self._disk is None:
            self._disk = ColumnFiles(spill, "steps", STEP_COLUMNS)
        self._last_end = self.last_end_us()
        self._disk.append(self._matrix())
        del self.rows[:]

    def _matrix(self) -> np.ndarray:
        """The rows still in memory (rows × columns)."""
        return np.frombuffer(self.rows, dtype=np.int64).reshape(-1, self.width)

    def column(self, name: str) -> np.ndarray:
        """One column over every step (a copy when part of it was spilled)."""
        memory = self._matrix()[:, STEP_COLUMNS.index(name)] if self.rows else np.zeros(0, np.int64)
        if self._disk is None:
            return memory
        return np.concatenate([self._disk.read(name), memory])

    def chunks(self, names: tuple[str, ...], size: int = CHUNK_ROWS) -> Iterator[dict]:
        """The named columns in slices of at most ``size`` steps, in step order.

        What the whole-run readers (ITL, time series, KV utilisation, steps.npz) walk, so that
        they hold one slice, not the log."""
        if self._disk is not None:
            for start in range(0, self._disk.length, size):
                yield {n: self._disk.read(n, start, start + size) for n in names}
        if self.rows:
            matrix = self._matrix()
            for start in range(0, len(matrix), size):
                block = matrix[start : start + size]
                yield {n: block[:, STEP_COLUMNS.index(n)] for n in names}

    def last_end_us(self) -> int:
        """When the last recorded step ended (0 if none)."""
        if not self.rows:
            return self._last_end
        w = self.width
        return int(self.rows[-w] + self.rows[-w + 1])

    def as_arrays(self) -> dict[str, np.ndarray]:
        return {name: np.array(self.column(name)) for name in STEP_COLUMNS}


REQUEST_INT_COLUMNS = (
    "id",
    "instance",
    "arrival_us",
    "enqueue_us",
    "first_scheduled_us",
    "first_token_us",  # when the first token reached the client (step end + α2); -1 if none
    "completion_us",  # when the last token reached the client (+ post-decode overhead); -1 if none
    "prompt_tokens",
    "prefix_tokens",
    "cached_tokens",  # prompt tokens served from the prefix cache at first admission
    "output_tokens",  # tokens generated
    "oracle_output_tokens",  # the workload's sampled output length
    "max_output_tokens",  # the client's budget (max_tokens); 0: up to the context window
    "preemptions",
    "itl_sum_us",  # Σ of this request's inter-token gaps (α2 included)
    "gateway_wait_us",  # time spent in the gateway queue (-1: never queued there)
    "session_id",  # -1: not part of a session
    "round_index",
    "think_us",  # the think time before this round (sessions)
)

# Disaggregated serving: the extra timeline of each request whose prefill ran on the prefill pool
# (kept in a separate table, so runs without pools pay nothing for it).
PD_COLUMNS = (
    "id",
    "prefill_instance",  # where its prefill ran
    "prefill_end_us",  # its prefill (and first token) finished; -1 if not yet
    "transfer_start_us",  # its KV transfer started (decode KV reserved); -1 if none
    "transfer_end_us",  # its KV transfer finished; -1 if not (yet)
    "decode_enqueue_us",  # it joined the decode instance's wait queue; -1 if not (yet)
    "transfer_blocks",  # KV blocks moved (prompt blocks the decode instance did not cache)
)

# Terminal (or end-of-run) status of each request.
STATUS_COMPLETED, STATUS_QUEUED, STATUS_RUNNING, STATUS_DROPPED, STATUS_NOT_ARRIVED = 0, 1, 2, 3, 4
STATUS_REJECTED, STATUS_SHED, STATUS_EXPIRED, STATUS_GATEWAY = 5, 6, 7, 8
STATUS_TRANSFERRING = 9
STATUS_NAMES = (
    "completed",
    "queued",  # in an instance's wait queue at the end of the run
    "running",  # in an instance's batch at the end of the run
    "dropped",  # refused by an instance's guards (unservable)
    "in_transit",  # between admission and an instance queue at the end of the run
    "rejected",  # refused by admission control or a full gateway queue
    "shed",  # removed from the gateway queue to make room for a more important request
    "expired",  # waited in the gateway queue longer than its TTL
    "gateway_queued",  # still in the gateway queue at the end of the run
    "transferring",  # prefilled, its KV cache still moving to the decode instance
)


class RequestTable:
    """Per-request records, one flat ``array('q')`` row each, appended at a terminal state.

    A row is the :data:`REQUEST_INT_COLUMNS` values, then the status and the codes of the SLO
    class, finish reason and client (strings interned to small integers).

    Rows arrive in completion order; readers get them in id order. Every ``spill_rows`` rows the
    table moves its rows to disk, bucketed by id (:class:`~servesim.simcore.spill.KeyedRows`),
    and calls :attr:`on_spill` with the scratch directory (the cluster moves its step logs there
    too). The first read after the run sorts the buckets one at a time into id-ordered column
    files; from then on the table is read-only.
    """

    CODED = ("slo_class", "finish_reason", "client", "tenant")
    COLUMNS = REQUEST_INT_COLUMNS + ("status",) + CODED
    width = len(COLUMNS)

    def __init__(self, spill_rows: int | None = None, bucket_ids: int | None = None) -> None:
        self.rows = array("q")
        # read at construction (not bound as defaults) so a test can make every run spill
        spill_rows = SPILL_ROWS if spill_rows is None else spill_rows
        self._bucket_ids = max(int(BUCKET_IDS if bucket_ids is None else bucket_ids), 1)
        self._codes: dict[str, dict[str, int]] = {name: {} for name in self.CODED}
        self._limit = max(int(spill_rows), 1) * self.width
        self._pack = struct.Struct(f"{self.width}q").pack
        self.on_spill: Callable[[SpillDir], None] | None = None
        self.spill_dir: SpillDir | None = None
        self._buckets: KeyedRows | None = None
        self._columns: ColumnFiles | None = None  # id-ordered, once sealed
        self._order: np.ndarray | None = None  # id order of the in-memory rows

    def __len__(self) -> int:
        n = len(self.rows) // self.width
        if self._buckets is not None:
            n += self._buckets.length
        if self._columns is not None:
            n += self._columns.length
        return n

    @property
    def spilled(self) -> bool:
        """Whether some rows live on disk (the run outgrew :data:`SPILL_ROWS`)."""
        return self.spill_dir is not None

    def code(self, name: str, label: str) -> int:
        table = self._codes[name]
        code = table.get(label)
        if code is None:
            code = table[label] = len(table)
        return code

    def append(self, values: tuple) -> None:
        """``values``: the int columns, status, then the codes (see :meth:`code`); exactly
        :attr:`width` ints (packed in one call, see :data:`STEP_ROW`)."""
        rows = self.rows
        rows.frombytes(self._pack(*values))
        if len(rows) >= self._limit:
            self.spill()

    def spill(self) -> None:
        """Move the rows held in memory to the id buckets on disk (and the step logs, through
        :attr:`on_spill`)."""
        if self._columns is not None:
            raise RuntimeError("the request table was read already; it takes no more rows")
        if self.spill_dir is None:
            self.spill_dir = SpillDir()
            self._buckets = KeyedRows(self.spill_dir, "requests", self.width, 0, self._bucket_ids)
        if self.rows:
            assert self._buckets is not None
            self._buckets.append(np.frombuffer(self.rows, dtype=np.int64).reshape(-1, self.width))
            del self.rows[:]
        self._order = None
        if self.on_spill is not None:
            self.on_spill(self.spill_dir)

    def _seal(self) -> ColumnFiles:
        """Sort the spilled rows into id-ordered column files (once, at the first read)."""
        if self._columns is None:
            self.spill()
            assert self._buckets is not None and self.spill_dir is not None
            columns = ColumnFiles(self.spill_dir, "requests", self.COLUMNS)
            for rows in self._buckets.drain():
                columns.append(rows[np.argsort(rows[:, 0], kind="stable")])
            self._columns = columns
            self._limit = 0  # the next append calls spill(), which refuses it
        return self._columns

    def labels(self, name: str) -> list[str]:
        table = self._codes[name]
        return sorted(table, key=table.__getitem__)

    def _memory(self) -> tuple[np.ndarray, np.ndarray]:
        """The in-memory rows and their id order."""
        matrix = np.frombuffer(self.rows, dtype=np.int64).reshape(-1, self.width)
        if self._order is None or len(self._order) != len(matrix):
            self._order = np.argsort(matrix[:, 0], kind="stable")
        return matrix, self._order

    def column(self, name: str) -> np.ndarray:
        """One column, in id order (a fresh array)."""
        if self.spilled:
            return self._seal().read(name)
        if not self.rows:
            return np.zeros(0, np.int64)
        matrix, order = self._memory()
        return matrix[order, self.COLUMNS.index(name)]

    def chunks(self, names: tuple[str, ...], size: int = CHUNK_ROWS) -> Iterator[dict]:
        """The named columns in id order, in slices of at most ``size`` rows."""
        if self.spilled:
            columns = self._seal()
            for start in range(0, columns.length, size):
                yield {n: columns.read(n, start, start + size) for n in names}
            return
        if not self.rows:
            return
        matrix, order = self._memory()
        for start in range(0, len(order), size):
            rows = matrix[order[start : start + size]]
            yield {n: rows[:, self.COLUMNS.index(n)] for n in names}


class PDTable:
    """One flat row of :data:`PD_COLUMNS` per split request, appended with its request row."""

    COLUMNS = PD_COLUMNS
    width = len(PD_COLUMNS)

    def __init__(self) -> None:
        self.rows = array("q")

    def __len__(self) -> int:
        return len(self.rows) // self.width

    def column(self, name: str) -> np.ndarray:
        if not len(self):
            return np.zeros(0, np.int64)
        return np.frombuffer(self.rows, dtype=np.int64).reshape(-1, self.width)[
            :, self.COLUMNS.index(name)
        ]


# ---------------------------------------------------------------- autoscaling: instance states
FLEET_STATES = ("cold", "loading", "warming", "ready", "draining", "stopped")
"""An autoscaled instance's states, by code (:mod:`servesim.components.autoscaler`): the codes of
the fleet's event log, the names its summary and time series show."""


def fleet_states_at(events: np.ndarray, instance: int, times: np.ndarray) -> np.ndarray:
    """The state (name) of ``instance`` at each of ``times`` from the fleet's event log (rows of
    time, instance, new state, in time order): cold before its first change; at an instant with
    several changes, the last. A time series shows with it when each instance was up."""
    mine = events[events[:, 1] == instance]
    at = np.searchsorted(mine[:, 0], times, side="right") - 1
    codes = np.where(at >= 0, mine[np.maximum(at, 0), 2] if len(mine) else 0, 0)
    return np.asarray(FLEET_STATES, dtype=object)[codes]
