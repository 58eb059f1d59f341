"""Pure decisions (no SimPy): admission, routing and its scorers, disaggregation deciders, saturation, scheduling order,
preemption victims, autoscaling; plus the control-plane metrics (``metrics``).

Each policy is a small class with one decision method; subclass a built-in and override it.
"""

from servesim.policies import (  # noqa: F401  (registers built-ins)
    admission,
    autoscaling,
    disaggregation,
    preemption,
    routing,
    saturation,
    scheduling,
    scorers,
)
