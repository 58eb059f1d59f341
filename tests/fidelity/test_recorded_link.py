"""A replay prices its collectives on the GPU link the run records (LLMServingSim's config.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest

from servesim.fidelity import read_measured
from servesim.fidelity.recorded_link import GIB_IN_GB, has_collectives, recorded_link
from servesim.fidelity.replay import load_replay

RUN_DIR = Path(__file__).parent / "data" / "llmservingsim_run"


def test_the_link_is_read_from_llmservingsims_cluster_config():
    # config.json: "link_bw": 16 (GiB/s, ASTRA-Sim's unit), "link_latency": 20000 (ns per hop)
    gbs, latency_us, source = recorded_link(read_measured(RUN_DIR))
    assert gbs == pytest.approx(16 * 2**30 / 1e9)  # 17.18 GB/s
    assert latency_us == 20.0
    assert "config.json" in source and "16 GiB/s" in source


def test_a_reader_that_records_the_link_is_preferred():
    run = read_measured(RUN_DIR)
    run = attrs.evolve(
        run, extra={**run.extra, "link_gbs": 50.0, "link_latency_us": 3.0, "link_source": "log"}
    )
    assert recorded_link(run) == (50.0, 3.0, "log")


@pytest.mark.parametrize(
    "config",
    [
        {"num_nodes": 1, "nodes": []},  # no link given
        {"link_bw": [16, 100], "link_latency": 20000, "nodes": []},  # per-dimension: not one number
        {"link_bw": 0, "link_latency": 20000, "nodes": []},
        {"link_bw": 16, "link_latency": 20000},  # not a cluster config (no nodes)
        [1, 2],
    ],
)
def test_no_usable_link_is_none(tmp_path, config):
    run = read_measured(RUN_DIR)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert recorded_link(attrs.evolve(run, source=str(folder))) is None
    assert recorded_link(attrs.evolve(run, source=str(tmp_path / "missing"))) is None


def test_only_a_replay_with_collectives_uses_the_link():
    assert not has_collectives({"tp": 1, "engine": {}})
    assert has_collectives({"tp": 2, "engine": {}})
    assert has_collectives({"tp": 1, "engine": {"dp": 2, "ep": 2}})
    assert has_collectives({"tp": 1, "engine": {"pp": 2}})


def _two_gpu_run(tmp_path: Path) -> Path:
    """The fixture run, recorded on two GPUs with tensor parallelism."""
    folder = tmp_path / "tp2"
    shutil.copytree(RUN_DIR, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    instance = config["nodes"][0]["instances"][0]
    instance.update(num_npus=2, tp_size=2)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    meta = json.loads((folder / "vllm_meta.json").read_text(encoding="utf-8"))
    meta["engine_kwargs"]["tensor_parallel_size"] = 2
    (folder / "vllm_meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def test_a_tp2_replay_prices_its_all_reduces_on_the_recorded_link(tmp_path):
    run = read_measured(_two_gpu_run(tmp_path))
    trace = run.write_trace_csv(tmp_path / "t.csv")
    scenario, assumed = load_replay(run, trace, latency="trained-physics")
    params = scenario.latency.params
    assert params["interconnect_gbs"] == pytest.approx(16 * GIB_IN_GB, abs=1e-3)
    assert params["interconnect_latency_us"] == 20.0
    assert any("run's own GPU link" in a and "17.2 GB/s" in a for a in assumed)


def test_a_single_gpu_replay_or_a_given_interconnect_is_left_alone(tmp_path):
    run = read_measured(RUN_DIR)  # TP1: no collective crosses the link
    trace = run.write_trace_csv(tmp_path / "t.csv")
    scenario, assumed = load_replay(run, trace, latency="trained-physics")
    assert "interconnect_gbs" not in scenario.latency.params
    assert not any("GPU link" in a for a in assumed)
    two = read_measured(_two_gpu_run(tmp_path))
    trace = two.write_trace_csv(tmp_path / "t2.csv")
    given = {"latency": {"model": "trained-physics", "interconnect_gbs": 64.0}}
    scenario, assumed = load_replay(two, trace, overrides=given)
    assert scenario.latency.params["interconnect_gbs"] == 64.0
    assert "interconnect_latency_us" not in scenario.latency.params
    assert not any("GPU link" in a for a in assumed)
