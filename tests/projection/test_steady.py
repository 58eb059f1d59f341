"""The steady-state arithmetic of one instance, against closed forms it must reproduce.

With blackbox coefficients ``β = (b0, b1, b2)`` a step costs ``b0 + b1·prefill tokens + b2·decode
requests``, so (constant lengths, prompts that fit one chunk) a prompt adds ``W = b1·P`` of work,
a decoding request sees ``N + 1`` decoders and the fixed point is solvable by hand::

    T = (b0 + b2·(λ·(O−1)·T + 1)) / (1 − λ·W)   ⇒   T = (b0 + b2) / (1 − λ·(b1·P + b2·(O−1)))
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from servesim.projection import project
from servesim.projection.project import _latency_model
from servesim.projection.steady import InstanceLimits, StepModel, steady_state
from servesim.projection.workload import workload_moments
from servesim.scenario import load_scenario
from tests.conftest import scenario_dict


def _model(**kw) -> StepModel:
    s = load_scenario(scenario_dict(**kw))
    spec = s.instance_specs[0]
    return StepModel(
        _latency_model(s, spec, "latency"),
        InstanceLimits.of(spec.engine),
        workload_moments(s.workload, spec.engine),
    )


BASE = dict(
    input=100,
    output=51,
    beta=(1000, 1, 10),
    kv_blocks=100_000,
    block_size=16,
    max_num_seqs=256,
    max_num_batched_tokens=4096,
)


def test_the_blackbox_fixed_point_matches_its_closed_form():
    m = _model(**BASE)
    lam = 500 / 1e6  # per µs
    s = steady_state(m, 500.0)
    expected = (1000 + 10) / (1 - lam * (1 * 100 + 10 * 50))  # 1442.857... µs
    assert s.sustainable
    assert s.step_us == pytest.approx(expected, rel=1e-6)
    assert s.tpot_us == pytest.approx(expected, rel=1e-6)  # α2 = 0
    assert s.decode_batch == pytest.approx(lam * 50 * expected, rel=1e-6)
    # Little's law over the whole stay
    assert s.in_system == pytest.approx(lam * s.e2e_us)
    assert s.e2e_us == pytest.approx(s.ttft_us + 50 * s.tpot_us)


def test_the_max_rate_is_where_the_decode_batch_reaches_max_num_seqs():
    """Unbounded utilisation would allow λ → 1/600 per µs; the 256 sequence slots bind first:
    N = λ·50·T = 256 at λ ≈ 1254 req/s (running prefills take a few slots more)."""
    p = project(load_scenario(scenario_dict(**BASE, rate=500.0, requests=100)))
    g = p.groups[0]
    assert 1200 < g.max_rate <= 256 / (50 * 1010 + 256 * 600) * 1e6
    assert g.max_rate_limit.startswith("max_num_seqs")
    m = _model(**BASE)
    assert steady_state(m, g.max_rate * 0.999).sustainable
    assert not steady_state(m, g.max_rate * 1.01).sustainable


def test_a_token_budget_smaller_than_the_prefill_demand_is_the_limit():
    kw = {**BASE, "input": 2000, "output": 5, "max_num_batched_tokens": 256}
    p = project(load_scenario(scenario_dict(**kw, rate=10.0, requests=100)))
    assert p.groups[0].max_rate_limit.startswith("token budget")


def test_a_small_kv_cache_is_the_limit():
    kw = {**BASE, "input": 1000, "output": 400, "kv_blocks": 2000}
    p = project(load_scenario(scenario_dict(**kw, rate=10.0, requests=100)))
    assert p.groups[0].max_rate_limit.startswith("kv cache")
    assert p.groups[0].concurrency_limit == int(2000 * 16 // (p.workload.decode_context + 9))


def test_an_unsustainable_rate_has_no_latencies_but_throughput_at_the_max():
    p = project(load_scenario(scenario_dict(**BASE, rate=5000.0, requests=100)))
    d = p.to_dict()
    assert not d["sustainable"] and d["tpot_mean_ms"] is None and d["ttft_mean_ms"] is None
    assert d["responses_per_sec"] == pytest.approx(p.max_rate)
    assert d["limit"] == d["max_rate_limit"]


def test_the_rate_is_split_evenly_over_instances():
    one = project(load_scenario(scenario_dict(**BASE, rate=500.0, requests=100)))
    two = project(load_scenario(scenario_dict(**BASE, rate=1000.0, requests=100, instances=2)))
    assert two.groups[0].state.step_us == pytest.approx(one.groups[0].state.step_us)
    assert two.max_rate == pytest.approx(2 * one.max_rate)


def test_a_shared_prefix_is_not_recomputed_with_prefix_caching():
    kw = {**BASE, "input": 100, "prefix": {"tokens": 400, "groups": 2}}
    cached = project(load_scenario(scenario_dict(**kw, rate=200.0, requests=100)))
    plain = project(
        load_scenario(scenario_dict(**kw, rate=200.0, requests=100, enable_prefix_caching=False))
    )
    assert cached.workload.computed == pytest.approx(100)
    assert plain.workload.computed == pytest.approx(500)
    assert cached.groups[0].state.ttft_us < plain.groups[0].state.ttft_us


@settings(max_examples=40, deadline=None)
@example(b0=200, b1=0.5, b2=1.5, prompt=17, output=2, load=0.5)  # F jumps over the diagonal
@given(
    b0=st.integers(200, 20_000),
    b1=st.floats(0.05, 3.0),
    b2=st.floats(1.0, 200.0),
    prompt=st.integers(16, 1500),
    output=st.integers(2, 400),
    load=st.floats(0.05, 0.95),
)
def test_the_solution_is_a_fixed_point_and_latency_grows_with_load(
    b0, b1, b2, prompt, output, load
):
    m = _model(**{**BASE, "input": prompt, "output": output, "beta": (b0, b1, b2)})
    from servesim.projection.steady import max_sustainable_rate

    top, _ = max_sustainable_rate(m, 1.0)
    assert math.isfinite(top) and top > 0
    low, high = steady_state(m, top * load * 0.5), steady_state(m, top * load)
    assert low.sustainable and high.sustainable
    for s in (low, high):
        lam = s.rate / 1e6

        def excess(
            t: float, lam: float = lam
        ) -> float:  # F(T) - T: the solver finds its sign change
            work, _ = m.prefill(lam * (output - 1) * t)
            return m.decode(lam * (output - 1) * t + 1) / (1 - lam * work) - t

        # A fixed point F(T) = T, or the instant where F steps down across the diagonal (the
        # chunk count of a prompt's prefill changes with the decode batch, so F has jumps and
        # may have no exact fixed point; e.g. beta (200, 0.5, 1.5), 17-token prompts, 2 tokens
        # out, load 0.5): F - T changes sign at the solution.
        tol = 1e-5 * s.step_us
        assert excess(s.step_us) <= tol
        assert excess(s.step_us * (1 - 1e-6)) >= -tol
        assert s.decode_batch == pytest.approx(lam * (output - 1) * s.step_us)
    assert high.tpot_us >= low.tpot_us
    assert high.ttft_us >= low.ttft_us - 1e-6


def test_a_shared_prefix_is_held_once_per_group_in_the_kv_cache():
    kw = {**BASE, "input": 100, "output": 51, "prefix": {"tokens": 400, "groups": 3}}
    p = project(load_scenario(scenario_dict(**kw, rate=200.0, requests=100)))
    s, w = p.groups[0].state, p.workload
    assert w.shared_kv == 3 * 400
    per_request = w.decode_context - 400 + 1 + 16 / 2
    own = s.prefill_us * 200 / 1e6 * (w.prompt - 400)
    assert s.kv_tokens_used == pytest.approx(s.decode_batch * per_request + own + 1200)
