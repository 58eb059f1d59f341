"""The cluster section parsers: homogeneous instances, heterogeneous ``groups`` and PD ``pools``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from servesim.scenario.engine import _engine, latency_context
from servesim.scenario.policies import _latency_choice, _plugin
from servesim.scenario.schema import (
    ENGINE_FIELDS,
    GROUP_FIELDS,
    POOL_FIELDS,
    POOL_NAMES,
    InstanceSpec,
    PolicyChoice,
)
from servesim.simcore import registry
from servesim.simcore.config import (
    as_bool,
    as_int,
    check_keys,
    expect_mapping,
)
from servesim.simcore.errors import ScenarioError


@attrs.frozen
class GroupDefaults:
    """What every group or pool of instances is resolved against: the scenario's own fields
    (a group overrides them one by one) and the loader's resolvers."""

    data: Mapping[str, Any]
    model: Any
    gpu: Any
    tp: int
    latency: PolicyChoice
    base_dir: str | None
    notes: list
    resolve_gpu: Callable[..., Any]
    auto_kv_blocks: Callable[..., Any]
    auto_max_model_len: Callable[..., Any]


def _pools(
    cluster: Mapping[str, Any], defaults: GroupDefaults
) -> tuple[tuple[InstanceSpec, ...], dict[str, PolicyChoice]]:
    """``cluster.pools``: prefill, decode and mixed instances, each pool with the group fields
    (gpu, tp, latency, engine) and its own ``routing``. Instances are numbered pool by pool:
    prefill first, then decode, then mixed, then any unassigned ones (``allow_unassigned``)."""
    data = defaults.data
    pools = expect_mapping(cluster["pools"], "cluster.pools")
    # multimodal: the encode pool holds no LLM instance (servesim.scenario.encode reads it)
    check_keys(pools, (*POOL_NAMES, "encode"), "cluster.pools")
    pools = {k: v for k, v in pools.items() if k != "encode"}
    groups: list[dict[str, Any]] = []
    roles: list[str] = []
    routing: dict[str, PolicyChoice] = {}
    counts: dict[str, int] = {}
    for role in POOL_NAMES:
        if pools.get(role) is None:
            continue
        path = f"cluster.pools.{role}"
        pool = expect_mapping(pools[role], path)
        check_keys(pool, POOL_FIELDS, path)
        count = as_int(pool.get("instances", 1), f"{path}.instances", minimum=0, maximum=100_000)
        counts[role] = count
        if pool.get("routing") is not None:
            choice = _plugin(pool["routing"], "routing", f"{path}.routing", "round-robin")
            registry.get("routing", choice.name).from_config(
                choice.params, registry.PluginContext(f"{path}.routing")
            )
            routing[role] = choice
        if count:
            group = {k: v for k, v in pool.items() if k not in ("instances", "routing")}
            groups.append({**group, "count": count})
            roles.append(role)
    if not counts.get("mixed") and not (counts.get("prefill") and counts.get("decode")):
        raise ScenarioError(
            "cluster.pools",
            dict(counts),
            "disaggregated serving needs at least one prefill and one decode instance "
            "(or a mixed pool), e.g. {prefill: {instances: 2}, decode: {instances: 2}}",
        )
    assigned = sum(counts.values())
    allow = as_bool(cluster.get("allow_unassigned", False), "cluster.allow_unassigned")
    total = assigned
    if cluster.get("instances") is not None:
        total = as_int(cluster["instances"], "cluster.instances", minimum=1, maximum=100_000)
        if assigned > total:
            raise ScenarioError(
                "cluster.pools",
                dict(counts),
                f"the pools hold {assigned} instances but cluster.instances is {total}; "
                "raise cluster.instances or shrink the pools (or drop cluster.instances)",
            )
        if assigned < total and not allow:
            raise ScenarioError(
                "cluster.instances",
                total,
                f"{total - assigned} instance(s) belong to no pool and would get no traffic; "
                "assign them to a pool, lower cluster.instances, or set "
                "cluster.allow_unassigned: true",
            )
    specs = _groups(groups, defaults, paths=[f"cluster.pools.{role}" for role in roles])
    for role, spec in zip(roles, _first_of_each(specs, groups)):
        if spec.engine.profile == "sglang":
            raise ScenarioError(
                f"cluster.pools.{role}.engine.profile",
                "sglang",
                "SGLang's scheduler is modelled on aggregated instances only, not combined with "
                "disaggregated pools; remove engine.profile or the pools",
            )
        if spec.engine.prefill_first:
            raise ScenarioError(
                f"cluster.pools.{role}.engine.prefill_first",
                True,
                "vLLM v0's prefill-first scheduler is not combined with disaggregated pools; "
                "remove engine.prefill_first",
            )
        if spec.engine.spec_draft_tokens:
            raise ScenarioError(
                f"cluster.pools.{role}.engine.speculative",
                {"draft_tokens": spec.engine.spec_draft_tokens},
                "speculative decoding is not combined with disaggregated pools; "
                "remove engine.speculative (see docs/explanation/what-is-modelled.md)",
            )
    if any(spec.engine.kv_block_bytes <= 0 for spec in specs):
        raise ScenarioError(
            "model",
            data.get("model"),
            "KV transfers are sized from the model's architecture, which is unknown for this "
            "model; name a model with a config (see `servesim list models`) or an HF config.json",
        )
    out: list[InstanceSpec] = []
    k = 0
    for role, group in zip(roles, groups):
        for _ in range(group["count"]):
            out.append(attrs.evolve(specs[k], role=role))
            k += 1
    if total > assigned:
        # unassigned instances have the scenario's own hardware and limits
        base = _groups([{"count": 1}], defaults, paths=["cluster.instances"])[0]
        out.extend([attrs.evolve(base, group=len(roles), role="none")] * (total - assigned))
    return tuple(out), routing


def _first_of_each(specs: Sequence[InstanceSpec], groups: Sequence[Mapping]) -> list[InstanceSpec]:
    """The first instance spec of each group (``specs`` holds every group's instances in order)."""
    out, k = [], 0
    for group in groups:
        out.append(specs[k])
        k += group["count"]
    return out


def _groups(
    value: Any, defaults: GroupDefaults, paths: Sequence[str] | None = None
) -> tuple[InstanceSpec, ...]:
    """``cluster.groups``: instances that differ in GPU, TP, engine limits or latency model.

    Each group's fields override the scenario's own (``engine`` field by field); KV capacity
    ``auto`` is derived from the group's own GPU and TP.
    """
    d = defaults
    data, model, gpu, tp, latency, notes = d.data, d.model, d.gpu, d.tp, d.latency, d.notes
    if not isinstance(value, (list, tuple)) or not value:
        raise ScenarioError(
            "cluster.groups", value, "expected a non-empty list, e.g. [{count: 2, gpu: H100}]"
        )
    specs: list[InstanceSpec] = []
    base_engine = dict(expect_mapping(data.get("engine"), "engine"))
    for i, group in enumerate(value):
        path = paths[i] if paths is not None else f"cluster.groups[{i}]"
        group = expect_mapping(group, path)
        check_keys(group, GROUP_FIELDS, path)
        count = as_int(group.get("count", 1), f"{path}.count", minimum=1, maximum=100_000)
        g_gpu = (
            d.resolve_gpu(group["gpu"], f"{path}.gpu", base_dir=d.base_dir)
            if "gpu" in group
            else gpu
        )
        g_tp = as_int(group["tp"], f"{path}.tp", minimum=1, maximum=1024) if "tp" in group else tp
        if "tp" in group and model.spec is not None and group.get("model") is None:
            from servesim.latency.tensor_parallel import check_tensor_parallel

            check_tensor_parallel(model.spec, g_tp, f"{path}.tp")
        # a group's own model (several models in one fleet): its KV, step times and adapters
        g_model = model
        if group.get("model") is not None:
            from servesim.latency.modelindex import resolve_model
            from servesim.latency.tensor_parallel import check_tensor_parallel

            g_model = resolve_model(group["model"], f"{path}.model", base_dir=d.base_dir)
            if g_model.spec is not None:
                check_tensor_parallel(g_model.spec, g_tp, f"{path}.tp")
        overrides = expect_mapping(group.get("engine"), f"{path}.engine")
        check_keys(overrides, ENGINE_FIELDS, f"{path}.engine")
        try:
            g_engine = _engine(
                {**base_engine, **overrides},
                g_model,
                g_gpu,
                g_tp,
                d.auto_kv_blocks,
                d.auto_max_model_len,
                notes,
            )
        except ScenarioError as exc:
            raise ScenarioError(f"{path}.{exc.path}", exc.value, exc.fix) from None
        g_latency = latency
        if group.get("latency") is not None:
            g_latency = _latency_choice(group["latency"], f"{path}.latency")
            cls = registry.get("latency", g_latency.name)
            params = g_latency.params
        else:
            cls = registry.get("latency", latency.name)
            params = dict(latency.params)
        if g_engine.parallel.plain:
            cls.from_config(params, latency_context(g_model, g_gpu, g_tp, path=f"{path}.latency"))
        else:
            from servesim.latency.expert_parallel import instance_latency

            name = g_latency.name
            context = latency_context(g_model, g_gpu, g_tp, g_engine.parallel)
            instance_latency(name, params, context, f"{path}.latency")
        if g_engine.block_size != int(base_engine.get("block_size", 16)):
            raise ScenarioError(
                f"{path}.engine.block_size",
                g_engine.block_size,
                "every instance must use the scenario's block_size (prefix-cache block ids are shared)",
            )
        spec = InstanceSpec(group=i, gpu=g_gpu, tp=g_tp, engine=g_engine, latency=g_latency)
        if g_model is not model:
            spec = attrs.evolve(spec, model=g_model)
        specs.extend([spec] * count)
    return tuple(specs)
