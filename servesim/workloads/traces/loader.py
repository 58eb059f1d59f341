"""Finding and reading a trace: bundled traces, file paths, format detection, :func:`load_trace`."""

from __future__ import annotations

import zlib
from os import PathLike
from pathlib import Path
from typing import Any

from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext, get, registry
from servesim.workloads.traces.reader import _first_line, _is_empty
from servesim.workloads.traces.table import TraceTable

PathArg = str | PathLike[str]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

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


def trace_formats() -> list[str]:
    """Registered trace format names (built-ins and plugins), sorted."""
    return registry("trace_format").names()


_SNIFF_ORDER = ("servesim", "tracev2", "azure", "mooncake", "csv")


def detect_format(file: Path, path: str = "workload.format") -> str:
    """The format of ``file`` by its content (and suffix for a TraceV2 header)."""
    first = _first_line(file)
    if not first and _is_empty(file):
        raise ScenarioError(
            "workload.trace", str(file), "empty file: a trace needs a header and rows"
        )
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
    reader = get("trace_format", format, f"{path}.format").from_config(
        options, PluginContext(path, base_dir=base_dir)
    )
    try:
        return reader.read(file)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise ScenarioError(str(file), None, f"cannot read the trace ({exc})") from None
