"""A local router for `servesim run --plugin examples/my_routers.py` (docs/howto/route-requests.md)."""

from servesim.plugins import RoutingPolicy, check_router, register


@register("routing", "fewest-in-flight")
class FewestInFlight(RoutingPolicy):
    """The instance with the fewest requests sent to it and not yet finished (ties: lowest index)."""

    def route(self, request, snapshots):
        return min(snapshots, key=lambda s: (s.in_flight, s.index)).index


if __name__ == "__main__":  # `python examples/my_routers.py` checks it against the contract
    check_router(FewestInFlight)
    print("fewest-in-flight meets the routing contract")
