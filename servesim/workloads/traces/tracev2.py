"""The ``tracev2`` trace format: BLIS TraceV2, a ``<prefix>.yaml`` header and a ``<prefix>.csv``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import yaml

from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register
from servesim.workloads.traces.reader import (
    TraceFormat,
    _Bad,
    _count,
    _csv_file,
    _label_codes,
    _time_us,
)
from servesim.workloads.traces.table import TableBuilder, TraceTable, _Labels, _renumber_groups


@register("trace_format", "tracev2")
class TraceV2Format(TraceFormat):
    """BLIS TraceV2 (blis_reference.md §6.7): ``<prefix>.yaml`` header + ``<prefix>.csv`` rows.

    Columns are matched by name. Read: ``input_tokens`` (excludes the shared prefix),
    ``output_tokens``, ``arrival_time_us``, ``send_time_us`` (the arrival when > 0, BLIS's replay
    rule), ``prefix_group`` + ``prefix_length``, ``server_input_tokens`` (the whole prompt when > 0
    and the row has no prefix group, as BLIS replays it), ``slo_class``, ``client_id``,
    ``tenant_id``, and the conversation columns ``session_id`` + ``round_index`` with
    ``last_chunk_time_us`` (an observed completion when > 0) and ``think_time_us``, which only a
    closed-loop replay (``workload.session_mode: closed-loop``) uses. Every other column
    (deadlines, modalities, other timings...) is ignored and listed in ``describe()``. The header's
    ``session_context_growth: accumulate`` says that a round's prompt holds the conversation so far.
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
        "session_id",
        "round_index",
        "last_chunk_time_us",
        "think_time_us",
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
    HEADER_READ: ClassVar[tuple[str, ...]] = (
        "trace_version",
        "time_unit",
        "mode",
        "created_at",
        "session_context_growth",
    )
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
        with _csv_file(file) as rows:
            col, ignored = rows.columns(
                self.REQUIRED,
                self.OPTIONAL,
                strict=False,
                ignorable=(*self.COLUMNS, *self.EXTRA_COLUMNS),
            )
            for one, other in (("prefix_group", "prefix_length"), ("session_id", "round_index")):
                if (one in col) != (other in col):
                    raise rows.header_error(
                        f"{one} and {other} go together: give both columns or neither"
                    )
            i_in, i_out = col["input_tokens"], col["output_tokens"]
            i_arr, i_send = col["arrival_time_us"], col.get("send_time_us")
            i_grp, i_len = col.get("prefix_group"), col.get("prefix_length")
            i_srv = col.get("server_input_tokens")
            i_slo, i_cli, i_ten = col.get("slo_class"), col.get("client_id"), col.get("tenant_id")
            session_cells = _SessionCells(col)
            groups = _Labels("")
            for line, cells in rows:
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
                    prefix = _count(cells[i_len], "prefix_length") if cells[i_len].strip() else 0
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
                slo, cli, ten = _label_codes(b, cells, i_slo, i_cli, i_ten)
                b.add(line, t, prompt, output, group, prefix, -1, slo, cli, ten)
                session_cells.add(b, cells)
        _renumber_groups(b, groups.names[1:])
        notes = ["arrival = send_time_us when > 0, else arrival_time_us (BLIS replay rule)"]
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


class _SessionCells:
    """A TraceV2 row's conversation cells (when the file has session_id and round_index columns)."""

    def __init__(self, col: dict[str, int]):
        self.i_session = col.get("session_id")
        self.i_round = col.get("round_index")
        self.i_done = col.get("last_chunk_time_us")
        self.i_think = col.get("think_time_us")

    def add(self, b: TableBuilder, cells: list[str]) -> None:
        if self.i_session is None or self.i_round is None:
            return
        session = cells[self.i_session].strip()
        if not session:  # a request outside any conversation: its timings are not needed
            b.add_session("", 0, -1, -1)
            return
        text = cells[self.i_round]
        if not text.strip():
            raise _Bad("round_index", text, "a row of a session needs its round index")
        b.add_session(
            session,
            _count(text, "round_index"),
            self._time(cells, self.i_done, "last_chunk_time_us"),
            self._time(cells, self.i_think, "think_time_us", zero_means_none=False),
        )

    @staticmethod
    def _time(cells: list[str], i: int | None, column: str, zero_means_none: bool = True) -> int:
        """A µs cell, -1 when the column or the cell is empty (or 0 when 0 means not observed)."""
        if i is None or not cells[i].strip():
            return -1
        value = _time_us(cells[i], column, 1)
        return -1 if zero_means_none and value == 0 else value
