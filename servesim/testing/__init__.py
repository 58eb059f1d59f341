"""Checks a plugin author runs on their own code: does it honour servesim's contracts?

Like scikit-learn's ``check_estimator`` or Gymnasium's ``check_env``::

    from servesim.testing import check_latency_model

    def test_my_model_meets_the_contract():
        check_latency_model(MyLatencyModel(...))

Each check raises ``AssertionError`` naming the property that failed and the inputs that broke it.
There is one per plugin kind, named ``check_<kind>``, and servesim runs each on every built-in:

=================  ========================  =====================================================
kind (registry)    check                     takes
=================  ========================  =====================================================
admission          ``check_admission``       a zero-argument factory (e.g. the class)
scheduler          ``check_scheduler``       a zero-argument factory
preemption         ``check_preemption``      a zero-argument factory
saturation         ``check_saturation``      a zero-argument factory
disaggregation     ``check_decider``         a zero-argument factory
autoscaler         ``check_autoscaler``      a zero-argument factory
routing            ``check_router``          a zero-argument factory
scorer             ``check_scorer``          a scorer object
latency            ``check_latency_model``   a latency model object
arrival            ``check_arrival``         an arrival process object
length             ``check_length``          a length distribution object
=================  ========================  =====================================================

Policies that keep state are built twice from their factory, so the determinism check compares
two fresh objects fed the same inputs.
"""

from servesim.testing.autoscaling import check_autoscaler
from servesim.testing.latency import check_latency_model
from servesim.testing.policies import (
    check_admission,
    check_decider,
    check_preemption,
    check_saturation,
    check_scheduler,
)
from servesim.testing.probes import OracleReadError, ProbeRequest
from servesim.testing.routing import check_router, check_scorer
from servesim.testing.workloads import check_arrival, check_length

__all__ = [
    "OracleReadError",
    "ProbeRequest",
    "check_admission",
    "check_arrival",
    "check_autoscaler",
    "check_decider",
    "check_latency_model",
    "check_length",
    "check_preemption",
    "check_router",
    "check_saturation",
    "check_scheduler",
    "check_scorer",
]
