"""The files of an observed run, each written atomically into ``DIR``.

* ``trace.csv`` + ``trace.yaml`` — BLIS TraceV2 (``mode: real``): every request sent, in send
  order, with its requested sizes, the server's prompt count (``server_input_tokens``), its
  arrival (when it was due) and send time, first and last text chunk, chunk count and status.
  ``servesim run --trace DIR/trace.csv`` replays it: arrivals are the send times (BLIS's rule).
* ``measured.csv`` — the generic measured-run CSV that ``servesim validate`` and ``servesim
  calibrate`` read: the requests that finished, ``arrival_s`` (send time), the server's own
  token counts, ``ttft_s`` and ``e2e_s``; settings as ``# key: value`` lines.
* ``chunks.jsonl`` — one line per request with every inter-chunk gap in µs (the ITL
  percentiles the CSV formats cannot hold).
* ``meta.json`` — url, model, settings, workload, tool versions, start time, calibration and the
  summary printed on the console.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servesim.fidelity.readers.common import summarize
from servesim.observe.client import OK, Outcome
from servesim.observe.load import Observation
from servesim.simcore.files import write_atomic
from servesim.workloads.traces.tracev2 import TraceV2Format
from servesim.workloads.traces.writer import tracev2_request_cells

MEASURED_COLUMNS = (
    "request_id",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "ttft_s",
    "e2e_s",
    "requested_input_tokens",
    "requested_output_tokens",
    "prefix_group",
    "prefix_tokens",
    "num_chunks",
    "due_s",
)
"""measured.csv's header: the reader's columns first, then what it ignores (kept for people)."""


def sent(observation: Observation) -> list[Outcome]:
    """The requests that were actually sent (a due request cut by Ctrl-C before it left is not)."""
    return [o for o in observation.outcomes if o.send_ns]


def _us(ns: int, t0: int) -> int:
    return int(round((ns - t0) / 1000))


def trace_text(observation: Observation, model: str, meta: dict[str, Any]) -> tuple[str, str]:
    """``(trace.yaml, trace.csv)`` texts."""
    t0 = observation.t0_ns
    header = {
        "trace_version": 3,
        "time_unit": "microseconds",
        "created_at": meta["started_at"],
        "mode": "real",
        "warm_up_requests": 0,
        "workload_seed": meta["workload"].get("seed"),
        "server": {"type": "openai-compatible", "model": model, "url": meta["url"]},
    }
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TraceV2Format.COLUMNS)
    for i, o in enumerate(sent(observation)):
        s = o.spec
        shared = s.prefix_group >= 0 and s.prefix_tokens > 0 and s.segments is None
        first = _us(o.chunk_ns[0], t0) if o.chunk_ns else 0
        last = _us(o.chunk_ns[-1], t0) if o.chunk_ns else 0
        output = o.tokens_out() if o.ok else s.output_tokens
        request = tracev2_request_cells(
            i, s, shared=shared, streaming="true", output_tokens=output, model=model
        )
        w.writerow(
            request
            + (
                o.prompt_tokens or 0,  # server_input_tokens: the server's count
                max(0, _us(o.scheduled_ns, t0)),
                _us(o.send_ns, t0),
                first,
                last,
                len(o.chunk_ns),
                o.status,
                o.error,
                o.finish_reason,
            )
        )
    return yaml.safe_dump(header, sort_keys=False), buf.getvalue()


def measured_text(observation: Observation, settings: dict[str, Any]) -> str:
    """measured.csv: ``# key: value`` settings, the header, one row per finished request."""
    t0 = observation.t0_ns
    lines = io.StringIO()
    for key, value in settings.items():
        if value is not None:
            lines.write(f"# {key}: {str(value).replace(chr(10), ' ')}\n")
    w = csv.writer(lines, lineterminator="\n")
    w.writerow(MEASURED_COLUMNS)
    for i, o in enumerate(sent(observation)):
        if not o.ok:
            continue
        s = o.spec
        ttft, e2e = o.ttft_ns, o.e2e_ns
        assert ttft is not None and e2e is not None
        w.writerow(
            (
                i,
                f"{(o.send_ns - t0) / 1e9:.6f}",
                o.prompt_tokens or s.prompt_tokens,
                o.tokens_out(),
                f"{ttft / 1e9:.6f}",
                f"{e2e / 1e9:.6f}",
                s.prompt_tokens,
                s.output_tokens,
                s.prefix_group if s.prefix_group >= 0 else "",
                s.prefix_tokens if s.prefix_group >= 0 else 0,
                len(o.chunk_ns),
                f"{max(0, o.scheduled_ns - t0) / 1e9:.6f}",
            )
        )
    return lines.getvalue()


def chunks_text(observation: Observation) -> str:
    """chunks.jsonl: per request its times relative to its send, in µs, and every gap."""
    out = []
    for i, o in enumerate(sent(observation)):
        record = {
            "request_id": i,
            "status": o.status,
            "send_us": _us(o.send_ns, observation.t0_ns),
            "ttft_us": None if o.ttft_ns is None else round(o.ttft_ns / 1000, 1),
            "e2e_us": None if o.e2e_ns is None else round(o.e2e_ns / 1000, 1),
            "stream_end_us": round((o.end_ns - o.send_ns) / 1000, 1) if o.end_ns else None,
            "prompt_tokens": o.prompt_tokens,
            "output_tokens": o.output_tokens,
            "gaps_us": [round(g / 1000, 1) for g in o.gaps_ns()],
        }
        if o.error:
            record["error"] = o.error
        out.append(json.dumps(record, separators=(",", ":")))
    return "".join(line + "\n" for line in out)


def summary(observation: Observation) -> dict[str, Any]:
    """Counts, throughput and TTFT / ITL / TPOT / E2E statistics (ms) of the recorded requests."""
    done = sent(observation)
    ok = [o for o in done if o.ok]
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    for o in done:
        statuses[o.status] = statuses.get(o.status, 0) + 1
        if not o.ok:
            errors[o.error] = errors.get(o.error, 0) + 1
    ttft = [o.ttft_ns / 1e6 for o in ok if o.ttft_ns is not None]
    e2e = [o.e2e_ns / 1e6 for o in ok if o.e2e_ns is not None]
    tpot = [
        (o.e2e_ns - o.ttft_ns) / 1e6 / (o.tokens_out() - 1)
        for o in ok
        if o.tokens_out() > 1 and o.e2e_ns is not None and o.ttft_ns is not None
    ]
    gaps = [g / 1e6 for o in ok for g in o.gaps_ns()]
    span_s = 0.0
    if ok:
        start = min(o.send_ns for o in ok)
        span_s = max(o.chunk_ns[-1] for o in ok) - start
        span_s /= 1e9
    multi = sum(1 for o in ok if len(o.chunk_ns) < o.tokens_out())
    return {
        "planned_requests": observation.planned,
        "sent_requests": len(done),
        "completed_requests": len(ok),
        "statuses": statuses,
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])),
        "stopped_by": observation.stopped_by,
        "warmup_failed": observation.warmup_failed,
        "duration_s": span_s,
        "responses_per_sec": len(ok) / span_s if span_s > 0 else 0.0,
        "output_tokens_per_sec": sum(o.tokens_out() for o in ok) / span_s if span_s > 0 else 0.0,
        "multi_token_chunk_requests": multi,
        "ttft_ms": summarize(np.asarray(ttft)),
        "itl_ms": summarize(np.asarray(gaps)),
        "tpot_ms": summarize(np.asarray(tpot)),
        "e2e_ms": summarize(np.asarray(e2e)),
    }


def format_summary(s: dict[str, Any]) -> str:
    """The console table of an observed run."""
    lines = [
        f"requests   {s['completed_requests']} completed of {s['sent_requests']} sent "
        f"({s['planned_requests']} planned) in {s['duration_s']:.1f} s"
        + (f"; stopped early ({s['stopped_by']})" if s["stopped_by"] else ""),
        f"throughput {s['responses_per_sec']:.2f} req/s, {s['output_tokens_per_sec']:.0f} "
        "output tok/s",
        f"{'latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for key, label in (
        ("ttft_ms", "TTFT"),
        ("itl_ms", "ITL"),
        ("tpot_ms", "TPOT"),
        ("e2e_ms", "E2E"),
    ):
        st = s[key]
        cells = "".join(
            f"{st[k]:>10.1f}" if st[k] is not None else f"{'-':>10}"
            for k in ("mean", "p50", "p90", "p99")
        )
        lines.append(f"{label:<14}{cells}")
    if s["multi_token_chunk_requests"]:
        lines.append(
            f"note       {s['multi_token_chunk_requests']} request(s) got several tokens per "
            "chunk: ITL is per chunk there, TPOT stays exact"
        )
    failed = s["sent_requests"] - s["completed_requests"]
    if failed:
        lines.append(
            f"failed     {failed} request(s): "
            + ", ".join(f"{n} {status}" for status, n in s["statuses"].items() if status != OK)
        )
        for message, n in list(s["errors"].items())[:5]:
            lines.append(f"  {n} x {message}")
    if s["warmup_failed"]:
        lines.append(f"warm-up    {s['warmup_failed']} warm-up request(s) failed")
    return "\n".join(lines)


def versions(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Versions of the tools that took the measurement."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for package in ("servesim", "httpx", "tokenizers", "transformers"):
        with contextlib.suppress(md.PackageNotFoundError):  # not installed: not listed
            out[package] = md.version(package)
    out.update(extra or {})
    return out


def started_at(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=timezone.utc).isoformat(timespec="milliseconds")


def write_observation(
    out_dir: str | Path,
    observation: Observation,
    *,
    model: str,
    meta: dict[str, Any],
    settings: dict[str, Any],
) -> list[Path]:
    """Write every file of the run into ``out_dir`` (created); return their paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    header, rows = trace_text(observation, model, meta)
    files = [
        write_atomic(folder / "trace.yaml", header),
        write_atomic(folder / "trace.csv", rows),
        write_atomic(folder / "measured.csv", measured_text(observation, settings)),
        write_atomic(folder / "chunks.jsonl", chunks_text(observation)),
    ]
    meta = {**meta, "summary": summary(observation), "files": [f.name for f in files]}
    meta["files"].append("meta.json")
    files.append(write_atomic(folder / "meta.json", json.dumps(meta, indent=2, default=str) + "\n"))
    return files
