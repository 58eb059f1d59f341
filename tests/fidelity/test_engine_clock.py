"""A run timed on the engine's clock is replayed without the front end's overheads."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest

from servesim.fidelity import read_measured
from servesim.fidelity.replay import load_replay, simulate_run
from servesim.latency.trained import default_coefficients

RUN_DIR = Path(__file__).parent / "data" / "llmservingsim_run"


def test_llmservingsim_runs_are_timed_on_the_engine_clock():
    # vLLM v1's queued_ts .. last_token_ts are the engine's; a CSV's times are the client's
    assert read_measured(RUN_DIR).clock == "engine"
    assert read_measured(Path(__file__).parent / "data" / "validate-tiny.csv").clock == "client"


def test_an_unknown_clock_is_refused():
    run = read_measured(RUN_DIR)
    with pytest.raises(ValueError, match="clock"):
        attrs.evolve(run, clock="wall")


def _latency_section(run, tmp_path, **kwargs):
    trace = run.write_trace_csv(tmp_path / "t.csv")
    scenario, assumed = load_replay(run, trace, latency="trained-physics", **kwargs)
    return scenario.latency.params, assumed


def test_the_engine_clock_drops_trained_physics_frontend_alphas(tmp_path):
    run = read_measured(RUN_DIR)
    section, assumed = _latency_section(run, tmp_path)
    assert section["alpha"] == [0, 0, 0]
    assert any("front-end overheads off" in a and "15.6 ms" in a for a in assumed)
    # on the client's clock the bundled alphas stay (the front end is inside the measured times)
    client = attrs.evolve(run, clock="client")
    section, assumed = _latency_section(client, tmp_path)
    assert "alpha" not in section
    assert not any("front-end" in a for a in assumed)


def test_a_given_alpha_is_kept_on_the_engine_clock(tmp_path):
    run = read_measured(RUN_DIR)
    trace = run.write_trace_csv(tmp_path / "t.csv")
    scenario, assumed = load_replay(
        run, trace, overrides={"latency": {"model": "trained-physics", "alpha": [1000, 0, 0]}}
    )
    assert scenario.latency.params["alpha"] == [1000, 0, 0]
    assert not any("front-end" in a for a in assumed)


def test_dropping_alpha0_shortens_every_ttft_by_it():
    # α0 only delays the arrival at the queue: with one request at a time, each TTFT differs
    # by exactly α0 plus α2 (the first token's streaming)
    run = read_measured(RUN_DIR)
    engine, _ = simulate_run(run)
    client, _ = simulate_run(attrs.evolve(run, clock="client"))
    a0, _, a2 = (int(x) for x in default_coefficients()[0])
    gap = (client.requests["first_token_us"] - client.requests["arrival_us"]) - (
        engine.requests["first_token_us"] - engine.requests["arrival_us"]
    )
    assert np.all(gap == a0 + a2)
