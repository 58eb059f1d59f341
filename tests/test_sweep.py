"""Sweeps: expansion, validation, backends that agree, resuming, failures, outputs, the example.

Runs use the default scenario cut to a few dozen requests, so each point takes a few hundredths
of a second; the example sweep runs as shipped.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from servesim.policies.routing import RoutingPolicy
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError
from servesim.studies.sweep import (
    DEFAULT_METRICS,
    add_sweep_parser,
    cmd_sweep,
    load_sweep,
    metric_value,
    run_point,
    run_sweep,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SMALL = {"workload.requests": 40, "cluster.instances": 2}
FORK = multiprocessing.get_start_method() == "fork"  # pool workers inherit test plugins


def small_sweep(**extra) -> dict:
    sweep = {
        "name": "small",
        "set": dict(SMALL),
        "grid": {"workload.rate": [10, 40], "policies.routing": ["round-robin", "least-loaded"]},
        "replicas": 2,
        "metrics": ["ttft_p99_ms", "e2e_p50_ms", "completed_requests"],
    }
    sweep.update(extra)
    return sweep


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def without_wall(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


def quiet(_line: str) -> None:
    return None


@pytest.fixture
def restored_registries():
    registry.describe()
    saved = {kind: dict(reg._items) for kind, reg in registry.REGISTRIES.items()}
    yield
    for kind, reg in registry.REGISTRIES.items():
        reg._items.clear()
        reg._items.update(saved[kind])


class Fragile(RoutingPolicy):
    """Round-robin that breaks at its 10th decision: ``fail: raise`` raises, ``fail: exit``
    kills its process (as an out-of-memory kill would); ``fail: none`` never breaks."""

    name = "sweep-test-fragile"
    needs_snapshots = False

    def __init__(self, fail: str = "none"):
        self.fail = fail
        self.decisions = 0

    @classmethod
    def from_config(cls, params, ctx):
        if params.get("fail", "none") not in ("none", "raise", "exit"):
            raise ScenarioError(f"{ctx.path}.fail", params["fail"], "must be none, raise or exit")
        return cls(params.get("fail", "none"))

    def route(self, request, snapshots):
        self.decisions += 1
        if self.decisions == 10 and self.fail == "raise":
            raise RuntimeError("the router broke at decision 10")
        if self.decisions == 10 and self.fail == "exit":
            os._exit(9)
        return snapshots[self.decisions % len(snapshots)].index


@pytest.fixture
def fragile(restored_registries):
    registry.register("routing", Fragile.name, Fragile, replace=True)
    return Fragile.name


# ---------------------------------------------------------------------- expansion


def test_grid_is_every_combination_with_a_seed_per_replica():
    sweep = load_sweep(
        small_sweep(replicas=3, grid={"workload.rate": [5, 10, 20], "engine.max_num_seqs": [8, 16]})
    )
    assert sweep.mode == "grid" and sweep.fields == ("workload.rate", "engine.max_num_seqs")
    assert len(sweep.points) == 3 * 2 * 3 and sweep.combinations == 6
    assert [p.fields for p in sweep.points[::3]] == [
        {"workload.rate": r, "engine.max_num_seqs": s} for r in (5, 10, 20) for s in (8, 16)
    ]
    assert [p.seed for p in sweep.points[:6]] == [42, 43, 44, 42, 43, 44]  # the default's seed 42
    assert all(re.fullmatch(r"[0-9a-f]{10}", p.id) for p in sweep.points)
    assert len({p.id for p in sweep.points}) == len(sweep.points)
    assert list(sweep.points[4].overrides) == [
        "workload.requests",
        "cluster.instances",
        "workload.rate",
        "engine.max_num_seqs",
        "seed",
    ]


def test_point_ids_are_stable_and_change_only_with_what_the_point_runs():
    ids = {p.describe(): p.id for p in load_sweep(small_sweep()).points}
    assert ids == {p.describe(): p.id for p in load_sweep(small_sweep()).points}
    grown = small_sweep(grid={"workload.rate": [10, 40, 80], "policies.routing": ["round-robin"]})
    kept = {p.describe(): p.id for p in load_sweep(grown).points}
    assert (
        kept["workload.rate=10 policies.routing=round-robin seed=42"]
        == ids["workload.rate=10 policies.routing=round-robin seed=42"]
    )
    more_requests = small_sweep(set={**SMALL, "workload.requests": 41})
    assert not set(ids.values()) & {p.id for p in load_sweep(more_requests).points}
    other_base = small_sweep(scenario={**json.loads(json.dumps(_default())), "seed": 42})
    assert not set(ids.values()) & {p.id for p in load_sweep(other_base).points}


def test_point_ids_change_when_a_file_the_scenario_names_changes(tmp_path):
    # A stale point must not be resumed after the trace it replays was edited.
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n0.5,20,5\n", encoding="utf-8")
    (tmp_path / "base.yaml").write_text(
        "workload: {trace: trace.csv, format: csv}\n", encoding="utf-8"
    )
    sweep = {"name": "files", "scenario": "base.yaml", "grid": {"cluster.instances": [1, 2]}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep), encoding="utf-8")
    before = [p.id for p in load_sweep(tmp_path / "sweep.yaml").points]
    assert before == [p.id for p in load_sweep(tmp_path / "sweep.yaml").points]
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n0.5,21,5\n", encoding="utf-8")
    after = [p.id for p in load_sweep(tmp_path / "sweep.yaml").points]
    assert not set(before) & set(after)


def _default() -> dict:
    from servesim.scenario import DEFAULT_SCENARIO

    return DEFAULT_SCENARIO


def test_the_first_seed_is_the_scenarios_after_set():
    sweep = load_sweep(small_sweep(set={**SMALL, "seed": 7}, replicas=2))
    assert [p.seed for p in sweep.points[:2]] == [7, 8]
    assert sweep.base_seed == 7


def test_random_sample_is_seeded_distinct_and_within_bounds():
    spec = {
        "samples": 6,
        "seed": 3,
        "fields": {
            "workload.rate": {"uniform": [5, 50]},
            "engine.max_num_seqs": {"randint": [8, 64]},
            "engine.max_num_batched_tokens": {"choice": [512, 1024, 2048]},
            "cluster.snapshot_interval": {"loguniform": [0.001, 0.1]},
        },
    }
    sweep = load_sweep({"set": SMALL, "random": spec, "replicas": 2})
    assert sweep.mode == "random" and len(sweep.points) == 12
    combos = [p.fields for p in sweep.points[::2]]
    assert combos == [p.fields for p in load_sweep({"set": SMALL, "random": spec}).points]
    assert len({json.dumps(c, sort_keys=True) for c in combos}) == 6
    for c in combos:
        assert 5 <= c["workload.rate"] <= 50 and len(repr(c["workload.rate"])) <= 8
        assert isinstance(c["engine.max_num_seqs"], int) and 8 <= c["engine.max_num_seqs"] <= 64
        assert c["engine.max_num_batched_tokens"] in (512, 1024, 2048)
        assert 0.001 <= c["cluster.snapshot_interval"] <= 0.1
    reseeded = load_sweep({"set": SMALL, "random": {**spec, "seed": 4}})
    assert [p.fields for p in reseeded.points] != combos
    assert [p.seed for p in sweep.points[:2]] == [42, 43]


def test_random_cannot_draw_more_distinct_points_than_exist():
    spec = {"samples": 5, "fields": {"policies.routing": {"choice": ["round-robin", "random"]}}}
    with pytest.raises(ScenarioError, match=r"random\.samples.*only 2 distinct combinations"):
        load_sweep({"set": SMALL, "random": spec})


def test_no_swept_field_runs_the_base_scenario_with_replicas():
    sweep = load_sweep({"set": SMALL, "replicas": 3})
    assert sweep.mode == "single" and sweep.fields == () and sweep.plot is None
    assert [p.seed for p in sweep.points] == [42, 43, 44]
    assert sweep.metrics == DEFAULT_METRICS


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "change, path, text",
    [
        ({"grid": {"workload.rat": [1, 2]}}, "grid.workload.rat", "did you mean 'rate'"),
        ({"grid": {"workload.rate": [10, -1]}}, "grid.workload.rate", "sweep point"),
        ({"grid": {}}, "grid", "empty"),
        ({"grid": {"workload.rate": []}}, "grid.workload.rate", "empty"),
        ({"grid": {"workload.rate": 10}}, "grid.workload.rate", "expected a list"),
        ({"grid": {"workload.rate": [10, 10]}}, "grid.workload.rate", "listed twice"),
        ({"grid": {"seed": [1, 2]}}, "grid.seed", "replicas"),
        ({"grid": {"cluster.instances": [1, 2]}}, "grid.cluster.instances", "also given in `set`"),
        ({"metrics": ["ttft_p99"]}, "metrics[0]", "did you mean 'ttft_p99_ms'"),
        ({"metrics": ["goodput"]}, "metrics[0]", "is a section"),
        ({"metrics": ["ttft_p99_ms.x"]}, "metrics[0]", "is a number"),
        ({"metrics": []}, "metrics", "non-empty list"),
        ({"replicas": -1}, "replicas", "at least 1"),
        ({"replicas": 0}, "replicas", "at least 1"),
        (
            {"random": {"samples": 2, "fields": {"workload.rate": {"uniform": [1, 2]}}}},
            "random",
            "either grid",
        ),
        ({"plot": {"x": "workload.rat"}}, "plot.x", "must be one of"),
        ({"plot": {"x": "workload.rate", "y": "nope"}}, "plot.y", "not a summary.json field"),
        ({"set": {"engine.block_sz": 16}}, "set.engine.block_sz", "did you mean 'block_size'"),
        ({"scenario": "missing.yaml"}, "scenario", "file not found"),
        ({"grids": {}}, "grids", "did you mean 'grid'"),
    ],
)
def test_invalid_sweeps_name_the_field(change, path, text):
    with pytest.raises(ScenarioError) as err:
        load_sweep(small_sweep(**change))
    assert err.value.path == path, str(err.value)
    assert text in str(err.value)


@pytest.mark.parametrize(
    "fields, path, text",
    [
        ({"workload.rate": {"normal": [1, 2]}}, "random.fields.workload.rate", "uniform"),
        ({"workload.rate": {"uniform": [5, 1]}}, "random.fields.workload.rate.uniform", "greater"),
        (
            {"workload.rate": {"loguniform": [0, 1]}},
            "random.fields.workload.rate.loguniform[0]",
            "",
        ),
        (
            {"engine.max_num_seqs": {"uniform": [8, 64]}},
            "random.fields.engine.max_num_seqs",
            "whole",
        ),
        ({}, "random.fields", "empty"),
    ],
)
def test_invalid_random_fields_name_the_field(fields, path, text):
    with pytest.raises(ScenarioError) as err:
        load_sweep({"set": SMALL, "random": {"samples": 2, "fields": fields}})
    assert err.value.path == path, str(err.value)
    assert text in str(err.value)


def test_a_bad_value_names_the_point_and_nothing_runs(tmp_path):
    sweep = {"set": SMALL, "grid": {"engine.max_num_seqs": [8, 0]}}
    (tmp_path / "bad.yaml").write_text(json.dumps(sweep), encoding="utf-8")
    args = parse(["sweep", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "out")])
    with pytest.raises(ScenarioError) as err:
        cmd_sweep(args)
    message = str(err.value)
    assert message.startswith("grid.engine.max_num_seqs: invalid value 0")
    assert re.search(r"sweep point [0-9a-f]{10}: engine.max_num_seqs=0\)", message)
    assert not (tmp_path / "out").exists()


def test_sweep_file_paths_are_relative_to_the_file_and_duplicate_keys_are_refused(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "seed: 5\nworkload: {preset: chatbot, rate: 10, requests: 30}\n", encoding="utf-8"
    )
    (tmp_path / "s.yaml").write_text(
        "scenario: base.yaml\ngrid: {workload.rate: [10, 20]}\n", encoding="utf-8"
    )
    sweep = load_sweep(tmp_path / "s.yaml")
    assert sweep.name == "s" and sweep.scenario == str(tmp_path / "base.yaml")
    assert [p.seed for p in sweep.points] == [5, 5]
    (tmp_path / "dup.yaml").write_text("replicas: 2\nreplicas: 3\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="given twice"):
        load_sweep(tmp_path / "dup.yaml")


# ---------------------------------------------------------------------- running


def test_run_point_is_the_scenario_run_with_the_overrides():
    import servesim

    overrides = {**SMALL, "workload.rate": 20, "seed": 3}
    result = run_point(None, overrides, ["ttft_p99_ms", "per_instance.1.requests"])
    expected = servesim.simulate(
        servesim.load_scenario(None, [f"{k}={v}" for k, v in overrides.items()])
    ).summary
    assert result["summary"] == expected
    assert result["metrics"] == {
        "ttft_p99_ms": expected["ttft_p99_ms"],
        "per_instance.1.requests": expected["per_instance"][1]["requests"],
    }
    assert metric_value(expected, "goodput.standard.slo_attainment") is None


def test_serial_and_process_backends_give_identical_results(tmp_path):
    sweep = load_sweep(small_sweep())
    serial = run_sweep(sweep, tmp_path / "serial", backend="serial", echo=quiet)
    pool = run_sweep(sweep, tmp_path / "pool", backend="process", workers=2, echo=quiet)
    assert serial.ran == pool.ran == 8 and not serial.failed and not pool.failed
    a, b = read_csv(tmp_path / "serial/points.csv"), read_csv(tmp_path / "pool/points.csv")
    assert without_wall(a) == without_wall(b) and len(a) == 8
    assert [r["point"] for r in a] == [p.id for p in sweep.points]
    assert {r["status"] for r in a} == {"ok"} and {r["completed_requests"] for r in a} == {"40"}
    for p in sweep.points:
        one = json.loads((tmp_path / "serial/points" / f"{p.id}.json").read_text())
        two = json.loads((tmp_path / "pool/points" / f"{p.id}.json").read_text())
        assert one["summary"] == two["summary"] and one["seed"] == p.seed
    # replicas differ, and the table's numbers are the summaries' exactly
    assert a[0]["ttft_p99_ms"] != a[1]["ttft_p99_ms"]
    first = json.loads((tmp_path / "serial/points" / f"{a[0]['point']}.json").read_text())
    assert float(a[0]["ttft_p99_ms"]) == first["summary"]["ttft_p99_ms"]


def test_resume_skips_finished_points_and_force_reruns_them(tmp_path):
    sweep = load_sweep(small_sweep())
    out = tmp_path / "out"
    first = run_sweep(sweep, out, backend="serial", echo=quiet)
    table = read_csv(out / "points.csv")
    lines: list[str] = []
    again = run_sweep(sweep, out, backend="serial", echo=lines.append)
    assert (again.ran, again.skipped) == (0, 8)
    assert "8 already finished (skipped), 0 to run" in lines[0]
    assert read_csv(out / "points.csv") == table  # wall times come from the saved points
    (out / "points" / f"{sweep.points[5].id}.json").unlink()
    partial = run_sweep(sweep, out, backend="serial", echo=quiet)
    assert (partial.ran, partial.skipped) == (1, 7)
    assert without_wall(read_csv(out / "points.csv")) == without_wall(table)
    forced = run_sweep(sweep, out, backend="serial", force=True, echo=quiet)
    assert (forced.ran, forced.skipped, first.ran) == (8, 0, 8)
    # a changed metric list needs no rerun: the saved summaries hold every field
    more = load_sweep(small_sweep(metrics=["ttft_p99_ms", "tokens_per_sec"]))
    assert run_sweep(more, out, backend="serial", echo=quiet).ran == 0
    assert "tokens_per_sec" in read_csv(out / "points.csv")[0]


def test_an_interrupted_sweep_keeps_what_finished_and_resumes(tmp_path, monkeypatch):
    import servesim.studies.sweep.backends as sweep_module

    real = sweep_module.run_point
    calls = []

    def interrupted_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(sweep_module, "run_point", interrupted_third)
    sweep = load_sweep(small_sweep())
    lines: list[str] = []
    run = run_sweep(sweep, tmp_path / "out", backend="serial", echo=lines.append)
    assert run.interrupted and run.ran == 2
    assert [r["point"] for r in read_csv(tmp_path / "out/points.csv")] == [
        p.id for p in sweep.points[:2]
    ]
    assert len(list((tmp_path / "out/points").glob("*.json"))) == 2
    assert any("run the same command again to resume" in line for line in lines)
    monkeypatch.setattr(sweep_module, "run_point", real)
    resumed = run_sweep(sweep, tmp_path / "out", backend="serial", echo=quiet)
    assert (resumed.ran, resumed.skipped, resumed.interrupted) == (6, 2, False)


def test_a_run_that_fails_is_recorded_with_its_message_and_the_others_run(tmp_path, fragile):
    spec = small_sweep(
        set={**SMALL, "policies.routing": fragile},
        grid={"workload.rate": [10, 40], "policies.routing.fail": ["none", "raise"]},
        replicas=1,
    )
    sweep = load_sweep(spec)  # valid: the router only breaks while running
    backends = ["serial", "process"] if FORK else ["serial"]
    for backend in backends:
        out = tmp_path / backend
        run = run_sweep(sweep, out, backend=backend, workers=2, echo=quiet)
        rows = read_csv(out / "points.csv")
        assert [r["status"] for r in rows] == ["ok", "failed", "ok", "failed"]
        assert rows[1]["error"] == "RuntimeError: the router broke at decision 10"
        assert rows[1]["ttft_p99_ms"] == "" and rows[0]["completed_requests"] == "40"
        assert run.failed == 2 and run.ran == 4
        failed = sweep.points[1].id
        assert "Traceback" in (out / "points" / f"{failed}.error.txt").read_text()
        assert not (out / "points" / f"{failed}.json").exists()
        again = run_sweep(sweep, out, backend="serial", echo=quiet)  # failures are retried
        assert (again.ran, again.skipped, again.failed) == (2, 2, 2)


@pytest.mark.skipif(not FORK, reason="pool workers must inherit the test router (fork)")
def test_a_worker_that_dies_fails_only_its_own_point(tmp_path, fragile):
    spec = small_sweep(
        set={**SMALL, "policies.routing": fragile},
        grid={"policies.routing.fail": ["none", "exit"], "workload.rate": [10, 20]},
        replicas=1,
    )
    sweep = load_sweep(spec)
    run = run_sweep(sweep, tmp_path / "out", backend="process", workers=2, echo=quiet)
    rows = read_csv(tmp_path / "out/points.csv")
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "failed"]
    assert all("the worker process died" in r["error"] for r in rows[2:])
    assert run.failed == 2 and not run.interrupted


def test_a_pool_broken_before_a_submit_hands_back_a_lost_point_not_an_exception():
    """A worker can die between the runner's wait and its next submit (seen under load): the
    submit into the broken pool must come back as a lost point, which the runner runs again."""
    import concurrent.futures

    from servesim.studies.sweep.backends import _Lost, _PoolBackend

    class BrokenExecutor:
        def submit(self, *args, **kwargs):
            raise concurrent.futures.process.BrokenProcessPool("a child process terminated")

    backend = _PoolBackend.__new__(_PoolBackend)
    backend.executor = BrokenExecutor()
    backend.job = lambda point: (point,)
    handle = backend.submit("point-0")
    assert backend.wait([handle]) == [handle]
    with pytest.raises(_Lost, match="a child process terminated"):
        backend.outcome(handle)


def test_a_metric_missing_from_a_summary_is_a_blank_cell_with_a_note(tmp_path):
    sweep = load_sweep(
        small_sweep(replicas=1, metrics=["ttft_p99_ms", "goodput.standard.slo_attainment"])
    )
    lines: list[str] = []
    run_sweep(sweep, tmp_path / "out", backend="serial", echo=lines.append)
    assert {
        r["goodput.standard.slo_attainment"] for r in read_csv(tmp_path / "out/points.csv")
    } == {""}
    assert any("goodput.standard.slo_attainment (4 of 4 points)" in line for line in lines)
    with_slo = small_sweep(
        replicas=1,
        set={**SMALL, "slo": {"standard": {"ttft": "100ms"}}},
        metrics=["goodput.standard.slo_attainment"],
    )
    run_sweep(load_sweep(with_slo), tmp_path / "slo", backend="serial", echo=quiet)
    values = [
        float(r["goodput.standard.slo_attainment"]) for r in read_csv(tmp_path / "slo/points.csv")
    ]
    assert all(0 <= v <= 1 for v in values) and len(values) == 4


def test_a_directory_that_is_not_a_sweep_is_refused(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ScenarioError, match="--out.*not a sweep results directory"):
        run_sweep(load_sweep(small_sweep()), tmp_path / "other", backend="serial", echo=quiet)


# ---------------------------------------------------------------------- outputs


def test_the_plot_and_the_resolved_sweep_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    sweep = load_sweep(small_sweep(plot={"x": "workload.rate", "y": "e2e_p50_ms"}))
    run = run_sweep(sweep, tmp_path / "out", backend="serial", echo=quiet)
    png = (tmp_path / "out/plot.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert tmp_path / "out/plot.png" in run.files
    again = load_sweep(tmp_path / "out/sweep.yaml")
    assert [p.id for p in again.points] == [p.id for p in sweep.points]
    assert again.plot.group == ("policies.routing",)


def test_without_matplotlib_or_pyarrow_the_table_is_still_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    lines: list[str] = []
    run = run_sweep(
        load_sweep(small_sweep(replicas=1)), tmp_path / "out", backend="serial", echo=lines.append
    )
    assert [p.name for p in run.files] == ["points.csv", "sweep.yaml"]
    assert any("matplotlib is not installed" in line for line in lines)
    assert any("pyarrow is not installed" in line for line in lines)


def test_parquet_matches_the_csv(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    run_sweep(load_sweep(small_sweep()), tmp_path / "out", backend="serial", echo=quiet)
    table = pq.read_table(tmp_path / "out/points.parquet").to_pylist()
    rows = read_csv(tmp_path / "out/points.csv")
    assert [r["point"] for r in table] == [r["point"] for r in rows]
    assert [repr(r["ttft_p99_ms"]) for r in table] == [r["ttft_p99_ms"] for r in rows]


# ---------------------------------------------------------------------- Ray


def test_ray_backend_gives_the_serial_results(tmp_path):
    ray = pytest.importorskip("ray")
    sweep = load_sweep(small_sweep(replicas=1))
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        run_sweep(sweep, tmp_path / "ray", backend="ray", echo=quiet)
    finally:
        ray.shutdown()
    run_sweep(sweep, tmp_path / "serial", backend="serial", echo=quiet)
    assert without_wall(read_csv(tmp_path / "ray/points.csv")) == without_wall(
        read_csv(tmp_path / "serial/points.csv")
    )


def test_without_ray_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ScenarioError) as err:
        run_sweep(load_sweep(small_sweep()), tmp_path / "out", backend="ray", echo=quiet)
    assert err.value.path == "--backend" and "pip install 'servesim[ray]'" in str(err.value)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- command line


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="servesim")
    add_sweep_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_command_line_runs_resumes_and_reports(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(json.dumps(small_sweep(replicas=1)), encoding="utf-8")
    argv = ["sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")]
    args = parse([*argv, "--backend", "serial"])
    assert args.handler is cmd_sweep and args.backend == "serial" and args.workers is None
    assert cmd_sweep(args) == 0
    out = capsys.readouterr().out
    assert "small: 4 points (4 combinations x 1 replica); 0 already finished" in out
    assert re.search(
        r"\[1/4\] [0-9a-f]{10} workload.rate=10 policies.routing=round-robin seed=42: ttft_p99_ms ",
        out,
    )
    assert re.search(r"workload.rate +policies.routing +ok +ttft_p99_ms", out)
    assert re.search(r"\n40 +least-loaded +1/1 +[\d.]+ +\d+ +40\n", out)
    assert cmd_sweep(parse([*argv, "--dry-run"])) == 0
    listing = capsys.readouterr().out
    assert "4 finished in" in listing and listing.count("(finished)") == 4
    with pytest.raises(ScenarioError, match="--ray-address"):
        cmd_sweep(parse([*argv, "--ray-address", "auto"]))
    with pytest.raises(ScenarioError, match="--workers"):
        cmd_sweep(parse([*argv, "--workers", "0"]))
    with pytest.raises(SystemExit):
        parse([*argv, "--backend", "threads"])


# ---------------------------------------------------------------------- the example


def test_the_example_sweep_shows_what_its_comments_say(tmp_path, capsys):
    args = parse(["sweep", str(EXAMPLES / "sweep-rate.yaml"), "--out", str(tmp_path / "out")])
    assert cmd_sweep(args) == 0
    rows = read_csv(tmp_path / "out/points.csv")
    assert len(rows) == 24 and {r["status"] for r in rows} == {"ok"}

    def mean(rate: str, routing: str, metric: str = "ttft_p99_ms") -> float:
        values = [
            float(r[metric])
            for r in rows
            if r["workload.rate"] == rate and r["policies.routing"] == routing
        ]
        assert len(values) == 2
        return sum(values) / 2

    for rate in ("30", "40"):
        for load_only in ("round-robin", "least-loaded"):
            assert mean(rate, "weighted") * 4 < mean(rate, load_only)
            assert mean(rate, load_only, "preemption_count") > 50
    assert mean("10", "weighted") < 300 and mean("10", "round-robin") < 300
    assert (tmp_path / "out/plot.png").exists() or "matplotlib" in capsys.readouterr().out


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(x) for x in text)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_killed_sweep_leaves_no_worker_running(tmp_path, how):
    import signal
    import subprocess
    import time

    sweep = small_sweep(
        set={"workload.requests": 3000, "cluster.instances": 2},
        grid={"workload.rate": [10, 20, 30, 40, 50, 60]},
        replicas=1,
    )
    file = tmp_path / "sweep.yaml"
    file.write_text(yaml.safe_dump(sweep), encoding="utf-8")
    servesim = Path(sys.executable).with_name("servesim")
    driver = subprocess.Popen(
        [
            str(servesim),
            "sweep",
            str(file),
            "--backend",
            "process",
            "--workers",
            "2",
            "--out",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.1)
            workers = (
                [p for p in _children(driver.pid) if _alive(p)] if driver.poll() is None else []
            )
        assert len(workers) >= 2, "the sweep never started its workers"
        driver.send_signal(getattr(signal, how))
        driver.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers)
    finally:
        if driver.poll() is None:
            driver.kill()


def test_a_sweep_can_tabulate_the_scenarios_fitness():
    from servesim.studies.sweep.metrics import check_metric, metric_value

    assert check_metric("fitness", "metrics[0]") == "fitness"
    assert metric_value({"fitness": 0.5}, "fitness") == 0.5
    assert metric_value({}, "fitness") is None
