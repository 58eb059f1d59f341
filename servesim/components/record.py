"""What a run records, compactly: a per-instance step log and a per-request table.

Both are columnar (``array('q')``), so a million requests or steps cost tens of megabytes, and
both are what the auditor and the results module read; nothing else about a run is kept.
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
    "batch_size",  # requests that computed tokens
    "waiting",  # wait-queue length after batch formation
    "kv_used",  # KV blocks in use after this step's allocation
    "pending_after",  # waiting + running when the step ended (after completions)
)


class StepLog:
    """One row per engine step of one instance, plus the inter-token gaps that span several steps."""

    __slots__ = STEP_COLUMNS + ("irregular_gaps_us",)

    def __init__(self) -> None:
        for name in STEP_COLUMNS:
            setattr(self, name, array("q"))
        # Gaps between consecutive tokens of a request that were not produced in consecutive steps
        # (after a preemption or a step in which the request got no token), in µs without α2.
        self.irregular_gaps_us = array("q")

    def __len__(self) -> int:
        return len(self.start_us)

    def extend(self, columns: dict[str, np.ndarray]) -> None:
        """Append many steps at once (a fast-forwarded window)."""
        for name in STEP_COLUMNS:
            getattr(self, name).frombytes(np.ascontiguousarray(columns[name], dtype=np.int64).tobytes())

    def column(self, name: str) -> np.ndarray:
        return np.frombuffer(getattr(self, name), dtype=np.int64) if len(self) else np.zeros(0, np.int64)

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
    "preemptions",
    "itl_sum_us",  # Σ of this request's inter-token gaps (α2 included)
)

# Terminal (or end-of-run) status of each request.
STATUS_COMPLETED, STATUS_QUEUED, STATUS_RUNNING, STATUS_DROPPED, STATUS_NOT_ARRIVED = 0, 1, 2, 3, 4
STATUS_NAMES = ("completed", "queued", "running", "dropped", "in_transit")


class RequestTable:
    """Columnar per-request records, appended when a request reaches a terminal state."""

    def __init__(self) -> None:
        self.ints = {name: array("q") for name in REQUEST_INT_COLUMNS}
        self.status = array("b")
        self._codes: dict[str, dict[str, int]] = {"slo_class": {}, "finish_reason": {}, "client": {}}
        self.codes = {name: array("h") for name in self._codes}

    def __len__(self) -> int:
        return len(self.status)

    def append(self, values: tuple, status: int, slo_class: str, finish_reason: str, client: str) -> None:
        for column, value in zip(self.ints.values(), values):
            column.append(value)
        self.status.append(status)
        for name, label in (("slo_class", slo_class), ("finish_reason", finish_reason), ("client", client)):
            table = self._codes[name]
            code = table.get(label)
            if code is None:
                code = table[label] = len(table)
            self.codes[name].append(code)

    def labels(self, name: str) -> list[str]:
        table = self._codes[name]
        return sorted(table, key=table.__getitem__)

    def column(self, name: str) -> np.ndarray:
        if name == "status":
            return np.frombuffer(self.status, dtype=np.int8) if len(self) else np.zeros(0, np.int8)
        if name in self.codes:
            return np.frombuffer(self.codes[name], dtype=np.int16) if len(self) else np.zeros(0, np.int16)
        return np.frombuffer(self.ints[name], dtype=np.int64) if len(self) else np.zeros(0, np.int64)
