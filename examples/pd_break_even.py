"""When does splitting prefill and decode pay, and how much network does it need?

Four H100s serve qwen3-14b at 4 requests/s, 256 output tokens per request, prompts of L tokens.
Two fleets: 4 co-located instances, or 2 prefill + 2 decode instances whose KV caches move over
one shared link of bandwidth B. For each L (and each B for the split fleet) it prints TTFT p90,
ITL p99, E2E p50 and the share of requests meeting a chat SLO (TTFT ≤ 1 s and mean ITL ≤ 30 ms),
plus the link's offered load ρ = rate × L × KV bytes per token / B (ρ ≥ 1: the link cannot keep
up). The tables and the figure in docs/tutorial/disaggregation.md come from this script.

    python examples/pd_break_even.py                      # the tables
    python examples/pd_break_even.py --plot break-even.png   # and the figure (needs matplotlib)
    SERVESIM_EXAMPLE_REQUESTS=300 python examples/pd_break_even.py   # quick, smaller runs
"""

import argparse
import os

import servesim

RATE = 4  # requests per second
PROMPTS = (512, 2048, 4096, 8192)
BANDWIDTHS = ("1GB/s", "5GB/s", "25GB/s", "100GB/s")
REQUESTS = int(os.environ.get("SERVESIM_EXAMPLE_REQUESTS", "1000"))
SLO = "{standard: {ttft: 1s, itl: 30ms}}"


def run(prompt: int, bandwidth: str | None) -> dict:
    overrides = [
        "model=qwen3-14b",
        "gpu=H100",
        f"workload={{rate: {RATE}, requests: {REQUESTS}, input: {{type: constant, value: {prompt}}}, "
        "output: {type: constant, value: 256}}",
        f"slo={SLO}",
        "policies.routing=least-loaded",
    ]
    if bandwidth is None:
        overrides.append("cluster.instances=4")
    else:
        overrides += [
            "cluster.pools={prefill: {instances: 2}, decode: {instances: 2}}",
            f"cluster.kv_transfer={{bandwidth: {bandwidth}, topology: shared}}",
        ]
    scenario = servesim.load_scenario(None, overrides)
    s = servesim.simulate(scenario).summary  # audited: raises AuditError on a violation
    rho = None
    if bandwidth is not None:
        rate_bytes = scenario.pd.transfer.bandwidth_bytes_s
        block_bytes = scenario.instance_specs[0].engine.kv_block_bytes
        rho = RATE * prompt * block_bytes / scenario.engine.block_size / rate_bytes
    return {
        "ttft_p90": s["ttft_p90_ms"],
        "itl_p99": s["itl_p99_ms"],
        "e2e_p50": s["e2e_p50_ms"],
        "slo": s["goodput"]["standard"]["slo_attainment"],
        "rho": rho,
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description="co-located vs disaggregated serving")
    parser.add_argument("--plot", metavar="PNG", help="also draw the figure (needs matplotlib)")
    args = parser.parse_args()
    results = {}
    print(
        "| prompt | fleet | link load ρ | TTFT p90 (ms) | ITL p99 (ms) | E2E p50 (ms) | within SLO |"
    )
    print("|---|---|---|---|---|---|---|")
    for prompt in PROMPTS:
        for bandwidth in (None, *BANDWIDTHS):
            r = results[prompt, bandwidth] = run(prompt, bandwidth)
            fleet = "4 co-located" if bandwidth is None else f"2P + 2D, {bandwidth}"
            rho = "" if r["rho"] is None else f"{r['rho']:.2f}"
            print(
                f"| {prompt} | {fleet} | {rho} | {r['ttft_p90']:.0f} | {r['itl_p99']:.1f} "
                f"| {r['e2e_p50']:.0f} | {r['slo']:.0%} |"
            )
    if args.plot:
        plot(results, args.plot)
    return results


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = list(PROMPTS)
    for label, key, style in (("ITL p99", "itl_p99", "-"), ("TTFT p90", "ttft_p90", "--")):
        left.plot(
            x, [results[p, None][key] for p in x], f"k{style}o", label=f"4 co-located, {label}"
        )
        left.plot(
            x,
            [results[p, "25GB/s"][key] for p in x],
            f"C0{style}s",
            label=f"2P + 2D (25GB/s), {label}",
        )
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("prompt length (tokens)")
    left.set_ylabel("latency (ms)")
    left.set_title("Token stalls vs time to first token")
    left.legend(fontsize=8)
    for prompt in PROMPTS:
        rho = [results[prompt, b]["rho"] for b in BANDWIDTHS]
        e2e = [results[prompt, b]["e2e_p50"] / 1000 for b in BANDWIDTHS]
        right.plot(rho, e2e, "-o", label=f"L = {prompt}")
    right.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    right.text(1.05, right.get_ylim()[1] * 0.5, "link saturated (ρ = 1)", fontsize=8, color="grey")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("link load ρ = rate × prompt × KV bytes/token ÷ bandwidth")
    right.set_ylabel("E2E p50 (s)")
    right.set_title("2P + 2D: end-to-end latency vs link load")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
