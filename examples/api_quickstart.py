"""The Python API in a dozen lines: load a scenario, simulate it, read the results."""

from pathlib import Path

import numpy as np

import servesim

here = Path(__file__).parent
scenario = servesim.load_scenario(here / "default.yaml", overrides=["workload.requests=500"])
results = servesim.simulate(scenario)  # audited; raises servesim.AuditError on a broken invariant

s = results.summary  # the same dict as summary.json
print(f"{s['completed_requests']} requests, {s['tokens_per_sec']:.0f} output tok/s")
print(f"TTFT p50 {s['ttft_p50_ms']:.1f} ms, p99 {s['ttft_p99_ms']:.1f} ms")
print(f"ITL  p50 {s['itl_p50_ms']:.1f} ms, p99 {s['itl_p99_ms']:.1f} ms")

r = results.requests  # per-request numpy columns, times in integer µs
ttft_us = r["first_token_us"] - r["arrival_us"]
slowest = int(np.argmax(ttft_us))
print(f"slowest first token: request {r['id'][slowest]}, {ttft_us[slowest] / 1000:.1f} ms")

# A variant of the same scenario: dotted-path overrides, validated like the YAML.
smaller = scenario.replace(**{"engine.max_num_seqs": 32})
print(
    "max_num_seqs 32 -> TTFT p99", round(servesim.simulate(smaller).summary["ttft_p99_ms"], 1), "ms"
)
