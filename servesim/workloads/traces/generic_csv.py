"""The ``csv`` trace format: plain CSV with an arrival column, input and output tokens, optional prefix."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from servesim.simcore.registry import register
from servesim.workloads.traces.reader import (
    TraceFormat,
    _Bad,
    _count,
    _csv_file,
    _prefix_tokens,
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
        with _csv_file(file, comments=True) as rows:
            times = [c for c in rows.header if c in self.TIME_COLUMNS]
            if len(times) != 1:
                raise rows.header_error(
                    "give exactly one arrival column: arrival_s, arrival_ms or arrival_us"
                )
            time_col = times[0]
            col, ignored = rows.columns(
                (time_col, "input_tokens", "output_tokens"),
                (*self.OPTIONAL, *(c for c in self.TIME_COLUMNS if c != time_col)),
                strict=False,
            )
            if "prefix_id" in col and "prefix_tokens" not in col:
                raise rows.header_error(
                    "prefix_id needs a prefix_tokens column (how many leading tokens the "
                    "requests of one prefix_id share)"
                )
            unit = self.TIME_COLUMNS[time_col]
            i_t, i_in, i_out = col[time_col], col["input_tokens"], col["output_tokens"]
            i_id, i_pre = col.get("prefix_id"), col.get("prefix_tokens")
            groups = _Labels("")
            for line, cells in rows:
                t = _time_us(cells[i_t], time_col, unit)
                prompt = _count(cells[i_in], "input_tokens", 1)
                output = _count(cells[i_out], "output_tokens")
                group = -1
                prefix = 0 if i_pre is None else _prefix_tokens(cells[i_pre], prompt)
                label = cells[i_id].strip() if i_id is not None else ""
                if label and prefix > 0:
                    group = groups.code(label) - 1
                elif prefix > 0:
                    raise _Bad("prefix_id", "", "prefix_tokens > 0 needs a prefix_id")
                b.add(line, t, prompt, output, group, prefix if group >= 0 else 0)
        _renumber_groups(b, groups.names[1:])
        notes = []
        if len(groups.names) > 1:
            notes.append(f"{len(groups.names) - 1} prefix ids mapped to prefix groups")
        return b.build(ignored=ignored, notes=notes)
