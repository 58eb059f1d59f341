"""servesim.components."""
