"""A custom routing policy, checked, registered and compared (docs/howto/write-a-policy.md)."""

from pathlib import Path

import servesim
from servesim.plugins import RoutingPolicy, check_router, register


@register("routing", "group-affinity")
class GroupAffinity(RoutingPolicy):
    """Each prefix group has a home instance (group mod n); go there unless its effective load
    exceeds the least-loaded instance's by more than `slack`. No group: the least loaded."""

    name = "group-affinity"

    def __init__(self, slack: int = 32):
        self.slack = slack

    def route(self, request, snapshots):
        # snapshots: one InstanceSnapshot per candidate; return the chosen one's `index`
        least = min(snapshots, key=lambda s: (s.effective_load, s.index))
        if request.prefix_group < 0:
            return least.index
        home = snapshots[request.prefix_group % len(snapshots)]
        if home.effective_load <= least.effective_load + self.slack:
            return home.index
        return least.index


check_router(GroupAffinity)  # the routing contract; raises AssertionError naming what broke

scenario = Path(__file__).parent / "cluster-weighted.yaml"  # 4 instances, 16 prefix groups
for routing in ("round-robin", "group-affinity"):
    s = servesim.simulate(
        servesim.load_scenario(
            scenario, overrides=[f"policies.routing={routing}", "workload.requests=1000"]
        )
    ).summary
    print(
        f"{routing}: TTFT p99 {s['ttft_p99_ms']:.1f} ms, cache hit rate "
        f"{s['cache_hit_rate']:.1%}, {s['preemption_count']} preemptions"
    )
