"""Request traces: read them (five formats), replay them as a workload, write and convert them.

A scenario replays a trace with ``workload: {trace: NAME_OR_FILE, ...}``::

    trace: azure-conv          # a bundled trace (see BUNDLED_TRACES) or a file path
    format: auto               # auto | servesim | tracev2 | mooncake | azure | csv
    time_scale: 1.0            # multiplies every recorded time (2 = half the rate)
    rate_scale: 1.0            # divides every recorded time (2 = twice the rate)
    requests: 1000             # replay only the first N requests (in arrival order)
    duration: 10min            # ... and/or only those within this long after the first one
    start: 0s                  # move the first arrival here (default: keep the recorded times)
    slo_class: standard        # give every request this class (default: the trace's, else standard)
    max_output_tokens: oracle  # or an integer budget for every request (default: the trace's)
    block_tokens: 512          # mooncake only: tokens per hash id

Formats (``docs/howto/replay-a-trace.md`` has the column tables):

* ``servesim`` — our own CSV (optionally gzip-compressed), first line ``# servesim-trace v1``.
  Holds every :class:`RequestSpec` field, including content ``segments``; what
  :func:`write_trace` writes, and what the bundled traces are stored in.
* ``tracev2`` — BLIS TraceV2 (blis_reference.md §6.7): ``<prefix>.yaml`` header + ``<prefix>.csv``.
* ``mooncake`` — Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` of 512-token blocks, mapped onto content segments so prefix reuse is real.
* ``azure`` — Azure LLM inference trace CSV: ``TIMESTAMP`` (wall clock), ``ContextTokens``,
  ``GeneratedTokens``.
* ``csv`` — plain CSV: ``arrival_s`` (or ``arrival_ms`` / ``arrival_us``), ``input_tokens``,
  ``output_tokens`` and optionally ``prefix_id`` + ``prefix_tokens``.

Reading rules shared by every format:

* A trace is read and validated completely when the workload is built (validation happens once,
  at load time), into compact numpy columns (about 100 bytes per request plus 16 per content
  segment); :meth:`TraceWorkload.requests` then creates the :class:`RequestSpec` objects lazily.
* Every malformed row is a :class:`ScenarioError` whose path is ``<file>:<line>`` and whose
  message names the column and what is allowed. No row is ever dropped: blank lines are not rows,
  and the only adjustment is ``output_tokens = 0`` read as 1 (a request always produces its first
  token), counted in ``describe()["adjusted"]``.
* Unsorted traces are sorted by arrival time, stably (rows with equal times keep their file order),
  with a warning; ``describe()`` reports how many rows were out of order and the first such line. Row order carries
  no meaning the simulator could use, and merged logs from several front ends are routinely a little
  out of order, so refusing them would only push users to an external sort.
* Request ids are 0..n-1 in arrival order. Times are integer microseconds; by default they are
  replayed as recorded (so an exported workload replays identically), ``start`` moves the first
  arrival, and ``time_scale / rate_scale`` stretches or compresses them (rounded to the µs).
* Mooncake hash ids: hash id ``h`` becomes segment ``trace_segment(h)`` of 512 tokens, the last block
  ``input_length − 512·(n−1)`` tokens. If ``input_length`` exceeds ``512·n`` the remainder is a
  private segment, ``trace_segment(TRACE_PRIVATE_BASE + row)`` where ``row`` is the 0-based data row
  of the file: unique to the request and never equal to a real hash id.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import io
import itertools
import json
import math
import zlib
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import date
from os import PathLike
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np
import yaml

from servesim.simcore.config import (
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    parse_duration_us,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger
from servesim.simcore.registry import get, register, registry
from servesim.simcore.rng import RandomStreams
from servesim.workloads.base import TRACE_SEGMENT_BASE, RequestSpec, as_request_count, trace_segment
from servesim.workloads.synthetic import ORACLE, SLO_CLASSES

PathArg = str | PathLike[str]

DATA_DIR = Path(__file__).resolve().parent / "data"

BUNDLED_TRACES: dict[str, dict[str, Any]] = {
    "azure-code": {
        "file": "azure-code.csv.gz",
        "rows": 8819,
        "description": "Azure LLM inference 2023, coding service: 8,819 requests over ~57 min",
        "license": "CC-BY-4.0",
    },
    "azure-conv": {
        "file": "azure-conv.csv.gz",
        "rows": 19366,
        "description": "Azure LLM inference 2023, conversation service: 19,366 requests over ~58 min",
        "license": "CC-BY-4.0",
    },
    "mooncake-conv": {
        "file": "mooncake-conv.csv.gz",
        "rows": 12031,
        "description": "Mooncake FAST'25 conversation trace (Kimi): 12,031 requests over ~59 min, "
        "512-token block hashes (36.6% of blocks repeat an earlier one)",
        "license": "Apache-2.0",
    },
    "mooncake-synthetic": {
        "file": "mooncake-synthetic.csv.gz",
        "rows": 3993,
        "description": "Mooncake FAST'25 synthetic trace (public datasets, Poisson arrivals): "
        "3,993 requests over ~17 min, 512-token block hashes (64.0% repeat)",
        "license": "Apache-2.0",
    },
}
"""Traces shipped in ``servesim/workloads/data/`` (servesim format), usable by name."""

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake hash id (the FAST'25 release's block size)."""

TRACE_PRIVATE_BASE = 1 << 36
"""Block ids from here on are private remainders (``TRACE_PRIVATE_BASE + row``), never hash ids."""

SERVESIM_MAGIC = "# servesim-trace v1"
_CHUNK = 4096


def bundled_traces() -> dict[str, dict[str, Any]]:
    """Name -> ``{file, rows, description, license}`` of every bundled trace (the file as a path)."""
    return {
        name: {**info, "file": DATA_DIR / info["file"]} for name, info in BUNDLED_TRACES.items()
    }


# ====================================================================== the columnar table


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
        self.metadata: dict[str, Any] = {}
        self.zero_output = 0

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

    def build(self, *, ignored: Sequence[str] = (), notes: Sequence[str] = ()) -> TraceTable:
        if not self.arrival:
            raise ScenarioError(str(self.file), None, "the trace has no requests")
        return TraceTable(self, ignored=ignored, notes=notes)


# ====================================================================== cell parsing


class _Bad(ValueError):
    """A malformed cell: ``column`` names it, ``what`` says what is allowed."""

    def __init__(self, column: str, value: Any, what: str):
        super().__init__(what)
        self.column, self.value, self.what = column, value, what


def _count(text: str, column: str, minimum: int = 0) -> int:
    """A whole number >= minimum ("12", "12.0" and "1e3" are accepted)."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise _Bad(column, text, "expected a whole number") from None
        if not math.isfinite(number) or number != int(number):
            raise _Bad(column, text, "expected a whole number") from None
        value = int(number)
    if value < minimum:
        if value < 0:
            raise _Bad(column, text, "must not be negative")
        raise _Bad(column, text, f"must be at least {minimum}")
    return value


def _time_us(text: str, column: str, unit_us: float) -> int:
    """A non-negative time in ``column``'s unit, as integer µs (rounded to nearest)."""
    if unit_us == 1:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is not None:
            if value < 0:
                raise _Bad(column, text, "must not be negative")
            return value
    try:
        number = float(text)
    except ValueError:
        raise _Bad(column, text, "expected a number") from None
    if not math.isfinite(number):
        raise _Bad(column, text, "expected a finite number")
    if number < 0:
        raise _Bad(column, text, "must not be negative")
    return int(round(number * unit_us))


def _slo(text: str, column: str) -> str:
    text = text.strip()
    if not text:
        return "standard"
    if text not in SLO_CLASSES:
        raise _Bad(column, text, f"unknown SLO class; use one of {', '.join(SLO_CLASSES)}")
    return text


def _numeric_labels(labels: list[str]) -> dict[str, int] | None:
    """If every label is a non-negative decimal integer, label -> its number, else None."""
    out = {}
    for label in labels:
        if not label.isdigit():
            return None
        out[label] = int(label)
    return out


def _open_text(file: Path) -> IO[str]:
    """Open a text file for reading, transparently gunzipping it (by its magic bytes)."""
    with open(file, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(file, "rt", encoding="utf-8", newline="")
    return open(file, encoding="utf-8", newline="")


def _first_line(file: Path) -> str:
    """The first non-blank line of a (possibly gzipped) text file, or '' if unreadable."""
    try:
        with _open_text(file) as fh:
            for _ in range(50):
                line = fh.readline()
                if not line:
                    break
                if line.strip():
                    return line.strip()
    except (OSError, UnicodeDecodeError, EOFError):
        return ""
    return ""


def _is_empty(file: Path) -> bool:
    """Whether a (possibly gzipped) text file holds nothing but white space."""
    try:
        with _open_text(file) as fh:
            return not fh.read(1 << 16).strip()
    except (OSError, UnicodeDecodeError, EOFError):
        return False


class _CsvRows:
    """Iterates a CSV file's rows with their physical line numbers; errors name file:line.

    With ``comments``, leading ``#`` lines are collected raw (before the CSV parser sees them, so
    quotes in a comment cannot confuse it) into ``self.comments`` as (line, text).
    """

    def __init__(self, file: Path, fh: IO[str], *, comments: bool = False):
        self.file = file
        self.comments: list[tuple[int, str]] = []
        self.offset = 0
        lines: Iterable[str] = fh
        if comments:
            while True:
                text = fh.readline()
                if not text:
                    break
                self.offset += 1
                if not text.strip():
                    continue
                if text.lstrip().startswith("#"):
                    self.comments.append((self.offset, text.strip()))
                    continue
                self.offset -= 1
                lines = itertools.chain([text], fh)
                break
        self.reader = csv.reader(lines)

    def header(self) -> tuple[int, list[str]]:
        """The header row (the first non-blank row)."""
        for line, cells in self:
            return line, [c.strip() for c in cells]
        raise ScenarioError(str(self.file), None, "the file is empty: expected a header row")

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        reader = self.reader
        offset = self.offset
        try:
            for cells in reader:
                if not cells or (len(cells) == 1 and not cells[0].strip()):
                    continue  # a blank line is not a row
                yield reader.line_num + offset, cells
        except csv.Error as exc:
            raise ScenarioError(
                f"{self.file}:{reader.line_num + offset}", None, f"malformed CSV ({exc})"
            ) from None


def _columns(
    file: Path,
    line: int,
    header: list[str],
    required: Sequence[str],
    optional: Sequence[str],
    *,
    strict: bool,
    fold_case: bool = False,
    ignorable: Sequence[str] = (),
) -> tuple[dict[str, int], list[str]]:
    """Map column names to indices; check required ones; return (index, ignored columns).

    An unknown column is an error when ``strict``; otherwise it is ignored (and reported), unless it
    is a near miss of a known column, which is always an error (a typo must not pass silently).
    ``ignorable`` columns are known to the format but not read: ignored without a near-miss check.
    """
    where = f"{file}:{line}"
    known = [*required, *optional]
    index: dict[str, int] = {}
    ignored = []
    lookup = {k.lower(): k for k in known} if fold_case else {k: k for k in known}
    for i, name in enumerate(header):
        key = lookup.get(name.lower() if fold_case else name)
        if key is not None:
            if key in index:
                raise ScenarioError(where, name, "the column is given twice")
            index[key] = i
            continue
        if name in ignorable:
            ignored.append(name)
            continue
        hint = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        if strict or hint:
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ScenarioError(
                where, name, f"unknown column{suggestion}; known columns: {', '.join(known)}"
            )
        ignored.append(name)
    missing = [c for c in required if c not in index]
    if missing:
        raise ScenarioError(
            where,
            ",".join(header),
            f"missing column(s) {', '.join(missing)}; the header must name {', '.join(required)}",
        )
    return index, ignored


def _row_error(file: Path, line: int, err: _Bad) -> ScenarioError:
    return ScenarioError(f"{file}:{line}", err.value, f"column {err.column}: {err.what}")


def _cells(file: Path, line: int, cells: list[str], width: int) -> list[str]:
    if len(cells) != width:
        raise ScenarioError(
            f"{file}:{line}",
            ",".join(cells),
            f"expected {width} columns (as in the header), got {len(cells)}",
        )
    return cells


# ====================================================================== formats


class TraceFormat(ABC):
    """Base class of trace readers (plugin kind ``trace_format``).

    Subclasses set ``name`` and ``description``, implement :meth:`sniff` (does this look like my
    format?) and :meth:`read` (file -> :class:`TraceTable`, every error naming file:line).
    ``options`` lists the keyword options the constructor accepts (e.g. mooncake's block_tokens).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        """True if ``file`` (whose first non-blank line is ``first_line``) is in this format."""

    @abstractmethod
    def read(self, file: Path) -> TraceTable:
        """Read and validate the whole file."""

    def resolve(self, file: Path) -> Path:
        """The file to read when the user named ``file`` (TraceV2 maps a .yaml to its .csv)."""
        return file


@register("trace_format", "servesim")
class ServesimFormat(TraceFormat):
    """servesim's own trace CSV (optionally gzipped). See the module docstring and the how-to.

    ::

        # servesim-trace v1
        # block_tokens: 512
        arrival_us,input_tokens,output_tokens,segments
        0,6758,500,0..12 13:102

    ``input_tokens`` is the whole prompt (shared prefix included). ``segments`` items are ``B:N``
    (content block B, N tokens), ``B`` (one full block of ``block_tokens``) or ``A..B`` (blocks
    A to B, each full); block B is the RequestSpec segment ``trace_segment(B)``.
    """

    name = "servesim"
    description = "servesim trace CSV (# servesim-trace v1), every RequestSpec field"
    REQUIRED: ClassVar[tuple[str, ...]] = ("arrival_us", "input_tokens", "output_tokens")
    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "max_output_tokens",
        "prefix_group",
        "prefix_tokens",
        "slo_class",
        "client",
        "tenant",
        "segments",
    )

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        return first_line.startswith("# servesim-trace")

    def read(self, file: Path) -> TraceTable:
        b = TableBuilder(file, self.name)
        with _open_text(file) as fh:
            rows = _CsvRows(file, fh, comments=True)
            line, header = rows.header()
            self._metadata(file, rows.comments, b)
            col, _ = _columns(file, line, header, self.REQUIRED, self.OPTIONAL, strict=True)
            if ("prefix_group" in col) != ("prefix_tokens" in col):
                raise ScenarioError(
                    f"{file}:{line}",
                    ",".join(header),
                    "prefix_group and prefix_tokens go together: give both columns or neither",
                )
            block = b.metadata.get("block_tokens")
            width = len(header)
            i_t, i_in, i_out = col["arrival_us"], col["input_tokens"], col["output_tokens"]
            i_max = col.get("max_output_tokens")
            i_grp = col.get("prefix_group")
            i_pre = col.get("prefix_tokens")
            i_slo, i_cli, i_ten = col.get("slo_class"), col.get("client"), col.get("tenant")
            i_seg = col.get("segments")
            for line, cells in rows:
                _cells(file, line, cells, width)
                try:
                    t = _time_us(cells[i_t], "arrival_us", 1)
                    prompt = _count(cells[i_in], "input_tokens", 1)
                    output = _count(cells[i_out], "output_tokens")
                    max_out = -1
                    if i_max is not None and cells[i_max].strip():
                        max_out = _count(cells[i_max], "max_output_tokens")
                    group, prefix = -1, 0
                    if i_grp is not None and i_pre is not None:
                        text = cells[i_grp].strip()
                        if text and not text.lstrip("-").isdigit():
                            raise _Bad("prefix_group", text, "expected an integer (-1 = none)")
                        group = int(text) if text else -1
                        if group < -1:
                            raise _Bad("prefix_group", text, "expected -1 (none) or a group >= 0")
                        prefix = (
                            _count(cells[i_pre], "prefix_tokens") if cells[i_pre].strip() else 0
                        )
                        if prefix > prompt:
                            raise _Bad(
                                "prefix_tokens",
                                cells[i_pre],
                                f"the shared prefix cannot exceed input_tokens ({prompt})",
                            )
                    slo = 0 if i_slo is None else b.slo_labels.code(_slo(cells[i_slo], "slo_class"))
                    cli = 0 if i_cli is None else b.client_labels.code(cells[i_cli] or "default")
                    ten = 0 if i_ten is None else b.tenant_labels.code(cells[i_ten])
                    segs = None
                    if i_seg is not None and cells[i_seg].strip():
                        segs = _parse_segments(cells[i_seg], block, prompt)
                except _Bad as err:
                    raise _row_error(file, line, err) from None
                b.add(line, t, prompt, output, group, prefix, max_out, slo, cli, ten)
                if segs is not None:
                    b.add_segments(*segs)
        return b.build()

    @staticmethod
    def _metadata(file: Path, comments: list[tuple[int, str]], b: TableBuilder) -> None:
        if not comments or not comments[0][1].startswith(SERVESIM_MAGIC):
            line = comments[0][0] if comments else 1
            raise ScenarioError(
                f"{file}:{line}",
                comments[0][1] if comments else None,
                f"a servesim trace starts with the line {SERVESIM_MAGIC!r}",
            )
        for line, text in comments[1:]:
            key, sep, value = text.lstrip("#").strip().partition(":")
            if not sep:
                continue  # a free-form comment
            key, value = key.strip(), value.strip()
            if key == "block_tokens":
                try:
                    b.metadata[key] = _count(value, "block_tokens", 1)
                except _Bad as err:
                    raise ScenarioError(
                        f"{file}:{line}", value, f"block_tokens {err.what}"
                    ) from None
            else:
                b.metadata[key] = value


def _parse_segments(text: str, block: int | None, prompt: int) -> tuple[list[int], list[int]]:
    """Parse a ``segments`` cell into (segment ids, lengths) summing to ``prompt``."""
    ids: list[int] = []
    lens: list[int] = []
    base = TRACE_SEGMENT_BASE
    for item in text.split():
        try:
            if ":" in item:
                h, _, n = item.partition(":")
                length = int(n)
                if length < 1:
                    raise _Bad("segments", item, "a segment has at least 1 token")
                ids.append(-(base + int(h)))
                lens.append(length)
                continue
            if block is None:
                raise _Bad(
                    "segments",
                    item,
                    "a bare block id needs a '# block_tokens: N' header line; "
                    "or write BLOCK:TOKENS",
                )
            if ".." in item:
                a, _, z = item.partition("..")
                lo, hi = int(a), int(z)
                if hi < lo:
                    raise _Bad("segments", item, "a run A..B needs A <= B")
                ids.extend(range(-(base + lo), -(base + hi) - 1, -1))
                lens.extend([block] * (hi - lo + 1))
            else:
                ids.append(-(base + int(item)))
                lens.append(block)
        except ValueError as exc:
            if isinstance(exc, _Bad):
                raise
            raise _Bad(
                "segments", item, "expected items BLOCK:TOKENS, BLOCK or FIRST..LAST"
            ) from None
    total = sum(lens)
    if total != prompt:
        raise _Bad(
            "segments",
            text if len(text) < 60 else text[:57] + "...",
            f"the segments hold {total} tokens but input_tokens is {prompt}",
        )
    return ids, lens


@register("trace_format", "csv")
class CsvFormat(TraceFormat):
    """Plain CSV: ``arrival_s`` (or ``arrival_ms``/``arrival_us``), ``input_tokens``,
    ``output_tokens``, optional ``prefix_id`` and ``prefix_tokens``.

    ``input_tokens`` is the whole prompt. Requests with the same non-empty ``prefix_id`` share
    their first ``prefix_tokens`` tokens (with different lengths in one group, they share the
    shortest); ``prefix_id`` needs the ``prefix_tokens`` column. Prefix ids become prefix groups
    0, 1, ... in order of first appearance, or keep their number if every id is an integer.
    Other columns are ignored and listed in ``describe()``.
    """

    name = "csv"
    description = "plain CSV: arrival_s, input_tokens, output_tokens[, prefix_id, prefix_tokens]"
    TIME_COLUMNS: ClassVar[dict[str, float]] = {
        "arrival_s": 1e6,
        "arrival_ms": 1e3,
        "arrival_us": 1.0,
    }
    OPTIONAL: ClassVar[tuple[str, ...]] = ("prefix_id", "prefix_tokens")

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        cells = [c.strip() for c in first_line.split(",")]
        return "input_tokens" in cells and any(c in cells for c in cls.TIME_COLUMNS)

    def read(self, file: Path) -> TraceTable:
        b = TableBuilder(file, self.name)
        with _open_text(file) as fh:
            rows = _CsvRows(file, fh, comments=True)
            line, header = rows.header()
            times = [c for c in header if c in self.TIME_COLUMNS]
            where = f"{file}:{line}"
            if len(times) != 1:
                raise ScenarioError(
                    where,
                    ",".join(header),
                    "give exactly one arrival column: arrival_s, arrival_ms or arrival_us",
                )
            time_col = times[0]
            col, ignored = _columns(
                file,
                line,
                header,
                (time_col, "input_tokens", "output_tokens"),
                (*self.OPTIONAL, *(c for c in self.TIME_COLUMNS if c != time_col)),
                strict=False,
            )
            if "prefix_id" in col and "prefix_tokens" not in col:
                raise ScenarioError(
                    where,
                    ",".join(header),
                    "prefix_id needs a prefix_tokens column (how many leading tokens the "
                    "requests of one prefix_id share)",
                )
            unit = self.TIME_COLUMNS[time_col]
            width = len(header)
            i_t, i_in, i_out = col[time_col], col["input_tokens"], col["output_tokens"]
            i_id, i_pre = col.get("prefix_id"), col.get("prefix_tokens")
            groups = _Labels("")
            for line, cells in rows:
                _cells(file, line, cells, width)
                try:
                    t = _time_us(cells[i_t], time_col, unit)
                    prompt = _count(cells[i_in], "input_tokens", 1)
                    output = _count(cells[i_out], "output_tokens")
                    group, prefix = -1, 0
                    if i_pre is not None and cells[i_pre].strip():
                        prefix = _count(cells[i_pre], "prefix_tokens")
                        if prefix > prompt:
                            raise _Bad(
                                "prefix_tokens",
                                cells[i_pre],
                                f"the shared prefix cannot exceed input_tokens ({prompt})",
                            )
                    label = cells[i_id].strip() if i_id is not None else ""
                    if label and prefix > 0:
                        group = groups.code(label) - 1
                    elif prefix > 0:
                        raise _Bad("prefix_id", "", "prefix_tokens > 0 needs a prefix_id")
                except _Bad as err:
                    raise _row_error(file, line, err) from None
                b.add(line, t, prompt, output, group, prefix if group >= 0 else 0)
        _renumber_groups(b, groups.names[1:])
        notes = []
        if len(groups.names) > 1:
            notes.append(f"{len(groups.names) - 1} prefix ids mapped to prefix groups")
        return b.build(ignored=ignored, notes=notes)


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


@register("trace_format", "azure")
class AzureFormat(TraceFormat):
    """Azure LLM inference trace CSV (2023 Splitwise / 2024 DynamoLLM releases).

    ``TIMESTAMP`` is a wall-clock ``YYYY-MM-DD HH:MM:SS[.fraction]``, converted to µs since the
    earliest row (rounded to the µs); ``ContextTokens`` -> prompt, ``GeneratedTokens`` -> output.
    No prefix information. Column names are matched case-insensitively.
    """

    name = "azure"
    description = "Azure LLM inference trace: TIMESTAMP, ContextTokens, GeneratedTokens"
    REQUIRED: ClassVar[tuple[str, ...]] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        cells = {c.strip().lower() for c in first_line.split(",")}
        return {"timestamp", "contexttokens", "generatedtokens"} <= cells

    def read(self, file: Path) -> TraceTable:
        b = TableBuilder(file, self.name)
        days: dict[str, int] = {}
        with _open_text(file) as fh:
            rows = _CsvRows(file, fh)
            line, header = rows.header()
            col, ignored = _columns(
                file, line, header, self.REQUIRED, (), strict=False, fold_case=True
            )
            width = len(header)
            i_t, i_in, i_out = col["TIMESTAMP"], col["ContextTokens"], col["GeneratedTokens"]
            add = b.add
            for line, cells in rows:
                _cells(file, line, cells, width)
                try:
                    t = _wall_clock_us(cells[i_t].strip(), days)
                    prompt = _count(cells[i_in], "ContextTokens", 1)
                    output = _count(cells[i_out], "GeneratedTokens")
                except _Bad as err:
                    raise _row_error(file, line, err) from None
                add(line, t, prompt, output)
        origin = min(b.arrival) if b.arrival else 0
        if origin:
            shifted = np.frombuffer(b.arrival, dtype=np.int64) - origin
            b.arrival = array("q", shifted.tobytes())
        notes = ["TIMESTAMP converted to µs since the earliest row"]
        return b.build(ignored=ignored, notes=notes)


def _wall_clock_us(text: str, days: dict[str, int]) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fraction]`` (or ``T`` separator) -> µs since 0001-01-01."""
    day = days.get(text[:10])
    if day is None:
        try:
            day = days[text[:10]] = date.fromisoformat(text[:10]).toordinal()
        except ValueError:
            day = -1
    if (
        day < 0
        or len(text) < 19
        or text[10] not in " T"
        or text[13] != ":"
        or text[16] != ":"
        or (len(text) > 19 and text[19] != ".")
    ):
        raise _Bad("TIMESTAMP", text, "expected a time like 2023-11-16 18:15:46.6805900")
    try:
        h, m, s = int(text[11:13]), int(text[14:16]), int(text[17:19])
        frac = text[20:]
        if frac and not frac.isdigit():
            raise ValueError(frac)
        if len(frac) <= 6:
            us = int(frac.ljust(6, "0")) if frac else 0
        else:  # 100 ns digits and beyond: round to the nearest µs
            us = int(frac[:6]) + (frac[6] >= "5")
    except ValueError:
        raise _Bad("TIMESTAMP", text, "expected a time like 2023-11-16 18:15:46.6805900") from None
    if h > 23 or m > 59 or s > 60:
        raise _Bad("TIMESTAMP", text, "hours, minutes or seconds out of range")
    return ((day * 24 + h) * 60 + m) * 60_000_000 + s * 1_000_000 + us


@register("trace_format", "mooncake")
class MooncakeFormat(TraceFormat):
    """Mooncake JSONL: one ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` per
    line. Hash ids are content blocks of ``block_tokens`` (512) tokens, mapped onto segments as the
    module docstring says; ``hash_ids`` may be absent (a fully private prompt)."""

    name = "mooncake"
    description = "Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids"
    options = ("block_tokens",)
    KEYS: ClassVar[tuple[str, ...]] = ("timestamp", "input_length", "output_length", "hash_ids")

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
        self.block_tokens = int(block_tokens)

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        return first_line.startswith("{") and '"input_length"' in first_line

    def read(self, file: Path) -> TraceTable:
        b = TableBuilder(file, self.name)
        block = self.block_tokens
        base = TRACE_SEGMENT_BASE
        private = 0
        ignored: dict[str, None] = {}
        row = 0
        with _open_text(file) as fh:
            for line, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                where = f"{file}:{line}"
                try:
                    rec = json.loads(text)
                except ValueError as exc:
                    raise ScenarioError(
                        where, text.strip()[:60], f"not valid JSON ({exc})"
                    ) from None
                if not isinstance(rec, dict):
                    raise ScenarioError(where, rec, "expected a JSON object per line")
                try:
                    t = _json_time(rec, "timestamp")
                    prompt = _json_count(rec, "input_length", 1)
                    output = _json_count(rec, "output_length", 0)
                    hashes = rec.get("hash_ids", [])
                    if not isinstance(hashes, list) or not all(
                        type(h) is int and h >= 0 for h in hashes
                    ):
                        raise _Bad("hash_ids", hashes, "expected a list of integers >= 0")
                    n = len(hashes)
                    if n and prompt <= block * (n - 1):
                        raise _Bad(
                            "hash_ids",
                            f"{n} ids",
                            f"input_length {prompt} fills at most {-(-prompt // block)} blocks "
                            f"of {block} tokens",
                        )
                    if n and max(hashes) >= TRACE_PRIVATE_BASE:
                        raise _Bad("hash_ids", max(hashes), f"ids must be < {TRACE_PRIVATE_BASE}")
                except _Bad as err:
                    raise ScenarioError(
                        where, err.value, f"field {err.column}: {err.what}"
                    ) from None
                for key in rec:
                    if key not in self.KEYS:
                        ignored[key] = None
                b.add(line, t, prompt, output)
                ids = [-(base + h) for h in hashes]
                lens = [block] * n
                covered = block * n
                if n and prompt < covered:
                    lens[-1] = prompt - block * (n - 1)
                elif prompt > covered:
                    ids.append(trace_segment(TRACE_PRIVATE_BASE + row))
                    lens.append(prompt - covered)
                    private += 1
                b.add_segments(ids, lens)
                row += 1
        notes = [
            f"hash_ids mapped to segments of {block} tokens (the last block of a prompt partial)"
        ]
        if private:
            notes.append(
                f"{private} prompts extend past their hash ids: the rest is a private segment"
            )
        return b.build(ignored=list(ignored), notes=notes)


def _json_count(rec: dict, key: str, minimum: int) -> int:
    if key not in rec:
        raise _Bad(key, None, "missing")
    value = rec[key]
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise _Bad(key, value, "expected a whole number")
    if value < minimum:
        raise _Bad(key, value, "must not be negative" if value < 0 else f"must be >= {minimum}")
    return value


def _json_time(rec: dict, key: str) -> int:
    if key not in rec:
        raise _Bad(key, None, "missing")
    value = rec[key]
    if type(value) is int:
        if value < 0:
            raise _Bad(key, value, "must not be negative")
        return value * 1000
    if type(value) is float and math.isfinite(value):
        if value < 0:
            raise _Bad(key, value, "must not be negative")
        return int(round(value * 1000))
    raise _Bad(key, value, "expected a time in milliseconds")


@register("trace_format", "tracev2")
class TraceV2Format(TraceFormat):
    """BLIS TraceV2 (blis_reference.md §6.7): ``<prefix>.yaml`` header + ``<prefix>.csv`` rows.

    Columns are matched by name. Read: ``input_tokens`` (excludes the shared prefix),
    ``output_tokens``, ``arrival_time_us``, ``send_time_us`` (the arrival when > 0, BLIS's replay
    rule), ``prefix_group`` + ``prefix_length``, ``server_input_tokens`` (the whole prompt when > 0
    and the row has no prefix group, as BLIS replays it), ``slo_class``, ``client_id``,
    ``tenant_id``. Every other column (sessions, deadlines, modalities, observed timings...) is
    ignored and listed in ``describe()``; every round of a session replays at its recorded time
    (BLIS's default ``--session-mode fixed``).
    """

    name = "tracev2"
    description = "BLIS TraceV2: <prefix>.yaml header + <prefix>.csv"
    REQUIRED: ClassVar[tuple[str, ...]] = ("input_tokens", "output_tokens", "arrival_time_us")
    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "send_time_us",
        "prefix_group",
        "prefix_length",
        "server_input_tokens",
        "slo_class",
        "client_id",
        "tenant_id",
    )
    COLUMNS: ClassVar[tuple[str, ...]] = (
        "request_id",
        "client_id",
        "tenant_id",
        "slo_class",
        "session_id",
        "round_index",
        "prefix_group",
        "prefix_length",
        "streaming",
        "input_tokens",
        "output_tokens",
        "text_tokens",
        "image_tokens",
        "audio_tokens",
        "video_tokens",
        "reason_ratio",
        "model",
        "deadline_us",
        "server_input_tokens",
        "arrival_time_us",
        "send_time_us",
        "first_chunk_time_us",
        "last_chunk_time_us",
        "num_chunks",
        "status",
        "error_message",
        "finish_reason",
    )
    """The columns BLIS writes, in its order (the EXTRA_COLUMNS appear only when needed)."""
    EXTRA_COLUMNS: ClassVar[tuple[str, ...]] = (
        "vllm_priority",
        "slo_target_us",
        "x_request_id",
        "adapter",
        "think_time_us",
    )
    HEADER_READ: ClassVar[tuple[str, ...]] = ("trace_version", "time_unit", "mode", "created_at")
    TIME_UNITS: ClassVar[tuple[str, ...]] = ("microseconds", "us", "µs")

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        if file.suffix in (".yaml", ".yml"):
            return True
        cells = {c.strip() for c in first_line.split(",")}
        return {"arrival_time_us", "input_tokens"} <= cells

    def resolve(self, file: Path) -> Path:
        if file.suffix in (".yaml", ".yml"):
            data = file.with_suffix(".csv")
            if not data.is_file():
                raise ScenarioError(
                    str(file), None, f"a TraceV2 header needs its data file {data.name} beside it"
                )
            return data
        return file

    def read(self, file: Path) -> TraceTable:
        file = self.resolve(file)
        b = TableBuilder(file, self.name)
        header_file = file.with_suffix(".yaml")
        if not header_file.is_file():
            header_file = file.with_suffix(".yml")
        ignored_header = self._header(header_file, b) if header_file.is_file() else []
        server_rows = 0
        with _open_text(file) as fh:
            rows = _CsvRows(file, fh)
            line, header = rows.header()
            col, ignored = _columns(
                file,
                line,
                header,
                self.REQUIRED,
                self.OPTIONAL,
                strict=False,
                ignorable=(*self.COLUMNS, *self.EXTRA_COLUMNS),
            )
            if ("prefix_group" in col) != ("prefix_length" in col):
                raise ScenarioError(
                    f"{file}:{line}",
                    ",".join(header),
                    "prefix_group and prefix_length go together: give both columns or neither",
                )
            width = len(header)
            i_in, i_out = col["input_tokens"], col["output_tokens"]
            i_arr, i_send = col["arrival_time_us"], col.get("send_time_us")
            i_grp, i_len = col.get("prefix_group"), col.get("prefix_length")
            i_srv = col.get("server_input_tokens")
            i_slo, i_cli, i_ten = col.get("slo_class"), col.get("client_id"), col.get("tenant_id")
            groups = _Labels("")
            for line, cells in rows:
                _cells(file, line, cells, width)
                try:
                    t = _time_us(cells[i_arr], "arrival_time_us", 1)
                    if i_send is not None and cells[i_send].strip():
                        send = _time_us(cells[i_send], "send_time_us", 1)
                        if send > 0:
                            t = send
                    suffix = _count(cells[i_in], "input_tokens")
                    output = _count(cells[i_out], "output_tokens")
                    group, prefix = -1, 0
                    if i_grp is not None and i_len is not None:
                        label = cells[i_grp].strip()
                        prefix = (
                            _count(cells[i_len], "prefix_length") if cells[i_len].strip() else 0
                        )
                        if label and prefix > 0:
                            group = groups.code(label) - 1
                        else:
                            prefix = 0
                    prompt = prefix + suffix
                    if group < 0 and i_srv is not None and cells[i_srv].strip():
                        server = _count(cells[i_srv], "server_input_tokens")
                        if server > 0:
                            prompt = server
                            server_rows += 1
                    if prompt < 1:
                        raise _Bad("input_tokens", cells[i_in], "the prompt needs at least 1 token")
                    slo = 0 if i_slo is None else b.slo_labels.code(_slo(cells[i_slo], "slo_class"))
                    cli = 0 if i_cli is None else b.client_labels.code(cells[i_cli] or "default")
                    ten = 0 if i_ten is None else b.tenant_labels.code(cells[i_ten])
                except _Bad as err:
                    raise _row_error(file, line, err) from None
                b.add(line, t, prompt, output, group, prefix, -1, slo, cli, ten)
        _renumber_groups(b, groups.names[1:])
        notes = [
            "arrival = send_time_us when > 0, else arrival_time_us (BLIS replay rule)",
            "sessions replay every round at its recorded time (BLIS --session-mode fixed)",
        ]
        if server_rows:
            notes.append(f"{server_rows} prompts sized by server_input_tokens")
        if ignored_header:
            notes.append(f"header fields not modelled: {', '.join(ignored_header)}")
        return b.build(ignored=ignored, notes=notes)

    def _header(self, file: Path, b: TableBuilder) -> list[str]:
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError(
                str(file), None, f"cannot read the TraceV2 header ({exc})"
            ) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{file}:{mark.line + 1}" if mark is not None else str(file)
            raise ScenarioError(
                where, None, f"the TraceV2 header is not valid YAML ({exc})"
            ) from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ScenarioError(str(file), data, "a TraceV2 header is a YAML mapping")
        unit = data.get("time_unit", "microseconds")
        if unit not in self.TIME_UNITS:
            raise ScenarioError(
                f"{file}:time_unit", unit, "servesim reads TraceV2 times in microseconds only"
            )
        for key in self.HEADER_READ:
            if key in data:
                value = data[key]  # YAML may give a datetime: keep describe() JSON-ready
                plain = value is None or isinstance(value, (str, int, float, bool))
                b.metadata[key] = value if plain else str(value)
        return [str(k) for k in data if k not in self.HEADER_READ]


def trace_formats() -> list[str]:
    """Registered trace format names (built-ins and plugins), sorted."""
    return registry("trace_format").names()


_SNIFF_ORDER = ("servesim", "tracev2", "azure", "mooncake", "csv")


def detect_format(file: Path, path: str = "workload.format") -> str:
    """The format of ``file`` by its content (and suffix for a TraceV2 header)."""
    first = _first_line(file)
    if not first and _is_empty(file):
        raise ScenarioError("workload.trace", str(file), "empty file: a trace needs a header and rows")
    names = [*_SNIFF_ORDER, *(n for n in trace_formats() if n not in _SNIFF_ORDER)]
    for name in names:
        if get("trace_format", name).sniff(file, first):
            return name
    raise ScenarioError(
        path,
        "auto",
        f"cannot tell the format of {file} from its first line {first[:60]!r}; "
        f"set format: to one of {', '.join(trace_formats())}",
    )


def resolve_trace(
    trace: Any, path: str = "workload.trace", base_dir: PathArg | None = None
) -> tuple[Path, str | None]:
    """(file, bundled name or None) for a trace named in a scenario.

    A bundled name wins; otherwise the value is a path, relative to ``base_dir`` (the scenario's
    directory) or the working directory. A TraceV2 prefix (``run1`` for run1.yaml + run1.csv) works.
    """
    if isinstance(trace, str) and trace in BUNDLED_TRACES:
        return DATA_DIR / BUNDLED_TRACES[trace]["file"], trace
    if not isinstance(trace, (str, PathLike)) or not str(trace):
        raise ScenarioError(
            path,
            trace,
            f"expected a trace file or a bundled trace: {', '.join(BUNDLED_TRACES)}",
        )
    file = Path(trace).expanduser()
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if not file.is_absolute():
        file = base / file
    if file.is_file():
        return file, None
    for suffix in (".yaml", ".csv"):
        candidate = file.with_name(file.name + suffix)
        if candidate.is_file():
            return candidate, None
    raise ScenarioError(
        path,
        str(trace),
        f"no such file: {file} (relative paths are resolved against {base}); "
        f"bundled traces: {', '.join(BUNDLED_TRACES)}",
    )


def load_trace(
    trace: Any,
    format: str = "auto",
    *,
    base_dir: PathArg | None = None,
    path: str = "workload",
    **options: Any,
) -> TraceTable:
    """Read a trace (a bundled name or a file) into a :class:`TraceTable`."""
    file, bundled = resolve_trace(trace, f"{path}.trace", base_dir)
    if format == "auto":
        format = "servesim" if bundled else detect_format(file, f"{path}.format")
    cls = get("trace_format", format, f"{path}.format")
    for key in options:
        if key not in cls.options:
            raise ScenarioError(
                f"{path}.{key}", options[key], f"not an option of the {format} format"
            )
    reader = cls(**options)
    try:
        return reader.read(file)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise ScenarioError(str(file), None, f"cannot read the trace ({exc})") from None


# ====================================================================== replay


class TraceWorkload:
    """Replays a trace; :meth:`requests` yields its :class:`RequestSpec` lazily in arrival order.

    Build it with :meth:`from_config` (a scenario's ``workload:`` section, see the module
    docstring) or from a :class:`TraceTable`.
    """

    fields: ClassVar[tuple[str, ...]] = (
        "trace",
        "format",
        "time_scale",
        "rate_scale",
        "requests",
        "duration",
        "start",
        "slo_class",
        "max_output_tokens",
        "block_tokens",
    )

    def __init__(
        self,
        table: TraceTable,
        *,
        name: str | None = None,
        time_scale: float = 1.0,
        rate_scale: float = 1.0,
        requests: int | None = None,
        duration_us: int | None = None,
        start_us: int | None = None,
        slo_class: str | None = None,
        max_output_tokens: int | str | None = None,
    ):
        self.table = table
        self.name = name
        self.time_scale = float(time_scale)
        self.rate_scale = float(rate_scale)
        self.limit = requests
        self.duration_us = duration_us
        self.start_us = start_us
        self.slo_class = slo_class
        self.max_output_tokens = max_output_tokens
        order = table.order
        recorded = table.arrival_us if order is None else table.arrival_us[order]
        factor = self.time_scale / self.rate_scale
        if start_us is None:
            offset, origin = 0, 0
        else:
            offset, origin = start_us, int(recorded[0])
        if factor == 1.0:
            times = recorded - origin + offset
        else:
            scaled = np.rint((recorded - origin).astype(np.float64) * factor)
            if not np.isfinite(scaled).all() or scaled.max() >= 2**62:
                raise ScenarioError(
                    "workload.time_scale", time_scale, "the scaled times overflow; scale less"
                )
            times = scaled.astype(np.int64) + offset
        n = len(times)
        if duration_us is not None:
            n = int(np.searchsorted(times, times[0] + duration_us, side="right"))
        if requests is not None:
            n = min(n, requests)
        self._times = times[:n]
        self._rows = (np.arange(n) if order is None else order[:n]).astype(np.int64)

    @classmethod
    def from_config(
        cls,
        section: Mapping[str, Any],
        path: str = "workload",
        base_dir: PathArg | None = None,
    ) -> TraceWorkload:
        """Validate a ``workload: {trace: ...}`` section and read the trace (errors name the field,
        or the trace's file:line)."""
        s = expect_mapping(section, path)
        check_keys(s, cls.fields, path)
        if s.get("trace") is None:
            raise ScenarioError(
                f"{path}.trace",
                None,
                f"missing; give a trace file or a bundled trace: {', '.join(BUNDLED_TRACES)}",
            )
        fmt = "auto"
        if s.get("format") is not None:
            fmt = as_str(s["format"], f"{path}.format", choices=("auto", *trace_formats()))
        scales = {}
        for key in ("time_scale", "rate_scale"):
            scales[key] = 1.0
            if s.get(key) is not None:
                scales[key] = as_float(s[key], f"{path}.{key}", exclusive_minimum=0.0)
        requests = None
        if s.get("requests") is not None:
            requests = as_request_count(s["requests"], f"{path}.requests")
        duration_us = None
        if s.get("duration") is not None:
            duration_us = parse_duration_us(s["duration"], f"{path}.duration", minimum=0)
        start_us = None
        if s.get("start") is not None:
            start_us = parse_duration_us(s["start"], f"{path}.start", minimum=0)
        slo_class = None
        if s.get("slo_class") is not None:
            slo_class = as_str(s["slo_class"], f"{path}.slo_class", choices=SLO_CLASSES)
        max_out: int | str | None = None
        if s.get("max_output_tokens") is not None:
            if s["max_output_tokens"] == ORACLE:
                max_out = ORACLE
            else:
                max_out = as_int(s["max_output_tokens"], f"{path}.max_output_tokens", minimum=0)
        options = {}
        if s.get("block_tokens") is not None:
            options["block_tokens"] = as_int(s["block_tokens"], f"{path}.block_tokens", minimum=1)
        table = load_trace(s["trace"], fmt, base_dir=base_dir, path=path, **options)
        name = s["trace"] if isinstance(s["trace"], str) else str(s["trace"])
        return cls(
            table,
            name=name,
            requests=requests,
            duration_us=duration_us,
            start_us=start_us,
            slo_class=slo_class,
            max_output_tokens=max_out,
            **scales,
        )

    def __len__(self) -> int:
        """How many requests :meth:`requests` yields."""
        return len(self._rows)

    def arrival_times_us(self) -> np.ndarray:
        """The replayed arrival times (µs, int64), in the order :meth:`requests` yields them."""
        return self._times.copy()

    def requests(self, streams: RandomStreams | None = None) -> Iterator[RequestSpec]:
        """Yield the requests in arrival order with ids 0..n-1 (``streams`` is unused: a trace
        draws nothing). A generator: specs are created one chunk at a time."""
        t = self.table
        slo_names, client_names, tenant_names = t.slo_names, t.client_names, t.tenant_names
        fixed_slo = self.slo_class
        budget = self.max_output_tokens
        has_segments = t.has_segments
        # a request whose prompt or answer a later request's prompt contains (a conversation's
        # next round) is marked `continued`, so its blocks stay findable after it finishes
        referenced: set[int] = set()
        if has_segments:
            ids = t.seg_ids
            referenced = set(np.unique(ids[ids >= 0]).tolist())
        for a in range(0, len(self._rows), _CHUNK):
            rows = self._rows[a : a + _CHUNK]
            outputs = t.output_tokens[rows]
            if budget is None:
                recorded = t.max_output_tokens[rows]
                budgets = np.where(recorded >= 0, recorded, outputs).tolist()
            elif budget == ORACLE:
                budgets = outputs.tolist()
            else:
                budgets = [budget] * len(rows)
            segments: list[Any] = [None] * len(rows)
            if has_segments:
                lo, hi = t.seg_offsets[rows].tolist(), t.seg_offsets[rows + 1].tolist()
                ids, lens = t.seg_ids, t.seg_lens
                for k, (i, j) in enumerate(zip(lo, hi)):
                    if j > i:
                        segments[k] = tuple(zip(ids[i:j].tolist(), lens[i:j].tolist()))
            for k, (arr, prompt, out, grp, pre, slo, cli, ten, bud, seg) in enumerate(
                zip(
                    self._times[a : a + _CHUNK].tolist(),
                    t.prompt_tokens[rows].tolist(),
                    outputs.tolist(),
                    t.prefix_group[rows].tolist(),
                    t.prefix_tokens[rows].tolist(),
                    t.slo_code[rows].tolist(),
                    t.client_code[rows].tolist(),
                    t.tenant_code[rows].tolist(),
                    budgets,
                    segments,
                ),
                start=a,
            ):
                spec = RequestSpec(
                    k,
                    arr,
                    prompt,
                    out,
                    grp,
                    pre,
                    bud,
                    fixed_slo or slo_names[slo],
                    client_names[cli],
                    tenant_names[ten],
                    seg,
                )
                if referenced and (2 * k in referenced or 2 * k + 1 in referenced):
                    spec.continued = True
                yield spec

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for summary.json: the source, the transformation, what was read
        and what was ignored or adjusted."""
        t = self.table
        rows = self._rows
        n = len(rows)
        times = self._times
        span = int(times[-1] - times[0]) if n else 0
        d: dict[str, Any] = {
            "kind": "trace",
            "trace": self.name,
            "bundled": self.name if self.name in BUNDLED_TRACES else None,
            "file": str(t.file),
            "format": t.format,
            "rows": len(t),
            "requests": n,
            "limit": self.limit,
            "duration_limit_us": self.duration_us,
            "time_scale": self.time_scale,
            "rate_scale": self.rate_scale,
            "start_us": self.start_us,
            "first_arrival_us": int(times[0]) if n else None,
            "last_arrival_us": int(times[-1]) if n else None,
            "mean_rate": (n - 1) / span * 1e6 if n > 1 and span > 0 else None,
            "mean_input_tokens": float(t.prompt_tokens[rows].mean()) if n else None,
            "mean_output_tokens": float(t.output_tokens[rows].mean()) if n else None,
            "slo_class": self.slo_class,
            "max_output_tokens": self.max_output_tokens,
            "sorted_in_file": t.out_of_order_rows == 0,
            "out_of_order_rows": t.out_of_order_rows,
            "first_out_of_order_line": t.first_out_of_order_line,
            "prefix_groups": int(len(np.unique(t.prefix_group[rows][t.prefix_group[rows] >= 0]))),
            "ignored_columns": t.ignored_columns,
            "adjusted": t.adjusted,
            "notes": t.notes,
            "metadata": {k: v for k, v in t.metadata.items() if k != "block_tokens"},
        }
        if t.has_segments:
            d["segments"] = _segment_stats(t, rows)
        if self.name in BUNDLED_TRACES:
            d["license"] = BUNDLED_TRACES[self.name]["license"]
        return d

    def __repr__(self) -> str:
        return (
            f"TraceWorkload(trace={self.name!r}, format={self.table.format!r}, "
            f"requests={len(self)}, time_scale={self.time_scale:g}, rate_scale={self.rate_scale:g})"
        )


def _segment_stats(t: TraceTable, rows: np.ndarray) -> dict[str, Any]:
    """Content-segment counts over ``rows``; ``reuse`` = the fraction of segments whose id already
    appeared in another (or the same) request: for Mooncake hash ids, the block reuse ratio."""
    lo, hi = t.seg_offsets[rows], t.seg_offsets[rows + 1]
    counts = hi - lo
    if t.order is None:  # rows are 0..n-1: their segments are one leading slice
        ids = t.seg_ids[: int(t.seg_offsets[len(rows)])]
    else:
        ids = np.concatenate([t.seg_ids[i:j] for i, j in zip(lo.tolist(), hi.tolist())])
    total = int(counts.sum())
    unique = int(len(np.unique(ids))) if total else 0
    return {
        "requests_with_segments": int((counts > 0).sum()),
        "segments": total,
        "reuse": (total - unique) / total if total else 0.0,
    }


def read_trace(trace: Any, format: str = "auto", **config: Any) -> list[RequestSpec]:
    """Every request of a trace, as :class:`TraceWorkload` replays it (``config``: the other
    ``workload:`` keys, e.g. ``requests=100, start="0s"``)."""
    section = {"trace": trace, "format": format, **config}
    return list(TraceWorkload.from_config(section).requests())


def block_reuse(specs: Iterable[RequestSpec]) -> float:
    """Fraction of content segments (e.g. Mooncake blocks) equal to one seen in an earlier
    request (or earlier in the same one) — the infinite-cache block hit ratio of a trace."""
    seen: set[int] = set()
    total = repeats = 0
    for spec in specs:
        for segment, _ in spec.segments or ():
            total += 1
            if segment in seen:
                repeats += 1
            else:
                seen.add(segment)
    return repeats / total if total else 0.0


# ====================================================================== writing


def _segment_items(segments: Sequence[tuple[int, int]], block: int | None) -> str:
    """Encode segments compactly: runs of consecutive full blocks as A..B, full blocks bare."""
    base = TRACE_SEGMENT_BASE
    out: list[str] = []
    run_lo = run_hi = None

    def flush() -> None:
        if run_lo is None:
            return
        if run_hi == run_lo:
            out.append(str(run_lo))
        elif run_hi == run_lo + 1:
            out.extend((str(run_lo), str(run_hi)))
        else:
            out.append(f"{run_lo}..{run_hi}")

    for segment, length in segments:
        h = -segment - base
        if block is not None and length == block:
            if run_hi is not None and h == run_hi + 1:
                run_hi = h
                continue
            flush()
            run_lo = run_hi = h
            continue
        flush()
        run_lo = run_hi = None
        out.append(f"{h}:{length}")
    flush()
    return " ".join(out)


def _check_spec(spec: RequestSpec, i: int) -> None:
    problem = None
    if spec.arrival_us < 0:
        problem = "arrival_us < 0"
    elif spec.prompt_tokens < 1:
        problem = "prompt_tokens < 1"
    elif spec.output_tokens < 1:
        problem = "output_tokens < 1"
    elif not 0 <= spec.prefix_tokens <= spec.prompt_tokens:
        problem = "prefix_tokens outside [0, prompt_tokens]"
    elif spec.max_output_tokens < 0:
        problem = "max_output_tokens < 0"
    elif spec.segments is not None:
        if not spec.segments or any(n < 1 for _, n in spec.segments):
            problem = "segments must be non-empty runs of >= 1 token"
        elif sum(n for _, n in spec.segments) != spec.prompt_tokens:
            problem = "segment lengths do not sum to prompt_tokens"
    if problem:
        raise ValueError(f"request #{i} (id {spec.id}) cannot be written: {problem}")


def _open_write(file: Path, compress: bool) -> IO[str]:
    if not compress:
        return open(file, "w", encoding="utf-8", newline="")
    raw = open(file, "wb")  # noqa: SIM115 - closed through the wrapper
    # mtime=0 and no file name in the gzip header: the same trace gives the same bytes
    gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9)
    return _ClosingText(gz, raw)


class _ClosingText(io.TextIOWrapper):
    def __init__(self, gz: gzip.GzipFile, raw: IO[bytes]):
        super().__init__(gz, encoding="utf-8", newline="")
        self._raw = raw

    def close(self) -> None:
        super().close()
        self._raw.close()


def _block_size(specs: Sequence[RequestSpec]) -> int | None:
    lengths: dict[int, int] = {}
    for spec in specs:
        for _, n in spec.segments or ():
            lengths[n] = lengths.get(n, 0) + 1
    if not lengths:
        return None
    best = min(lengths, key=lambda n: (-lengths[n], n))
    return best if lengths[best] > 1 else None


def write_trace(
    specs: Iterable[RequestSpec],
    path: PathArg,
    format: str = "servesim",
    *,
    strict: bool = True,
    metadata: Mapping[str, Any] | None = None,
    compress: bool | None = None,
) -> dict[str, Any]:
    """Write requests as a trace that replays to identical :class:`RequestSpec` objects.

    ``format="servesim"`` writes one CSV (gzip-compressed when ``compress`` or the name ends in
    ``.gz``), with only the columns the requests need and ``metadata`` as ``# key: value`` lines.
    ``format="tracev2"`` writes ``<stem>.yaml`` + ``<stem>.csv`` (for ``path`` ending in .yaml, .csv
    or neither). TraceV2 cannot hold content segments or a budget other than the output length;
    with ``strict`` such a field is a :class:`ScenarioError`, otherwise it is dropped and counted in
    the result.
    Ids are not stored: a trace replays with ids 0..n-1 in arrival order, so write requests in
    arrival order. Returns ``{"files": [...], "rows": n, "dropped": {field: rows}}``.
    """
    specs = list(specs)
    for i, spec in enumerate(specs):
        _check_spec(spec, i)
    file = Path(path)
    _check_destination(file)
    if format == "servesim":
        if compress is None:
            compress = file.suffix == ".gz"
        _write_servesim(specs, file, metadata or {}, compress)
        return {"files": [str(file)], "rows": len(specs), "dropped": {}}
    if format == "tracev2":
        return _write_tracev2(specs, file, strict, metadata or {})
    raise ScenarioError("format", format, "servesim can write the formats servesim and tracev2")


def _check_destination(file: Path) -> None:
    """A trace can be written at ``file``: its folder exists (and is a folder), and ``file`` is
    not itself a folder."""
    parent = file.parent
    for above in [parent, *parent.parents]:
        if above.exists():
            if not above.is_dir():
                raise ScenarioError(
                    "destination",
                    str(file),
                    f"{above} is a file, not a folder; choose a destination in a folder",
                )
            break
    if not parent.is_dir():
        raise ScenarioError(
            "destination",
            str(file),
            f"the folder {parent} does not exist; create it first (mkdir -p {parent})",
        )
    if file.is_dir():
        raise ScenarioError("destination", str(file), "is a folder; give a file name")


def _write_servesim(
    specs: list[RequestSpec], file: Path, metadata: Mapping[str, Any], compress: bool
) -> None:
    block = _block_size(specs)
    columns = ["arrival_us", "input_tokens", "output_tokens"]
    need = {
        "max_output_tokens": any(s.max_output_tokens != s.output_tokens for s in specs),
        "prefix_group": any(s.prefix_group != -1 or s.prefix_tokens for s in specs),
        "slo_class": any(s.slo_class != "standard" for s in specs),
        "client": any(s.client != "default" for s in specs),
        "tenant": any(s.tenant for s in specs),
        "segments": any(s.segments is not None for s in specs),
    }
    for name in ("max_output_tokens", "prefix_group", "slo_class", "client", "tenant", "segments"):
        if need[name]:
            columns.append(name)
            if name == "prefix_group":
                columns.append("prefix_tokens")
    for value in (*(str(s.client) for s in specs), *(str(s.tenant) for s in specs)):
        if value.startswith("#") or "\n" in value or "\r" in value:
            raise ValueError(f"client/tenant label {value!r} cannot be written")
    with _open_write(file, compress) as fh:
        fh.write(SERVESIM_MAGIC + "\n")
        if block is not None:
            fh.write(f"# block_tokens: {block}\n")
        for key, value in metadata.items():
            text = str(value).replace("\n", " ")
            if key == "block_tokens" or not str(key).isidentifier():
                raise ValueError(f"metadata key {key!r} is reserved or not an identifier")
            fh.write(f"# {key}: {text}\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for s in specs:
            row: list[Any] = [s.arrival_us, s.prompt_tokens, s.output_tokens]
            if need["max_output_tokens"]:
                row.append("" if s.max_output_tokens == s.output_tokens else s.max_output_tokens)
            if need["prefix_group"]:
                row += [s.prefix_group, s.prefix_tokens]
            if need["slo_class"]:
                row.append(s.slo_class)
            if need["client"]:
                row.append(s.client)
            if need["tenant"]:
                row.append(s.tenant)
            if need["segments"]:
                row.append("" if s.segments is None else _segment_items(s.segments, block))
            w.writerow(row)


def _tracev2_files(file: Path) -> tuple[Path, Path]:
    if file.suffix in (".yaml", ".yml", ".csv"):
        stem = file.with_suffix("")
    else:
        stem = file
    return stem.with_name(stem.name + ".yaml"), stem.with_name(stem.name + ".csv")


def _write_tracev2(
    specs: list[RequestSpec], file: Path, strict: bool, metadata: Mapping[str, Any]
) -> dict[str, Any]:
    dropped: dict[str, int] = {}

    def lossy(field: str, i: int, spec: RequestSpec, why: str) -> None:
        if strict:
            raise ScenarioError(
                str(file),
                field,
                f"TraceV2 cannot hold {why} (request #{i}, id {spec.id}); write the servesim "
                "format, or drop it (strict=False; servesim convert --lossy)",
            )
        dropped[field] = dropped.get(field, 0) + 1

    for i, s in enumerate(specs):
        if s.segments is not None:
            lossy("segments", i, s, "content segments (e.g. Mooncake hash ids)")
        if s.max_output_tokens != s.output_tokens:
            lossy("max_output_tokens", i, s, "a max_output_tokens other than the output length")
        if s.prefix_group >= 0 and s.prefix_tokens == 0:
            lossy("prefix_group", i, s, "a prefix group with an empty prefix")
        if s.prefix_group < -1 or (s.prefix_group == -1 and s.prefix_tokens):
            lossy("prefix_tokens", i, s, "prefix_tokens without a prefix group")
    header_file, data_file = _tracev2_files(file)
    header: dict[str, Any] = {
        "trace_version": 3,
        "time_unit": "microseconds",
        "mode": "generated",
        "warm_up_requests": 0,
    }
    for key in ("created_at", "workload_spec", "workload_seed"):
        if key in metadata:
            header[key] = metadata[key]
    header_file.write_text(yaml.safe_dump(header, sort_keys=False), encoding="utf-8")
    with open(data_file, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(TraceV2Format.COLUMNS)
        for s in specs:
            shared = s.prefix_group >= 0 and s.prefix_tokens > 0
            prefix = s.prefix_tokens if shared else 0
            suffix = s.prompt_tokens - prefix
            w.writerow(
                (
                    s.id,
                    s.client,
                    s.tenant,
                    s.slo_class,
                    "",  # session_id
                    0,  # round_index
                    s.prefix_group if shared else "",
                    prefix,
                    "false",  # streaming
                    suffix,
                    s.output_tokens,
                    suffix,  # text_tokens
                    0,
                    0,
                    0,
                    0,  # image, audio, video tokens; reason_ratio
                    "",  # model
                    0,  # deadline_us
                    0,  # server_input_tokens
                    s.arrival_us,
                    s.arrival_us,  # send_time_us
                    0,
                    0,
                    0,  # first/last chunk times, num_chunks: not run yet
                    "ok",
                    "",
                    "",
                )
            )
    return {"files": [str(header_file), str(data_file)], "rows": len(specs), "dropped": dropped}


def convert(
    src: PathArg,
    dst: PathArg,
    src_format: str = "auto",
    dst_format: str = "auto",
    *,
    strict: bool = True,
    metadata: Mapping[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Convert a trace file (or bundled name) to ``dst`` in the servesim or TraceV2 format.

    Rows are written in arrival order with their recorded times (no scaling, no shift), so
    reading ``dst`` gives the same requests as reading ``src``. ``dst_format="auto"`` picks
    TraceV2 for a ``.yaml``/``.yml`` destination, servesim otherwise. ``options`` are reader
    options (``block_tokens`` for mooncake). Returns :func:`write_trace`'s summary plus the source.
    """
    table = load_trace(src, src_format, path="convert", **options)
    if dst_format == "auto":
        dst_format = "tracev2" if Path(dst).suffix in (".yaml", ".yml") else "servesim"
    as_str(dst_format, "convert.dst_format", choices=("servesim", "tracev2"))
    specs = TraceWorkload(table).requests()
    meta = {**{k: v for k, v in table.metadata.items() if k != "block_tokens"}, **(metadata or {})}
    result = write_trace(specs, dst, dst_format, strict=strict, metadata=meta)
    result["source"] = {"file": str(table.file), "format": table.format}
    return result
