"""Converting a trace file from any readable format to the servesim or TraceV2 format."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.simcore.config import (
    as_str,
)
from servesim.simcore.errors import ScenarioError
from servesim.workloads.traces.loader import PathArg, load_trace
from servesim.workloads.traces.replay import TraceWorkload
from servesim.workloads.traces.writer import write_trace


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
    Neither destination holds recorded sessions (what a closed-loop replay needs): a source with
    sessions is refused, or with ``strict=False`` its rows are written without them.
    """
    table = load_trace(src, src_format, path="convert", **options)
    in_sessions = int((table.session >= 0).sum()) if table.has_sessions else 0
    if in_sessions and strict:
        raise ScenarioError(
            str(table.file),
            "session_id",
            f"{in_sessions} rows belong to recorded sessions, which the converted trace cannot "
            "hold (a closed-loop replay needs them); replay this file directly, or drop them "
            "(strict=False; servesim convert --lossy)",
        )
    if dst_format == "auto":
        dst_format = "tracev2" if Path(dst).suffix in (".yaml", ".yml") else "servesim"
    as_str(dst_format, "convert.dst_format", choices=("servesim", "tracev2"))
    specs = TraceWorkload(table).requests()
    meta = {**{k: v for k, v in table.metadata.items() if k != "block_tokens"}, **(metadata or {})}
    result = write_trace(specs, dst, dst_format, strict=strict, metadata=meta)
    if in_sessions:
        result["dropped"]["sessions"] = in_sessions
    result["source"] = {"file": str(table.file), "format": table.format}
    return result
