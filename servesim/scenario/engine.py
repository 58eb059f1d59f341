"""The ``engine`` section parser (vLLM knobs, KV capacity, speculative decoding) and the latency
context an instance's model, GPU and tp give."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servesim.scenario.schema import ENGINE_FIELDS, EngineConfig, read_field
from servesim.simcore.config import (
    as_bool,
    as_float,
    as_int,
    check_keys,
    expect_mapping,
    parse_bytes,
    parse_duration_us,
    parse_rate_bytes,
)
from servesim.simcore.errors import ScenarioError

_DEFAULT = EngineConfig()
"""The engine section's defaults, stated once: on :class:`EngineConfig`'s fields."""


def latency_context(model: Any, gpu: Any, tp: int, parallel: Any = None, path: str = "latency"):
    """The :class:`~servesim.latency.base.LatencyContext` a latency model is built with, for the
    section at ``path`` (``parallel``: the engine's parallel layout, None = tp only)."""
    from servesim.latency.base import LatencyContext

    return LatencyContext(
        model=model.hf_id or model.name,
        gpu=gpu.name,
        tp=tp,
        model_spec=model.spec,
        hardware=gpu,
        path=path,
        parallel=parallel,
    )


def _parallel(section: Mapping[str, Any], model: Any, tp: int, p: str) -> dict[str, Any]:
    """``engine.dp/ep/pp/cp`` and the node layout, validated (servesim.latency.parallel)."""
    from servesim.latency.parallel import Parallelism, check_parallelism

    values: dict[str, Any] = {}
    for key in ("dp", "ep", "pp", "cp"):
        values[key] = as_int(section.get(key, 1), f"{p}.{key}", minimum=1, maximum=4096)
    values["gpus_per_node"] = as_int(
        section.get("gpus_per_node", _DEFAULT.gpus_per_node),
        f"{p}.gpus_per_node",
        minimum=1,
        maximum=4096,
    )
    gbs = parse_rate_bytes(
        section.get("internode_bandwidth", f"{_DEFAULT.internode_gbs:g}GB/s"),
        f"{p}.internode_bandwidth",
    )
    if gbs <= 0:
        raise ScenarioError(
            f"{p}.internode_bandwidth",
            section.get("internode_bandwidth"),
            "must be positive: the per-GPU link between nodes, e.g. 50GB/s (one 400 Gb/s NIC)",
        )
    values["internode_gbs"] = gbs / 1e9
    values["internode_latency_us"] = float(
        parse_duration_us(
            section.get("internode_latency", f"{_DEFAULT.internode_latency_us:g}us"),
            f"{p}.internode_latency",
        )
    )
    par = Parallelism(**values)
    if model.spec is None and (par.ep > 1 or par.pp > 1 or par.cp > 1):
        key = "ep" if par.ep > 1 else "pp" if par.pp > 1 else "cp"
        raise ScenarioError(
            f"{p}.{key}",
            values[key],
            f"{model.name} has no architecture config (layers, experts): give model: "
            "path/to/config.json, or remove the field",
        )
    check_parallelism(model.spec, tp, par, p)
    return values


def _engine(
    section: Mapping[str, Any],
    model: Any,
    gpu: Any,
    tp: int,
    auto_kv_blocks,
    auto_max_model_len,
    notes: list,
) -> EngineConfig:
    check_keys(section, ENGINE_FIELDS, "engine")
    p = "engine"
    max_num_seqs = read_field(EngineConfig, "max_num_seqs", section, p)
    max_batched = read_field(EngineConfig, "max_num_batched_tokens", section, p)
    block_size = read_field(EngineConfig, "block_size", section, p)
    threshold = read_field(EngineConfig, "long_prefill_token_threshold", section, p)
    prefill_first = read_field(EngineConfig, "prefill_first", section, p)
    chunked_raw = section.get("enable_chunked_prefill", not prefill_first)
    chunked = as_bool(chunked_raw, f"{p}.enable_chunked_prefill")
    if prefill_first and threshold:
        raise ScenarioError(
            f"{p}.long_prefill_token_threshold",
            threshold,
            "engine.prefill_first (vLLM v0) computes every prompt in one step; remove the threshold",
        )
    if prefill_first and chunked:
        raise ScenarioError(
            f"{p}.enable_chunked_prefill",
            chunked_raw,
            "engine.prefill_first is vLLM v0's scheduler, which never chunks a prompt; "
            "remove engine.enable_chunked_prefill (or set it to false)",
        )
    prefix = read_field(EngineConfig, "enable_prefix_caching", section, p)
    utilisation = read_field(EngineConfig, "gpu_memory_utilization", section, p)
    # engine.profile: sglang -- SGLang's page size and chunk size (see _sglang_limits)
    profile = read_field(EngineConfig, "profile", section, p)
    if profile == "sglang":
        block_size, max_batched = _sglang_limits(section, gpu, prefill_first, block_size, p)

    layout = _parallel(section, model, tp, p)
    parallel = EngineConfig(**layout).parallel
    kv_raw = section.get("kv_blocks", "auto")
    if kv_raw == "auto":
        spec = model.require_spec("model", "engine.kv_blocks: auto (KV capacity from memory)")
        kv_blocks = auto_kv_blocks(
            spec,
            gpu,
            tp,
            block_size,
            utilisation,
            max_num_batched_tokens=max_batched,
            max_num_seqs=max_num_seqs,
            **({} if parallel.plain else {"parallel": parallel}),
            path=f"{p}.kv_blocks",
        )
        kv_source = (
            f"auto: {gpu.name} x{tp}{parallel.label()}, gpu_memory_utilization "
            f"{utilisation:g}, activation peak of {max_batched} tokens"
        )
    else:
        kv_blocks = as_int(kv_raw, f"{p}.kv_blocks", minimum=1)
        kv_source = "explicit"
    # engine.lora: LoRA adapters (servesim.scenario.lora); with kv_blocks auto their GPU slots
    # take their memory from the KV cache, as vLLM allocates them before sizing it
    from servesim.scenario.lora import parse_lora, slots_kv_blocks

    lora = parse_lora(section.get("lora"), f"{p}.lora", model, tp)
    if lora is not None and kv_raw == "auto":
        from servesim.latency.kvcapacity import kv_bytes_per_token

        per_block = int(kv_bytes_per_token(model.spec, tp) * block_size)
        kv_blocks, taken = slots_kv_blocks(lora, kv_blocks, per_block)
        kv_source += f", minus {taken} for {lora.max_loras} LoRA slot(s)"

    capacity_tokens = kv_blocks * block_size
    mml_raw = section.get("max_model_len", "auto")
    if mml_raw == "auto":
        derived = auto_max_model_len(model.spec) if model.spec is not None else None
        if derived is None:
            max_model_len, mml_source = (
                capacity_tokens,
                "auto: KV capacity (model config has no context limit)",
            )
        elif derived > capacity_tokens:
            max_model_len, mml_source = (
                capacity_tokens,
                f"auto: capped from {derived} to the KV capacity",
            )
            notes.append(
                (
                    "max_model_len capped to the KV cache capacity",
                    {
                        "model_limit": derived,
                        "kv_capacity_tokens": capacity_tokens,
                        "fix": "set engine.max_model_len explicitly or give more KV blocks",
                    },
                )
            )
        else:
            max_model_len, mml_source = derived, "auto: from the model config"
    else:
        max_model_len = as_int(mml_raw, f"{p}.max_model_len", minimum=1)
        mml_source = "explicit"
        if max_model_len < block_size:
            raise ScenarioError(
                f"{p}.max_model_len",
                max_model_len,
                f"must hold at least one block ({block_size} tokens)",
            )
        if -(-max_model_len // block_size) > kv_blocks:
            raise ScenarioError(
                f"{p}.max_model_len",
                max_model_len,
                f"a request this long needs {-(-max_model_len // block_size)} KV blocks but the cache has "
                f"{kv_blocks}; lower max_model_len to at most {capacity_tokens} or raise engine.kv_blocks",
            )
    if max_model_len < 2:
        raise ScenarioError(
            f"{p}.max_model_len",
            max_model_len,
            "must be at least 2 tokens (one prompt, one output)",
        )
    if profile == "sglang":
        if not chunked:  # whole prompts, however long: only max_prefill_tokens bounds a batch
            max_batched = max(max_model_len, max_batched)
        if "max_num_seqs" not in section:
            from servesim.components.sglang import default_max_running_requests

            max_num_seqs = default_max_running_requests(kv_blocks, max_model_len)
    # vLLM v0 admits a prompt only if 1% of the cache stays free afterwards (its watermark)
    watermark = int(0.01 * kv_blocks) if prefill_first else 0
    if prefill_first and "max_num_batched_tokens" not in section:
        max_batched = max(max_model_len, max_batched)  # vLLM v0's default without chunking
    if not chunked and max_batched < max_model_len:
        raise ScenarioError(
            f"{p}.max_num_batched_tokens",
            max_batched,
            f"without chunked prefill a whole prompt must fit one step: raise it to max_model_len "
            f"({max_model_len}), lower engine.max_model_len, or "
            + (
                "remove engine.prefill_first"
                if prefill_first
                else "set engine.enable_chunked_prefill: true"
            ),
        )
    kv_block_bytes = 0
    if model.spec is not None:
        from servesim.latency.kvcapacity import kv_bytes_per_token

        kv_block_bytes = int(kv_bytes_per_token(model.spec, tp) * block_size)
    cpu_raw = section.get("kv_cpu_blocks", _DEFAULT.kv_cpu_blocks)
    if isinstance(cpu_raw, str) and not cpu_raw.strip().isdigit():
        size = parse_bytes(cpu_raw, f"{p}.kv_cpu_blocks")
        if not kv_block_bytes:
            raise ScenarioError(
                f"{p}.kv_cpu_blocks",
                cpu_raw,
                "a size needs the model's KV bytes per block; give a block count instead",
            )
        kv_cpu_blocks = int(size // kv_block_bytes)
    else:
        kv_cpu_blocks = as_int(cpu_raw, f"{p}.kv_cpu_blocks", minimum=0)
    cpu_bandwidth = parse_rate_bytes(
        section.get("kv_cpu_bandwidth", "25GB/s"), f"{p}.kv_cpu_bandwidth"
    )
    if cpu_bandwidth <= 0:
        raise ScenarioError(
            f"{p}.kv_cpu_bandwidth",
            section.get("kv_cpu_bandwidth"),
            "must be positive, e.g. 25GB/s",
        )
    cpu_latency = parse_duration_us(section.get("kv_cpu_latency", 0), f"{p}.kv_cpu_latency")
    preemption_mode = read_field(EngineConfig, "preemption_mode", section, p)
    # vLLM's --swap-space: GiB of CPU memory per GPU (a bare number is GiB, as in vLLM)
    swap_space = parse_bytes(section.get("swap_space", 4), f"{p}.swap_space", bare_unit="gib")
    swap_blocks = int(swap_space // kv_block_bytes) if kv_block_bytes else 0
    if preemption_mode == "swap" and not kv_block_bytes:
        raise ScenarioError(
            f"{p}.preemption_mode",
            preemption_mode,
            "swapping is priced from the model's KV bytes per block; use a model with an "
            "architecture config (model: path/to/config.json) or preemption_mode: recompute",
        )
    spec_k, spec_a, spec_c = _speculative(section.get("speculative"), f"{p}.speculative")
    if spec_k and preemption_mode == "swap":
        raise ScenarioError(
            f"{p}.preemption_mode",
            preemption_mode,
            "swapping is modelled without speculative decoding; "
            "use preemption_mode: recompute or remove engine.speculative",
        )
    if spec_k and layout["dp"] > 1 and model.spec is not None and model.spec.is_moe:
        raise ScenarioError(
            f"{p}.speculative",
            section.get("speculative"),
            "speculative decoding is not modelled in lock-stepped data-parallel MoE ranks; "
            "remove engine.speculative or set engine.dp: 1",
        )
    if spec_k and prefill_first:
        raise ScenarioError(
            f"{p}.prefill_first",
            True,
            "speculative decoding is modelled with vLLM v1's scheduler only; "
            "remove engine.prefill_first or engine.speculative",
        )
    if kv_cpu_blocks and not kv_block_bytes:
        raise ScenarioError(
            f"{p}.kv_cpu_blocks",
            kv_cpu_blocks,
            "the CPU tier needs the model's KV bytes per block to price reloads; use a model with an "
            "architecture config (model: path/to/config.json)",
        )
    if profile == "sglang":
        _check_sglang(section, model, layout, spec_k, preemption_mode, kv_cpu_blocks, p)
    else:
        _check_sglang_knobs(section, p)
    # engine.kv_tiers: offload tiers below the GPU (servesim.scenario.kvtiers)
    from servesim.scenario.kvtiers import parse_kv_tiers

    kv_tiers = parse_kv_tiers(
        section.get("kv_tiers"), f"{p}.kv_tiers", kv_block_bytes, kv_cpu_blocks
    )
    config = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        block_size=block_size,
        kv_blocks=kv_blocks,
        kv_blocks_source=kv_source,
        max_model_len=max_model_len,
        max_model_len_source=mml_source,
        long_prefill_token_threshold=threshold,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix,
        prefill_first=prefill_first,
        watermark_blocks=watermark,
        gpu_memory_utilization=utilisation,
        kv_cpu_blocks=kv_cpu_blocks,
        kv_cpu_bandwidth_bytes_s=cpu_bandwidth,
        kv_cpu_latency_us=cpu_latency,
        kv_block_bytes=kv_block_bytes,
        preemption_mode=preemption_mode,
        swap_space_bytes=swap_space,
        swap_blocks=swap_blocks,
        spec_draft_tokens=spec_k,
        spec_acceptance=spec_a,
        spec_draft_cost=spec_c,
        kv_tiers=kv_tiers,
        **layout,
        profile=profile,
        schedule_policy=read_field(EngineConfig, "schedule_policy", section, p),
        schedule_conservativeness=read_field(EngineConfig, "schedule_conservativeness", section, p),
        max_prefill_tokens=read_field(EngineConfig, "max_prefill_tokens", section, p),
        lora=lora,
    )
    if lora is not None:
        from servesim.scenario.lora import check_lora_engine

        check_lora_engine(lora, config, p)
    return config


def _sglang_limits(
    section: Mapping[str, Any], gpu: Any, prefill_first: bool, block_size: int, p: str
) -> tuple[int, int]:
    """``engine.profile: sglang``: its page size (one token) and, unless given, its chunk size
    (``max_num_batched_tokens`` stands for SGLang's ``chunked_prefill_size``), which SGLang
    picks by the GPU's memory."""
    from servesim.components.sglang import default_chunked_prefill_size

    if "block_size" in section and block_size != 1:
        raise ScenarioError(
            f"{p}.block_size",
            block_size,
            "engine.profile: sglang models SGLang's default page_size of one token; "
            "remove engine.block_size (or set it to 1)",
        )
    if prefill_first:
        raise ScenarioError(
            f"{p}.prefill_first",
            True,
            "engine.prefill_first is vLLM v0's scheduler; engine.profile: sglang has its own "
            "(prefill batches first); remove one of them",
        )
    if "max_num_batched_tokens" in section:
        return 1, read_field(EngineConfig, "max_num_batched_tokens", section, p)
    return 1, default_chunked_prefill_size(gpu.memory_gib)


SGLANG_KNOBS = ("schedule_policy", "schedule_conservativeness", "max_prefill_tokens")


def _check_sglang_knobs(section: Mapping[str, Any], p: str) -> None:
    """SGLang's own knobs changed from their defaults without ``profile: sglang`` would be
    ignored: refused instead."""
    for key in SGLANG_KNOBS:
        if key in section and read_field(EngineConfig, key, section, p) != getattr(_DEFAULT, key):
            raise ScenarioError(
                f"{p}.{key}",
                section[key],
                "applies to engine.profile: sglang only; add profile: sglang or remove it",
            )


def _check_sglang(
    section: Mapping[str, Any],
    model: Any,
    layout: Mapping[str, int],
    spec_k: int,
    preemption_mode: str,
    kv_cpu_blocks: int,
    p: str,
) -> None:
    """The engine features not modelled with ``engine.profile: sglang``."""
    unsupported = (
        (
            "long_prefill_token_threshold",
            section.get("long_prefill_token_threshold", 0),
            "a per-request prefill cap (vLLM's; SGLang chunks by chunked_prefill_size)",
        ),
        ("speculative", spec_k, "speculative decoding"),
        ("preemption_mode", preemption_mode == "swap", "swapping (SGLang retracts instead)"),
        ("kv_cpu_blocks", kv_cpu_blocks, "a CPU KV tier (SGLang's hierarchical cache)"),
        ("kv_tiers", section.get("kv_tiers"), "KV offload tiers (SGLang's hierarchical cache)"),
        (
            "dp",
            layout["dp"] > 1 and model.spec is not None and model.spec.is_moe,
            "lock-stepped data-parallel MoE ranks",
        ),
    )
    for key, used, what in unsupported:
        if used:
            raise ScenarioError(
                f"{p}.{key}",
                section.get(key),
                f"{what} is not modelled with engine.profile: sglang; remove engine.{key} "
                "or use engine.profile: vllm",
            )


def _speculative(value: Any, path: str) -> tuple[int, float, float]:
    """``speculative: {draft_tokens: k, acceptance_rate: a, draft_cost: auto|c}`` (absent = off)."""
    if value is None or value is False:
        return 0, 0.0, 0.0
    section = expect_mapping(value, path)
    check_keys(section, ("draft_tokens", "acceptance_rate", "draft_cost"), path)
    for key in ("draft_tokens", "acceptance_rate"):
        if key not in section:
            raise ScenarioError(
                f"{path}.{key}",
                None,
                "missing; e.g. speculative: {draft_tokens: 3, acceptance_rate: 0.7}",
            )
    k = as_int(section["draft_tokens"], f"{path}.draft_tokens", minimum=1, maximum=64)
    a = as_float(section["acceptance_rate"], f"{path}.acceptance_rate")
    if not 0.0 < a < 1.0:
        raise ScenarioError(f"{path}.acceptance_rate", a, "must be strictly between 0 and 1")
    cost = section.get("draft_cost", "auto")
    if cost == "auto":
        from servesim.components.speculative import auto_draft_cost

        c = auto_draft_cost(a)
    else:
        c = as_float(cost, f"{path}.draft_cost", exclusive_minimum=0.0, maximum=1.0)
    return k, a, c
