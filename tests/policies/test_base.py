"""The shared policy base: every policy kind inherits ``name`` and the parameterless
``from_config`` from :class:`servesim.policies.base.Policy`."""

import pytest

from servesim.plugins import BASE_CLASSES, PluginContext, ScenarioError
from servesim.policies.base import Policy
from servesim.policies.preemption import LastAdmitted
from servesim.policies.scheduling import FCFS

POLICY_KINDS = ["admission", "routing", "scheduler", "preemption", "disaggregation", "saturation"]


@pytest.mark.parametrize("kind", POLICY_KINDS)
def test_each_policy_kind_base_is_a_policy_without_a_name(kind):
    base = BASE_CLASSES[kind]
    assert issubclass(base, Policy)
    assert base.name == ""
    assert "from_config" not in vars(base)  # the one default lives on Policy


def test_default_from_config_builds_the_class_it_is_called_on():
    built = FCFS.from_config({}, PluginContext("policies.scheduler"))
    assert type(built) is FCFS and built.name == "fcfs"


def test_default_from_config_rejects_a_parameter_naming_the_field():
    with pytest.raises(ScenarioError, match=r"policies\.preemption.*slack"):
        LastAdmitted.from_config({"slack": 3}, PluginContext("policies.preemption"))
