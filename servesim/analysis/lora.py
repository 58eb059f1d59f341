"""Per-model and per-adapter figures of a run whose requests name models or adapters:
``summary.json``'s ``by_model``, ``by_adapter`` and ``adapters`` (absent from other runs), and
their console lines.

Each group's latency is over its completed requests, as the run's own: TTFT (arrival to first
token), ITL (a request's mean gap between tokens), E2E; throughput is its output tokens and
completed requests per simulated second. Requests without an adapter are the group ``base``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servesim.components.record import STATUS_COMPLETED

_STATS = (("mean", None), ("p50", 50), ("p90", 90), ("p99", 99))


def _stats(values_ms: np.ndarray, prefix: str) -> dict[str, float]:
    values_ms = values_ms[~np.isnan(values_ms)]
    if not len(values_ms):
        return {f"{prefix}_{name}_ms": 0.0 for name, _ in _STATS}
    return {
        f"{prefix}_{name}_ms": float(
            np.mean(values_ms) if q is None else np.percentile(values_ms, q)
        )
        for name, q in _STATS
    }


def _group_rows(codes: np.ndarray, names: list[str], columns: dict, duration_s: float) -> dict:
    done = columns["status"] == STATUS_COMPLETED
    arrival = columns["arrival_us"]
    out_tokens = columns["output_tokens"]
    ttft = (columns["first_token_us"] - arrival) / 1000.0
    e2e = (columns["completion_us"] - arrival) / 1000.0
    itl = np.where(
        out_tokens > 1, columns["itl_sum_us"] / np.maximum(out_tokens - 1, 1) / 1000.0, np.nan
    )
    rows: dict[str, Any] = {}
    for code, name in enumerate(names):
        mine = codes == code
        if not mine.any():
            continue
        ok = mine & done
        row: dict[str, Any] = {
            "requests": int(mine.sum()),
            "completed": int(ok.sum()),
            "responses_per_sec": float(ok.sum()) / duration_s,
            "tokens_per_sec": float(out_tokens[ok].sum()) / duration_s,
        }
        row.update(_stats(ttft[ok], "ttft"))
        row.update(_stats(itl[ok], "itl"))
        row.update(_stats(e2e[ok], "e2e"))
        rows[name or "base"] = row
    return rows


def lora_metrics(record: Any, req: Any, duration_s: float) -> dict[str, Any]:
    """``by_model`` (several models served or named), ``by_adapter`` and ``adapters`` (with
    adapters), from the run's books (``record.lora``)."""
    books = record.lora
    ids = np.asarray(req["id"], dtype=np.int64)
    names = ("status", "arrival_us", "first_token_us", "completion_us", "output_tokens")
    columns = {name: np.asarray(req[name], dtype=np.int64) for name in names}
    columns["itl_sum_us"] = np.asarray(req["itl_sum_us"], dtype=np.float64)
    out: dict[str, Any] = {}
    model_code = np.asarray(books["model_code"], dtype=np.int64)
    adapter_code = np.asarray(books["adapter_code"], dtype=np.int64)
    if len(set(books["served"])) > 1 or len(books["models"]) > 1:
        out["by_model"] = _group_rows(model_code[ids], books["models"], columns, duration_s)
    counters = [c for c in books["instances"] if c]
    if len(books["adapters"]) > 1 or counters:
        out["by_adapter"] = _group_rows(adapter_code[ids], books["adapters"], columns, duration_s)
        out["adapters"] = {
            "loads": sum(c["adapter_loads"] for c in counters),
            "disk_loads": sum(c["adapter_disk_loads"] for c in counters),
            "evictions": sum(c["adapter_evictions"] for c in counters),
            "load_ms": sum(c["adapter_load_us"] for c in counters) / 1000.0,
            "per_instance": [{"index": k, **c} for k, c in enumerate(books["instances"]) if c],
        }
    return out


def _group_line(label: str, name: str, row: dict[str, Any]) -> str:
    return (
        f"{label:<11}{name}: {row['completed']} of {row['requests']} completed, "
        f"ttft p50 {row['ttft_p50_ms']:.1f} ms p99 {row['ttft_p99_ms']:.1f} ms, "
        f"itl mean {row['itl_mean_ms']:.1f} ms, {row['tokens_per_sec']:.0f} tok/s"
    )


def lora_lines(s: dict[str, Any]) -> list[str]:
    """The console lines: one per model, one per adapter, the adapter loads."""
    lines = [
        _group_line(label, name, row)
        for key, label in (("by_model", "model"), ("by_adapter", "adapter"))
        for name, row in s.get(key, {}).items()
    ]
    adapters = s.get("adapters")
    if adapters is not None:
        lines.append(
            f"adapters   {adapters['loads']} loads ({adapters['disk_loads']} from disk, "
            f"{adapters['load_ms']:.1f} ms in steps), {adapters['evictions']} evictions"
        )
    return lines


class _LoRAColumns:
    """A CSV writer that appends each request row's ``model`` and ``adapter`` (by its id)."""

    def __init__(self, writer: Any, books: dict[str, Any]):
        self.writer = writer
        self.models = np.asarray(books["models"], dtype=object)[books["model_code"]]
        adapters = np.asarray(books["adapters"], dtype=object)[books["adapter_code"]]
        self.adapters = adapters

    def writerow(self, header: Any) -> None:
        self.writer.writerow(tuple(header) + ("model", "adapter"))

    def writerows(self, rows: Any) -> None:
        models, adapters = self.models, self.adapters
        self.writer.writerows(row + (models[row[0]], adapters[row[0]]) for row in rows)


def with_lora_columns(writer: Any, record: Any) -> Any:
    """requests.csv's writer, with ``model`` and ``adapter`` columns when the run used them."""
    books = getattr(record, "lora", None)
    return writer if books is None else _LoRAColumns(writer, books)
