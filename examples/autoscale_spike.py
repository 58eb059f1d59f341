"""The spike of examples/autoscale-spike.yaml, served by the autoscaled fleet and by fixed ones.

Prints the autoscaler's scale events, then one row per fleet: the TTFT it gave and the
GPU-hours it used (a fixed fleet holds its GPUs for the whole run).
"""

from pathlib import Path

import servesim

HERE = Path(__file__).resolve().parent
scenario = servesim.load_scenario(HERE / "autoscale-spike.yaml")

auto = servesim.simulate(scenario)
scaling = auto.summary["autoscaling"]
print("scale events (instance: state changes)")
for event in scaling["events"]:
    if event["time_s"] > 0:
        print(f"  {event['time_s']:7.1f} s  instance {event['instance']}: {event['state']}")
print()
print(f"{'fleet':<22} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'GPU-hours':>10}")


def row(name: str, summary: dict, gpu_hours: float) -> None:
    print(
        f"{name:<22} {summary['ttft_p50_ms']:>12.0f} {summary['ttft_p99_ms']:>12.0f} "
        f"{gpu_hours:>10.3f}"
    )


row("autoscaled (2-6)", auto.summary, scaling["gpu_hours"])
for n in (2, 6):
    fixed = servesim.simulate(
        scenario.replace(**{"cluster.autoscaling": False, "cluster.instances": n})
    )
    row(f"fixed {n} instances", fixed.summary, n * fixed.summary["sim_duration_s"] / 3600)
print(f"autoscaled cost: ${scaling['cost_usd']:.2f} at ${scaling['cost_per_gpu_hour']:g}/GPU-hour")
