"""The progress bar: shown on a terminal for long runs, never on pipes, never changes a run."""

from __future__ import annotations

import io
import time

from servesim.analysis.tables import requests_csv
from servesim.components.cluster import Cluster
from servesim.progress import RunProgress
from servesim.scenario import load_scenario

SCENARIO = ["workload.requests=3000", "workload.rate=26"]


def test_the_bar_reports_requests_and_simulated_time():
    stream = io.StringIO()
    bar = RunProgress(3000, delay_s=0.0, every=1000, stream=stream, force=True)
    record = Cluster(load_scenario(None, SCENARIO), bar).run()
    text = stream.getvalue()
    assert "3000/3000" in text and "req/s" in text and "sim " in text
    assert f"sim {record.end_us / 1e6:,.1f} s" in text  # the last update is the run's end


def test_the_bar_appears_at_the_first_report_after_the_delay():
    stream = io.StringIO()
    bar = RunProgress(100, delay_s=0.05, every=10, stream=stream, force=True)
    bar.update(10, 1_000_000)
    assert bar._bar is None and stream.getvalue() == ""  # too early: nothing made, nothing shown
    time.sleep(0.06)
    bar.update(20, 2_000_000)
    bar.update(100, 9_000_000)
    bar.close()
    assert "100/100" in stream.getvalue() and "sim 9.0 s" in stream.getvalue()


def test_the_bars_elapsed_time_counts_from_the_run_start_not_from_the_bar():
    stream = io.StringIO()
    bar = RunProgress(100, delay_s=1.1, every=10, stream=stream, force=True)
    time.sleep(1.15)
    bar.update(50, 1_000_000)
    bar.close()
    assert "[00:01<" in stream.getvalue()  # tqdm's elapsed field: the 1.15 s before the bar too


def test_no_bar_when_the_stream_is_not_a_terminal():
    stream = io.StringIO()  # isatty() is False
    assert not RunProgress(10, stream=stream).enabled


def test_a_run_is_the_same_with_and_without_the_bar():
    plain = Cluster(load_scenario(None, SCENARIO)).run()
    bar = RunProgress(3000, delay_s=0.0, every=7, stream=io.StringIO(), force=True)
    shown = Cluster(load_scenario(None, SCENARIO), bar).run()
    assert requests_csv(plain) == requests_csv(shown)
