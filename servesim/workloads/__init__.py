"""servesim.workloads."""
