"""Writing a results directory atomically (temp dir + rename) and recovering an interrupted write."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from servesim.analysis.tables import (
    decisions_csv,
    transfers_csv,
    write_requests_csv,
    write_steps_npz,
    write_timeseries_csv,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import current_umask
from servesim.simcore.log import get_logger
from servesim.simcore.spill import process_alive


def dumps_summary(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_results(out_dir: str | Path, summary: dict[str, Any], record: Any, scenario: Any) -> Path:
    """Write summary.json, requests.csv, timeseries.csv, steps.npz and scenario.yaml atomically.

    Files go to a temporary sibling directory that replaces ``out_dir`` in one rename, so a reader
    never sees a half-written result and an interrupted run leaves the previous result intact.
    The per-request and per-step files are streamed into that directory a slice at a time, so
    writing a run of millions of requests holds one slice in memory, never a whole file.
    """
    out = Path(out_dir).resolve()
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "summary.json").exists())
    ):
        raise ScenarioError(
            "output.dir",
            str(out_dir),
            "exists and is not a servesim results directory, so it will not be replaced; choose another --out",
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for note in recover_results_dir(out):
            get_logger("servesim.analysis").warning(note)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    except OSError as exc:
        raise ScenarioError(
            "output.dir",
            str(out_dir),
            f"cannot create the results directory ({exc.strerror or exc}); choose another --out",
        ) from None
    try:
        # the per-row files stream out of the record a slice at a time (flat memory)
        with open(tmp / "requests.csv", "w", encoding="utf-8") as fh:
            write_requests_csv(fh, record)
        with open(tmp / "timeseries.csv", "w", encoding="utf-8") as fh:
            write_timeseries_csv(fh, record, scenario.output.timeseries_interval_us)
        if scenario.output.steps:
            with open(tmp / "steps.npz", "wb") as fh:
                write_steps_npz(fh, record)
        (tmp / "scenario.yaml").write_text(scenario.to_yaml(), encoding="utf-8")
        if getattr(record, "exported", None) is not None:
            from servesim.workloads.traces import write_trace

            write_trace(
                record.exported, tmp / "workload.csv.gz", metadata={"scenario": scenario.name}
            )
        if getattr(record, "decisions", None) is not None:
            (tmp / "decisions.csv").write_text(decisions_csv(record), encoding="utf-8")
        if getattr(record, "transfers", None) is not None:
            (tmp / "transfers.csv").write_text(transfers_csv(record), encoding="utf-8")
        # summary.json last: a directory holding it holds everything.
        (tmp / "summary.json").write_text(dumps_summary(summary), encoding="utf-8")
        os.chmod(
            tmp, 0o777 & ~current_umask()
        )  # mkdtemp makes it private; results are ordinary files
        if out.exists():
            # Two renames: a crash between them leaves the previous result in `old`, and the
            # next write (recover_results_dir) puts it back.
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
            os.replace(out, old / "previous")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ScenarioError(
            "output.dir",
            str(out_dir),
            f"cannot write results there ({exc.strerror or exc}); choose another --out",
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def recover_results_dir(out: Path) -> list[str]:
    """Undo what a run killed while writing ``out`` left behind; what was done, in words.

    A write builds the new result in ``.<name>.partial-<pid>-*`` beside ``out`` and swaps it in
    with two renames through ``.<name>.old-<pid>-*/previous``. A killed writer (its pid no longer
    running) leaves a partial directory, removed here, or, killed between the renames, the
    previous result in its ``old`` directory, put back at ``out`` when nothing is there.
    """
    done: list[str] = []
    if not out.parent.is_dir():
        return done
    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.old-*")):
        if _writer_alive(leftover, "old"):
            continue
        previous = leftover / "previous"
        if previous.is_dir() and not out.exists():
            os.replace(previous, out)
            done.append(
                f"restored the previous result at {out} (a run was killed while replacing it)"
            )
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.partial-*")):
        if not _writer_alive(leftover, "partial"):
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"removed {leftover} (the unfinished result of a killed run)")
    return done


def _writer_alive(leftover: Path, kind: str) -> bool:
    """Whether the process that made ``leftover`` (``.<name>.<kind>-<pid>-*``) still runs."""
    tail = leftover.name.rsplit(f".{kind}-", 1)[-1]
    try:
        pid = int(tail.split("-", 1)[0])
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # ours, from a write this process abandoned
    return process_alive(pid)
