"""The scenario schema is declared once (attrs fields with their YAML key, doc line and parser) and
docs/reference/scenario.md agrees with it both ways: every declared field has a row in its
section's table, and every row of that table names a declared field."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from servesim.scenario import schema
from servesim.scenario.schema import (
    AuditConfig,
    ClusterConfig,
    EngineConfig,
    FlowControl,
    KVTransferConfig,
    OutputConfig,
    SLOTarget,
    TopLevel,
    read_section,
    section_keys,
)
from servesim.simcore.errors import ScenarioError

REFERENCE = (Path(__file__).parent.parent / "docs" / "reference" / "scenario.md").read_text()

# (section class, structural keys parsed elsewhere, scenario.md heading, row prefix)
SECTIONS = [
    (TopLevel, schema.TOP_LEVEL_FIELDS, "## Top level", ""),
    (ClusterConfig, schema.CLUSTER_FIELDS, "## cluster", "cluster."),
    (KVTransferConfig, schema.KV_TRANSFER_FIELDS, "### KV transfer", ""),
    (schema.AutoscalingConfig, schema.AUTOSCALING_FIELDS, "### Autoscaling", ""),
    (FlowControl, schema.FLOW_CONTROL_FIELDS, "### Flow control", "policies.flow_control."),
    (SLOTarget, schema.SLO_TARGET_FIELDS, "## slo", "slo.<class>."),
    (EngineConfig, schema.ENGINE_FIELDS, "## engine", "engine."),
    (AuditConfig, schema.AUDIT_FIELDS, "## audit", "audit."),
    (OutputConfig, schema.OUTPUT_FIELDS, "## output", "output."),
]


def table_fields(heading: str, prefix: str) -> set[str]:
    """The first-level field names of the rows under ``heading`` (up to the next heading)."""
    start = REFERENCE.index(f"\n{heading}\n")
    end = REFERENCE.find("\n#", start + len(heading) + 2)
    text = REFERENCE[start : end if end >= 0 else len(REFERENCE)]
    names = re.findall(r"^\| `" + re.escape(prefix) + r"([a-z0-9_]+)`", text, flags=re.MULTILINE)
    return set(names)


@pytest.mark.parametrize(
    "cls, keys, heading, prefix", SECTIONS, ids=lambda x: getattr(x, "__name__", None)
)
def test_the_reference_table_and_the_schema_name_the_same_fields(cls, keys, heading, prefix):
    documented = table_fields(heading, prefix)
    assert set(keys) >= set(section_keys(cls))
    assert not set(keys) - documented, f"{heading}: undocumented fields {set(keys) - documented}"
    assert not documented - set(keys), (
        f"{heading}: documented but not in the schema {documented - set(keys)}"
    )


@pytest.mark.parametrize("cls", [c for c, *_ in SECTIONS], ids=lambda c: c.__name__)
def test_every_declared_field_has_a_doc_line(cls):
    for f in attrs.fields(cls):
        if schema.KEY in f.metadata:
            assert f.metadata[schema.DOC].strip(), f"{cls.__name__}.{f.name} has no doc line"


@pytest.mark.parametrize(
    "cls",
    [TopLevel, ClusterConfig, KVTransferConfig, SLOTarget, AuditConfig, OutputConfig],
    ids=lambda c: c.__name__,
)
def test_an_empty_section_is_the_class_defaults(cls):
    """Each default is stated once, on the class: reading an empty section gives exactly it."""
    assert read_section(cls, {}, "x") == cls()


def test_a_given_value_is_parsed_into_the_fields_units_and_errors_name_the_field():
    cfg = read_section(ClusterConfig, {"snapshot_interval": "10ms", "instances": 3}, "cluster")
    assert (cfg.snapshot_interval_us, cfg.instances) == (10_000, 3)
    with pytest.raises(ScenarioError) as info:
        read_section(KVTransferConfig, {"bandwidth": 0}, "cluster.kv_transfer")
    assert info.value.path == "cluster.kv_transfer.bandwidth"


def test_the_engine_reads_its_simple_fields_through_their_declaration():
    """``read_field`` gives the declared default when the key is absent, and the declared rule
    refuses a bad value naming the field."""
    assert (
        schema.read_field(EngineConfig, "max_num_seqs", {}, "engine") == EngineConfig().max_num_seqs
    )
    assert schema.read_field(EngineConfig, "block_size", {"block_size": 32}, "engine") == 32
    with pytest.raises(ScenarioError) as info:
        schema.read_field(EngineConfig, "preemption_mode", {"preemption_mode": "evict"}, "engine")
    assert info.value.path == "engine.preemption_mode"


def documented_default(heading: str, key: str) -> str:
    """The Default column of ``key``'s row under ``heading``."""
    start = REFERENCE.index(f"\n{heading}\n")
    row = re.search(r"^\| `" + re.escape(key) + r"` \|[^|]*\| ([^|]*) \|", REFERENCE[start:], re.M)
    assert row, f"{heading}: no row for {key}"
    return row.group(1).strip()


def as_yaml(value: object) -> str:
    """A parsed default as the reference writes it (``none``, ``false``, ``42``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@pytest.mark.parametrize("field", attrs.fields(TopLevel), ids=lambda f: f.name)
def test_the_reference_states_each_top_level_default_as_declared(field):
    """The top-level table's Default column is the declaration's default (stated once, in
    schema.TopLevel): ``load_scenario`` and the reference cannot disagree."""
    key = field.metadata[schema.KEY]
    assert documented_default("## Top level", key) == f"`{as_yaml(field.default)}`"


def test_the_default_scenario_is_derived_from_the_declared_defaults():
    top = TopLevel()
    assert {k: schema.DEFAULT_SCENARIO[k] for k in schema.RECORDED_FIELDS} == {
        "seed": top.seed,
        "model": top.model,
        "gpu": top.gpu,
        "tp": top.tp,
    }
    assert list(schema.DEFAULT_SCENARIO) == ["seed", "model", "gpu", "tp", "latency", "workload"]


@pytest.mark.parametrize(
    "raw, field, expected",
    [
        ({}, "name", "scenario"),
        ({"name": None}, "name", "scenario"),
        ({"name": ""}, "name", "scenario"),
        ({"name": "run-1"}, "name", "run-1"),
        ({"horizon": "none"}, "horizon_us", None),
        ({"horizon": "2s"}, "horizon_us", 2_000_000),
        ({"exact_steps": True}, "exact_steps", True),
    ],
)
def test_top_level_fields_read_through_their_declaration(raw, field, expected):
    assert schema.read_field(TopLevel, field, raw, "") == expected


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"name": "a/b"}, "name: invalid value 'a/b': must not contain '/'"),
        ({"seed": -1}, "seed: invalid value -1"),
        ({"tp": 0}, "tp: invalid value 0"),
        ({"horizon": 0}, "horizon: invalid value 0"),
        ({"exact_steps": "yes"}, "exact_steps: invalid value 'yes': expected true or false"),
    ],
)
def test_a_bad_top_level_value_names_the_field_without_a_leading_dot(raw, message):
    with pytest.raises(ScenarioError) as info:
        read_section(TopLevel, raw, "")
    assert str(info.value).startswith(message)
