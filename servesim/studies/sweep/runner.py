""":func:`run_sweep`: run the points that have no result yet on a backend, recording each as it
finishes; Ctrl-C stops cleanly and a re-run resumes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from servesim.simcore.errors import ScenarioError
from servesim.studies.sweep.backends import (
    BACKENDS,
    _import_ray,
    _Lost,
    _PoolBackend,
    _RayBackend,
    _SerialBackend,
)
from servesim.studies.sweep.points import _write_atomic
from servesim.studies.sweep.resume import _results_dir, _State
from servesim.studies.sweep.spec import Point, Sweep
from servesim.studies.sweep.table import _shape, format_table


@attrs.define
class SweepRun:
    """What :func:`run_sweep` did: the table rows, counts, the files written and notes."""

    out: Path
    rows: list[dict[str, Any]]
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    interrupted: bool = False
    wall_s: float = 0.0
    files: list[Path] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    *,
    backend: str = "process",
    workers: int | None = None,
    force: bool = False,
    ray_address: str | None = None,
    log_level: str = "warning",
    echo: Callable[[str], Any] | None = print,
) -> SweepRun:
    """Run every point of ``sweep`` that has no result in ``out`` yet; write the table and plot.

    ``backend`` is ``process`` (a pool of ``workers`` processes, default one per CPU),
    ``serial`` (one point at a time in this process) or ``ray`` (Ray tasks; ``ray_address``
    names a running cluster, default: a local one). ``force`` discards earlier results of the
    sweep's points. Ctrl-C stops scheduling: running points finish (a second Ctrl-C abandons
    them), finished points are kept, and the result says ``interrupted``.
    """
    say = echo or (lambda _text: None)
    if backend not in BACKENDS:
        raise ScenarioError("--backend", backend, f"must be one of: {', '.join(BACKENDS)}")
    if workers is not None and workers < 1:
        raise ScenarioError("--workers", workers, "must be at least 1")
    if backend == "ray":
        _import_ray()  # before anything is written
    started = time.perf_counter()
    out = _results_dir(out)
    (out / "points").mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "sweep.yaml", sweep.to_yaml())

    state = _State(sweep, out)
    skipped = state.resume(force)
    todo = [p for p in sweep.points if p.id not in state.records]
    run = SweepRun(out=out, rows=[], skipped=skipped)
    base = sweep.scenario

    def job(point: Point) -> tuple:
        return (base, dict(point.overrides), list(sweep.metrics))

    engine: Any = None
    finish_interrupted = False
    if todo:
        if backend == "serial":
            engine = _SerialBackend(job)
        elif backend == "ray":
            engine = _RayBackend(job, log_level, workers, ray_address)
        else:
            engine = _PoolBackend(job, log_level, min(workers or os.cpu_count() or 1, len(todo)))
    where = {
        "serial": "serially",
        "process": f"on {getattr(engine, 'limit', 0)} worker process(es)",
        "ray": f"as Ray tasks ({getattr(engine, 'limit', 0)} at a time)",
    }[backend]
    say(
        f"sweep {sweep.name}: {_shape(sweep)}; {skipped} already finished (skipped), "
        f"{len(todo)} to run" + (f" {where}" if todo else "") + f" -> {out}"
    )
    state.write_table(final=True)
    try:
        if engine is not None:
            run.interrupted = _drive(engine, todo, state, say)
    finally:
        if engine is not None:
            try:
                engine.close()
            except KeyboardInterrupt:
                engine.abandon([])
                run.interrupted = True
        try:
            run.files = state.finish()
        except KeyboardInterrupt:
            finish_interrupted = run.interrupted = True
            run.files = [out / "points.csv", out / "sweep.yaml"]
            state.notes.append(
                "interrupted while writing the final outputs; run the command again to write them"
            )
    run.rows = state.rows()
    if len(run.rows) == len(sweep.points) and not finish_interrupted:
        run.interrupted = False  # Ctrl-C came after the last point had finished
    run.ran = state.ran
    run.failed = sum(1 for r in run.rows if r["status"] == "failed")
    run.wall_s = time.perf_counter() - started
    run.notes = state.notes
    say("")
    say(format_table(sweep, run.rows))
    for row in run.rows:
        if row["status"] == "failed":
            say(f"failed {row['point']}: {row['error']}")
    for note in run.notes:
        say(note)
    written = ", ".join(p.name for p in run.files)
    ok = sum(1 for r in run.rows if r["status"] == "ok")
    say(
        f"{ok} of {len(sweep.points)} points finished ({run.ran} run now in "
        f"{run.wall_s:.1f} s wall, {skipped} earlier), {run.failed} failed; "
        f"wrote {written} in {out}"
    )
    if run.interrupted:
        say("interrupted: the finished points are kept; run the same command again to resume")
    return run


def _drive(engine: Any, todo: list[Point], state: _State, say: Callable[[str], Any]) -> bool:
    """Submit points (at most ``engine.limit`` at once), record each outcome; True if interrupted.

    A point whose worker died is run again, alone; if its worker dies again it is failed.
    """
    queue: deque[Point] = deque(todo)
    retry: deque[Point] = deque()
    suspects: set[str] = set()
    inflight: dict[Any, Point] = {}
    broken = stopping = False
    total = len(todo)
    while True:
        try:
            if not stopping:
                if broken and not inflight:
                    engine.restart()
                    broken = False
                if not broken:
                    if retry:
                        if not inflight:
                            point = retry.popleft()
                            inflight[engine.submit(point)] = point
                    else:
                        while queue and len(inflight) < engine.limit:
                            point = queue.popleft()
                            inflight[engine.submit(point)] = point
            if not inflight:
                return stopping
            for handle in engine.wait(list(inflight)):
                point = inflight.pop(handle)
                try:
                    result = engine.outcome(handle)
                except _Lost as exc:
                    broken = True
                    if point.id not in suspects:
                        suspects.add(point.id)
                        retry.append(point)
                        continue
                    result = {
                        "error": f"the worker process died while running this point ({exc}); "
                        "run it with --backend serial to see why",
                        "traceback": str(exc),
                    }
                say(state.record(point, result, total))
        except KeyboardInterrupt:
            if stopping:
                say(f"abandoning {len(inflight)} running point(s)")
                engine.abandon(list(inflight))
                return True
            stopping = True
            queue.clear()
            retry.clear()
            if inflight:
                say(
                    f"stopping: waiting for {len(inflight)} running point(s) to finish "
                    "(Ctrl-C again to abandon them)"
                )
