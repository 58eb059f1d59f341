"""Lesson 3 — prefix affinity vs load balance.

Four instances, 16 system prompts of 2,048 tokens shared by all requests, caches that cannot hold
every prompt everywhere (examples/cluster-weighted.yaml). A router can spread load evenly, or send
each system prompt where it is already cached; the best routers do both.

    python examples/course/lesson3_affinity.py                 # the table
    python examples/course/lesson3_affinity.py --plot fig.png  # and the figure (matplotlib)
"""

import argparse
import os
from pathlib import Path

import servesim

SCENARIO = Path(__file__).resolve().parent.parent / "cluster-weighted.yaml"
REQUESTS = int(os.environ.get("SERVESIM_EXAMPLE_REQUESTS", "2000"))
ROUTERS = {
    "round-robin": "round-robin",
    "least-loaded": "least-loaded",
    "prefix only": "{name: weighted, scorers: {precise-prefix-cache: 1}}",
    "prefix 2 + load 1 + KV 1": (
        "{name: weighted, scorers: {precise-prefix-cache: 2, queue-depth: 1, kv-utilization: 1}}"
    ),
}


def main() -> dict:
    parser = argparse.ArgumentParser(description="prefix affinity vs load balance")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args()
    out = {}
    print(
        "| router | prefix hit rate | load imbalance | TTFT p50 (ms) | TTFT p99 (ms) | preemptions |"
    )
    print("|---|---|---|---|---|---|")
    for label, routing in ROUTERS.items():
        s = servesim.simulate(
            servesim.load_scenario(
                SCENARIO, [f"workload.requests={REQUESTS}", f"policies.routing={routing}"]
            )
        ).summary
        out[label] = s
        print(
            f"| {label} | {s['cache_hit_rate']:.1%} | {s['load_imbalance']:.2f} "
            f"| {s['ttft_p50_ms']:.0f} | {s['ttft_p99_ms']:.0f} | {s['preemption_count']} |"
        )
    if args.plot:
        plot(out, args.plot)
    return out


def plot(out, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, s in out.items():
        ax.scatter(s["cache_hit_rate"] * 100, s["ttft_p99_ms"], s=60, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("prefix-cache hit rate (%)")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_title("Prefix affinity vs load balance (4 instances)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
