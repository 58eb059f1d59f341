"""servesim.simcore.describe: a description built from a tuple of fields keeps their order."""

from types import SimpleNamespace

import pytest

from servesim.simcore.describe import describe_fields


def test_bare_names_and_renamed_pairs_keep_the_listed_order():
    obj = SimpleNamespace(b=2, a=1, gbs=450.0)
    assert list(describe_fields(obj, ("b", ("per_direction", "gbs"), "a")).items()) == [
        ("b", 2),
        ("per_direction", 450.0),
        ("a", 1),
    ]


def test_a_missing_attribute_is_an_error_not_a_silent_default():
    with pytest.raises(AttributeError, match="absent"):
        describe_fields(SimpleNamespace(), ("absent",))
