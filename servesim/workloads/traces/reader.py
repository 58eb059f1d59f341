"""What every trace reader shares: cell parsers whose errors name the column, (gzipped) text files,
CSV rows with their line numbers and header-to-column mapping (:func:`_csv_file`, the one read loop
of the CSV formats), and the :class:`TraceFormat` base class."""

from __future__ import annotations

import csv
import gzip
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, ClassVar

from servesim.simcore.csvcells import BadCell, cell_finite, cell_whole
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext
from servesim.workloads.fields import SLO_CLASSES
from servesim.workloads.traces.table import TableBuilder, TraceTable

_Bad = BadCell  # one cell error for every CSV reader (servesim.simcore.csvcells)


def _count(text: str, column: str, minimum: int = 0) -> int:
    """A whole number >= minimum ("12", "12.0" and "1e3" are accepted)."""
    return cell_whole(text, column, minimum=minimum)


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
    number = cell_finite(text, column)
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


def _prefix_tokens(text: str, prompt: int) -> int:
    """A ``prefix_tokens`` cell: how many leading prompt tokens are shared (0 when empty)."""
    if not text.strip():
        return 0
    prefix = _count(text, "prefix_tokens")
    if prefix > prompt:
        raise _Bad(
            "prefix_tokens", text, f"the shared prefix cannot exceed input_tokens ({prompt})"
        )
    return prefix


def _label_codes(
    b: TableBuilder,
    cells: list[str],
    i_slo: int | None,
    i_client: int | None,
    i_tenant: int | None,
) -> tuple[int, int, int]:
    """A row's SLO class, client and tenant as ``b``'s label codes; an absent column gives 0 (the
    default label), an empty client cell the client ``default``."""
    slo = 0 if i_slo is None else b.slo_labels.code(_slo(cells[i_slo], "slo_class"))
    client = 0 if i_client is None else b.client_labels.code(cells[i_client] or "default")
    tenant = 0 if i_tenant is None else b.tenant_labels.code(cells[i_tenant])
    return slo, client, tenant


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
    """Iterates a CSV file's data rows with their physical line numbers; errors name file:line.

    The header (the first non-blank row) is read on construction into ``header`` (at line
    ``header_line``); every data row must have as many cells, and ``line`` follows the row being
    read so that :func:`_csv_file` can name it in a bad cell's error. With ``comments``, leading
    ``#`` lines are collected raw (before the CSV parser sees them, so quotes in a comment cannot
    confuse it) into ``self.comments`` as (line, text).
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
        self._cells = self._nonblank()
        first = next(self._cells, None)
        if first is None:
            raise ScenarioError(str(file), None, "the file is empty: expected a header row")
        self.header_line, cells = first
        self.header = [c.strip() for c in cells]
        self.line = self.header_line

    def columns(
        self,
        required: Sequence[str],
        optional: Sequence[str],
        *,
        strict: bool,
        fold_case: bool = False,
        ignorable: Sequence[str] = (),
    ) -> tuple[dict[str, int], list[str]]:
        """Map the header's column names to indices; check required ones; return (index, ignored
        columns).

        An unknown column is an error when ``strict``; otherwise it is ignored (and reported),
        unless it is a near miss of a known column, which is always an error (a typo must not pass
        silently). ``ignorable`` columns are known to the format but not read: ignored without a
        near-miss check.
        """
        header = self.header
        where = f"{self.file}:{self.header_line}"
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
            import difflib  # only an unknown column needs a suggestion

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

    def header_error(self, what: str) -> ScenarioError:
        """An error about the header row (a column missing its partner, say), naming file:line."""
        return ScenarioError(f"{self.file}:{self.header_line}", ",".join(self.header), what)

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        file, width = self.file, len(self.header)
        for line, cells in self._cells:
            self.line = line
            if len(cells) != width:
                raise ScenarioError(
                    f"{file}:{line}",
                    ",".join(cells),
                    f"expected {width} columns (as in the header), got {len(cells)}",
                )
            yield line, cells

    def _nonblank(self) -> Iterator[tuple[int, list[str]]]:
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


@contextmanager
def _csv_file(file: Path, *, comments: bool = False) -> Iterator[_CsvRows]:
    """Open a (possibly gzipped) CSV trace and read its header; a bad cell (:class:`BadCell`)
    raised while its rows are read becomes an error naming the file, the row's line and the column.

    Every CSV format reads its rows this way, so no reader repeats the width check or the error.
    """
    with _open_text(file) as fh:
        rows = _CsvRows(file, fh, comments=comments)
        try:
            yield rows
        except _Bad as err:
            raise ScenarioError(
                f"{file}:{rows.line}", err.value, f"column {err.column}: {err.what}"
            ) from None


# -------------------------------------------------------------------------- the format base


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

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> TraceFormat:
        """The reader for a scenario's format options (``ctx.path`` is the workload section):
        each must be one of :attr:`options`, passed to the constructor by name."""
        for key in params:
            if key not in cls.options:
                raise ScenarioError(
                    f"{ctx.path}.{key}",
                    params[key],
                    f"not an option of the {cls.name or cls.__qualname__} format",
                )
        return cls(**params)
