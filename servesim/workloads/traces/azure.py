"""The ``azure`` trace format: the Azure LLM inference trace CSV (wall-clock timestamps)."""

from __future__ import annotations

from array import array
from datetime import date
from pathlib import Path
from typing import ClassVar

import numpy as np

from servesim.simcore.registry import register
from servesim.workloads.traces.reader import TraceFormat, _Bad, _count, _csv_file
from servesim.workloads.traces.table import TableBuilder, TraceTable


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
        with _csv_file(file) as rows:
            col, ignored = rows.columns(self.REQUIRED, (), strict=False, fold_case=True)
            i_t, i_in, i_out = col["TIMESTAMP"], col["ContextTokens"], col["GeneratedTokens"]
            add = b.add
            for line, cells in rows:
                t = _wall_clock_us(cells[i_t].strip(), days)
                prompt = _count(cells[i_in], "ContextTokens", 1)
                output = _count(cells[i_out], "GeneratedTokens")
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
