"""``engine.lora``: LoRA adapters an instance serves beside its base model (vLLM's LoRA knobs),
and the checks that tie a workload's models and adapters to the instances that serve them.

vLLM's knobs keep their names and defaults: ``max_loras`` (adapters in GPU slots, so also the
most distinct adapters one batch may hold; vLLM default 1), ``max_cpu_loras`` (adapters kept in
CPU memory, default ``max_loras``, never fewer), ``max_lora_rank`` (the rank the GPU slots are
sized for; vLLM default 16). servesim adds what vLLM reads from the adapter files: the adapters
themselves (``adapters``: names, or name -> rank), the modules they adapt (``target_modules``:
``attention`` = q, k, v, o projections, the common PEFT choice and the default; ``all-linear``
adds the MLP's gate, up and down; or a list of those names) and what loading one costs
(``pcie_bandwidth``, ``disk_bandwidth``, ``load_latency``). How the engine uses them is in
:mod:`servesim.components.adapters`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from servesim.simcore.config import (
    as_int,
    check_keys,
    expect_mapping,
    parse_duration_us,
    parse_rate_bytes,
)
from servesim.simcore.errors import ScenarioError

LORA_KEYS = (
    "max_loras",
    "max_cpu_loras",
    "max_lora_rank",
    "adapters",
    "target_modules",
    "pcie_bandwidth",
    "disk_bandwidth",
    "load_latency",
)
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULE_SETS = {"attention": MODULES[:4], "all-linear": MODULES}
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted max_lora_rank values
EXAMPLE = "e.g. lora: {max_loras: 2, adapters: [sql, chat]}"


@attrs.frozen
class LoRAConfig:
    """One instance's LoRA settings, validated. ``adapters`` maps each adapter name to its rank.
    Sizes, for the instance's model and tp: ``adapter_bytes`` each adapter's file (all layers),
    ``shard_bytes`` the part of it each GPU holds (what it copies over PCIe), ``slot_bytes`` one
    GPU slot (padded to ``max_lora_rank``) on each GPU, ``flops_per_token`` the LoRA kernels'
    FLOPs per token on each GPU. ``pcie_bytes_s`` is each GPU's host-to-GPU copy rate (the GPUs
    of a tp group copy their shards in parallel)."""

    max_loras: int = 1
    max_cpu_loras: int = 1
    max_lora_rank: int = 16
    adapters: Mapping[str, int] = attrs.field(factory=dict)
    target_modules: tuple[str, ...] = MODULE_SETS["attention"]
    pcie_bytes_s: float = 25e9
    disk_bytes_s: float = 2e9
    load_latency_us: int = 1000
    adapter_bytes: Mapping[str, int] = attrs.field(factory=dict)
    shard_bytes: Mapping[str, int] = attrs.field(factory=dict)
    slot_bytes: int = 0
    flops_per_token: float = 0.0
    model: str = ""


ROW_PARALLEL = ("o_proj", "down_proj")
"""Layers split by their input over the tp GPUs (vLLM's RowParallelLinear); the others are split
by their output (ColumnParallelLinear)."""


def module_dims(spec: Any) -> dict[str, tuple[int, int]]:
    """(in, out) features of each adaptable linear layer of one transformer layer."""
    hidden = spec.hidden_size
    head = spec.head_dim
    q = spec.num_heads * head
    kv = spec.num_kv_heads * head
    ffn = spec.dense_intermediate_size or spec.intermediate_size
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, ffn),
        "up_proj": (hidden, ffn),
        "down_proj": (ffn, hidden),
    }


def rank_width(spec: Any, modules: tuple[str, ...], tp: int = 1) -> float:
    """Parameters per unit of rank one GPU holds, over the adapted matrices of all layers: an
    adapter of rank r has A (r x in) and B (out x r) per matrix. As vLLM shards them, a
    column-parallel layer keeps A whole and splits B's rows over the tp GPUs; a row-parallel one
    splits A's columns and keeps B whole. ``tp`` 1: the whole adapter."""
    dims = module_dims(spec)
    width = 0.0
    for m in modules:
        n_in, n_out = dims[m]
        width += n_in / tp + n_out if m in ROW_PARALLEL else n_in + n_out / tp
    return spec.num_layers * width


def slots_kv_blocks(lora: LoRAConfig, kv_blocks: int, block_bytes: int) -> tuple[int, int]:
    """KV blocks left when the ``max_loras`` GPU slots take their memory out of the KV cache
    (vLLM allocates them with the model, before it sizes the cache), and the blocks taken."""
    taken = -(-lora.max_loras * lora.slot_bytes // block_bytes) if block_bytes else 0
    return max(kv_blocks - taken, 1), taken


def parse_lora(value: Any, path: str, model: Any, tp: int = 1) -> LoRAConfig | None:
    """``engine.lora`` (absent, null or false: LoRA off), validated against the model; sizes
    for an instance of ``tp`` GPUs."""
    if value in (None, False):
        return None
    section = expect_mapping(value, path)
    check_keys(section, LORA_KEYS, path)
    if model.spec is None:
        raise ScenarioError(
            path,
            dict(section),
            f"adapter sizes come from the model's architecture, which is unknown for "
            f"{model.name}; name a model with a config (see `servesim list models`)",
        )
    max_loras = as_int(section.get("max_loras", 1), f"{path}.max_loras", minimum=1, maximum=4096)
    max_cpu = as_int(
        section.get("max_cpu_loras", max_loras), f"{path}.max_cpu_loras", minimum=1, maximum=1 << 20
    )
    if max_cpu < max_loras:
        raise ScenarioError(
            f"{path}.max_cpu_loras",
            max_cpu,
            f"must be at least max_loras ({max_loras}): an adapter in a GPU slot is also kept in "
            "CPU memory (vLLM refuses the same); raise max_cpu_loras or drop it",
        )
    max_rank = as_int(section.get("max_lora_rank", 16), f"{path}.max_lora_rank", minimum=1)
    if max_rank not in VLLM_RANKS:
        raise ScenarioError(
            f"{path}.max_lora_rank", max_rank, f"vLLM accepts one of {list(VLLM_RANKS)}"
        )
    adapters = _adapters(section.get("adapters"), f"{path}.adapters", max_rank)
    modules = _modules(section.get("target_modules", "attention"), f"{path}.target_modules")
    rates = {}
    for key, default in (("pcie_bandwidth", "25GB/s"), ("disk_bandwidth", "2GB/s")):
        rate = parse_rate_bytes(section.get(key, default), f"{path}.{key}")
        if not rate > 0:
            raise ScenarioError(f"{path}.{key}", section.get(key), "must be positive, e.g. 25GB/s")
        rates[key] = rate
    latency = parse_duration_us(section.get("load_latency", "1ms"), f"{path}.load_latency")
    spec = model.spec
    width, shard = rank_width(spec, modules), rank_width(spec, modules, tp)
    dtype = spec.bytes_per_param if spec.bytes_per_param >= 2 else 2.0
    return LoRAConfig(
        max_loras=max_loras,
        max_cpu_loras=max_cpu,
        max_lora_rank=max_rank,
        adapters=adapters,
        target_modules=modules,
        pcie_bytes_s=rates["pcie_bandwidth"],
        disk_bytes_s=rates["disk_bandwidth"],
        load_latency_us=latency,
        adapter_bytes={name: int(rank * width * dtype) for name, rank in adapters.items()},
        shard_bytes={name: int(rank * shard * dtype) for name, rank in adapters.items()},
        slot_bytes=int(max_rank * shard * dtype),
        flops_per_token=2.0 * max_rank * shard,
        model=model.name,
    )


def _adapters(value: Any, path: str, max_rank: int) -> dict[str, int]:
    """``adapters``: a list of names (each of rank ``max_lora_rank``) or a mapping name -> rank."""
    if isinstance(value, (list, tuple)) and value:
        value = {name: max_rank for name in value}
    if not isinstance(value, Mapping) or not value:
        raise ScenarioError(
            path,
            value,
            f"name the adapters this instance can load (a list, or name: rank); {EXAMPLE}",
        )
    out: dict[str, int] = {}
    for name, rank in value.items():
        if not isinstance(name, str) or not name:
            raise ScenarioError(path, name, "an adapter name must be a non-empty string")
        r = as_int(rank, f"{path}.{name}", minimum=1)
        if r > max_rank:
            raise ScenarioError(
                f"{path}.{name}",
                r,
                f"the rank exceeds max_lora_rank ({max_rank}); vLLM refuses to load such an "
                "adapter: raise engine.lora.max_lora_rank or use a smaller rank",
            )
        out[name] = r
    return out


def _modules(value: Any, path: str) -> tuple[str, ...]:
    if isinstance(value, str) and value in MODULE_SETS:
        return MODULE_SETS[value]
    if isinstance(value, (list, tuple)) and value and all(m in MODULES for m in value):
        return tuple(m for m in MODULES if m in value)
    raise ScenarioError(
        path,
        value,
        f"expected attention, all-linear, or a list of {', '.join(MODULES)}",
    )


def check_lora_engine(lora: LoRAConfig | None, engine: Any, path: str) -> None:
    """The engine features LoRA is not combined with (their schedulers admit requests their own
    way, or price a step more than once)."""
    if lora is None:
        return
    for used, key, what in (
        (engine.profile == "sglang", "profile", "SGLang's scheduler"),
        (engine.prefill_first, "prefill_first", "vLLM v0's prefill-first scheduler"),
        (engine.spec_draft_tokens > 0, "speculative", "speculative decoding"),
        (engine.preemption_mode == "swap", "preemption_mode", "preemption by swapping"),
    ):
        if used:
            raise ScenarioError(
                f"{path}.lora",
                "(set)",
                f"LoRA adapters are not modelled with {what}; remove engine.lora or engine.{key}",
            )


def check_served(scenario: Any) -> None:
    """Every model and adapter the workload names is served by some instance (load time)."""
    from servesim.latency.modelindex import resolve_model

    workload = scenario.workload
    names = tuple(getattr(workload, "model_names", ()) or ())
    adapters = tuple(getattr(workload, "adapter_names", ()) or ())
    specs = scenario.instance_specs
    served = sorted({served_model(scenario, s) for s in specs})
    lora = any(s.engine.lora is not None for s in specs)
    if len(served) == 1 and not names and not adapters and not lora:
        return  # one model, no adapters: nothing to check
    if scenario.pd is not None and (len(served) > 1 or lora):
        raise ScenarioError(
            "cluster.pools",
            served,
            "several models and LoRA adapters are not combined with disaggregated pools; "
            "serve one model without engine.lora, or use cluster.groups without pools",
        )
    if len(served) > 1 and scenario.cluster.autoscaling is not None:
        raise ScenarioError(
            "cluster.autoscaling",
            served,
            "autoscaling is not combined with several models; remove cluster.autoscaling or "
            "serve one model",
        )
    if (names or adapters) and getattr(workload, "sessions", None):
        raise ScenarioError(
            "workload",
            "sessions",
            "requests that name models or adapters are not combined with sessions (their later "
            "rounds would name neither); replay the trace open loop or drop those columns",
        )
    trace = hasattr(workload, "table")
    pairs = tuple(getattr(workload, "name_pairs", ()) or ())
    default = served[0] if len(served) == 1 else scenario.model.name
    unnamed = not names or any(not raw for raw, _ in pairs)
    if unnamed and default not in served:
        raise ScenarioError(
            "workload.trace" if trace else "workload.models",
            None,
            f"some requests name no model and the scenario's model ({default}) is served by no "
            f"instance (served: {', '.join(served)}); name a model for every request, e.g. "
            f"workload.models: {{{served[0]}: 1}}",
        )
    canonical = {}
    for raw in names:
        name = canonical[raw] = resolve_model(raw, "workload.models").name
        if name not in served:
            raise ScenarioError(
                "workload.trace" if trace else "workload.models",
                raw,
                f"no instance serves this model (served: {', '.join(served)}); give a group "
                f"model: {raw} in cluster.groups, or fix the name",
            )
    where = "workload.trace" if trace else "workload.adapters"
    for raw, adapter in getattr(workload, "name_pairs", ()) or ():
        model = canonical.get(raw, default) if raw else default
        if adapter and not any(
            s.engine.lora is not None
            and adapter in s.engine.lora.adapters
            and served_model(scenario, s) == model
            for s in specs
        ):
            known = sorted(
                {
                    a
                    for s in specs
                    if s.engine.lora is not None and served_model(scenario, s) == model
                    for a in s.engine.lora.adapters
                }
            )
            raise ScenarioError(
                where,
                adapter,
                f"no instance serving {model} can load this adapter (it knows: "
                + (", ".join(known) or "none, no engine.lora")
                + "); add it to engine.lora.adapters of those instances, or fix the name",
            )


def served_model(scenario: Any, spec: Any) -> str:
    """The name of the model an instance serves (its group's, else the scenario's)."""
    return (spec.model or scenario.model).name
