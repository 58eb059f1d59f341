"""The scenario schema: the frozen config sections a :class:`~servesim.scenario.Scenario` is made of,
the fields each YAML section accepts, and the built-in default scenario."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from servesim.latency.kvcapacity import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
)
from servesim.simcore.config import (
    as_bool,
    as_float,
    as_int,
    as_str,
    parse_duration_us,
    parse_rate_bytes,
)
from servesim.simcore.errors import ScenarioError

__all__ = [
    "AUDIT_FIELDS",
    "AUTOSCALING_FIELDS",
    "CLUSTER_FIELDS",
    "DEFAULT_SCENARIO",
    "ENGINE_FIELDS",
    "FLOW_CONTROL_FIELDS",
    "GROUP_FIELDS",
    "OUTPUT_FIELDS",
    "POLICY_FIELDS",
    "SLO_TARGET_FIELDS",
    "TOP_LEVEL_FIELDS",
    "AuditConfig",
    "AutoscalingConfig",
    "ClusterConfig",
    "EngineConfig",
    "FlowControl",
    "InstanceSpec",
    "KVTransferConfig",
    "OutputConfig",
    "PDConfig",
    "PolicyChoice",
    "SLOTarget",
    "TopLevel",
]
"""What ``servesim.scenario`` exports of the schema; the field helpers stay for its parsers."""

POOL_NAMES = ("prefill", "decode", "mixed")
KV_TRANSFER_TOPOLOGIES = ("shared", "pair", "prefill-nic", "decode-nic")
KV_TRANSFER_SHARING = ("processor-sharing", "at-start")
POLICY_FIELDS = (
    "admission",
    "routing",
    "scheduler",
    "preemption",
    "flow_control",
    "disaggregation",
)

# ------------------------------------------------------------------ one declaration per field
# A section's fields are declared once, on its attrs class: the attribute holds the parsed value
# (in servesim's units, e.g. µs) and its default; the metadata holds the YAML key, the doc line
# and the parser that validates a given value. ``section_keys`` and ``read_section`` read them,
# so a field's name, type, default, doc and rule cannot drift apart (docs/reference/scenario.md
# is checked against ``section_keys`` by tests/test_schema_fields.py).

KEY, DOC, PARSE = "servesim.key", "servesim.doc", "servesim.parse"
Parser = Callable[[Any, str], Any]


def setting(default: Any, key: str, doc: str, parse: Parser | None = None) -> Any:
    """One scenario field: its ``default`` (parsed form), YAML ``key``, ``doc`` line and the
    ``parse(value, path)`` that validates a given value (None: the section's parser reads it
    itself, e.g. when it depends on another field)."""
    return attrs.field(default=default, metadata={KEY: key, DOC: doc, PARSE: parse})


def section_keys(cls: type, *structural: str) -> tuple[str, ...]:
    """The YAML keys a section accepts: its class's fields, then ``structural`` sub-sections that
    other parsers read (e.g. ``cluster.pools``)."""
    return tuple(f.metadata[KEY] for f in attrs.fields(cls) if KEY in f.metadata) + structural


def read_section(cls: type, section: Mapping[str, Any], path: str, **given: Any) -> Any:
    """``cls`` built from a validated YAML section: each declared field the section gives is
    parsed by its field's parser (errors name ``path.key``), the others keep their default;
    ``given`` supplies the fields the caller parsed itself."""
    values = dict(given)
    for f in attrs.fields(cls):
        key, parse = f.metadata.get(KEY), f.metadata.get(PARSE)
        if key is not None and parse is not None and key in section:
            values[f.name] = parse(section[key], _at(path, key))
    return cls(**values)


def read_field(cls: type, name: str, section: Mapping[str, Any], path: str) -> Any:
    """One declared field of ``cls`` from a YAML section: parsed by its parser when given (errors
    name ``path.key``), else its default; for the parsers that read fields one at a time."""
    f = attrs.fields_dict(cls)[name]
    key = f.metadata[KEY]
    return f.metadata[PARSE](section[key], _at(path, key)) if key in section else f.default


def _at(path: str, key: str) -> str:
    """The field path of ``key`` in the section at ``path`` (the top level's path is empty)."""
    return f"{path}.{key}" if path else key


def _duration(minimum: int = 0) -> Parser:
    return lambda value, path: parse_duration_us(value, path, minimum=minimum)


def _int(minimum: int, maximum: int | None = None) -> Parser:
    return lambda value, path: as_int(value, path, minimum=minimum, maximum=maximum)


def _choice(*choices: str) -> Parser:
    return lambda value, path: as_str(value, path, choices=choices)


def _positive_rate(value: Any, path: str) -> float:
    rate = parse_rate_bytes(value, path)
    if not rate > 0:
        raise ScenarioError(path, value, "must be positive, e.g. 25GB/s or 200Gbps")
    return rate


def _non_negative(value: Any, path: str) -> float:
    return as_float(value, path, minimum=0)


def _gateway_order(value: Any, path: str) -> str:
    from servesim.components.gateway import ORDERS  # the gateway owns its orders

    return as_str(value, path, choices=ORDERS)


def _directory(value: Any, path: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ScenarioError(path, value, "expected a directory path")
    return value


DEFAULT_RUN_NAME = "scenario"


def _run_name(value: Any, path: str) -> str:
    """A run's name names its results directory: no '/'; empty or null means the default."""
    if value in (None, ""):
        return DEFAULT_RUN_NAME
    name = as_str(value, path)
    if "/" in name or name in (".", ".."):
        raise ScenarioError(path, name, "must not contain '/' (it names the results directory)")
    return name


def _horizon(value: Any, path: str) -> int | None:
    return None if value in (None, "none") else parse_duration_us(value, path, minimum=1)


@attrs.frozen
class TopLevel:
    """The scenario's top-level scalar fields; each section (``cluster``, ``engine``, ...) has its
    own class below. ``model`` and ``gpu`` stay names here: the builder resolves them (a file is
    found relative to the scenario's directory), so they have no parser of their own."""

    name: str = setting(
        DEFAULT_RUN_NAME, "name", "label of the run; names its results directory", _run_name
    )
    seed: int = setting(42, "seed", "master random seed", _int(0, 2**63 - 1))
    model: str = setting("qwen3-14b", "model", "the served model: bundled, config.json or HF id")
    gpu: str = setting("H100", "gpu", "a bundled GPU, or a YAML file defining one")
    tp: int = setting(1, "tp", "tensor-parallel GPUs per instance", _int(1, 1024))
    horizon_us: int | None = setting(
        None, "horizon", "stop at this simulated time (none: when every request is done)", _horizon
    )
    exact_steps: bool = setting(
        False, "exact_steps", "every engine step its own event (no fast-forward)", as_bool
    )


TOP_LEVEL_SECTIONS = (
    "cluster",
    "engine",
    "latency",
    "policies",
    "workload",
    "audit",
    "output",
    "slo",
    "fitness",
    "encoder",
)
"""The top-level keys that hold a section, each read by its own parser."""
TOP_LEVEL_FIELDS = section_keys(TopLevel, *TOP_LEVEL_SECTIONS)

RECORDED_FIELDS = ("seed", "model", "gpu", "tp")
"""Top-level fields every loaded scenario states, given or not: a saved run names its seed,
model, GPU and tp even if a default changes later."""

DEFAULT_SCENARIO: dict[str, Any] = {
    **{
        f.metadata[KEY]: f.default
        for f in attrs.fields(TopLevel)
        if f.metadata[KEY] in RECORDED_FIELDS
    },
    "latency": {"model": "blackbox"},
    "workload": {"preset": "chatbot", "rate": 20, "requests": 2000},
}
"""The scenario run when none is given; its recorded fields and latency also fill a given one."""


@attrs.frozen
class EngineConfig:
    """vLLM engine limits, with vLLM's names. ``kv_blocks``/``max_model_len`` are resolved ints.

    The defaults here are the ``engine`` section's defaults (the parser reads them from this class);
    the three the KV-capacity profile run also needs come from :mod:`servesim.latency.kvcapacity`."""

    max_num_seqs: int = setting(
        DEFAULT_MAX_NUM_SEQS, "max_num_seqs", "most running requests", _int(1, 1 << 20)
    )
    max_num_batched_tokens: int = setting(
        DEFAULT_MAX_NUM_BATCHED_TOKENS, "max_num_batched_tokens", "token budget of a step", _int(1)
    )
    block_size: int = setting(16, "block_size", "tokens per KV block", _int(1, 1 << 20))
    kv_blocks: int = setting(0, "kv_blocks", "KV blocks per instance (auto: sized from memory)")
    kv_blocks_source: str = "auto"
    max_model_len: int = setting(0, "max_model_len", "longest prompt + output (auto: the model's)")
    max_model_len_source: str = "auto"
    long_prefill_token_threshold: int = setting(
        0,
        "long_prefill_token_threshold",
        "most prompt tokens of one request per step (0: off)",
        _int(0),
    )
    enable_chunked_prefill: bool = setting(True, "enable_chunked_prefill", "split long prompts")
    enable_prefix_caching: bool = setting(
        True, "enable_prefix_caching", "reuse cached prefixes", as_bool
    )
    prefill_first: bool = setting(
        False, "prefill_first", "vLLM v0's prefill-first scheduler", as_bool
    )
    watermark_blocks: int = 0
    gpu_memory_utilization: float = setting(
        DEFAULT_GPU_MEMORY_UTILIZATION,
        "gpu_memory_utilization",
        "share of GPU memory vLLM uses",
        lambda value, path: as_float(value, path, exclusive_minimum=0.0, maximum=1.0),
    )
    kv_cpu_blocks: int = setting(0, "kv_cpu_blocks", "CPU KV tier: blocks (or bytes)")
    kv_cpu_bandwidth_bytes_s: float = setting(25e9, "kv_cpu_bandwidth", "CPU tier reload rate")
    kv_cpu_latency_us: int = setting(0, "kv_cpu_latency", "CPU tier reload setup time")
    kv_block_bytes: int = 0
    preemption_mode: str = setting(
        "recompute", "preemption_mode", "recompute or swap", _choice("recompute", "swap")
    )
    swap_space_bytes: float = setting(4 * 2**30, "swap_space", "CPU swap space per GPU")
    swap_blocks: int = 0  # CPU blocks of the swap space (per GPU bytes / per GPU block bytes)
    spec_draft_tokens: int = setting(0, "speculative", "speculative decoding (draft tokens, ...)")
    spec_acceptance: float = 0.0
    spec_draft_cost: float = 0.0
    # parallelism beyond tp (servesim.latency.parallel): data-parallel ranks per engine (each an
    # instance), expert parallelism over dp x tp, pipeline stages, context-parallel ranks, and
    # where the GPUs sit (nodes of gpus_per_node, the inter-node link per GPU)
    dp: int = setting(1, "dp", "data-parallel ranks per engine")
    ep: int = setting(1, "ep", "expert parallelism over dp x tp")
    pp: int = setting(1, "pp", "pipeline stages")
    cp: int = setting(1, "cp", "context-parallel ranks")
    gpus_per_node: int = setting(8, "gpus_per_node", "GPUs per node")
    internode_gbs: float = setting(50.0, "internode_bandwidth", "inter-node link per GPU")
    internode_latency_us: float = setting(10.0, "internode_latency", "inter-node link latency")
    # engine.profile: sglang (servesim.components.sglang): SGLang's scheduler and radix cache;
    # the three knobs below are SGLang's own and apply to that profile only
    profile: str = setting(
        "vllm", "profile", "the engine modelled: vllm or sglang", _choice("vllm", "sglang")
    )
    schedule_policy: str = setting(
        "fcfs", "schedule_policy", "SGLang's queue order: fcfs or lpm", _choice("fcfs", "lpm")
    )
    schedule_conservativeness: float = setting(
        1.0,
        "schedule_conservativeness",
        "SGLang: scales the output reserved for running requests",
        lambda value, path: as_float(value, path, exclusive_minimum=0.0, maximum=100.0),
    )
    max_prefill_tokens: int = setting(
        16384, "max_prefill_tokens", "SGLang: most prompt tokens of one prefill batch", _int(1)
    )
    # KV offload tiers below the GPU, fastest first (servesim.scenario.kvtiers.TierConfig each)
    kv_tiers: tuple = setting(
        (), "kv_tiers", "KV offload tiers: name, capacity, bandwidth, latency"
    )
    # LoRA adapters (servesim.scenario.lora.LoRAConfig; None: off)
    lora: Any = setting(None, "lora", "LoRA adapters: max_loras, adapters, load costs")

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

    @property
    def kv_tier_limits(self) -> tuple:
        """The offload tiers as an engine takes them, fastest first: ``kv_tiers``, or the one
        CPU tier of ``kv_cpu_blocks`` (priced as before), or none."""
        if self.kv_tiers:
            return tuple(tier.limits(self.kv_block_bytes) for tier in self.kv_tiers)
        if self.kv_cpu_blocks:
            return (
                (
                    "cpu",
                    self.kv_cpu_blocks,
                    self.kv_cpu_latency_us,
                    self.cpu_reload_us_per_block,
                    self.kv_block_bytes,
                ),
            )
        return ()


@attrs.frozen
class PolicyChoice:
    """A plugin name and its parameters (validated by the plugin)."""

    name: str
    params: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ClusterConfig:
    """Control-plane timing: latencies added per request and the freshness of router signals."""

    instances: int = setting(1, "instances", "number of identical instances", _int(1, 100_000))
    admission_latency_us: int = setting(
        0, "admission_latency", "arrival to admission decision", _duration()
    )
    routing_latency_us: int = setting(
        0, "routing_latency", "routable to routing decision", _duration()
    )
    routing_concurrency: int = setting(
        0,
        "routing_concurrency",
        "routing decisions in progress at once; 0 = no limit",
        _int(0, 1_000_000),
    )
    snapshot_interval_us: int = setting(
        50_000, "snapshot_interval", "refresh period of the router's snapshots", _duration()
    )
    cache_signal_delay_us: int = setting(
        50_000, "cache_signal_delay", "age of the prefix-cache view scorers read", _duration()
    )
    # ---- autoscaling (cluster.autoscaling; servesim.components.autoscaler)
    autoscaling: Any = setting(
        None,
        "autoscaling",
        "start and stop instances on an autoscaler's signal (absent: every instance serves "
        "from the start; see the autoscaling section)",
        lambda value, path: _autoscaling(value, path),
    )

    @autoscaling.validator
    def _fits_the_fleet(self, _attribute: Any, value: Any) -> None:
        from servesim.scenario.autoscaling import check_fits_the_fleet

        if value is not None:
            check_fits_the_fleet(value, self.instances)


@attrs.frozen
class AutoscalingConfig:
    """``cluster.autoscaling``: the autoscaler policy, the fleet's bounds and an instance's
    start-up (see servesim.components.autoscaler)."""

    policy: PolicyChoice = attrs.field(
        metadata={KEY: "policy", DOC: "the autoscaler (required), e.g. queue-depth", PARSE: None}
    )
    min_instances: int = setting(1, "min_instances", "fewest instances serving", _int(1, 100_000))
    max_instances: int = setting(
        0, "max_instances", "most instances serving (0: cluster.instances)", _int(0, 100_000)
    )
    initial_instances: int = setting(
        0, "initial_instances", "instances ready at the start (0: min_instances)", _int(0, 100_000)
    )
    interval_us: int = setting(
        10_000_000, "interval", "period of the autoscaler's samples", _duration(minimum=1)
    )
    scale_up_cooldown_us: int = setting(
        30_000_000, "scale_up_cooldown", "least time between two scale-ups", _duration()
    )
    scale_down_cooldown_us: int = setting(
        120_000_000, "scale_down_cooldown", "least time from any action to one", _duration()
    )
    load_bandwidth_bytes_s: float = setting(
        2e9, "load_bandwidth", "bytes/s each GPU loads its weights at", _positive_rate
    )
    load_time_us: int = setting(
        0, "load_time", "a fixed loading time instead (0: weights / load_bandwidth)", _duration()
    )
    warmup_us: int = setting(
        10_000_000, "warmup", "from loaded to ready (CUDA graphs)", _duration()
    )
    cost_per_gpu_hour: float = setting(
        -1.0, "cost_per_gpu_hour", "USD per GPU-hour (absent: the GPU table's)", _non_negative
    )


AUTOSCALING_FIELDS = section_keys(AutoscalingConfig)


def _autoscaling(value: Any, path: str) -> AutoscalingConfig | None:
    """``cluster.autoscaling`` (absent, null or false: off)."""
    from servesim.scenario.autoscaling import autoscaler_choice, check_bounds
    from servesim.simcore.config import check_keys, expect_mapping

    if value in (None, False):
        return None
    section = expect_mapping(value, path)
    check_keys(section, AUTOSCALING_FIELDS, path)
    name, params = autoscaler_choice(section.get("policy"), f"{path}.policy")
    config = read_section(
        AutoscalingConfig, section, path, policy=PolicyChoice(name=name, params=params)
    )
    check_bounds(config, path)
    return config


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
    model: Any = None  # its group's own model (a ModelInfo; None: the scenario's)


@attrs.frozen
class KVTransferConfig:
    """The links that move KV caches from prefill to decode instances (``cluster.kv_transfer``)."""

    bandwidth_bytes_s: float = setting(25e9, "bandwidth", "each link's bytes/s", _positive_rate)
    base_latency_us: int = setting(50, "base_latency", "setup time of a transfer", _duration())
    topology: str = setting(
        "shared", "topology", "which transfers share a link", _choice(*KV_TRANSFER_TOPOLOGIES)
    )
    sharing: str = setting(
        "processor-sharing",
        "sharing",
        "how a link's bandwidth is split",
        _choice(*KV_TRANSFER_SHARING),
    )
    decode_full: str = setting(
        "wait",
        "decode_full",
        "no room for the prompt's KV on the decode instance: wait (the prefill instance frees "
        "it), backpressure (the prefill instance keeps it until the transfer ends), drop (BLIS)",
        _choice("wait", "backpressure", "drop"),
    )
    decode_queue_limit: float = setting(
        0.0,
        "decode_queue_limit",
        "a decode instance accepts a transfer only while the prompts it accepted and does not "
        "run yet hold less than this fraction of its KV blocks (0: no limit; DistServe: 0.05)",
        lambda value, path: as_float(value, path, minimum=0.0, maximum=1.0),
    )
    blocking: bool = setting(
        False, "blocking", "the decode instance stalls for each transfer it receives", as_bool
    )


@attrs.frozen
class PDConfig:
    """Disaggregated serving: the decider, the transfer links, per-pool routing overrides."""

    decider: PolicyChoice
    transfer: KVTransferConfig
    routing: Mapping[str, PolicyChoice] = attrs.field(factory=dict)


@attrs.frozen
class EncodePoolConfig:
    """Multimodal encode-prefill-decode disaggregation: the encode instances (``cluster.pools.
    encode``) and the links that carry their embeddings to the LLM instances. ``gpu`` is a
    HardwareSpec (the scenario's GPU when not given)."""

    instances: int = setting(1, "instances", "encode instances", _int(1, 100_000))
    gpu: Any = setting(None, "gpu", "the encode instances' GPU (default: the scenario's)")
    tp: int = setting(1, "tp", "GPUs per encode instance (the encoder is split over them)", _int(1))
    max_batch_items: int = setting(
        8, "max_batch_items", "most media items one encoder batch holds", _int(1)
    )
    bandwidth_bytes_s: float = setting(
        25e9, "bandwidth", "each encode instance's embedding link, bytes/s", _positive_rate
    )
    base_latency_us: int = setting(
        50, "base_latency", "setup time of an embedding transfer", _duration()
    )


ENCODE_POOL_FIELDS = section_keys(EncodePoolConfig)


@attrs.frozen
class FlowControl:
    """Gateway queue settings (see servesim.components.gateway)."""

    detector: PolicyChoice = attrs.field(
        metadata={KEY: "detector", DOC: "the saturation detector (required)", PARSE: None}
    )
    order: str = setting("priority", "order", "release order", _gateway_order)
    max_queue: int = setting(0, "max_queue", "most requests waiting (0: unbounded)", _int(0))
    per_band_capacity: int = setting(
        0, "per_band_capacity", "most requests waiting per priority band (0: unbounded)", _int(0)
    )
    shedding: bool = setting(False, "shedding", "evict a sheddable request when full", as_bool)
    ttl_us: int = setting(0, "ttl", "longest wait in the gateway (0: no limit)", _duration())
    tick_us: int = setting(1000, "tick", "period of release attempts", _duration(minimum=1))


@attrs.frozen
class SLOTarget:
    """Per-class goodput targets in µs (0 = not judged on that dimension)."""

    ttft_us: int = setting(0, "ttft", "time to first token", _duration(minimum=1))
    itl_us: int = setting(0, "itl", "inter-token latency", _duration(minimum=1))
    e2e_us: int = setting(0, "e2e", "end-to-end latency", _duration(minimum=1))


@attrs.frozen
class OutputConfig:
    """What a run writes (the ``output`` section)."""

    dir: str | None = setting(None, "dir", "results directory (None: results/<name>)", _directory)
    timeseries_interval_us: int = setting(
        1_000_000, "timeseries_interval", "sampling interval of timeseries.csv", _duration(1)
    )
    steps: bool = setting(True, "steps", "write steps.npz", as_bool)
    trace: str = setting(
        "none", "trace", "decisions: record every routing decision", _choice("none", "decisions")
    )
    counterfactual_k: int = setting(
        3, "counterfactual_k", "best candidates per decisions.csv row", _int(1)
    )
    workload_trace: bool = setting(
        False, "workload_trace", "write workload.csv.gz, this run's requests, replayable", as_bool
    )


@attrs.frozen
class AuditConfig:
    """The post-run auditor's switches (the ``audit`` section)."""

    enabled: bool = setting(True, "enabled", "check the run's invariants after it", as_bool)
    kv_every_step: bool = setting(
        False, "kv_every_step", "recount every KV block after every step", as_bool
    )


CLUSTER_FIELDS = section_keys(ClusterConfig, "groups", "pools", "allow_unassigned", "kv_transfer")
GROUP_FIELDS = ("count", "gpu", "tp", "latency", "engine")
GROUP_FIELDS = (*GROUP_FIELDS, "model")  # a group's own served model (scenario/lora.py)
POOL_FIELDS = ("instances", "gpu", "tp", "latency", "engine", "routing")
KV_TRANSFER_FIELDS = section_keys(KVTransferConfig)
FLOW_CONTROL_FIELDS = section_keys(FlowControl)
SLO_TARGET_FIELDS = section_keys(SLOTarget)
ENGINE_FIELDS = section_keys(EngineConfig)
OUTPUT_FIELDS = section_keys(OutputConfig)
AUDIT_FIELDS = section_keys(AuditConfig)
