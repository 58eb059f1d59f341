"""The shared key rules of workload mappings (servesim.workloads.keys)."""

import pytest

from servesim.simcore.errors import ScenarioError
from servesim.workloads.keys import either_keys, require_keys


def test_a_missing_required_key_is_named_with_the_fix():
    require_keys({"to": 1, "duration": "1s"}, ("to", "duration"), "w.ramp", "a ramp needs both")
    with pytest.raises(ScenarioError, match=r"w\.ramp\.duration.*missing; a ramp needs both"):
        require_keys({"to": 1}, ("to", "duration"), "w.ramp", "a ramp needs both")


def test_either_keys_returns_the_given_keys_of_each_group_in_their_order():
    p = {"sigma": 1, "mu": 2}
    assert either_keys(p, ("mu", "sigma"), ("mean", "std_dev"), "l", "fix") == (["mu", "sigma"], [])
    assert either_keys({}, ("a",), ("b",), "l", "fix") == ([], [])


def test_giving_both_groups_is_refused_at_the_first_key_of_the_second():
    p = {"mu": 2, "std_dev": 3, "mean": 4}
    with pytest.raises(ScenarioError, match=r"l\.mean: invalid value 4: not both") as err:
        either_keys(p, ("mu", "sigma"), ("mean", "std_dev"), "l", "not both")
    assert err.value.path == "l.mean"
