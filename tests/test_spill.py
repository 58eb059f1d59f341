"""Streaming results: a run whose rows were moved to disk gives exactly what the in-memory run
gives (summary, every written file, the audit), and the on-disk pieces keep every row."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import servesim
from servesim.analysis import tables
from servesim.analysis.metrics import itl_gaps, request_arrays, weighted_percentile
from servesim.components import record as record_module
from servesim.components.record import RequestTable, StepLog
from servesim.simcore.spill import ColumnFiles, KeyedRows, SpillDir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Each scenario exercises a different part of the table: plain completion, unfinished requests
# at a horizon, gateway refusals and SLO classes, sessions, disaggregation, speculation.
SCENARIOS = {
    "default": (None, ["workload.requests=400", "workload.rate=30"]),
    "horizon": (None, ["workload.requests=400", "workload.rate=60", "horizon=8s"]),
    "flow-control": (EXAMPLES / "flow-control-overload.yaml", ["workload.requests=300"]),
    "sessions": (EXAMPLES / "sessions.yaml", ["workload.requests=40"]),
    "pd": (EXAMPLES / "pd-disaggregation.yaml", ["workload.requests=200"]),
    "speculative": (
        None,
        [
            "workload.requests=200",
            "engine.speculative={draft_tokens: 3, acceptance_rate: 0.7}",
        ],
    ),
}


def _run(name: str, monkeypatch: pytest.MonkeyPatch, spill: bool) -> servesim.Results:
    source, overrides = SCENARIOS[name]
    if spill:  # every 7 rows to disk, buckets of 5 ids: many buckets, rows out of id order
        monkeypatch.setattr(record_module, "SPILL_ROWS", 7)
        monkeypatch.setattr(record_module, "BUCKET_IDS", 5)
    results = servesim.simulate(servesim.load_scenario(source, overrides))
    monkeypatch.undo()
    assert results.record.requests.spilled == spill
    return results


def _files(results: servesim.Results, out: Path) -> dict[str, bytes]:
    results.write(out)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "steps.npz"}
    with np.load(out / "steps.npz") as npz:
        files.update({f"steps.npz:{k}": npz[k].tobytes() for k in sorted(npz.files)})
    return files


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_spilled_run_writes_exactly_what_the_in_memory_run_writes(name, monkeypatch, tmp_path):
    memory = _run(name, monkeypatch, spill=False)
    spilled = _run(name, monkeypatch, spill=True)
    assert spilled.summary == memory.summary
    assert spilled.summary["audit"]["passed"], spilled.summary["audit"]
    assert _files(spilled, tmp_path / "s") == _files(memory, tmp_path / "m")
    a, b = memory.requests, spilled.requests
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_the_steps_npz_stream_is_what_savez_compressed_writes(monkeypatch, tmp_path):
    results = _run("speculative", monkeypatch, spill=True)
    with open(tmp_path / "streamed.npz", "wb") as fh:
        tables.write_steps_npz(fh, results.record)
    np.savez_compressed(tmp_path / "whole.npz", **tables.steps_npz_payload(results.record))
    with np.load(tmp_path / "streamed.npz") as a, np.load(tmp_path / "whole.npz") as b:
        assert a.files == b.files
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])


def test_itl_gaps_as_distinct_values_keep_the_multiset(monkeypatch):
    results = _run("speculative", monkeypatch, spill=False)
    values, counts = itl_gaps(results.record)
    assert np.all(np.diff(values) > 0) and np.all(counts > 0)
    # the full list of gaps, expanded from the step log the way the old reader did
    expanded = []
    for log, info in zip(results.record.step_logs, results.record.instances):
        alpha2 = info["alpha2_us"]
        expanded.append(np.repeat(log.column("dt_us") + alpha2, log.column("regular_tokens")))
        expanded.append(np.full(int(log.column("burst_tokens").sum()), alpha2))
        expanded.append(np.frombuffer(log.irregular_gaps_us, dtype=np.int64) + alpha2)
    full = np.sort(np.concatenate(expanded))
    np.testing.assert_array_equal(np.repeat(values, counts), full)
    for p in (50, 90, 99):
        assert weighted_percentile(values, counts, p) == np.percentile(full, p)


def test_the_spill_directory_goes_when_the_run_is_dropped(monkeypatch):
    results = _run("default", monkeypatch, spill=True)
    path = results.record.requests.spill_dir.path
    assert any(path.iterdir())
    del results
    import gc

    gc.collect()
    assert not path.exists()


def test_a_read_table_takes_no_more_rows():
    table = RequestTable(spill_rows=2)
    for i in range(5):
        table.append((i,) + (0,) * (table.width - 1))
    assert table.column("id").tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="read already"):
        table.append((9,) + (0,) * (table.width - 1))


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(0, 500), unique=True, max_size=60),
    spill_rows=st.integers(1, 9),
    bucket_ids=st.integers(1, 40),
)
def test_a_table_reads_back_in_id_order_however_it_spilled(ids, spill_rows, bucket_ids):
    table = RequestTable(spill_rows=spill_rows, bucket_ids=bucket_ids)
    seen = []
    for rid in ids:  # appended in arbitrary (completion) order
        row = (rid,) + tuple(rid * 10 + j for j in range(1, table.width))
        table.append(row)
        seen.append(row)
    expected = np.array(sorted(seen), dtype=np.int64).reshape(-1, table.width)
    assert len(table) == len(ids)
    for j, name in enumerate(table.COLUMNS):
        np.testing.assert_array_equal(table.column(name), expected[:, j])
    chunks = list(table.chunks(("id", "status"), size=4))
    got = np.concatenate([c["id"] for c in chunks]) if chunks else np.zeros(0, np.int64)
    np.testing.assert_array_equal(got, expected[:, 0])


@settings(max_examples=30, deadline=None)
@given(blocks=st.lists(st.integers(0, 12), max_size=8), size=st.integers(1, 7))
def test_a_step_log_spilled_in_pieces_reads_back_in_step_order(blocks, size):
    log, spill, expected = StepLog(), SpillDir(), []
    step = 0
    for n in blocks:
        rows = [[step + k] * log.width for k in range(n)]
        for row in rows:
            log.rows.extend(row)
        expected.extend(rows)
        step += n
        log.spill(spill)
    log.rows.extend([step] * log.width)  # one row left in memory
    expected.append([step] * log.width)
    matrix = np.array(expected, dtype=np.int64)
    assert len(log) == len(matrix)
    np.testing.assert_array_equal(log.column("dt_us"), matrix[:, 1])
    got = np.concatenate([c["start_us"] for c in log.chunks(("start_us",), size=size)])
    np.testing.assert_array_equal(got, matrix[:, 0])
    assert log.last_end_us() == 2 * step


def test_column_files_and_buckets_read_back_what_was_written():
    spill = SpillDir()
    columns = ColumnFiles(spill, "t", ("a", "b"))
    columns.append(np.array([[1, 2], [3, 4]]))
    columns.append(np.array([[5, 6]]))
    assert columns.read("b").tolist() == [2, 4, 6]
    assert columns.read("a", 1, 3).tolist() == [3, 5]
    rows = KeyedRows(spill, "k", 2, 0, 10)
    rows.append(np.array([[25, 0], [3, 1], [14, 2], [7, 3]]))
    rows.append(np.array([[21, 4], [1, 5]]))
    buckets = [b[:, 0].tolist() for b in rows.drain()]
    assert buckets == [[3, 7, 1], [14], [25, 21]]
    spill.remove()
    assert not spill.path.exists()


def test_request_arrays_of_a_spilled_run_read_each_column_afresh(monkeypatch):
    results = _run("default", monkeypatch, spill=True)
    columns = request_arrays(results.record)
    first = columns["arrival_us"]
    assert first is not columns["arrival_us"]  # nothing cached for a spilled run
    np.testing.assert_array_equal(first, columns["arrival_us"])


def test_the_time_series_guard_bounds_rows_over_all_instances(monkeypatch):
    results = servesim.simulate(
        servesim.load_scenario(
            None, ["cluster.instances=4", "workload.requests=200", "workload.rate=100"]
        )
    )
    monkeypatch.setattr(tables, "MAX_TIMESERIES_SAMPLES", 40)
    series = tables.timeseries(results.record, 1_000)  # 1 ms: thousands of samples unguarded
    assert 0 < len(series["time_s"]) <= 40 + 4
    assert set(series["instance"].tolist()) == {0, 1, 2, 3}
    assert tables.timeseries_csv(results.record, 1_000).count("\n") == len(series["time_s"]) + 1


def test_scratch_left_by_a_killed_process_is_removed(tmp_path):
    import subprocess
    import sys

    from servesim.simcore import spill as spill_module

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = tmp_path / f"{spill_module.PREFIX}{int(gone.stdout)}-abc"
    alive = tmp_path / f"{spill_module.PREFIX}{os.getppid()}-abc"
    unrelated = tmp_path / f"{spill_module.PREFIX}notapid"
    for d in (dead, alive, unrelated):
        d.mkdir()
        (d / "rows").write_bytes(b"x")
    assert spill_module.remove_orphans(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and unrelated.exists()
