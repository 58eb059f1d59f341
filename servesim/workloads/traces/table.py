"""The columnar trace table every reader fills: :class:`TableBuilder` appends validated rows to
typed arrays, :class:`TraceTable` holds them as numpy columns with the arrival order."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger


class _Labels:
    """Interns string labels to small integer codes (code 0 is the default label)."""

    __slots__ = ("names", "codes")

    def __init__(self, default: str):
        self.names = [default]
        self.codes = {default: 0}

    def code(self, name: str) -> int:
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = len(self.names)
            self.names.append(name)
        return c


class TraceTable:
    """A trace read into compact columns, one row per request, in file order.

    ``arrival_us`` holds the recorded times in µs (the format's own origin); ``max_output_tokens``
    is -1 where the trace leaves the budget to the workload (oracle); ``prefix_group`` is -1 for
    no shared prefix. Row i's content segments are ``seg_ids/seg_lens[seg_offsets[i]:
    seg_offsets[i+1]]`` (an empty run means none). Build one with :class:`TableBuilder`.

    Formats that record conversations also fill ``session`` (the row's session code, -1 for a
    request outside any session; the names are ``session_names``), ``round_index``, ``done_us``
    (the recorded time its answer's last token arrived, -1 when not observed) and ``think_us`` (a
    think time the trace recorded before the row, -1 when none); without them these are None.
    """

    def __init__(self, builder: TableBuilder, *, ignored: Sequence[str] = (), notes=()):
        b = builder

        def col(a: array) -> np.ndarray:
            return np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)

        self.file = b.file
        self.format = b.format
        self.lines = col(b.lines)
        self.arrival_us = col(b.arrival)
        self.prompt_tokens = col(b.prompt)
        self.output_tokens = col(b.output)
        self.prefix_group = col(b.group)
        self.prefix_tokens = col(b.prefix)
        self.max_output_tokens = col(b.max_out)
        self.slo_code = col(b.slo)
        self.client_code = col(b.client)
        self.tenant_code = col(b.tenant)
        self.slo_names = b.slo_labels.names
        self.client_names = b.client_labels.names
        self.tenant_names = b.tenant_labels.names
        self.seg_offsets = col(b.seg_offsets)
        self.seg_ids = col(b.seg_ids)
        self.seg_lens = col(b.seg_lens)
        self.session = self.round_index = self.done_us = self.think_us = None
        if b.session is not None:
            self.session = col(b.session)
            self.round_index = col(b.round_index)
            self.done_us = col(b.done_us)
            self.think_us = col(b.think_us)
        self.session_names = b.session_labels.names[1:]
        # LoRA / several models: per row the model and adapter codes (None: no such columns)
        self.model_code = self.adapter_code = None
        if b.model is not None:
            self.model_code, self.adapter_code = col(b.model), col(b.adapter)
        self.model_names, self.adapter_names = b.model_labels.names, b.adapter_labels.names
        self.metadata: dict[str, Any] = dict(b.metadata)
        self.ignored_columns = list(ignored)
        self.notes = list(notes)
        self.adjusted = {"zero_output_rows": b.zero_output} if b.zero_output else {}
        # Stable arrival order, and how far the file was from it.
        t = self.arrival_us
        running_max = np.maximum.accumulate(t) if len(t) else t
        late = np.flatnonzero(t[1:] < running_max[:-1]) + 1 if len(t) > 1 else np.zeros(0, int)
        self.out_of_order_rows = int(len(late))
        self.first_out_of_order_line = int(self.lines[late[0]]) if len(late) else None
        self.order = np.argsort(t, kind="stable") if len(late) else None
        if len(late):
            get_logger("servesim.workloads").warning(
                f"{self.out_of_order_rows} trace row(s) are not in arrival order (the first at "
                f"line {self.first_out_of_order_line}); the trace is replayed sorted by arrival "
                "time, rows with equal times in file order"
            )

    def __len__(self) -> int:
        return len(self.arrival_us)

    @property
    def has_segments(self) -> bool:
        return len(self.seg_ids) > 0

    @property
    def has_sessions(self) -> bool:
        """Whether some row belongs to a recorded session (closed-loop replay needs one)."""
        return self.session is not None and bool((self.session >= 0).any())


class TableBuilder:
    """Accumulates validated rows (appending to typed arrays: 8 bytes per value) for a reader."""

    def __init__(self, file: Path, format: str):
        self.file = file
        self.format = format
        self.lines = array("q")
        self.arrival = array("q")
        self.prompt = array("q")
        self.output = array("q")
        self.group = array("q")
        self.prefix = array("q")
        self.max_out = array("q")
        self.slo = array("q")
        self.client = array("q")
        self.tenant = array("q")
        self.seg_offsets = array("q", [0])
        self.seg_ids = array("q")
        self.seg_lens = array("q")
        self.slo_labels = _Labels("standard")
        self.client_labels = _Labels("default")
        self.tenant_labels = _Labels("")
        # recorded sessions (see TraceTable): allocated by the first add_session call
        self.session: array | None = None
        self.round_index = array("q")
        self.done_us = array("q")
        self.think_us = array("q")
        self.session_labels = _Labels("")
        self.metadata: dict[str, Any] = {}
        self.zero_output = 0
        # LoRA / several models: each row's model and adapter codes ("" = none); allocated by the
        # first add_names call (a reader with those columns calls it for every row)
        self.model: array | None = None
        self.adapter = array("q")
        self.model_labels = _Labels("")
        self.adapter_labels = _Labels("")

    def add(
        self,
        line: int,
        arrival_us: int,
        prompt: int,
        output: int,
        group: int = -1,
        prefix: int = 0,
        max_out: int = -1,
        slo: int = 0,
        client: int = 0,
        tenant: int = 0,
    ) -> None:
        """Append one row (already validated by the reader, except ``output == 0`` -> 1)."""
        if output == 0:
            output = 1
            self.zero_output += 1
        self.lines.append(line)
        self.arrival.append(arrival_us)
        self.prompt.append(prompt)
        self.output.append(output)
        self.group.append(group)
        self.prefix.append(prefix)
        self.max_out.append(max_out)
        self.slo.append(slo)
        self.client.append(client)
        self.tenant.append(tenant)
        self.seg_offsets.append(len(self.seg_ids))

    def add_segments(self, ids: Iterable[int], lens: Iterable[int]) -> None:
        """Give the row just added its content segments."""
        self.seg_ids.extend(ids)
        self.seg_lens.extend(lens)
        self.seg_offsets[-1] = len(self.seg_ids)

    def add_session(self, session: str, round_index: int, done_us: int, think_us: int) -> None:
        """Give the row just added its session (``""``: none), round, observed completion time and
        recorded think time (-1: not recorded). A reader that calls it calls it for every row."""
        if self.session is None:
            if len(self.arrival) != 1:
                raise ValueError("add_session must be called for every row, from the first")
            self.session = array("q")
        self.session.append(self.session_labels.code(session) - 1 if session else -1)
        self.round_index.append(round_index)
        self.done_us.append(done_us)
        self.think_us.append(think_us)

    def add_names(self, model: str, adapter: str) -> None:
        """Give the row just added the model and the LoRA adapter it names ("": none)."""
        if self.model is None:
            self.model = array("q")
        self.model.append(self.model_labels.code(model))
        self.adapter.append(self.adapter_labels.code(adapter))

    def build(self, *, ignored: Sequence[str] = (), notes: Sequence[str] = ()) -> TraceTable:
        if not self.arrival:
            raise ScenarioError(str(self.file), None, "the trace has no requests")
        if self.session is not None and len(self.session) != len(self.arrival):
            raise ValueError("add_session was not called for every row")
        return TraceTable(self, ignored=ignored, notes=notes)


def _numeric_labels(labels: list[str]) -> dict[str, int] | None:
    """If every label is a non-negative decimal integer, label -> its number, else None."""
    out = {}
    for label in labels:
        if not label.isdigit():
            return None
        out[label] = int(label)
    return out


def _renumber_groups(b: TableBuilder, labels: list[str]) -> None:
    """Groups were numbered by first appearance; keep integer labels' own numbers instead."""
    numbers = _numeric_labels(labels)
    if not numbers:
        return
    mapping = np.array([numbers[label] for label in labels], dtype=np.int64)
    groups = np.frombuffer(b.group, dtype=np.int64)
    has = groups >= 0
    remapped = groups.copy()
    remapped[has] = mapping[groups[has]]
    b.group = array("q", remapped.tobytes())
