"""Writing requests as a trace (servesim CSV or BLIS TraceV2) that replays to the same requests."""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from servesim.simcore.errors import ScenarioError
from servesim.workloads.base import TRACE_SEGMENT_BASE, RequestSpec
from servesim.workloads.traces.loader import PathArg
from servesim.workloads.traces.servesim_csv import SERVESIM_MAGIC
from servesim.workloads.traces.tracev2 import TraceV2Format


def _segment_items(segments: Sequence[tuple[int, int]], block: int | None) -> str:
    """Encode segments compactly: runs of consecutive full blocks as A..B, full blocks bare."""
    base = TRACE_SEGMENT_BASE
    out: list[str] = []
    run_lo = run_hi = None

    def flush() -> None:
        if run_lo is None:
            return
        if run_hi == run_lo:
            out.append(str(run_lo))
        elif run_hi == run_lo + 1:
            out.extend((str(run_lo), str(run_hi)))
        else:
            out.append(f"{run_lo}..{run_hi}")

    for segment, length in segments:
        h = -segment - base
        if block is not None and length == block:
            if run_hi is not None and h == run_hi + 1:
                run_hi = h
                continue
            flush()
            run_lo = run_hi = h
            continue
        flush()
        run_lo = run_hi = None
        out.append(f"{h}:{length}")
    flush()
    return " ".join(out)


def _check_spec(spec: RequestSpec, i: int) -> None:
    problem = None
    if spec.arrival_us < 0:
        problem = "arrival_us < 0"
    elif spec.prompt_tokens < 1:
        problem = "prompt_tokens < 1"
    elif spec.output_tokens < 1:
        problem = "output_tokens < 1"
    elif not 0 <= spec.prefix_tokens <= spec.prompt_tokens:
        problem = "prefix_tokens outside [0, prompt_tokens]"
    elif spec.max_output_tokens < 0:
        problem = "max_output_tokens < 0"
    elif spec.segments is not None:
        if not spec.segments or any(n < 1 for _, n in spec.segments):
            problem = "segments must be non-empty runs of >= 1 token"
        elif sum(n for _, n in spec.segments) != spec.prompt_tokens:
            problem = "segment lengths do not sum to prompt_tokens"
    if problem:
        raise ValueError(f"request #{i} (id {spec.id}) cannot be written: {problem}")


def _open_write(file: Path, compress: bool) -> IO[str]:
    if not compress:
        return open(file, "w", encoding="utf-8", newline="")
    raw = open(file, "wb")  # noqa: SIM115 - closed through the wrapper
    # mtime=0 and no file name in the gzip header: the same trace gives the same bytes
    gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9)
    return _ClosingText(gz, raw)


class _ClosingText(io.TextIOWrapper):
    def __init__(self, gz: gzip.GzipFile, raw: IO[bytes]):
        super().__init__(gz, encoding="utf-8", newline="")
        self._raw = raw

    def close(self) -> None:
        super().close()
        self._raw.close()


def _block_size(specs: Sequence[RequestSpec]) -> int | None:
    lengths: dict[int, int] = {}
    for spec in specs:
        for _, n in spec.segments or ():
            lengths[n] = lengths.get(n, 0) + 1
    if not lengths:
        return None
    best = min(lengths, key=lambda n: (-lengths[n], n))
    return best if lengths[best] > 1 else None


def write_trace(
    specs: Iterable[RequestSpec],
    path: PathArg,
    format: str = "servesim",
    *,
    strict: bool = True,
    metadata: Mapping[str, Any] | None = None,
    compress: bool | None = None,
) -> dict[str, Any]:
    """Write requests as a trace that replays to identical :class:`RequestSpec` objects.

    ``format="servesim"`` writes one CSV (gzip-compressed when ``compress`` or the name ends in
    ``.gz``), with only the columns the requests need and ``metadata`` as ``# key: value`` lines.
    ``format="tracev2"`` writes ``<stem>.yaml`` + ``<stem>.csv`` (for ``path`` ending in .yaml, .csv
    or neither). TraceV2 cannot hold content segments or a budget other than the output length;
    with ``strict`` such a field is a :class:`ScenarioError`, otherwise it is dropped and counted in
    the result.
    Ids are not stored: a trace replays with ids 0..n-1 in arrival order, so write requests in
    arrival order. Returns ``{"files": [...], "rows": n, "dropped": {field: rows}}``.
    """
    specs = list(specs)
    for i, spec in enumerate(specs):
        _check_spec(spec, i)
    file = Path(path)
    _check_destination(file)
    if format == "servesim":
        if compress is None:
            compress = file.suffix == ".gz"
        _write_servesim(specs, file, metadata or {}, compress)
        return {"files": [str(file)], "rows": len(specs), "dropped": {}}
    if format == "tracev2":
        return _write_tracev2(specs, file, strict, metadata or {})
    raise ScenarioError("format", format, "servesim can write the formats servesim and tracev2")


def _check_destination(file: Path) -> None:
    """A trace can be written at ``file``: its folder exists (and is a folder), and ``file`` is
    not itself a folder."""
    parent = file.parent
    for above in [parent, *parent.parents]:
        if above.exists():
            if not above.is_dir():
                raise ScenarioError(
                    "destination",
                    str(file),
                    f"{above} is a file, not a folder; choose a destination in a folder",
                )
            break
    if not parent.is_dir():
        raise ScenarioError(
            "destination",
            str(file),
            f"the folder {parent} does not exist; create it first (mkdir -p {parent})",
        )
    if file.is_dir():
        raise ScenarioError("destination", str(file), "is a folder; give a file name")


def _write_servesim(
    specs: list[RequestSpec], file: Path, metadata: Mapping[str, Any], compress: bool
) -> None:
    block = _block_size(specs)
    columns = ["arrival_us", "input_tokens", "output_tokens"]
    need = {
        "max_output_tokens": any(s.max_output_tokens != s.output_tokens for s in specs),
        "prefix_group": any(s.prefix_group != -1 or s.prefix_tokens for s in specs),
        "slo_class": any(s.slo_class != "standard" for s in specs),
        "client": any(s.client != "default" for s in specs),
        "tenant": any(s.tenant for s in specs),
        "segments": any(s.segments is not None for s in specs),
    }
    for name in ("max_output_tokens", "prefix_group", "slo_class", "client", "tenant", "segments"):
        if need[name]:
            columns.append(name)
            if name == "prefix_group":
                columns.append("prefix_tokens")
    for value in (*(str(s.client) for s in specs), *(str(s.tenant) for s in specs)):
        if value.startswith("#") or "\n" in value or "\r" in value:
            raise ValueError(f"client/tenant label {value!r} cannot be written")
    # LoRA / several models: the model and adapter each request names (workloads/lora.py)
    named = any(getattr(s, "model", "") or getattr(s, "adapter", "") for s in specs)
    if named:
        columns += ["model", "adapter"]
    with _open_write(file, compress) as fh:
        fh.write(SERVESIM_MAGIC + "\n")
        if block is not None:
            fh.write(f"# block_tokens: {block}\n")
        for key, value in metadata.items():
            text = str(value).replace("\n", " ")
            if key == "block_tokens" or not str(key).isidentifier():
                raise ValueError(f"metadata key {key!r} is reserved or not an identifier")
            fh.write(f"# {key}: {text}\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for s in specs:
            row: list[Any] = [s.arrival_us, s.prompt_tokens, s.output_tokens]
            if need["max_output_tokens"]:
                row.append("" if s.max_output_tokens == s.output_tokens else s.max_output_tokens)
            if need["prefix_group"]:
                row += [s.prefix_group, s.prefix_tokens]
            if need["slo_class"]:
                row.append(s.slo_class)
            if need["client"]:
                row.append(s.client)
            if need["tenant"]:
                row.append(s.tenant)
            if need["segments"]:
                row.append("" if s.segments is None else _segment_items(s.segments, block))
            if named:
                row += [getattr(s, "model", ""), getattr(s, "adapter", "")]
            w.writerow(row)


def tracev2_request_cells(
    row_id: int,
    s: RequestSpec,
    *,
    shared: bool,
    streaming: str,
    output_tokens: int,
    model: str,
) -> tuple[Any, ...]:
    """The request half of a TraceV2 row (``request_id`` to ``deadline_us``, in
    :attr:`TraceV2Format.COLUMNS` order). A generated trace and a measured run's trace (in
    :mod:`servesim.observe`) both write it; ``shared`` says whether the prefix is reported as a
    shared group (the rest of the prompt is the suffix, counted as text tokens)."""
    prefix = s.prefix_tokens if shared else 0
    suffix = s.prompt_tokens - prefix
    return (
        row_id,
        s.client,
        s.tenant,
        s.slo_class,
        "",  # session_id
        0,  # round_index
        s.prefix_group if shared else "",
        prefix,
        streaming,
        suffix,
        output_tokens,
        suffix,  # text_tokens
        0,
        0,
        0,
        0,  # image, audio, video tokens; reason_ratio
        model,
        0,  # deadline_us
    )


def _tracev2_files(file: Path) -> tuple[Path, Path]:
    if file.suffix in (".yaml", ".yml", ".csv"):
        stem = file.with_suffix("")
    else:
        stem = file
    return stem.with_name(stem.name + ".yaml"), stem.with_name(stem.name + ".csv")


def _write_tracev2(
    specs: list[RequestSpec], file: Path, strict: bool, metadata: Mapping[str, Any]
) -> dict[str, Any]:
    dropped: dict[str, int] = {}

    def lossy(field: str, i: int, spec: RequestSpec, why: str) -> None:
        if strict:
            raise ScenarioError(
                str(file),
                field,
                f"TraceV2 cannot hold {why} (request #{i}, id {spec.id}); write the servesim "
                "format, or drop it (strict=False; servesim convert --lossy)",
            )
        dropped[field] = dropped.get(field, 0) + 1

    for i, s in enumerate(specs):
        if s.segments is not None:
            lossy("segments", i, s, "content segments (e.g. Mooncake hash ids)")
        if s.max_output_tokens != s.output_tokens:
            lossy("max_output_tokens", i, s, "a max_output_tokens other than the output length")
        if s.prefix_group >= 0 and s.prefix_tokens == 0:
            lossy("prefix_group", i, s, "a prefix group with an empty prefix")
        if s.prefix_group < -1 or (s.prefix_group == -1 and s.prefix_tokens):
            lossy("prefix_tokens", i, s, "prefix_tokens without a prefix group")
    header_file, data_file = _tracev2_files(file)
    header: dict[str, Any] = {
        "trace_version": 3,
        "time_unit": "microseconds",
        "mode": "generated",
        "warm_up_requests": 0,
    }
    for key in ("created_at", "workload_spec", "workload_seed"):
        if key in metadata:
            header[key] = metadata[key]
    header_file.write_text(yaml.safe_dump(header, sort_keys=False), encoding="utf-8")
    with open(data_file, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(TraceV2Format.COLUMNS)
        for s in specs:
            shared = s.prefix_group >= 0 and s.prefix_tokens > 0
            request = tracev2_request_cells(
                s.id, s, shared=shared, streaming="false", output_tokens=s.output_tokens, model=""
            )
            w.writerow(
                request
                + (
                    0,  # server_input_tokens
                    s.arrival_us,
                    s.arrival_us,  # send_time_us
                    0,
                    0,
                    0,  # first/last chunk times, num_chunks: not run yet
                    "ok",
                    "",
                    "",
                )
            )
    return {"files": [str(header_file), str(data_file)], "rows": len(specs), "dropped": dropped}
