"""Replaying a trace as a workload: :class:`TraceWorkload` and the helpers built on it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from servesim.simcore.config import (
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.base import RecordedSessions, RequestSpec
from servesim.workloads.fields import ORACLE, read_shared_fields
from servesim.workloads.lora import tagged
from servesim.workloads.traces.loader import BUNDLED_TRACES, PathArg, load_trace, trace_formats
from servesim.workloads.traces.sessions import check_sessions, describe_mode, plan_sessions
from servesim.workloads.traces.table import TraceTable

SESSION_MODES = ("fixed", "closed-loop")
"""How a trace's recorded sessions replay (BLIS ``--session-mode``): every round at its recorded
time, or each later round a think time after the previous one completed."""

_CHUNK = 4096


class TraceWorkload:
    """Replays a trace; :meth:`requests` yields its :class:`RequestSpec` lazily in arrival order.

    Build it with :meth:`from_config` (a scenario's ``workload:`` section, see the module
    docstring) or from a :class:`TraceTable`.
    """

    fields: ClassVar[tuple[str, ...]] = (
        "trace",
        "format",
        "time_scale",
        "rate_scale",
        "requests",
        "duration",
        "start",
        "slo_class",
        "max_output_tokens",
        "block_tokens",
        "session_mode",
    )

    def __init__(
        self,
        table: TraceTable,
        *,
        name: str | None = None,
        time_scale: float = 1.0,
        rate_scale: float = 1.0,
        requests: int | None = None,
        duration_us: int | None = None,
        start_us: int | None = None,
        slo_class: str | None = None,
        max_output_tokens: int | str | None = None,
        session_mode: str = "fixed",
        path: str = "workload",
    ):
        self.table = table
        self.name = name
        self.time_scale = float(time_scale)
        self.rate_scale = float(rate_scale)
        self.limit = requests
        self.duration_us = duration_us
        self.start_us = start_us
        self.slo_class = slo_class
        self.max_output_tokens = max_output_tokens
        order = table.order
        recorded = table.arrival_us if order is None else table.arrival_us[order]
        factor = self.time_scale / self.rate_scale
        if start_us is None:
            offset, origin = 0, 0
        else:
            offset, origin = start_us, int(recorded[0])
        if factor == 1.0:
            times = recorded - origin + offset
        else:
            scaled = np.rint((recorded - origin).astype(np.float64) * factor)
            if not np.isfinite(scaled).all() or scaled.max() >= 2**62:
                raise ScenarioError(
                    "workload.time_scale", time_scale, "the scaled times overflow; scale less"
                )
            times = scaled.astype(np.int64) + offset
        n = len(times)
        if duration_us is not None:
            n = int(np.searchsorted(times, times[0] + duration_us, side="right"))
        if requests is not None:
            n = min(n, requests)
        self._times = times[:n]
        self._rows = (np.arange(n) if order is None else order[:n]).astype(np.int64)
        # closed-loop replay: the stream holds first rounds only, the cluster sends the rest
        self.session_mode = session_mode
        self.sessions: RecordedSessions | None = None
        self._stream: np.ndarray | None = None  # positions in _rows the stream yields (None: all)
        self._tags: np.ndarray | None = None
        if session_mode == "closed-loop":
            check_sessions(table, path)
            self._stream, self._tags, self.sessions = plan_sessions(
                table, self._rows, factor, self._follow_up_specs
            )

    @classmethod
    def from_config(
        cls,
        section: Mapping[str, Any],
        path: str = "workload",
        base_dir: PathArg | None = None,
    ) -> TraceWorkload:
        """Validate a ``workload: {trace: ...}`` section and read the trace (errors name the field,
        or the trace's file:line)."""
        s = expect_mapping(section, path)
        check_keys(s, cls.fields, path)
        if s.get("trace") is None:
            raise ScenarioError(
                f"{path}.trace",
                None,
                f"missing; give a trace file or a bundled trace: {', '.join(BUNDLED_TRACES)}",
            )
        fmt = "auto"
        if s.get("format") is not None:
            fmt = as_str(s["format"], f"{path}.format", choices=("auto", *trace_formats()))
        scales = {}
        for key in ("time_scale", "rate_scale"):
            scales[key] = 1.0
            if s.get(key) is not None:
                scales[key] = as_float(s[key], f"{path}.{key}", exclusive_minimum=0.0)
        shared = read_shared_fields(s, path, slo_mix=False)  # slo_class: a class or None
        slo_class = shared.slo_class if isinstance(shared.slo_class, str) else None
        options = {}
        if s.get("block_tokens") is not None:
            options["block_tokens"] = as_int(s["block_tokens"], f"{path}.block_tokens", minimum=1)
        table = load_trace(s["trace"], fmt, base_dir=base_dir, path=path, **options)
        name = s["trace"] if isinstance(s["trace"], str) else str(s["trace"])
        mode = "fixed"
        if s.get("session_mode") is not None:
            mode = as_str(s["session_mode"], f"{path}.session_mode", choices=SESSION_MODES)
        return cls(
            table,
            name=name,
            requests=shared.requests,
            duration_us=shared.duration_us,
            start_us=shared.start_us,
            slo_class=slo_class,
            max_output_tokens=shared.max_output_tokens,
            session_mode=mode,
            path=path,
            **scales,
        )

    def __len__(self) -> int:
        """How many requests the replay selects: all of them arrive in a fixed replay; in a
        closed-loop one :meth:`requests` yields the first rounds and the cluster sends the later
        rounds of sessions that are not cut short."""
        return len(self._rows)

    def arrival_times_us(self) -> np.ndarray:
        """The replayed arrival times (µs, int64), in the order :meth:`requests` yields them."""
        return self._times.copy()

    def requests(self, streams: RandomStreams | None = None) -> Iterator[RequestSpec]:
        """Yield the requests in arrival order with ids 0..n-1 (``streams`` is unused: a trace
        draws nothing). A generator: specs are created one chunk at a time. In a closed-loop
        replay only the first round of each session (its ``session`` set) and the requests
        outside sessions: the cluster sends the later rounds (:attr:`sessions`)."""
        if self._stream is None:
            return self._specs(self._rows, self._times)
        return self._specs(self._rows[self._stream], self._times[self._stream], self._tags)

    @property
    def model_names(self) -> tuple[str, ...]:
        """The models the trace's ``model`` column names (LoRA / several models)."""
        return self._named(self.table.model_names)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The LoRA adapters the trace's ``adapter`` column names."""
        return self._named(self.table.adapter_names)

    def _named(self, labels: list[str]) -> tuple[str, ...]:
        return () if self.table.model_code is None else tuple(n for n in labels if n)

    @property
    def name_pairs(self) -> tuple[tuple[str, str], ...]:
        """Every (model, adapter) pair the trace's rows name ("": none)."""
        t = self.table
        if t.model_code is None:
            return ()
        codes = np.unique(np.stack([t.model_code, t.adapter_code], axis=1), axis=0)
        return tuple((t.model_names[m], t.adapter_names[a]) for m, a in codes.tolist())

    def follow_ups(self, streams: RandomStreams | None = None) -> RecordedSessions | None:
        """The sessions' later rounds, which the cluster sends (closed-loop replay; else None)."""
        return self.sessions

    def _follow_up_specs(self, rows: np.ndarray) -> list[RequestSpec]:
        return list(self._specs(rows, np.zeros(len(rows), dtype=np.int64)))

    def _specs(
        self, rows_all: np.ndarray, times: np.ndarray, tags: np.ndarray | None = None
    ) -> Iterator[RequestSpec]:
        """The specs of table rows ``rows_all`` arriving at ``times`` (ids 0, 1, ...), opening
        the sessions ``tags`` (-1: none)."""
        t = self.table
        slo_names, client_names, tenant_names = t.slo_names, t.client_names, t.tenant_names
        fixed_slo = self.slo_class
        budget = self.max_output_tokens
        has_segments = t.has_segments
        named = None if t.model_code is None else (t.model_names, t.adapter_names)
        # a request whose prompt or answer a later request's prompt contains (a conversation's
        # next round) is marked `continued`, so its blocks stay findable after it finishes
        referenced: set[int] = set()
        if has_segments:
            ids = t.seg_ids
            referenced = set(np.unique(ids[ids >= 0]).tolist())
        for a in range(0, len(rows_all), _CHUNK):
            rows = rows_all[a : a + _CHUNK]
            outputs = t.output_tokens[rows]
            if budget is None:
                recorded = t.max_output_tokens[rows]
                budgets = np.where(recorded >= 0, recorded, outputs).tolist()
            elif budget == ORACLE:
                budgets = outputs.tolist()
            else:
                budgets = [budget] * len(rows)
            segments: list[Any] = [None] * len(rows)
            if has_segments:
                lo, hi = t.seg_offsets[rows].tolist(), t.seg_offsets[rows + 1].tolist()
                ids, lens = t.seg_ids, t.seg_lens
                for k, (i, j) in enumerate(zip(lo, hi)):
                    if j > i:
                        segments[k] = tuple(zip(ids[i:j].tolist(), lens[i:j].tolist()))
            for k, (arr, prompt, out, grp, pre, slo, cli, ten, bud, seg) in enumerate(
                zip(
                    times[a : a + _CHUNK].tolist(),
                    t.prompt_tokens[rows].tolist(),
                    outputs.tolist(),
                    t.prefix_group[rows].tolist(),
                    t.prefix_tokens[rows].tolist(),
                    t.slo_code[rows].tolist(),
                    t.client_code[rows].tolist(),
                    t.tenant_code[rows].tolist(),
                    budgets,
                    segments,
                ),
                start=a,
            ):
                spec = RequestSpec(
                    k,
                    arr,
                    prompt,
                    out,
                    grp,
                    pre,
                    bud,
                    fixed_slo or slo_names[slo],
                    client_names[cli],
                    tenant_names[ten],
                    seg,
                )
                if referenced and (2 * k in referenced or 2 * k + 1 in referenced):
                    spec.continued = True
                if tags is not None:
                    spec.session = int(tags[k])
                if named is not None:  # LoRA / several models: the trace's model and adapter
                    r = int(rows[k - a])
                    spec = tagged(spec, named[0][t.model_code[r]], named[1][t.adapter_code[r]])
                yield spec

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for summary.json: the source, the transformation, what was read
        and what was ignored or adjusted."""
        t = self.table
        rows = self._rows
        n = len(rows)
        times = self._times
        span = int(times[-1] - times[0]) if n else 0
        d: dict[str, Any] = {
            "kind": "trace",
            "trace": self.name,
            "bundled": self.name if self.name in BUNDLED_TRACES else None,
            "file": str(t.file),
            "format": t.format,
            "rows": len(t),
            "requests": n,
            "limit": self.limit,
            "duration_limit_us": self.duration_us,
            "time_scale": self.time_scale,
            "rate_scale": self.rate_scale,
            "start_us": self.start_us,
            "first_arrival_us": int(times[0]) if n else None,
            "last_arrival_us": int(times[-1]) if n else None,
            "mean_rate": (n - 1) / span * 1e6 if n > 1 and span > 0 else None,
            "mean_input_tokens": float(t.prompt_tokens[rows].mean()) if n else None,
            "mean_output_tokens": float(t.output_tokens[rows].mean()) if n else None,
            "slo_class": self.slo_class,
            "max_output_tokens": self.max_output_tokens,
            "sorted_in_file": t.out_of_order_rows == 0,
            "out_of_order_rows": t.out_of_order_rows,
            "first_out_of_order_line": t.first_out_of_order_line,
            "prefix_groups": int(len(np.unique(t.prefix_group[rows][t.prefix_group[rows] >= 0]))),
            "ignored_columns": t.ignored_columns,
            "adjusted": t.adjusted,
            "notes": t.notes,
            "metadata": {k: v for k, v in t.metadata.items() if k != "block_tokens"},
        }
        d.update(describe_mode(t, self.sessions))
        if t.has_segments:
            d["segments"] = _segment_stats(t, rows)
        if self.name in BUNDLED_TRACES:
            d["license"] = BUNDLED_TRACES[self.name]["license"]
        return d

    def __repr__(self) -> str:
        return (
            f"TraceWorkload(trace={self.name!r}, format={self.table.format!r}, "
            f"requests={len(self)}, time_scale={self.time_scale:g}, rate_scale={self.rate_scale:g}, "
            f"session_mode={self.session_mode!r})"
        )


def _segment_stats(t: TraceTable, rows: np.ndarray) -> dict[str, Any]:
    """Content-segment counts over ``rows``; ``reuse`` = the fraction of segments whose id already
    appeared in another (or the same) request: for Mooncake hash ids, the block reuse ratio."""
    lo, hi = t.seg_offsets[rows], t.seg_offsets[rows + 1]
    counts = hi - lo
    if t.order is None:  # rows are 0..n-1: their segments are one leading slice
        ids = t.seg_ids[: int(t.seg_offsets[len(rows)])]
    else:
        ids = np.concatenate([t.seg_ids[i:j] for i, j in zip(lo.tolist(), hi.tolist())])
    total = int(counts.sum())
    unique = int(len(np.unique(ids))) if total else 0
    return {
        "requests_with_segments": int((counts > 0).sum()),
        "segments": total,
        "reuse": (total - unique) / total if total else 0.0,
    }


def read_trace(trace: Any, format: str = "auto", **config: Any) -> list[RequestSpec]:
    """Every request of a trace, as :class:`TraceWorkload` replays it (``config``: the other
    ``workload:`` keys, e.g. ``requests=100, start="0s"``)."""
    section = {"trace": trace, "format": format, **config}
    return list(TraceWorkload.from_config(section).requests())


def block_reuse(specs: Iterable[RequestSpec]) -> float:
    """Fraction of content segments (e.g. Mooncake blocks) equal to one seen in an earlier
    request (or earlier in the same one) — the infinite-cache block hit ratio of a trace."""
    seen: set[int] = set()
    total = repeats = 0
    for spec in specs:
        for segment, _ in spec.segments or ():
            total += 1
            if segment in seen:
                repeats += 1
            else:
                seen.add(segment)
    return repeats / total if total else 0.0
