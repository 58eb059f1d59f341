"""Lesson 2 — the KV-cache cliff and preemption.

The default chatbot load (qwen3-14b on one H100, 20 req/s) with the KV cache shrunk step by
step. While the cache holds the running batch, latency does not care about its size; once it
does not, the engine preempts requests (evicts their KV and recomputes it later) and latency
falls off a cliff.

    python examples/course/lesson2_kv_cliff.py                 # the table
    python examples/course/lesson2_kv_cliff.py --plot fig.png  # and the figure (matplotlib)
"""

import argparse
import os

import servesim

REQUESTS = int(os.environ.get("SERVESIM_EXAMPLE_REQUESTS", "2000"))
BLOCKS = (600, 800, 1000, 1200, 1600, 2400, 4000)  # of 16 tokens; an H100 gives 18,006


def main() -> list:
    parser = argparse.ArgumentParser(description="the KV-cache cliff")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args()
    rows = []
    print(
        "| KV blocks | KV peak | preemptions | preempted requests | TTFT p99 (ms) | E2E p50 (ms) | E2E p99 (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for blocks in BLOCKS:
        s = servesim.simulate(
            servesim.load_scenario(
                None,
                [
                    "workload.rate=20",
                    f"workload.requests={REQUESTS}",
                    f"engine.kv_blocks={blocks}",
                    "engine.max_model_len=8192",
                ],
            )
        ).summary
        rows.append((blocks, s))
        print(
            f"| {blocks} | {s['kv_utilization_peak']:.0%} | {s['preemption_count']} "
            f"| {s['preempted_requests']} | {s['ttft_p99_ms']:.0f} | {s['e2e_p50_ms']:.0f} "
            f"| {s['e2e_p99_ms']:.0f} |"
        )
    if args.plot:
        plot(rows, args.plot)
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    blocks = [b for b, _ in rows]
    ax.plot(blocks, [s["e2e_p99_ms"] / 1000 for _, s in rows], "o-", label="E2E p99")
    ax.plot(blocks, [s["e2e_p50_ms"] / 1000 for _, s in rows], "s-", label="E2E p50")
    ax.set_xlabel("KV cache size (blocks of 16 tokens)")
    ax.set_ylabel("latency (s)")
    ax.set_title("The KV-cache cliff: qwen3-14b, H100, chatbot at 20 req/s")
    twin = ax.twinx()
    twin.bar(blocks, [s["preemption_count"] for _, s in rows], width=120, alpha=0.3, color="C3")
    twin.set_ylabel("preemptions (bars)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
