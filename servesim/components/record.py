"""What a run records, compactly: a per-instance step log and a per-request table.

Both are flat int64 rows (``array('q')``): 192 bytes per request and 80 bytes per step, so a
million requests cost about 200 MB however long they ran. They are what the auditor and the
results module read; nothing else about a run is kept.
"""

from __future__ import annotations

from array import array

import numpy as np

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


class StepLog:
    """One row per engine step of one instance, plus the inter-token gaps that span several steps.

    Rows are stored flat in one ``array('q')`` (one ``extend`` per step, no per-column calls).
    """

    __slots__ = ("rows", "irregular_gaps_us", "blocked_us")
    width = len(STEP_COLUMNS)

    def __init__(self) -> None:
        self.rows = array("q")
        # Gaps between consecutive tokens of a request that were not produced in consecutive steps
        # (after a preemption or a step in which the request got no token), in µs without α2.
        self.irregular_gaps_us = array("q")
        # Instants at which the instance went idle with waiting work it could not admit: nothing
        # running and the queue head's KV held by transfers in flight (disaggregated serving).
        self.blocked_us = array("q")

    def __len__(self) -> int:
        return len(self.rows) // self.width

    def extend(self, columns: dict[str, np.ndarray]) -> None:
        """Append many steps at once (a fast-forwarded window)."""
        block = np.column_stack(
            [np.asarray(columns[name], dtype=np.int64) for name in STEP_COLUMNS]
        )
        self.rows.frombytes(np.ascontiguousarray(block).tobytes())

    def _matrix(self) -> np.ndarray:
        return np.frombuffer(self.rows, dtype=np.int64).reshape(-1, self.width)

    def column(self, name: str) -> np.ndarray:
        if not len(self):
            return np.zeros(0, np.int64)
        return self._matrix()[:, STEP_COLUMNS.index(name)]

    def last_end_us(self) -> int:
        """When the last recorded step ended (0 if none)."""
        if not len(self):
            return 0
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
    """

    CODED = ("slo_class", "finish_reason", "client", "tenant")
    COLUMNS = REQUEST_INT_COLUMNS + ("status",) + CODED
    width = len(COLUMNS)

    def __init__(self) -> None:
        self.rows = array("q")
        self._codes: dict[str, dict[str, int]] = {name: {} for name in self.CODED}

    def __len__(self) -> int:
        return len(self.rows) // self.width

    def code(self, name: str, label: str) -> int:
        table = self._codes[name]
        code = table.get(label)
        if code is None:
            code = table[label] = len(table)
        return code

    def append(self, values: tuple) -> None:
        """``values``: the int columns, status, then the three codes (see :meth:`code`)."""
        self.rows.extend(values)

    def labels(self, name: str) -> list[str]:
        table = self._codes[name]
        return sorted(table, key=table.__getitem__)

    def column(self, name: str) -> np.ndarray:
        if not len(self):
            return np.zeros(0, np.int64)
        return np.frombuffer(self.rows, dtype=np.int64).reshape(-1, self.width)[
            :, self.COLUMNS.index(name)
        ]


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
