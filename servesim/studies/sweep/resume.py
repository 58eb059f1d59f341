"""A sweep's results directory: the results of earlier runs read back (a finished point is not run
again), new ones recorded and written atomically as they come (points.csv, points.parquet,
points/<id>.json, sweep.yaml, plot.png).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.simcore.config import plain_data as _plain
from servesim.simcore.errors import ScenarioError
from servesim.studies.sweep.metrics import metric_value
from servesim.studies.sweep.points import _cell, _write_atomic
from servesim.studies.sweep.spec import Point, Sweep
from servesim.studies.sweep.table import _number_text, plot_sweep


class _State:
    """The sweep's results: earlier ones read back, new ones recorded and written as they come."""

    def __init__(self, sweep: Sweep, out: Path):
        self.sweep = sweep
        self.out = out
        self.records: dict[str, dict[str, Any]] = {}
        self.ran = 0
        self.notes: list[str] = []
        self._write_cost = 0.0
        self._last_write = 0.0

    def _json(self, point: Point) -> Path:
        return self.out / "points" / f"{point.id}.json"

    def _error_file(self, point: Point) -> Path:
        return self.out / "points" / f"{point.id}.error.txt"

    def resume(self, force: bool) -> int:
        """Read the finished points back (or, with ``force``, delete them); how many were read."""
        for point in self.sweep.points:
            path = self._json(point)
            if force:
                path.unlink(missing_ok=True)
                self._error_file(point).unlink(missing_ok=True)
                continue
            if not path.exists():
                continue
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                summary = saved["summary"]
                wall = float(saved.get("wall_s", 0.0))
            except (OSError, ValueError, KeyError, TypeError):
                self.notes.append(f"{path} is unreadable; point {point.id} was run again")
                continue
            self.records[point.id] = {
                "metrics": {m: metric_value(summary, m) for m in self.sweep.metrics},
                "wall_s": wall,
                "status": "ok",
                "error": "",
            }
        return len(self.records)

    def record(self, point: Point, result: Mapping[str, Any], total: int) -> str:
        """Store one outcome (points/<id>.json or .error.txt, the table); the progress line."""
        self.ran += 1
        if "error" in result:
            _write_atomic(self._error_file(point), str(result.get("traceback") or result["error"]))
            self.records[point.id] = {
                "metrics": {},
                "wall_s": None,
                "status": "failed",
                "error": result["error"],
            }
            shown = f"FAILED: {result['error']}"
        else:
            payload = {
                "point": point.id,
                "fields": _plain(point.fields),
                "seed": point.seed,
                "overrides": _plain(point.overrides),
                "scenario": self.sweep.scenario
                if not isinstance(self.sweep.scenario, Mapping)
                else "(inline)",
                "wall_s": result["wall_s"],
                "summary": result["summary"],
            }
            _write_atomic(self._json(point), json.dumps(payload, indent=1, allow_nan=False) + "\n")
            self._error_file(point).unlink(missing_ok=True)
            metrics = {m: metric_value(result["summary"], m) for m in self.sweep.metrics}
            self.records[point.id] = {
                "metrics": metrics,
                "wall_s": result["wall_s"],
                "status": "ok",
                "error": "",
            }
            shown = ", ".join(f"{m} {_number_text(metrics[m])}" for m in self.sweep.metrics[:3])
            shown += f" ({result['wall_s']:.2f} s)"
        self.write_table()
        width = len(str(total))
        return f"[{self.ran:>{width}}/{total}] {point.id} {point.describe()}: {shown}"

    def rows(self) -> list[dict[str, Any]]:
        """The table: one row per point with a result, in the sweep's order."""
        rows = []
        for point in self.sweep.points:
            rec = self.records.get(point.id)
            if rec is None:
                continue
            row: dict[str, Any] = {"point": point.id, **point.fields, "seed": point.seed}
            for m in self.sweep.metrics:
                row[m] = rec["metrics"].get(m)
            row.update(wall_s=rec["wall_s"], status=rec["status"], error=rec["error"])
            rows.append(row)
        return rows

    def columns(self) -> list[str]:
        return [
            "point",
            *self.sweep.fields,
            "seed",
            *self.sweep.metrics,
            "wall_s",
            "status",
            "error",
        ]

    def write_table(self, final: bool = False) -> None:
        """Rewrite points.csv atomically; skipped when the last write was recent and slow."""
        now = time.perf_counter()
        if not final and now - self._last_write < 10 * self._write_cost:
            return
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        columns = self.columns()
        writer.writerow(columns)
        for row in self.rows():
            writer.writerow([_cell(row[c]) for c in columns])
        _write_atomic(self.out / "points.csv", buffer.getvalue())
        self._last_write = time.perf_counter()
        self._write_cost = self._last_write - now

    def finish(self) -> list[Path]:
        """The final points.csv, points.parquet (with pyarrow) and plot.png (with matplotlib)."""
        self.write_table(final=True)
        files = [self.out / "points.csv"]
        rows = self.rows()
        parquet = _write_parquet(self.out / "points.parquet", self.columns(), rows)
        if parquet is None:
            self.notes.append("points.parquet not written: pyarrow is not installed")
        else:
            files.append(parquet)
        missing = [
            f"{m} ({n} of {len(rows)} points)"
            for m in self.sweep.metrics
            if (n := sum(1 for r in rows if r["status"] == "ok" and r[m] is None))
        ]
        if missing:
            self.notes.append(
                "no value in some points' summaries (blank cells): " + ", ".join(missing)
            )
        if self.sweep.plot is not None:
            plotted, note = plot_sweep(self.sweep, rows, self.out / "plot.png")
            if plotted is not None:
                files.append(plotted)
            if note:
                self.notes.append(note)
        files.append(self.out / "sweep.yaml")
        return files


def _results_dir(out: str | Path) -> Path:
    path = Path(out)
    if path.exists() and (
        not path.is_dir() or (any(path.iterdir()) and not (path / "sweep.yaml").exists())
    ):
        raise ScenarioError(
            "--out",
            str(out),
            "exists and is not a sweep results directory, so nothing is written there; "
            "choose another --out",
        )
    return path


def _write_parquet(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> Path | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    arrays = {}
    for c in columns:
        values = [_plain(r[c]) for r in rows]
        try:
            arrays[c] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            arrays[c] = pa.array([None if v is None else _cell(v) for v in values], pa.string())
    buffer = io.BytesIO()
    pq.write_table(pa.table(arrays), buffer)
    _write_atomic(path, buffer.getvalue())
    return path
