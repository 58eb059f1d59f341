"""Bad control-plane inputs fail at load time with a ScenarioError naming the field (DESIGN §6):
routing scorers and weights, saturation detectors, flow control, cluster latencies, SLO targets,
SLO class / tenant mixes and admission parameters. Each case loads a small valid scenario with one
field broken, as a dict, as YAML text and as a ``--set`` override where that makes sense."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import yaml
from conftest import scenario_dict

import servesim
from servesim.simcore.errors import ScenarioError, UnknownPluginError


def base() -> dict[str, Any]:
    data = scenario_dict(instances=2, requests=5)
    data["policies"] = {"routing": "round-robin"}
    return data


def with_field(path: str, value: Any) -> dict[str, Any]:
    """``base()`` with the dotted ``path`` set to ``value`` (intermediate mappings created)."""
    data = copy.deepcopy(base())
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return data


def load_error(data: Any, overrides=()) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        servesim.load_scenario(data, overrides)
    return info.value


def assert_names(err: ScenarioError, field: str) -> None:
    assert err.path == field, f"error names {err.path!r}, expected {field!r}: {err}"
    assert str(err).startswith(f"{field}:")
    assert "\n" not in str(err)


# (dotted path to set, value, field the error must name)
CASES = [
    # ------------------------------------------------------------ weighted routing
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"no-such-scorer": 1}},
        "policies.routing.scorers.no-such-scorer",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": 0}},
        "policies.routing.scorers.queue-depth",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": 1, "kv-utilization": -2}},
        "policies.routing.scorers.kv-utilization",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": float("nan")}},
        "policies.routing.scorers.queue-depth",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": float("inf")}},
        "policies.routing.scorers.queue-depth",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": "heavy"}},
        "policies.routing.scorers.queue-depth",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"prefix-affinity": {"weight": 0}}},
        "policies.routing.scorers.prefix-affinity.weight",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"prefix-affinity": {"weight": float("nan")}}},
        "policies.routing.scorers.prefix-affinity.weight",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"prefix-affinity": {"capacity": 0}}},
        "policies.routing.scorers.prefix-affinity.capacity",
    ),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": {"window": 3}}},
        "policies.routing.scorers.queue-depth.window",
    ),
    ("policies.routing", {"name": "weighted", "scorers": {}}, "policies.routing.scorers"),
    ("policies.routing", {"name": "weighted", "scorers": None}, "policies.routing.scorers"),
    (
        "policies.routing",
        {"name": "weighted", "scorers": {"queue-depth": 1e308, "kv-utilization": 1e308}},
        "policies.routing.scorers",
    ),
    ("policies.routing", {"name": "weighted", "weights": {}}, "policies.routing.weights"),
    ("policies.routing", "no-such-router", "policies.routing"),
    ("policies.routing", {"name": "least-loaded", "seed": 3}, "policies.routing.seed"),
    # ------------------------------------------------------------ saturation detectors
    (
        "policies.flow_control",
        {"detector": {"name": "utilization", "queue_depth_threshold": float("nan")}},
        "policies.flow_control.detector.queue_depth_threshold",
    ),
    (
        "policies.flow_control",
        {"detector": {"name": "utilization", "kv_utilization_threshold": float("nan")}},
        "policies.flow_control.detector.kv_utilization_threshold",
    ),
    (
        "policies.flow_control",
        {"detector": {"name": "utilization", "kv_utilization_threshold": 0}},
        "policies.flow_control.detector.kv_utilization_threshold",
    ),
    (
        "policies.flow_control",
        {"detector": {"name": "utilization", "queue_depth_threshold": float("inf")}},
        "policies.flow_control.detector.queue_depth_threshold",
    ),
    (
        "policies.flow_control",
        {"detector": {"name": "concurrency", "max_concurrency": 0}},
        "policies.flow_control.detector.max_concurrency",
    ),
    (
        "policies.flow_control",
        {"detector": {"name": "concurrency", "max_concurrency": float("nan")}},
        "policies.flow_control.detector.max_concurrency",
    ),
    ("policies.flow_control", {"detector": "no-such-detector"}, "policies.flow_control.detector"),
    (
        "policies.flow_control",
        {"detector": {"name": "no-such-detector"}},
        "policies.flow_control.detector.name",
    ),
    (
        "policies.flow_control",
        {"detector": {"queue_depth_threshold": 3}},
        "policies.flow_control.detector.name",
    ),
    # ------------------------------------------------------------ flow control
    ("policies.flow_control", {"order": "fifo"}, "policies.flow_control.detector"),
    ("policies.flow_control", {}, "policies.flow_control.detector"),
    ("policies.flow_control", True, "policies.flow_control"),
    ("policies.flow_control", "utilization", "policies.flow_control"),
    (
        "policies.flow_control",
        {"detector": "utilization", "order": "lifo"},
        "policies.flow_control.order",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "order": None},
        "policies.flow_control.order",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "max_queue": -1},
        "policies.flow_control.max_queue",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "max_queue": 2.5},
        "policies.flow_control.max_queue",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "per_band_capacity": -3},
        "policies.flow_control.per_band_capacity",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "shedding": "yes please"},
        "policies.flow_control.shedding",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "ttl": "-5ms"},
        "policies.flow_control.ttl",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "ttl": "soon"},
        "policies.flow_control.ttl",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "tick": "-1ms"},
        "policies.flow_control.tick",
    ),
    (
        "policies.flow_control",
        {"detector": "utilization", "queue": 5},
        "policies.flow_control.queue",
    ),
    # ------------------------------------------------------------ cluster timing
    ("cluster.routing_latency", "-1ms", "cluster.routing_latency"),
    ("cluster.routing_latency", -0.5, "cluster.routing_latency"),
    ("cluster.routing_latency", float("nan"), "cluster.routing_latency"),
    ("cluster.routing_latency", "3 fortnights", "cluster.routing_latency"),
    ("cluster.routing_concurrency", -1, "cluster.routing_concurrency"),
    ("cluster.routing_concurrency", 2.5, "cluster.routing_concurrency"),
    ("cluster.routing_concurrency", "many", "cluster.routing_concurrency"),
    ("cluster.admission_latency", "-2us", "cluster.admission_latency"),
    ("cluster.snapshot_interval", "-50ms", "cluster.snapshot_interval"),
    ("cluster.cache_signal_delay", -1, "cluster.cache_signal_delay"),
    ("cluster.cache_signal_delay", float("inf"), "cluster.cache_signal_delay"),
    ("cluster.instances", 0, "cluster.instances"),
    ("cluster.router_latency", "1ms", "cluster.router_latency"),
    # ------------------------------------------------------------ SLO targets
    ("slo", {"critical": {"p99": "1s"}}, "slo.critical.p99"),
    ("slo", {"critical": {"ttft": "100ms", "tpot": "5ms"}}, "slo.critical.tpot"),
    ("slo", {"critical": {}}, "slo.critical"),
    ("slo", {"critical": {"ttft": 0}}, "slo.critical.ttft"),
    ("slo", {"critical": {"ttft": "-1s"}}, "slo.critical.ttft"),
    ("slo", {"critical": {"itl": float("nan")}}, "slo.critical.itl"),
    ("slo", {"critical": {"e2e": "forever"}}, "slo.critical.e2e"),
    ("slo", {"critical": "100ms"}, "slo.critical"),
    ("slo", ["critical"], "slo"),
    # ------------------------------------------------------------ SLO class and tenant mixes
    ("workload.slo_class", {"critical": 1, "gold": 1}, "workload.slo_class.gold"),
    ("workload.slo_class", {"critical": 0}, "workload.slo_class.critical"),
    ("workload.slo_class", {"critical": -1, "standard": 2}, "workload.slo_class.critical"),
    ("workload.slo_class", {"critical": float("nan")}, "workload.slo_class.critical"),
    ("workload.slo_class", {}, "workload.slo_class"),
    ("workload.slo_class", "platinum", "workload.slo_class"),
    ("workload.tenant", {"acme": 1, "globex": 0}, "workload.tenant.globex"),
    ("workload.tenant", {}, "workload.tenant"),
    # ------------------------------------------------------------ admission
    (
        "policies.admission",
        {"name": "token-bucket", "capacity": -5},
        "policies.admission.capacity",
    ),
    ("policies.admission", {"name": "token-bucket", "capacity": 0}, "policies.admission.capacity"),
    (
        "policies.admission",
        {"name": "token-bucket", "capacity": float("nan")},
        "policies.admission.capacity",
    ),
    (
        "policies.admission",
        {"name": "token-bucket", "refill_per_s": -1},
        "policies.admission.refill_per_s",
    ),
    (
        "policies.admission",
        {"name": "token-bucket", "refill_per_s": float("inf")},
        "policies.admission.refill_per_s",
    ),
    ("policies.admission", {"name": "token-bucket", "size": 10}, "policies.admission.size"),
    ("policies.admission", {"name": "tier-shed", "threshold": -1}, "policies.admission.threshold"),
    (
        "policies.admission",
        {"name": "tier-shed", "min_priority": 1000},
        "policies.admission.min_priority",
    ),
    (
        "policies.admission",
        {"name": "gaie-legacy", "queue_depth_threshold": 0},
        "policies.admission.queue_depth_threshold",
    ),
    ("policies.admission", "admit-some", "policies.admission"),
    ("policies.admission", {"capacity": 10}, "policies.admission.name"),
    ("policies.admission", {"name": "reject-all", "reason": "x"}, "policies.admission.reason"),
    # ------------------------------------------------------------ other policies
    ("policies.scheduler", "lifo", "policies.scheduler"),
    ("policies.preemption", {"name": "random"}, "policies.preemption.name"),
    ("policies.eviction", "lru", "policies.eviction"),
]


@pytest.mark.parametrize(
    ("path", "value", "field"), CASES, ids=[f"{c[2]}={c[1]!r}"[:70] for c in CASES]
)
def test_a_bad_control_plane_field_is_a_scenario_error_naming_it(path, value, field):
    assert_names(load_error(with_field(path, value)), field)


def _finite_only(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_only(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_only(v) for v in value)
    return True


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [c for c in CASES if not _finite_only(c[1])],
    ids=[f"{c[2]}" for c in CASES if not _finite_only(c[1])],
)
def test_yaml_nan_and_infinity_are_rejected_as_well(path, value, field, tmp_path):
    """The same scenario written as YAML (.nan / .inf), loaded from a file."""
    file = tmp_path / "scenario.yaml"
    file.write_text(yaml.safe_dump(with_field(path, value)), encoding="utf-8")
    assert ".nan" in file.read_text() or ".inf" in file.read_text()
    assert_names(load_error(file), field)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("policies.routing.name=weighted", None),  # valid on its own: the default profile
        ("policies.flow_control.order=lifo", "policies.flow_control.detector"),
        ("cluster.routing_latency=-1ms", "cluster.routing_latency"),
        ("slo.critical.p99=1s", "slo.critical.p99"),
        ("workload.slo_class.gold=1", "workload.slo_class.gold"),
        ("policies.admission.name=token-bucket", None),
    ],
)
def test_set_overrides_on_control_plane_fields_are_validated(override, field):
    data = base()
    if field is None:
        servesim.load_scenario(data, [override])
        return
    assert_names(load_error(data, [override]), field)


def test_an_unknown_scorer_lists_the_known_scorers():
    err = load_error(with_field("policies.routing", {"name": "weighted", "scorers": {"qd": 1}}))
    assert isinstance(err, UnknownPluginError)
    assert err.kind == "scorer"
    assert "queue-depth" in err.known and "precise-prefix-cache" in err.known
    assert "queue-depth" in str(err)


def test_an_unknown_order_lists_the_orders():
    err = load_error(
        with_field("policies.flow_control", {"detector": "concurrency", "order": "lifo"})
    )
    for order in ("fifo", "priority", "slo-deadline"):
        assert order in str(err)


def test_an_unknown_slo_class_in_a_mix_lists_the_classes():
    err = load_error(with_field("workload.slo_class", {"gold": 1}))
    for cls in ("critical", "standard", "sheddable", "batch", "background"):
        assert cls in str(err)


def test_every_error_surfaces_before_anything_runs():
    """Broken control-plane parameters fail in load_scenario, never mid-run."""
    data = with_field(
        "policies.routing",
        {"name": "weighted", "scorers": {"prefix-affinity": {"weight": 1, "capacity": -1}}},
    )
    assert_names(load_error(data), "policies.routing.scorers.prefix-affinity.capacity")


def test_valid_control_plane_sections_load():
    data = base()
    data["cluster"].update(
        admission_latency="1ms", routing_latency=0, snapshot_interval=0, cache_signal_delay="2ms"
    )
    data["policies"] = {
        "routing": {
            "name": "weighted",
            "scorers": {"prefix-affinity": {"weight": 2, "capacity": 100}, "queue-depth": 0.5},
        },
        "admission": {"name": "token-bucket", "capacity": 500, "refill_per_s": 0},
        "flow_control": {
            "detector": {"name": "concurrency", "max_concurrency": 3},
            "order": "slo-deadline",
            "max_queue": 10,
            "per_band_capacity": 4,
            "shedding": True,
            "ttl": "1s",
            "tick": "500us",
        },
    }
    data["slo"] = {"critical": {"ttft": "100ms"}, "standard": {"e2e": "5s", "itl": "50ms"}}
    data["workload"]["slo_class"] = {"critical": 1, "standard": 3}
    data["workload"]["tenant"] = {"acme": 2, "globex": 1}
    scenario = servesim.load_scenario(data)
    fc = scenario.flow_control
    assert (fc.order, fc.max_queue, fc.per_band_capacity, fc.shedding) == (
        "slo-deadline",
        10,
        4,
        True,
    )
    assert (fc.ttl_us, fc.tick_us) == (1_000_000, 500)
    assert scenario.cluster.admission_latency_us == 1000
    assert scenario.cluster.cache_signal_delay_us == 2000
    assert scenario.slo["critical"].ttft_us == 100_000
    assert scenario.slo["standard"].ttft_us == 0
