"""servesim.latency."""
