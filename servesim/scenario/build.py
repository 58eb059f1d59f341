"""From a validated scenario dict to a :class:`Scenario`: :func:`build_scenario` checks every section
(once, at load time) and resolves model, GPU, KV capacity and plugin names."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs
import yaml

from servesim.scenario.cluster import GroupDefaults, _groups, _pools
from servesim.scenario.engine import _engine, latency_context
from servesim.scenario.policies import (
    _decider,
    _flow_control,
    _kv_transfer,
    _latency_choice,
    _plugin,
    parse_slo_targets,
)
from servesim.scenario.schema import (
    AUDIT_FIELDS,
    CLUSTER_FIELDS,
    DEFAULT_SCENARIO,
    OUTPUT_FIELDS,
    POLICY_FIELDS,
    TOP_LEVEL_FIELDS,
    AuditConfig,
    ClusterConfig,
    EngineConfig,
    FlowControl,
    InstanceSpec,
    OutputConfig,
    PDConfig,
    PolicyChoice,
    SLOTarget,
    TopLevel,
    read_field,
    read_section,
)
from servesim.simcore import registry
from servesim.simcore.config import (
    check_keys,
    expect_mapping,
    plain_data,
    set_path,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger


@attrs.frozen
class Scenario:
    """Everything a run needs. Build with :func:`load_scenario`; ``raw`` is the validated input."""

    name: str
    seed: int
    model: Any  # servesim.latency.modelindex.ModelInfo
    gpu: Any  # servesim.latency.hardware.HardwareSpec
    tp: int
    instances: int
    engine: EngineConfig
    latency: PolicyChoice
    routing: PolicyChoice
    scheduler: PolicyChoice
    preemption: PolicyChoice
    admission: PolicyChoice
    flow_control: FlowControl | None
    cluster: ClusterConfig
    slo: Mapping[str, SLOTarget]
    instance_specs: tuple[InstanceSpec, ...]
    workload: Any  # servesim.workloads.synthetic.SyntheticWorkload
    horizon_us: int | None
    exact_steps: bool
    audit: AuditConfig
    output: OutputConfig
    raw: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    pd: PDConfig | None = None
    base_dir: str | None = None
    fitness: tuple[Any, ...] = ()
    """Fitness objectives (:func:`servesim.analysis.verdict.parse_fitness`) scored into
    ``summary.json``'s ``fitness``; empty: no score."""
    # multimodal (servesim.scenario.encode): the encoder (None: text only) and the encode pool
    # (None: the encoder is colocated on the LLM instances)
    encoder: Any = None
    encode_pool: Any = None

    def to_yaml(self) -> str:
        return yaml.safe_dump(plain_data(self.raw), sort_keys=False)

    def replace(self, **overrides: Any) -> Scenario:
        """A new scenario with dotted-path overrides: ``s.replace(**{"engine.max_num_seqs": 8})``."""
        raw = copy.deepcopy(plain_data(self.raw))
        for key, value in overrides.items():
            set_path(raw, key, yaml.safe_dump(value, default_flow_style=True).strip())
        return build_scenario(raw, base_dir=self.base_dir)


def build_scenario(raw: Mapping[str, Any], base_dir: str | None = None) -> Scenario:
    """Validate a scenario dict (already merged with overrides) into a :class:`Scenario`."""
    from servesim.latency.hardware import resolve_gpu
    from servesim.latency.kvcapacity import auto_kv_blocks, auto_max_model_len
    from servesim.latency.modelindex import resolve_model
    from servesim.latency.tensor_parallel import check_tensor_parallel
    from servesim.workloads.spec import workload_from_config

    notes: list = []  # warnings, logged only once the whole scenario is known to be valid
    data = dict(expect_mapping(raw, "scenario"))
    check_keys(data, TOP_LEVEL_FIELDS, "")
    for key, value in DEFAULT_SCENARIO.items():
        if key not in data and key != "workload":
            data[key] = copy.deepcopy(value)
    if "workload" not in data:
        raise ScenarioError(
            "workload", None, "missing; e.g. workload: {preset: chatbot, rate: 10, requests: 1000}"
        )

    name = read_field(TopLevel, "name", data, "")
    seed = read_field(TopLevel, "seed", data, "")
    model = resolve_model(data["model"], "model", base_dir=base_dir)
    for (
        item
    ) in model.unmodelled:  # a config field servesim does not model is never dropped silently
        notes.append(
            (
                f"model config field {', '.join(item.fields)} not modelled",
                {"model": model.name, "kind": item.kind, "effect": item.effect},
            )
        )
    gpu = resolve_gpu(data["gpu"], "gpu", base_dir=base_dir)
    tp = read_field(TopLevel, "tp", data, "")
    if model.spec is not None:  # tp must split the heads (vLLM's rule); the error names tp
        check_tensor_parallel(model.spec, tp, "tp")

    cluster_section = expect_mapping(data.get("cluster"), "cluster")
    check_keys(cluster_section, CLUSTER_FIELDS, "cluster")
    cluster_cfg = read_section(ClusterConfig, cluster_section, "cluster")
    instances = cluster_cfg.instances

    engine = _engine(
        expect_mapping(data.get("engine"), "engine"),
        model,
        gpu,
        tp,
        auto_kv_blocks,
        auto_max_model_len,
        notes,
    )

    latency = _latency_choice(data.get("latency") or DEFAULT_SCENARIO["latency"], "latency")
    latency_name, latency_params = latency.name, latency.params
    latency_cls = registry.get("latency", latency_name)
    # Build it once now so bad parameters (or a model/GPU/TP without coefficients) fail at load time.
    if engine.parallel.plain:
        latency_cls.from_config(latency_params, latency_context(model, gpu, tp))
    else:
        from servesim.latency.expert_parallel import instance_latency

        instance_latency(
            latency_name,
            latency_params,
            latency_context(model, gpu, tp, engine.parallel),
            "latency",
        )

    pd = None
    # what every group or pool of instances is resolved against
    group_defaults = GroupDefaults(
        data,
        model,
        gpu,
        tp,
        latency,
        base_dir,
        notes,
        resolve_gpu,
        auto_kv_blocks,
        auto_max_model_len,
    )
    if cluster_section.get("pools") is not None:
        if cluster_section.get("groups") is not None:
            raise ScenarioError(
                "cluster.groups",
                cluster_section["groups"],
                "give either groups or pools (each pool takes the group fields itself)",
            )
        instance_specs, pool_routing = _pools(cluster_section, group_defaults)
        cluster_cfg = attrs.evolve(cluster_cfg, instances=len(instance_specs))
        instances = len(instance_specs)
        pd = PDConfig(
            decider=_decider(
                expect_mapping(data.get("policies"), "policies").get("disaggregation"),
                instance_specs,
            ),
            transfer=_kv_transfer(cluster_section.get("kv_transfer")),
            routing=pool_routing,
        )
    elif cluster_section.get("groups") is not None:
        if "instances" in cluster_section:
            raise ScenarioError(
                "cluster.instances",
                cluster_section["instances"],
                "give either instances or groups (the group counts add up to the instance count)",
            )
        instance_specs = _groups(cluster_section["groups"], group_defaults)
        cluster_cfg = attrs.evolve(cluster_cfg, instances=len(instance_specs))
        instances = len(instance_specs)
    else:
        spec = InstanceSpec(group=0, gpu=gpu, tp=tp, engine=engine, latency=latency)
        instance_specs = (spec,) * instances

    if any(spec.engine.dp > 1 for spec in instance_specs):
        # each data-parallel engine is dp ranks, each an instance (own scheduler and KV)
        if pd is not None:
            raise ScenarioError(
                "engine.dp",
                max(spec.engine.dp for spec in instance_specs),
                "data-parallel ranks inside disaggregated pools are not modelled; give each "
                "pool more instances instead",
            )
        instance_specs = tuple(spec for spec in instance_specs for _ in range(spec.engine.dp))
        instances = len(instance_specs)
        cluster_cfg = attrs.evolve(cluster_cfg, instances=instances)

    if pd is None:
        for key, fix in (
            ("kv_transfer", "KV transfers need disaggregated pools: add cluster.pools"),
            ("allow_unassigned", "only meaningful with cluster.pools"),
        ):
            if cluster_section.get(key) is not None:
                raise ScenarioError(f"cluster.{key}", cluster_section[key], fix)
        choice = expect_mapping(data.get("policies"), "policies").get("disaggregation")
        if choice is not None and _decider(choice, ()).name != "never":
            raise ScenarioError(
                "policies.disaggregation",
                choice,
                "disaggregation needs prefill and decode pools: add cluster.pools "
                "(e.g. {prefill: {instances: 2}, decode: {instances: 2}})",
            )
    policies = expect_mapping(data.get("policies"), "policies")
    check_keys(policies, POLICY_FIELDS, "policies")
    routing = _plugin(policies.get("routing"), "routing", "policies.routing", "round-robin")
    scheduler = _plugin(policies.get("scheduler"), "scheduler", "policies.scheduler", "fcfs")
    preemption = _plugin(policies.get("preemption"), "preemption", "policies.preemption", "fcfs")
    admission = _plugin(
        policies.get("admission"), "admission", "policies.admission", "always-admit"
    )
    # build every policy once now, so bad parameters fail at load time with their field path
    for kind, choice, where in (
        ("routing", routing, "policies.routing"),
        ("scheduler", scheduler, "policies.scheduler"),
        ("preemption", preemption, "policies.preemption"),
        ("admission", admission, "policies.admission"),
    ):
        registry.get(kind, choice.name).from_config(choice.params, registry.PluginContext(where))
    flow_control = _flow_control(policies.get("flow_control"), notes)
    slo = parse_slo_targets(data.get("slo"))

    workload = workload_from_config(data["workload"], "workload", base_dir=base_dir)
    from servesim.scenario.encode import parse_multimodal

    encoder, encode_pool = parse_multimodal(
        data, cluster_section.get("pools"), workload, model, gpu, resolve_gpu, base_dir
    )

    horizon_us = read_field(TopLevel, "horizon_us", data, "")
    exact_steps = read_field(TopLevel, "exact_steps", data, "")

    audit_section = expect_mapping(data.get("audit"), "audit")
    check_keys(audit_section, AUDIT_FIELDS, "audit")
    audit = read_section(AuditConfig, audit_section, "audit")

    output_section = expect_mapping(data.get("output"), "output")
    check_keys(output_section, OUTPUT_FIELDS, "output")
    output = read_section(OutputConfig, output_section, "output")

    log = get_logger("servesim.scenario")
    for event, fields in notes:
        log.warning(event, **fields)
    scenario = Scenario(
        name=name,
        seed=seed,
        model=model,
        gpu=gpu,
        tp=tp,
        instances=instances,
        engine=engine,
        latency=latency,
        routing=routing,
        scheduler=scheduler,
        preemption=preemption,
        admission=admission,
        flow_control=flow_control,
        cluster=cluster_cfg,
        slo=slo,
        instance_specs=instance_specs,
        workload=workload,
        horizon_us=horizon_us,
        exact_steps=exact_steps,
        audit=audit,
        output=output,
        raw=data,
        base_dir=base_dir,
        pd=pd,
        fitness=_fitness(data.get("fitness")),
        encoder=encoder,
        encode_pool=encode_pool,
    )
    if getattr(cluster_cfg, "autoscaling", None) is not None:
        # refused at load, not at the run: what autoscaling does not combine with (yet)
        from servesim.components.autoscaler import check_fleet_scenario

        check_fleet_scenario(scenario)
    # several models / LoRA adapters: what the requests name is served (servesim.scenario.lora)
    from servesim.scenario.lora import check_served

    check_served(scenario)
    return scenario


def _fitness(value: Any) -> tuple[Any, ...]:
    """The scenario's ``fitness`` weights as objectives (none when absent)."""
    if value is None:
        return ()
    from servesim.analysis.verdict import parse_fitness

    return parse_fitness(value, "fitness")
