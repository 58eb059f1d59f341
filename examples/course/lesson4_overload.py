"""Lesson 4 — flow control under overload: shedding the right requests.

90 requests/s of mixed SLO classes offered to two instances that serve about 60/s
(examples/flow-control-overload.yaml). Without flow control every request is routed: with FCFS
instances every class misses its SLO; priority scheduling saves the critical class but starves the
sheddable one. A gateway queue gated by a saturation detector turns the excess away — sheddable
requests first — and serves more requests within SLO.

    python examples/course/lesson4_overload.py                 # the table
    python examples/course/lesson4_overload.py --plot fig.png  # and the figure (matplotlib)
"""

import argparse
import os
from pathlib import Path

import servesim

SCENARIO = Path(__file__).resolve().parent.parent / "flow-control-overload.yaml"
REQUESTS = int(os.environ.get("SERVESIM_EXAMPLE_REQUESTS", "6000"))
CLASSES = ("critical", "standard", "sheddable")
VARIANTS = {
    "no flow control, FCFS": ["policies.flow_control=null", "policies.scheduler=fcfs"],
    "no flow control, priority": ["policies.flow_control=null"],
    "gateway, utilization": [],
    "gateway, concurrency": [
        "policies.flow_control.detector={name: concurrency, max_concurrency: 250}"
    ],
}


def main() -> dict:
    parser = argparse.ArgumentParser(description="flow control under overload")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args()
    out = {}
    print(
        "| cluster | class | completed | refused | TTFT p99 (ms) | within SLO | goodput, all classes (req/s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, overrides in VARIANTS.items():
        results = servesim.simulate(
            servesim.load_scenario(SCENARIO, [f"workload.requests={REQUESTS}", *overrides])
        )
        s = results.summary
        out[label] = s
        df = results.to_pandas()
        for cls in CLASSES:
            mine = df[df.slo_class == cls]
            refused = mine.status.isin(["rejected", "shed", "expired"]).sum()
            done = (mine.status == "completed").sum()
            c = s["per_class"][cls]
            g = s["goodput"][cls]
            total = sum(s["goodput"][k]["goodput_rps"] for k in CLASSES)
            print(
                f"| {label} | {cls} | {done} | {refused} | {c['ttft_p99_ms']:.0f} "
                f"| {g['slo_attainment']:.0%} | {total:.1f} |"
            )
    if args.plot:
        plot(out, args.plot)
    return out


def plot(out, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.2
    for k, (label, s) in enumerate(out.items()):
        xs = [i + k * width for i in range(len(CLASSES))]
        ax.bar(xs, [s["goodput"][c]["slo_attainment"] * 100 for c in CLASSES], width, label=label)
    ax.set_xticks([i + 1.5 * width for i in range(len(CLASSES))], CLASSES)
    ax.set_ylabel("requests within SLO (%)")
    ax.set_title("Overload: 90 req/s offered to a 60 req/s cluster")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
