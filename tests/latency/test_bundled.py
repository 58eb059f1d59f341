"""The bundled name tables' lookup: any key, any case, one entry per key."""

from __future__ import annotations

import pytest

from servesim.latency.bundled import name_lookup
from servesim.latency.hardware import _hardware_table, resolve_gpu
from servesim.latency.modelindex import _model_index


def test_every_name_and_other_key_finds_its_entry_in_any_case():
    entries = {"H100": ("H100-SXM", None, ""), "A100-80": ("a100",)}
    lookup = name_lookup(entries, lambda keys: keys, "gpus.yaml")
    assert lookup == {"h100": "H100", "h100-sxm": "H100", "a100-80": "A100-80", "a100": "A100-80"}


def test_a_key_naming_two_entries_is_refused_naming_both():
    entries = {"llama-a": ("meta/llama",), "llama-b": ("META/LLAMA",)}
    with pytest.raises(
        ValueError, match=r"models.yaml: 'META/LLAMA' names both llama-a and llama-b"
    ):
        name_lookup(entries, lambda keys: keys, "models.yaml")


def test_an_entry_may_repeat_its_own_name_among_its_keys():
    assert name_lookup({"qwen": ("Qwen", "qwen")}, lambda keys: keys, "models.yaml") == {
        "qwen": "qwen"
    }


@pytest.mark.parametrize("table", [_hardware_table, _model_index])
def test_the_bundled_tables_resolve_every_key_to_an_entry(table):
    entries, lookup = table()
    assert set(lookup.values()) == set(entries)
    assert all(name.lower() in lookup for name in entries)


def test_a_gpu_alias_resolves_to_the_canonical_spec():
    specs, lookup = _hardware_table()
    aliased = next(spec for spec in specs.values() if spec.aliases)
    assert resolve_gpu(aliased.aliases[0].upper()) is aliased
