"""Lesson 1 — queueing vs batching: why latency explodes near saturation.

One H100 serves qwen3-14b requests of exactly 256 prompt and 64 output tokens. First with
max_num_seqs = 1: the server takes one request at a time and every request needs the same
service time S, so it is an M/D/1 queue, whose mean wait is Pollaczek–Khinchine's
W = ρ·S / (2·(1 − ρ)) at load ρ = λ·S. Then the same server with continuous batching
(max_num_seqs = 256): the batch grows with the load, so each request's service slows down a
little but the server's capacity grows a lot.

    python examples/course/lesson1_queueing.py                 # the table
    python examples/course/lesson1_queueing.py --plot fig.png  # and the figure (matplotlib)
"""

import argparse
import os

import servesim

REQUESTS = int(os.environ.get("SERVESIM_EXAMPLE_REQUESTS", "20000"))
LOADS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
BASE = [
    "workload={rate: 1, requests: 1, input: {type: constant, value: 256}, "
    "output: {type: constant, value: 64}}",
]


def run(*overrides: str):
    return servesim.simulate(servesim.load_scenario(None, [*BASE, *overrides]))


def wait_ms(results) -> float:
    """Mean time in the instance's wait queue: from entering it to the first scheduled step."""
    r = results.requests
    return float((r["first_scheduled_us"] - r["enqueue_us"]).mean()) / 1000.0


def main() -> dict:
    parser = argparse.ArgumentParser(description="queueing vs batching")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args()
    one = "engine.max_num_seqs=1"
    # One request alone: the server is busy S for it, and it waits only the latency model's fixed
    # α queueing delay (request parsing before the wait queue), which is not a queue
    alone = run(one)
    service_ms = alone.record.instances[0]["busy_us"] / 1000.0
    rows = []
    print(f"service time S = {service_ms:.1f} ms, capacity 1/S = {1000 / service_ms:.2f} req/s")
    print("| load ρ | rate (req/s) | mean wait, M/D/1 formula at the realised load (ms) "
          "| simulated, max_num_seqs 1 (ms) | simulated, max_num_seqs 256 (ms) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for rho in LOADS:
        rate = rho * 1000 / service_ms
        load = [
            f"workload.rate={rate}",
            f"workload.requests={REQUESTS}",
            "workload.arrival=poisson",
        ]
        sim = run(one, *load)
        single = wait_ms(sim)
        # the formula at the load this sample of Poisson arrivals really offered
        arrivals = sim.requests["arrival_us"]
        realised = (len(arrivals) - 1) / ((arrivals.max() - arrivals.min()) / 1000.0) * service_ms
        formula = realised * service_ms / (2 * (1 - realised))
        batched = wait_ms(run(*load))
        rows.append((rho, rate, formula, single, batched))
        print(f"| {rho:.2f} | {rate:.2f} | {formula:.1f} | {single:.1f} | {batched:.1f} |")
    if args.plot:
        plot(rows, service_ms, args.plot)
    return {"service_ms": service_ms, "rows": rows}


def plot(rows, service_ms, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    rho = [r[0] for r in rows]
    ax.plot(rho, [r[2] for r in rows], "k-", label="M/D/1 formula ρS/2(1−ρ)")
    ax.plot(rho, [r[3] for r in rows], "o", label="simulated, max_num_seqs = 1")
    ax.plot(rho, [r[4] for r in rows], "s-", label="simulated, continuous batching")
    ax.set_yscale("log")
    ax.set_xlabel("load ρ = rate × S (S = service time of one request alone)")
    ax.set_ylabel("mean wait before first scheduled (ms)")
    ax.set_title(f"Queueing vs batching (S = {service_ms:.0f} ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
