"""The whole input of a run: a frozen, validated :class:`Scenario`, loaded from YAML or a dict.

Validation happens here, once: every error is a :class:`~servesim.simcore.errors.ScenarioError`
naming the field path, the bad value and the fix. Model/GPU specs are resolved, the KV capacity
and context limit are derived (``auto``), and plugin names are looked up, so a scenario that loads
is a scenario that runs.

``schema`` declares the sections and their fields, ``loader`` reads files, dicts and ``--set``
overrides, ``build`` validates the whole, and ``engine``, ``policies`` and ``cluster`` parse one
section each.
"""

from servesim.scenario.build import Scenario, build_scenario
from servesim.scenario.engine import latency_context
from servesim.scenario.loader import load_scenario, read_yaml_file
from servesim.scenario.policies import parse_slo_targets
from servesim.scenario.schema import (
    AUDIT_FIELDS,
    CLUSTER_FIELDS,
    DEFAULT_SCENARIO,
    ENGINE_FIELDS,
    FLOW_CONTROL_FIELDS,
    GROUP_FIELDS,
    OUTPUT_FIELDS,
    POLICY_FIELDS,
    SLO_TARGET_FIELDS,
    TOP_LEVEL_FIELDS,
    AuditConfig,
    ClusterConfig,
    EngineConfig,
    FlowControl,
    InstanceSpec,
    KVTransferConfig,
    OutputConfig,
    PDConfig,
    PolicyChoice,
    SLOTarget,
)

__all__ = [
    "AUDIT_FIELDS",
    "CLUSTER_FIELDS",
    "DEFAULT_SCENARIO",
    "ENGINE_FIELDS",
    "FLOW_CONTROL_FIELDS",
    "GROUP_FIELDS",
    "OUTPUT_FIELDS",
    "POLICY_FIELDS",
    "SLO_TARGET_FIELDS",
    "TOP_LEVEL_FIELDS",
    "AuditConfig",
    "ClusterConfig",
    "EngineConfig",
    "FlowControl",
    "InstanceSpec",
    "KVTransferConfig",
    "OutputConfig",
    "PDConfig",
    "PolicyChoice",
    "SLOTarget",
    "Scenario",
    "build_scenario",
    "latency_context",
    "load_scenario",
    "parse_slo_targets",
    "read_yaml_file",
]
