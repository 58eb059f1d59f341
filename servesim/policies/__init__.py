"""Pure decisions (no SimPy): routing, scheduling order, preemption victims.

Each policy is a small class with one decision method; subclass a built-in and override it.
"""

from servesim.policies import preemption, routing, scheduling  # noqa: F401  (registers built-ins)
