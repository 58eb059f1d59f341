"""End-to-end tests of the cluster control plane: routing, snapshots (INV-7), admission, gateway
flow control and their validation, each through ``servesim.simulate`` on small scenarios."""
