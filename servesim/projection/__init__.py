"""The projector: a scenario's steady state in closed form, beside the simulator
(``servesim project``; docs/explanation/projection.md).

:func:`project` takes the same :class:`~servesim.scenario.Scenario` as :func:`servesim.simulate`
and answers in milliseconds of CPU: per instance, the decode batch-size fixed point at the offered
rate, TTFT with a queueing term for prefill, TPOT/ITL, throughput, KV use, the maximum
sustainable rate and concurrency, and how sure the step times are (:mod:`.confidence`).
Modules: ``workload`` (length moments), ``steady`` (one instance), ``project`` (the scenario),
``confidence`` (the ladder), ``cli`` (``servesim project``).
"""

from servesim.projection.confidence import RUNGS, Confidence, confidence_of
from servesim.projection.project import GroupProjection, Projection, project
from servesim.projection.steady import SteadyState, max_sustainable_rate, steady_state
from servesim.projection.workload import WorkloadMoments, workload_moments

__all__ = [
    "RUNGS",
    "Confidence",
    "GroupProjection",
    "Projection",
    "SteadyState",
    "WorkloadMoments",
    "confidence_of",
    "max_sustainable_rate",
    "project",
    "steady_state",
    "workload_moments",
]
