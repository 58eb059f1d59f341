"""servesim: a discrete-event simulator of LLM inference serving clusters, built on SimPy.

>>> import servesim
>>> scenario = servesim.load_scenario()            # the documented default
>>> results = servesim.simulate(scenario)
>>> results.summary["ttft_p99_ms"]                  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servesim.analysis.plots.data import load_results
    from servesim.run import Results, simulate
    from servesim.scenario import Scenario, load_scenario
    from servesim.simcore.errors import (
        AuditError,
        ScenarioError,
        ServesimError,
        UnknownPluginError,
    )

# Public name -> the module that defines it. Nothing is imported until a name is first used:
# ``import servesim.cli`` (every command line run) imports this package, and eager imports here
# would load the simulator, the results reader and numpy before the command is even parsed.
_EXPORTS = {
    "AuditError": "servesim.simcore.errors",
    "Results": "servesim.run",
    "Scenario": "servesim.scenario",
    "ScenarioError": "servesim.simcore.errors",
    "ServesimError": "servesim.simcore.errors",
    "UnknownPluginError": "servesim.simcore.errors",
    "load_results": "servesim.analysis.plots.data",
    "load_scenario": "servesim.scenario",
    "simulate": "servesim.run",
}

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


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use (PEP 562) and keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
