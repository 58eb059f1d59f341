"""The whole input of a run: a frozen, validated :class:`Scenario`, loaded from YAML or a dict.

Validation happens here, once: every error is a :class:`~servesim.simcore.errors.ScenarioError`
naming the field path, the bad value and the fix. Model/GPU specs are resolved, the KV capacity
and context limit are derived (``auto``), and plugin names are looked up, so a scenario that loads
is a scenario that runs.

``schema`` declares the sections and their fields, ``loader`` reads files, dicts and ``--set``
overrides, ``build`` validates the whole, and ``engine``, ``policies`` and ``cluster`` parse one
section each.
"""

from servesim.scenario import schema
from servesim.scenario.build import Scenario, build_scenario
from servesim.scenario.engine import latency_context
from servesim.scenario.loader import load_scenario, read_yaml_file
from servesim.scenario.policies import parse_slo_targets
from servesim.scenario.schema import *  # noqa: F403 -- the sections and field lists (schema.__all__)

__all__ = [
    *schema.__all__,  # the sections, their field lists and the default scenario
    "Scenario",
    "build_scenario",
    "latency_context",
    "load_scenario",
    "parse_slo_targets",
    "read_yaml_file",
]
