"""``servesim observe`` end to end against the local streaming server: the load modes, the files
(TraceV2 round trip into ``run``, measured.csv into ``validate``), errors, interruption."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")

from servesim.cli import main  # noqa: E402
from servesim.fidelity.readers import read_measured  # noqa: E402
from servesim.scenario import load_scenario  # noqa: E402
from servesim.simcore.rng import RandomStreams  # noqa: E402
from servesim.workloads.traces.tracev2 import TraceV2Format  # noqa: E402
from tests.observe.streaming_server import StreamingServer  # noqa: E402

FAST = {"first_s": 0.002, "gap_s": 0.001}
SMALL = [
    "--set", "workload.input={type: uniform, min: 8, max: 40}",
    "--set", "workload.output={type: uniform, min: 2, max: 6}",
]  # fmt: skip


def _observe(url: str, out: Path, *args: str) -> int:
    return main(["observe", "--url", url, "--model", "m", "--out", str(out), *SMALL, *args])


def _rows(file: Path) -> list[dict[str, str]]:
    lines = [line for line in file.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def _in_flight_peak(served: list[dict]) -> int:
    """Most requests the server was answering at once (receive to last write)."""
    events = []
    for s in served:
        events.append((s["received_ns"], 1))
        events.append((s["written_ns"][-1], -1))
    peak = now = 0
    for _, step in sorted(events):
        now += step
        peak = max(peak, now)
    return peak


def test_open_loop_sends_the_requests_run_would_simulate_at_their_arrivals(tmp_path, capsys):
    args = ["--rate", "40", "--requests", "12", "--arrival", "constant"]
    with StreamingServer({"first_s": 0.06, "gap_s": 0.001}) as server:  # 60+ ms each
        assert _observe(server.url, tmp_path, *args) == 0
        served = server.served()
    printed = capsys.readouterr().out
    assert "12 completed of 12 sent" in printed
    rows = _rows(tmp_path / "trace.csv")
    scenario = load_scenario(None, [f"workload.{a[2:]}={b}" for a, b in zip(args[::2], args[1::2])]
                             + [s for s in SMALL if s != "--set"])  # fmt: skip
    specs = list(scenario.workload.requests(RandomStreams(scenario.seed)))
    assert len(rows) == len(served) == 12
    # rows are in send order; two requests due close together may reach the wire swapped
    for row, spec in zip(sorted(rows, key=lambda r: int(r["arrival_time_us"])), specs):
        # the same arrivals and sizes as the simulation of these flags
        assert int(row["arrival_time_us"]) == spec.arrival_us
        assert int(row["input_tokens"]) == spec.prompt_tokens
        assert int(row["output_tokens"]) == spec.output_tokens
        assert int(row["server_input_tokens"]) == spec.prompt_tokens + 1  # + the server's BOS
        # sent when due (open loop), not after the previous answer (a loaded machine may be late)
        assert 0 <= int(row["send_time_us"]) - spec.arrival_us < 500_000
        assert row["status"] == "ok" and int(row["num_chunks"]) == spec.output_tokens
    assert _in_flight_peak(served) >= 2  # due every 25 ms, each answered in 60+ ms: overlapping
    bodies = [s["body"] for s in served]
    assert all(b["stream"] and b["ignore_eos"] for b in bodies)
    assert all(b["stream_options"] == {"include_usage": True} for b in bodies)
    assert sorted(b["max_tokens"] for b in bodies) == sorted(s.output_tokens for s in specs)


def test_shared_prefixes_reach_the_server_and_the_trace(tmp_path):
    prefix = ["--set", "workload.prefix={tokens: 16, groups: 2}"]
    with StreamingServer(FAST) as server:
        assert _observe(server.url, tmp_path, "--rate", "50", "--arrival", "constant",
                        "--requests", "8", *prefix) == 0  # fmt: skip
        served = server.served()
    rows = _rows(tmp_path / "trace.csv")
    assert all(r["prefix_group"] != "" and r["prefix_length"] == "16" for r in rows)
    # (the server may receive two requests in another order than they were sent)
    sizes = sorted(len(s["body"]["prompt"].split()) for s in served)
    assert sizes == sorted(16 + int(r["input_tokens"]) for r in rows)
    heads = {" ".join(s["body"]["prompt"].split()[:16]) for s in served}
    assert len(heads) == len({r["prefix_group"] for r in rows}) == 2  # one text per group
    table = TraceV2Format().read(tmp_path / "trace.csv")
    assert sorted(set(table.prefix_group.tolist())) == [0, 1]
    assert set(table.prefix_tokens.tolist()) == {16}


def test_closed_loop_keeps_n_requests_in_flight(tmp_path):
    script = {"first_s": 0.01, "gap_s": 0.002}
    with StreamingServer(script) as server:
        assert _observe(server.url, tmp_path, "--max-concurrency", "2", "--requests", "8") == 0
        served = server.served()
    assert len(served) == 8
    assert _in_flight_peak(served) == 2
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["mode"] == "closed loop"
    rows = _rows(tmp_path / "trace.csv")
    # arrivals are the send times: each next request left when a previous one ended
    assert all(r["arrival_time_us"] == r["send_time_us"] for r in rows)


def test_max_concurrency_caps_an_open_loop_and_keeps_the_due_times(tmp_path):
    script = {"first_s": 0.02, "gap_s": 0.002}
    args = ["--rate", "200", "--requests", "6", "--arrival", "constant", "--max-concurrency", "1"]
    with StreamingServer(script) as server:
        assert _observe(server.url, tmp_path, *args) == 0
        served = server.served()
    assert _in_flight_peak(served) == 1
    rows = _rows(tmp_path / "trace.csv")
    late = [int(r["send_time_us"]) - int(r["arrival_time_us"]) for r in rows]
    assert late[-1] > 50_000  # the last waited for the five before it (each > 20 ms)


def test_the_trace_replays_in_servesim_run_and_validate_reads_measured_csv(tmp_path, capsys):
    with StreamingServer(FAST) as server:
        assert _observe(server.url, tmp_path, "--rate", "50", "--requests", "10",
                        "--gpu", "H100", "--setting", "max_num_seqs=64") == 0  # fmt: skip
    table = TraceV2Format().read(tmp_path / "trace.csv")
    rows = _rows(tmp_path / "trace.csv")
    assert len(table.arrival_us) == 10
    assert table.arrival_us.tolist() == [int(r["send_time_us"]) for r in rows]
    assert table.prompt_tokens.tolist() == [int(r["server_input_tokens"]) for r in rows]
    capsys.readouterr()
    assert main(["run", "--trace", str(tmp_path / "trace.csv"), "--no-write", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["injected_requests"] == summary["completed_requests"] == 10

    run = read_measured(tmp_path / "measured.csv")
    chunks = [json.loads(line) for line in (tmp_path / "chunks.jsonl").read_text().splitlines()]
    assert run.n == 10 and run.system == "observed" and run.gpu == "H100"
    assert run.max_num_seqs == 64
    assert run.ttft_us.tolist() == pytest.approx([c["ttft_us"] for c in chunks], abs=1.0)
    assert run.e2e_us.tolist() == pytest.approx([c["e2e_us"] for c in chunks], abs=1.0)
    assert run.output_tokens.tolist() == [c["output_tokens"] for c in chunks]
    assert run.request_rate == 50.0


def test_validate_replays_an_observed_run(tmp_path, capsys):
    with StreamingServer(FAST) as server:
        assert _observe(server.url, tmp_path, "--rate", "50", "--requests", "6",
                        "--gpu", "H100") == 0  # fmt: skip
    capsys.readouterr()
    measured = str(tmp_path / "measured.csv")
    assert main(["validate", measured, "--model", "qwen3-14b", "--out", str(tmp_path / "v"),
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 6 and report["simulated_completed"] == 6


def test_server_errors_are_recorded_per_request_and_summarised(tmp_path, capsys):
    script = {
        **FAST,
        "requests": {"1": {"status": 500}, "2": {"drop_after": 1}, "3": {"error_after": 1}},
    }
    with StreamingServer(script) as server:
        assert _observe(server.url, tmp_path, "--max-concurrency", "1", "--requests", "6") == 0
    printed = capsys.readouterr().out
    assert "3 completed of 6 sent" in printed
    assert "HTTP 500: scripted failure" in printed
    statuses = [r["status"] for r in _rows(tmp_path / "trace.csv")]
    assert statuses == ["ok", "error", "incomplete", "error", "ok", "ok"]
    errors = [r["error_message"] for r in _rows(tmp_path / "trace.csv")]
    assert "scripted stream error" in errors[3]
    assert len(_rows(tmp_path / "measured.csv")) == 3  # only finished requests are measured
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["summary"]["statuses"] == {"ok": 3, "error": 2, "incomplete": 1}


def test_an_unreachable_server_is_a_clear_error_before_anything_is_sent(tmp_path, capsys):
    code = _observe("http://127.0.0.1:9", tmp_path, "--max-concurrency", "1", "--requests", "2")
    assert code == 2
    err = capsys.readouterr().err
    assert "--url" in err and "no server answers there" in err and "Traceback" not in err
    assert not (tmp_path / "trace.csv").exists()


def test_a_model_the_server_does_not_list_is_noted(tmp_path, capsys):
    with StreamingServer(FAST) as server:
        code = main(["observe", "--url", server.url, "--model", "other", "--out", str(tmp_path),
                     "--max-concurrency", "1", "--requests", "1", *SMALL])  # fmt: skip
    assert code == 0
    assert "the server lists m, not other" in capsys.readouterr().err
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["served_models"] == ["m"]


def test_warm_up_requests_are_sent_first_and_not_recorded(tmp_path):
    with StreamingServer(FAST) as server:
        assert _observe(server.url, tmp_path, "--max-concurrency", "2", "--requests", "4",
                        "--warmup", "3") == 0  # fmt: skip
        served = server.served()
    assert len(served) == 7
    assert len(_rows(tmp_path / "trace.csv")) == 4
    warm = {s["body"]["prompt"] for s in served[:3]}
    measured = {s["body"]["prompt"] for s in served[3:]}
    assert not warm & measured
    assert max(s["written_ns"][-1] for s in served[:3]) < min(s["received_ns"] for s in served[3:])


def test_duration_stops_sending_new_requests(tmp_path, capsys):
    with StreamingServer(FAST) as server:
        args = ["--rate", "20", "--arrival", "constant", "--requests", "100", "--duration", "0.3"]
        assert _observe(server.url, tmp_path, *args) == 0
    rows = _rows(tmp_path / "trace.csv")
    assert 4 <= len(rows) <= 7  # arrivals every 50 ms up to 0.3 s
    assert "stopped early (duration)" in capsys.readouterr().out


def test_api_key_from_the_flag_or_the_environment_and_the_chat_endpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESIM_API_KEY", "from-env")
    with StreamingServer(FAST) as server:
        assert _observe(server.url, tmp_path / "a", "--max-concurrency", "1", "--requests", "1",
                        "--chat") == 0  # fmt: skip
        assert _observe(server.url, tmp_path / "b", "--max-concurrency", "1", "--requests", "1",
                        "--api-key", "flag", "--no-ignore-eos") == 0  # fmt: skip
        served = server.served()
    assert served[0]["headers"]["Authorization"] == "Bearer from-env"
    assert served[0]["body"]["messages"][0]["role"] == "user"
    assert served[1]["headers"]["Authorization"] == "Bearer flag"
    assert "ignore_eos" not in served[1]["body"]
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["settings"]["api_key"] == "given" and "from-env" not in json.dumps(meta)
    assert meta["endpoint"].endswith("/v1/chat/completions")


def test_calibration_makes_prompts_the_servers_exact_size(tmp_path):
    with StreamingServer(FAST) as server:
        assert _observe(server.url, tmp_path, "--max-concurrency", "1", "--requests", "4",
                        "--calibrate-ratio") == 0  # fmt: skip
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["prompts"]["calibration"]["overhead_tokens"] == pytest.approx(1.0)
    rows = _rows(tmp_path / "trace.csv")
    assert all(r["server_input_tokens"] == r["input_tokens"] for r in rows)


def test_ctrl_c_writes_what_finished_and_says_so(tmp_path, capsys):
    """SIGINT once the server has seen two requests: the run stops, the cut requests are
    recorded as incomplete, the files are written and the exit code is 130."""
    script = {"first_s": 0.05, "gap_s": 0.02}
    with StreamingServer(script) as server:

        def interrupt() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(server.served()) < 2:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        killer = threading.Thread(target=interrupt)
        killer.start()
        args = ["--rate", "20", "--arrival", "constant", "--requests", "40"]
        code = _observe(server.url, tmp_path, *args)
        killer.join()
    assert code == 130
    err = capsys.readouterr().err
    assert "interrupted" in err
    rows = _rows(tmp_path / "trace.csv")
    assert 2 <= len(rows) < 40
    assert rows[-1]["status"] == "incomplete"
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["summary"]["stopped_by"] == "interrupted"


def test_without_httpx_the_command_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx now raises ImportError
    code = main(["observe", "--url", "http://127.0.0.1:9", "--model", "m", "--rate", "1",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "pip install 'servesim[observe]'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ([], "--rate R, --max-concurrency N"),
        (["--rate", "1", "--trace", "x.csv"], "--trace"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--rate", "1", "--duration", "-1"], "--duration"),
        (["--rate", "1", "--setting", "oops"], "--setting"),
    ],
)
def test_bad_input_names_the_flag(tmp_path, capsys, args, named):
    with StreamingServer(FAST) as server:
        code = main(["observe", "--url", server.url, "--model", "m", "--out", str(tmp_path),
                     "--requests", "1", *args])  # fmt: skip
    assert code == 2
    assert named in capsys.readouterr().err


def test_the_url_must_be_http(tmp_path, capsys):
    code = main(["observe", "--url", "localhost:8000", "--model", "m", "--rate", "1",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 2 and "--url" in capsys.readouterr().err
