"""The scenario schema: the frozen config sections a :class:`~servesim.scenario.Scenario` is made of,
the fields each YAML section accepts, and the built-in default scenario."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from servesim.latency.kvcapacity import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
)

DEFAULT_SCENARIO: dict[str, Any] = {
    "seed": 42,
    "model": "qwen3-14b",
    "gpu": "H100",
    "tp": 1,
    "latency": {"model": "blackbox"},
    "workload": {"preset": "chatbot", "rate": 20, "requests": 2000},
}

TOP_LEVEL_FIELDS = (
    "name",
    "seed",
    "model",
    "gpu",
    "tp",
    "cluster",
    "engine",
    "latency",
    "policies",
    "workload",
    "horizon",
    "exact_steps",
    "audit",
    "output",
    "slo",
)
CLUSTER_FIELDS = (
    "instances",
    "groups",
    "pools",
    "allow_unassigned",
    "kv_transfer",
    "admission_latency",
    "routing_latency",
    "snapshot_interval",
    "cache_signal_delay",
)
GROUP_FIELDS = ("count", "gpu", "tp", "latency", "engine")
POOL_NAMES = ("prefill", "decode", "mixed")
POOL_FIELDS = ("instances", "gpu", "tp", "latency", "engine", "routing")
KV_TRANSFER_FIELDS = (
    "bandwidth",
    "base_latency",
    "topology",
    "sharing",
    "decode_full",
    "decode_queue_limit",
    "blocking",
)
KV_TRANSFER_TOPOLOGIES = ("shared", "pair", "prefill-nic", "decode-nic")
KV_TRANSFER_SHARING = ("processor-sharing", "at-start")
FLOW_CONTROL_FIELDS = (
    "detector",
    "order",
    "max_queue",
    "per_band_capacity",
    "shedding",
    "ttl",
    "tick",
)
SLO_TARGET_FIELDS = ("ttft", "itl", "e2e")
ENGINE_FIELDS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_blocks",
    "max_model_len",
    "long_prefill_token_threshold",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "prefill_first",
    "gpu_memory_utilization",
    "kv_cpu_blocks",
    "kv_cpu_bandwidth",
    "kv_cpu_latency",
    "preemption_mode",
    "swap_space",
    "speculative",
    "dp",
    "ep",
    "pp",
    "cp",
    "gpus_per_node",
    "internode_bandwidth",
    "internode_latency",
)
POLICY_FIELDS = (
    "admission",
    "routing",
    "scheduler",
    "preemption",
    "flow_control",
    "disaggregation",
)
OUTPUT_FIELDS = (
    "dir",
    "timeseries_interval",
    "steps",
    "trace",
    "counterfactual_k",
    "workload_trace",
)
AUDIT_FIELDS = ("enabled", "kv_every_step")


@attrs.frozen
class EngineConfig:
    """vLLM engine limits, with vLLM's names. ``kv_blocks``/``max_model_len`` are resolved ints.

    The defaults here are the ``engine`` section's defaults (the parser reads them from this class);
    the three the KV-capacity profile run also needs come from :mod:`servesim.latency.kvcapacity`."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    block_size: int = 16
    kv_blocks: int = 0
    kv_blocks_source: str = "auto"
    max_model_len: int = 0
    max_model_len_source: str = "auto"
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    prefill_first: bool = False
    watermark_blocks: int = 0
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cpu_blocks: int = 0
    kv_cpu_bandwidth_bytes_s: float = 25e9
    kv_cpu_latency_us: int = 0
    kv_block_bytes: int = 0
    preemption_mode: str = "recompute"
    swap_space_bytes: float = 4 * 2**30
    swap_blocks: int = 0  # CPU blocks of the swap space (per GPU bytes / per GPU block bytes)
    spec_draft_tokens: int = 0
    spec_acceptance: float = 0.0
    spec_draft_cost: float = 0.0
    # parallelism beyond tp (servesim.latency.parallel): data-parallel ranks per engine (each an
    # instance), expert parallelism over dp x tp, pipeline stages, context-parallel ranks, and
    # where the GPUs sit (nodes of gpus_per_node, the inter-node link per GPU)
    dp: int = 1
    ep: int = 1
    pp: int = 1
    cp: int = 1
    gpus_per_node: int = 8
    internode_gbs: float = 50.0
    internode_latency_us: float = 10.0

    @property
    def parallel(self) -> Any:
        """The :class:`~servesim.latency.parallel.Parallelism` these fields describe."""
        from servesim.latency.parallel import Parallelism

        return Parallelism(
            dp=self.dp,
            ep=self.ep,
            pp=self.pp,
            cp=self.cp,
            gpus_per_node=self.gpus_per_node,
            internode_gbs=self.internode_gbs,
            internode_latency_us=self.internode_latency_us,
            batch_tokens=self.max_num_batched_tokens if self.pp > 1 else 0,
        )

    @property
    def cpu_reload_us_per_block(self) -> float:
        return (
            self.kv_block_bytes / self.kv_cpu_bandwidth_bytes_s * 1e6
            if self.kv_block_bytes
            else 0.0
        )


@attrs.frozen
class PolicyChoice:
    """A plugin name and its parameters (validated by the plugin)."""

    name: str
    params: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ClusterConfig:
    """Control-plane timing: latencies added per request and the freshness of router signals."""

    instances: int = 1
    admission_latency_us: int = 0
    routing_latency_us: int = 0
    snapshot_interval_us: int = 50_000
    cache_signal_delay_us: int = 50_000


@attrs.frozen
class InstanceSpec:
    """One instance's hardware, engine limits and latency model (groups make them differ).

    ``role`` is its pool in disaggregated serving: prefill, decode, mixed (both), or none (an
    unassigned instance that receives no traffic); "mixed" when the scenario has no pools.
    """

    group: int
    gpu: Any
    tp: int
    engine: EngineConfig
    latency: PolicyChoice
    role: str = "mixed"


@attrs.frozen
class KVTransferConfig:
    """The links that move KV caches from prefill to decode instances (``cluster.kv_transfer``)."""

    bandwidth_bytes_s: float = 25e9
    base_latency_us: int = 50
    topology: str = "shared"
    sharing: str = "processor-sharing"
    # no room for the prompt's KV on the decode instance: wait (the prefill instance frees it),
    # backpressure (the prefill instance keeps it until the transfer ends) or drop (BLIS)
    decode_full: str = "wait"
    # a decode instance accepts a transfer only while the prompts it accepted and does not run
    # yet hold less than this fraction of its KV blocks (0: no limit; DistServe: 0.05)
    decode_queue_limit: float = 0.0
    blocking: bool = False  # the decode instance stalls for each transfer it receives (DistServe)


@attrs.frozen
class PDConfig:
    """Disaggregated serving: the decider, the transfer links, per-pool routing overrides."""

    decider: PolicyChoice
    transfer: KVTransferConfig
    routing: Mapping[str, PolicyChoice] = attrs.field(factory=dict)


@attrs.frozen
class FlowControl:
    """Gateway queue settings (see servesim.components.gateway)."""

    detector: PolicyChoice
    order: str = "priority"
    max_queue: int = 0
    per_band_capacity: int = 0
    shedding: bool = False
    ttl_us: int = 0
    tick_us: int = 1000


@attrs.frozen
class SLOTarget:
    """Per-class goodput targets in µs (0 = not judged on that dimension)."""

    ttft_us: int = 0
    itl_us: int = 0
    e2e_us: int = 0


@attrs.frozen
class OutputConfig:
    dir: str | None = None
    timeseries_interval_us: int = 1_000_000
    steps: bool = True
    trace: str = "none"  # "decisions": record every routing decision (decisions.csv)
    counterfactual_k: int = 3
    workload_trace: bool = False  # write workload.csv.gz: this run's requests, replayable


@attrs.frozen
class AuditConfig:
    enabled: bool = True
    kv_every_step: bool = False


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
