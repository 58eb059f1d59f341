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

The package has one module per format (``servesim_csv``, ``tracev2``, ``azure``, ``mooncake``,
``generic_csv``), the shared core (``table``: the columnar table; ``reader``: cell parsing, CSV rows,
the :class:`TraceFormat` base), ``loader`` (bundled traces, detection, :func:`load_trace`),
``replay`` (:class:`TraceWorkload`), ``writer`` (:func:`write_trace`) and ``conversion``
(:func:`convert`). Importing it registers the five built-in ``trace_format`` plugins.
"""

from servesim.workloads.traces.azure import AzureFormat
from servesim.workloads.traces.conversion import convert
from servesim.workloads.traces.generic_csv import CsvFormat
from servesim.workloads.traces.loader import (
    BUNDLED_TRACES,
    DATA_DIR,
    bundled_traces,
    detect_format,
    load_trace,
    resolve_trace,
    trace_formats,
)
from servesim.workloads.traces.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    TRACE_PRIVATE_BASE,
    MooncakeFormat,
)
from servesim.workloads.traces.reader import TraceFormat
from servesim.workloads.traces.replay import TraceWorkload, block_reuse, read_trace
from servesim.workloads.traces.servesim_csv import SERVESIM_MAGIC, ServesimFormat
from servesim.workloads.traces.table import TableBuilder, TraceTable
from servesim.workloads.traces.tracev2 import TraceV2Format
from servesim.workloads.traces.writer import write_trace

__all__ = [
    "BUNDLED_TRACES",
    "DATA_DIR",
    "MOONCAKE_BLOCK_TOKENS",
    "SERVESIM_MAGIC",
    "TRACE_PRIVATE_BASE",
    "AzureFormat",
    "CsvFormat",
    "MooncakeFormat",
    "ServesimFormat",
    "TableBuilder",
    "TraceFormat",
    "TraceTable",
    "TraceV2Format",
    "TraceWorkload",
    "block_reuse",
    "bundled_traces",
    "convert",
    "detect_format",
    "load_trace",
    "read_trace",
    "resolve_trace",
    "trace_formats",
    "write_trace",
]
