"""servesim.policies."""
