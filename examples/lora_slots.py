"""examples/lora-adapters.yaml with the Python API: how many GPU slots (max_loras) and which
router the eight adapters need.

Prints one row per variant: the adapter loads, the load time the steps paid, and the TTFT of
the hottest adapter and of the coldest.
"""

from pathlib import Path

import servesim

HERE = Path(__file__).resolve().parent
scenario = servesim.load_scenario(HERE / "lora-adapters.yaml")
AFFINITY = {"name": "weighted", "scorers": {"adapter-affinity": 2, "queue-depth": 1}}
QUEUE = {"name": "weighted", "scorers": {"queue-depth": 1}}

print(
    f"{'max_loras':>9} {'routing':<17} {'loads':>6} {'load ms':>8} {'sql p99':>9} {'math p99':>9}"
)
for slots, routing, name in (
    (4, AFFINITY, "adapter-affinity"),
    (4, QUEUE, "queue-depth"),
    (2, AFFINITY, "adapter-affinity"),
    (8, QUEUE, "queue-depth"),
):
    variant = scenario.replace(
        **{
            "engine.lora.max_loras": slots,
            "engine.lora.max_cpu_loras": 8,
            "policies.routing": routing,
        }
    )
    s = servesim.simulate(variant).summary
    hot, cold = s["by_adapter"]["sql"], s["by_adapter"]["math"]
    print(
        f"{slots:>9} {name:<17} {s['adapters']['loads']:>6} {s['adapters']['load_ms']:>8.1f} "
        f"{hot['ttft_p99_ms']:>9.1f} {cold['ttft_p99_ms']:>9.1f}"
    )
