"""The documented generic CSV of per-request results read into a :class:`MeasuredRun`."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from servesim.fidelity.readers.common import (
    UNKNOWN,
    MeasuredRun,
    PathArg,
    _Bad,
    _existing,
    _ordered,
    _read_text,
    _relative_us,
    _sorted_by_arrival,
    _tpot_us,
)
from servesim.fidelity.readers.vllm_log import _log_kv_blocks
from servesim.simcore.csvcells import BadCell, cell_number, cell_whole
from servesim.simcore.errors import ScenarioError

CSV_REQUIRED = ("arrival_s", "input_tokens", "output_tokens", "ttft_s", "e2e_s")
CSV_OPTIONAL = ("queued_s", "tpot_s", "request_id")
_CSV_SETTINGS: dict[str, Callable[[str], Any]] = {
    "name": str,
    "system": str,
    "model": str,
    "model_config": str,
    "gpu": str,
    "engine_version": str,
    "dtype": str,
    "tp": int,
    "pp": int,
    "dp": int,
    "num_instances": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "kv_blocks": int,
    "block_size": int,
    "kv_capacity_tokens": int,
    "prefill_tp": int,
    "prefill_pp": int,
    "decode_tp": int,
    "decode_pp": int,
    "request_rate": float,
}
"""Settings a generic CSV may give in ``# key: value`` comment lines before its header."""


def read_generic_csv(path: PathArg, *, system: str | None = None) -> MeasuredRun:
    """Read a measured run from a CSV (header required; times in seconds; module doc).

    Required columns ``arrival_s, input_tokens, output_tokens, ttft_s, e2e_s``; optional
    ``queued_s`` (time waiting before first scheduled), ``tpot_s`` (else derived) and
    ``request_id``. Latency cells may be empty (unknown); present values must be finite and
    ≥ 0, with ``queued_s ≤ ttft_s ≤ e2e_s``. Rows are sorted by arrival.
    """
    file = _existing(path)
    text = _read_text(file)
    settings: dict[str, Any] = {}
    extra: dict[str, str] = {}
    lines = text.splitlines()
    start = 0
    while start < len(lines) and (
        not lines[start].strip() or lines[start].lstrip().startswith("#")
    ):
        content = lines[start].strip().lstrip("#").strip()
        if ":" in content:
            key, _, value = content.partition(":")
            key, value = key.strip(), value.strip()
            if key in _CSV_SETTINGS:
                try:
                    settings[key] = _CSV_SETTINGS[key](value)
                except ValueError:
                    kind = _CSV_SETTINGS[key].__name__
                    raise ScenarioError(
                        f"{file}:{start + 1}", value, f"setting {key}: expected a {kind}"
                    ) from None
            elif key:
                extra[key] = value
        start += 1
    if start >= len(lines):
        raise ScenarioError(
            str(file), None, f"no header row; expected the columns {', '.join(CSV_REQUIRED)}"
        )

    reader = csv.reader(lines[start:])
    try:
        header = [c.strip() for c in next(reader)]
    except csv.Error as exc:
        raise ScenarioError(f"{file}:{start + 1}", None, f"malformed CSV ({exc})") from None
    header_line = start + 1
    index: dict[str, int] = {}
    for i, column in enumerate(header):
        if column in index:
            raise ScenarioError(f"{file}:{header_line}", column, "the column is given twice")
        index[column] = i
    missing = [c for c in CSV_REQUIRED if c not in index]
    if missing:
        raise ScenarioError(
            f"{file}:{header_line}",
            ",".join(header),
            f"missing column(s) {', '.join(missing)}; the header must name "
            f"{', '.join(CSV_REQUIRED)} (optional: {', '.join(CSV_OPTIONAL)})",
        )
    ignored = [c for c in header if c not in CSV_REQUIRED and c not in CSV_OPTIONAL]

    arrival: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    ttft: list[float] = []
    e2e: list[float] = []
    queued: list[float] = []
    tpot: list[float] = []
    ids: list[str] = []
    try:
        for cells in reader:
            line = header_line + reader.line_num - 1
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ScenarioError(
                    f"{file}:{line}",
                    ",".join(cells),
                    f"expected {len(header)} columns (as in the header), got {len(cells)}",
                )
            record = len(arrival)
            try:
                arrival.append(_cell(cells, index, "arrival_s", required=True))
                inp.append(_cell_count(cells, index, "input_tokens"))
                out.append(_cell_count(cells, index, "output_tokens"))
                t = _cell(cells, index, "ttft_s")
                e = _cell(cells, index, "e2e_s")
                q = _cell(cells, index, "queued_s")
                p = _cell(cells, index, "tpot_s")
                row = {k: cells[index[k]] for k in ("queued_s", "ttft_s", "e2e_s") if k in index}
                _ordered(row, (("queued_s", q), ("ttft_s", t), ("e2e_s", e)))
            except BadCell as err:
                raise ScenarioError(
                    f"{file}:{line}", err.value, f"record {record}, column {err.column}: {err.what}"
                ) from None
            except _Bad as err:
                raise ScenarioError(
                    f"{file}:{line}", err.value, f"record {record}, column {err.field}: {err.what}"
                ) from None
            ttft.append(UNKNOWN if t is None else t * 1e6)
            e2e.append(UNKNOWN if e is None else e * 1e6)
            queued.append(UNKNOWN if q is None else q * 1e6)
            tpot.append(UNKNOWN if p is None else p * 1e6)
            ids.append(
                cells[index["request_id"]].strip() if "request_id" in index else f"line {line}"
            )
    except csv.Error as exc:
        raise ScenarioError(
            f"{file}:{header_line + reader.line_num - 1}", None, f"malformed CSV ({exc})"
        ) from None
    if not arrival:
        raise ScenarioError(str(file), None, "the file has a header but no rows")

    times = np.asarray(arrival, dtype=np.float64)
    order, out_of_order = _sorted_by_arrival(times)
    ttft_us = np.asarray(ttft)[order]
    e2e_us = np.asarray(e2e)[order]
    outputs = np.asarray(out, dtype=np.int64)[order]
    tpot_us = np.asarray(tpot)[order] if "tpot_s" in index else _tpot_us(ttft_us, e2e_us, outputs)
    run = MeasuredRun(
        name=str(settings.pop("name", file.stem)),
        source=str(file),
        system=str(settings.pop("system", system or "unknown")),
        arrival_us=_relative_us(times[order]),
        input_tokens=np.asarray(inp, dtype=np.int64)[order],
        output_tokens=outputs,
        ttft_us=ttft_us,
        e2e_us=e2e_us,
        tpot_us=tpot_us,
        queued_us=np.asarray(queued)[order] if "queued_s" in index else None,
        request_ids=tuple(ids[int(i)] for i in order),
        extra=dict(extra),
    )
    for key, value in settings.items():
        setattr(run, key, value)
    if run.kv_blocks is not None:
        run.extra["kv_blocks_source"] = f"{file} ('# kv_blocks:' line)"
    else:
        _log_kv_blocks(run, file.parent, file.stem)
    if system is not None and run.system != system:
        run.notes.append(f"the file's '# system:' line ({run.system}) overrides system={system!r}")
    if ignored:
        run.notes.append(f"columns ignored: {', '.join(ignored)}")
    if out_of_order:
        run.notes.append(f"{out_of_order} row(s) out of arrival order; sorted by arrival_s")
    if "tpot_s" not in index:
        run.notes.append("TPOT derived as (e2e_s - ttft_s) / (output_tokens - 1)")
    measured = run.measured_rate()
    if measured is not None:
        run.extra["measured_rate"] = measured
    return run


def _cell(
    cells: list[str], index: Mapping[str, int], column: str, *, required: bool = False
) -> float | None:
    """Seconds in ``column`` (>= 0); None when the column is absent or the cell empty."""
    if column not in index:
        return None
    text = cells[index[column]].strip()
    if not text:
        if required:
            raise BadCell(column, text, "a value is required")
        return None
    return cell_number(text, column, hint="leave the cell empty when unknown")


def _cell_count(cells: list[str], index: Mapping[str, int], column: str) -> int:
    return cell_whole(cells[index[column]].strip(), column, minimum=1)
