"""Every built-in routing policy on one workload: the tables in docs/howto/route-requests.md.

Runs examples/cluster-weighted.yaml (4 instances, 16 shared system prompts, a tight KV cache)
once per routing policy and prints a Markdown table; then shows how the freshness of the
router's load signals (cluster.snapshot_interval, 50 ms in the scenario) changes the two
load-aware policies.

    python examples/compare_routers.py
    SERVESIM_EXAMPLE_REQUESTS=600 python examples/compare_routers.py    # a quick, smaller run
"""

import os
from pathlib import Path

import servesim

SCENARIO = Path(__file__).parent / "cluster-weighted.yaml"
REQUESTS = os.environ.get("SERVESIM_EXAMPLE_REQUESTS")  # unset: the scenario's 4,000

LOAD_ONLY = "{name: weighted, scorers: {queue-depth: 1, kv-utilization: 1}}"
ROUTERS = {  # label -> the value of policies.routing
    "round-robin": "round-robin",
    "random": "random",
    "least-loaded": "least-loaded",
    "weighted: queue-depth 1, kv-utilization 1": LOAD_ONLY,
    "weighted: precise-prefix-cache 2, queue-depth 1, kv-utilization 1": (
        "{name: weighted, scorers: {precise-prefix-cache: 2, queue-depth: 1, kv-utilization: 1}}"
    ),
    "weighted: prefix-affinity 2, queue-depth 1, kv-utilization 1": (
        "{name: weighted, scorers: {prefix-affinity: 2, queue-depth: 1, kv-utilization: 1}}"
    ),
    "always-busiest": "always-busiest",
}
COLUMNS = "TTFT p50 (ms) | TTFT p99 (ms) | E2E p50 (ms) | cache hit rate | preemptions |"


def run(*overrides: str) -> dict:
    extra = [f"workload.requests={REQUESTS}"] if REQUESTS else []
    scenario = servesim.load_scenario(SCENARIO, overrides=[*extra, *overrides])
    return servesim.simulate(scenario).summary  # audited: raises AuditError on a violation


def cells(s: dict) -> str:
    return (
        f"{s['ttft_p50_ms']:.1f} | {s['ttft_p99_ms']:.1f} | {s['e2e_p50_ms']:.1f} "
        f"| {s['cache_hit_rate']:.1%} | {s['preemption_count']} |"
    )


results = {label: run(f"policies.routing={routing}") for label, routing in ROUTERS.items()}
print(f"| Routing policy | {COLUMNS}")
print("|---|---|---|---|---|---|")
for label, summary in results.items():
    print(f"| `{label}` | {cells(summary)}")

print()
print(f"| Routing policy | `snapshot_interval` | {COLUMNS}")
print("|---|---|---|---|---|---|---|")
for label in ("least-loaded", "weighted: queue-depth 1, kv-utilization 1"):
    for interval in ("0", "50ms", "1s"):
        if interval == "50ms":  # the scenario's own setting: the run above
            summary = results[label]
        else:
            summary = run(
                f"policies.routing={ROUTERS[label]}", f"cluster.snapshot_interval={interval}"
            )
        print(f"| `{label}` | {interval} | {cells(summary)}")
