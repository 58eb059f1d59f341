"""Replaying Mooncake hash ids gives the prefix-cache hit rate the ids imply."""

from __future__ import annotations

import pytest

from servesim import load_scenario, simulate
from servesim.workloads.traces import TraceWorkload, block_reuse


@pytest.mark.parametrize("name", ["mooncake-synthetic", "mooncake-conv"])
def test_an_unbounded_cache_hits_every_repeated_block_of_the_trace(name):
    """With 512-token KV blocks (one per hash id) and a cache that never evicts, a request's
    prompt hits exactly the leading blocks an earlier request already computed. Mooncake's ids
    are prefix-chained, so those are all its repeated ids — except that a fully repeated prompt
    still recomputes its last block (vLLM recomputes the last token) — and each request counts
    the blocks it computes itself once."""
    requests = 400
    data = {
        "model": "llama-3.1-8b",
        "latency": {"model": "blackbox", "alpha": [0, 0, 0], "beta": [1000, 0.01, 1]},
        "engine": {
            "block_size": 512,
            "kv_blocks": 200_000,
            "max_model_len": 200_000 * 512,
            "max_num_batched_tokens": 1 << 20,
        },
        "workload": {"trace": name, "requests": requests},
    }
    scenario = load_scenario(data)
    specs = list(TraceWorkload.from_config(data["workload"]).requests())
    expected_blocks = 0
    seen: set[int] = set()
    for spec in specs:
        full = spec.prompt_tokens // 512
        hits = 0
        for segment, _ in spec.segments[:full]:
            if segment not in seen:
                break
            hits += 1
        if hits == full and spec.prompt_tokens % 512 == 0:
            hits -= 1  # the last token is always recomputed
        expected_blocks += hits
        seen.update(segment for segment, _ in spec.segments[:full])
    results = simulate(scenario)
    cached = int(results.requests["cached_tokens"].sum())
    assert cached == expected_blocks * 512
    # not a vacuous match: the replayed slice of the trace does reuse blocks
    assert expected_blocks > 0 and block_reuse(specs) > 0.01
