"""A table of measured step times (:class:`StepTable`), how rows become one, and the choice of
model and hardware its readers share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np

from servesim.simcore.errors import ScenarioError


@attrs.define(eq=False)
class StepTable:
    """Measured (or composed) engine step times, one row per step.

    ``kind`` is ``prefill``, ``decode`` or ``mixed``; ``prefill_items`` holds one
    ``(context_before, new_tokens, prompt_len)`` per prefilling request (as in
    :class:`~servesim.latency.base.BatchSummary`); ``group`` ties repeats of one measured point
    together (k-fold keeps a group in one fold); ``tp`` is each row's tensor parallelism.
    """

    source: str
    format: str
    model: str
    hardware: str
    kind: np.ndarray
    prefill_tokens: np.ndarray
    decode_requests: np.ndarray
    decode_context: np.ndarray
    prefill_items: list[tuple[tuple[int, int, int], ...]]
    time_us: np.ndarray
    group: np.ndarray
    tp: np.ndarray
    notes: list[str] = attrs.field(factory=list)

    @property
    def n(self) -> int:
        return int(self.time_us.size)

    @property
    def tps(self) -> tuple[int, ...]:
        return tuple(sorted({int(t) for t in self.tp}))

    def describe(self) -> dict[str, Any]:
        kinds = {k: int(np.count_nonzero(self.kind == k)) for k in ("prefill", "decode", "mixed")}
        return {
            "kind": "steps",
            "source": self.source,
            "format": self.format,
            "model": self.model,
            "hardware": self.hardware,
            "tp": list(self.tps),
            "rows": {k: v for k, v in kinds.items() if v},
        }


def _table_from_rows(
    rows: list[dict[str, Any]], *, source: str, fmt: str, model: str, hardware: str
) -> StepTable:
    keys: dict[Any, int] = {}
    groups = [keys.setdefault(r["group"], len(keys)) for r in rows]
    return StepTable(
        source=source,
        format=fmt,
        model=model,
        hardware=hardware,
        kind=np.asarray([r["kind"] for r in rows]),
        prefill_tokens=np.asarray([r["prefill_tokens"] for r in rows], dtype=np.int64),
        decode_requests=np.asarray([r["decode_requests"] for r in rows], dtype=np.int64),
        decode_context=np.asarray([r["decode_context"] for r in rows], dtype=np.int64),
        prefill_items=[r["prefill_items"] for r in rows],
        time_us=np.asarray([r["time_us"] for r in rows], dtype=np.float64),
        group=np.asarray(groups, dtype=np.int64),
        tp=np.asarray([r["tp"] for r in rows], dtype=np.int64),
    )


def _composed_tp(tp: int | None, why: str) -> int:
    """The tp of a step table composed from per-kernel or per-layer costs: 1 (also when ``tp`` is
    None), since neither source's communication is composed; ``why`` is the error's reason."""
    tp = 1 if tp is None else tp
    if tp != 1:
        raise ScenarioError("--tp", tp, why)
    return tp


def _choose(
    records: list[dict[str, Any]], key: str, wanted: str | None, file: Path, context: str = ""
) -> str:
    available = sorted({r[key] for r in records})
    flag = "--model" if key == "model" else "--hardware"
    if wanted is None:
        if len(available) == 1:
            return available[0]
        raise ScenarioError(
            flag,
            None,
            f"{file} has several {key}s{' ' + context if context else ''}: "
            f"{', '.join(available)}; choose one",
        )
    for name in available:
        if name.lower() == wanted.strip().lower():
            return name
    raise ScenarioError(
        flag,
        wanted,
        f"not in {file}{' ' + context if context else ''}; available: {', '.join(available)}",
    )
