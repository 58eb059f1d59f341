"""The ``csv`` trace format: plain CSV with an arrival column, input and output tokens, optional prefix."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register
from servesim.workloads.traces.reader import (
    TraceFormat,
    _Bad,
    _cells,
    _columns,
    _count,
    _CsvRows,
    _open_text,
    _row_error,
    _time_us,
)
from servesim.workloads.traces.table import TableBuilder, TraceTable, _Labels, _renumber_groups


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
