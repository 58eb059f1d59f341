"""servesim: a discrete-event simulator of LLM inference serving clusters, built on SimPy.

>>> import servesim
>>> scenario = servesim.load_scenario()            # the documented default
>>> results = servesim.simulate(scenario)
>>> results.summary["ttft_p99_ms"]                  # doctest: +SKIP
"""

from servesim.analysis.plots.data import load_results
from servesim.run import Results, simulate
from servesim.scenario import Scenario, load_scenario
from servesim.simcore.errors import AuditError, ScenarioError, ServesimError, UnknownPluginError

__all__ = [
    "AuditError",
    "Results",
    "Scenario",
    "ScenarioError",
    "ServesimError",
    "UnknownPluginError",
    "load_results",
    "load_scenario",
    "simulate",
]
__version__ = "0.1.0"
