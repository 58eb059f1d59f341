"""Converting a trace file from any readable format to the servesim or TraceV2 format."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.simcore.config import (
    as_str,
)
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
