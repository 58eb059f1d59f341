"""The whole input of a run: a frozen, validated :class:`Scenario`, loaded from YAML or a dict.

Validation happens here, once: every error is a :class:`~servesim.simcore.errors.ScenarioError`
naming the field path, the bad value and the fix. Model/GPU specs are resolved, the KV capacity
and context limit are derived (``auto``), and plugin names are looked up, so a scenario that loads
is a scenario that runs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from servesim.simcore import registry
from servesim.simcore.config import (
    as_bool,
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    load_yaml,
    parse_bytes,
    parse_duration_us,
    parse_rate_bytes,
    parse_set_option,
    set_path,
)
from servesim.simcore.errors import ScenarioError
from servesim.simcore.log import get_logger

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
    """vLLM engine limits, with vLLM's names. ``kv_blocks``/``max_model_len`` are resolved ints."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
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
    gpu_memory_utilization: float = 0.9
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

    def to_yaml(self) -> str:
        return yaml.safe_dump(_plain(self.raw), sort_keys=False)

    def replace(self, **overrides: Any) -> Scenario:
        """A new scenario with dotted-path overrides: ``s.replace(**{"engine.max_num_seqs": 8})``."""
        raw = copy.deepcopy(_plain(self.raw))
        for key, value in overrides.items():
            set_path(raw, key, yaml.safe_dump(value, default_flow_style=True).strip())
        return build_scenario(raw, base_dir=self.base_dir)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_yaml_file(file: str | Path, path: str = "scenario") -> dict[str, Any]:
    """Read a YAML mapping, turning I/O and syntax problems into one-line ScenarioErrors."""
    p = Path(file)
    if not p.exists():
        raise ScenarioError(path, str(file), "file not found; check the path")
    if p.is_dir():
        raise ScenarioError(path, str(file), "is a directory; give a YAML scenario file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(
            path, str(file), f"cannot read it ({exc.__class__.__name__}: {exc})"
        ) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(path, str(file), f"YAML syntax error{where}: {problem}") from None
    if data is None:
        raise ScenarioError(
            path,
            str(file),
            ("empty file" if not text.strip() else "the file holds only comments")
            + (
                "; a scenario needs at least a workload section, e.g. "
                "workload: {preset: chatbot, rate: 10, requests: 1000}"
                if path == "scenario"
                else f"; give the {path} file's fields"
            ),
        )
    if not isinstance(data, dict):
        raise ScenarioError(
            path, str(file), "the file must contain a YAML mapping (field: value) at the top level"
        )
    return data


def load_scenario(
    source: str | Path | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> Scenario:
    """Load and validate a scenario from a YAML file, a dict, or the default (``None``).

    ``overrides`` are ``path.to.field=value`` strings (what ``--set`` passes), applied in order.
    Fields the source omits take the defaults of :data:`DEFAULT_SCENARIO` and of each section.
    """
    base_dir: str | None = None
    if source is None:
        raw = copy.deepcopy(DEFAULT_SCENARIO)
    elif isinstance(source, Mapping):
        raw = copy.deepcopy(_plain(source))
    else:
        raw = read_yaml_file(source)
        base_dir = str(Path(source).resolve().parent)
    for option in overrides:
        key, value = parse_set_option(option)
        set_path(raw, key, value)
    return build_scenario(raw, base_dir=base_dir)


def _plugin(value: Any, kind: str, path: str, default: str) -> PolicyChoice:
    """``name`` or ``{name: ..., params...}`` → a PolicyChoice whose name is registered."""
    if value is None:
        value = default
    if isinstance(value, str):
        name, params = value, {}
    else:
        section = expect_mapping(value, path)
        if "name" not in section:
            raise ScenarioError(
                f"{path}.name", None, f"missing; name the {kind} plugin (see `servesim list`)"
            )
        name = section["name"]
        params = {k: v for k, v in section.items() if k != "name"}
    registry.get(kind, name, f"{path}.name" if not isinstance(value, str) else path)
    return PolicyChoice(name=name, params=params)


def build_scenario(raw: Mapping[str, Any], base_dir: str | None = None) -> Scenario:
    """Validate a scenario dict (already merged with overrides) into a :class:`Scenario`."""
    from servesim.latency.hardware import resolve_gpu
    from servesim.latency.kvcapacity import auto_kv_blocks, auto_max_model_len
    from servesim.latency.modelindex import resolve_model
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

    name = "scenario" if data.get("name") in (None, "") else as_str(data["name"], "name")
    if "/" in name or name in (".", ".."):
        raise ScenarioError("name", name, "must not contain '/' (it names the results directory)")
    seed = as_int(data["seed"], "seed", minimum=0, maximum=2**63 - 1)
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
    tp = as_int(data["tp"], "tp", minimum=1, maximum=1024)

    cluster_section = expect_mapping(data.get("cluster"), "cluster")
    check_keys(cluster_section, CLUSTER_FIELDS, "cluster")
    instances = as_int(
        cluster_section.get("instances", 1), "cluster.instances", minimum=1, maximum=100_000
    )
    cluster_cfg = ClusterConfig(
        instances=instances,
        admission_latency_us=parse_duration_us(
            cluster_section.get("admission_latency", 0), "cluster.admission_latency"
        ),
        routing_latency_us=parse_duration_us(
            cluster_section.get("routing_latency", 0), "cluster.routing_latency"
        ),
        snapshot_interval_us=parse_duration_us(
            cluster_section.get("snapshot_interval", "50ms"), "cluster.snapshot_interval"
        ),
        cache_signal_delay_us=parse_duration_us(
            cluster_section.get("cache_signal_delay", "50ms"), "cluster.cache_signal_delay"
        ),
    )

    engine = _engine(
        expect_mapping(data.get("engine"), "engine"),
        model,
        gpu,
        tp,
        auto_kv_blocks,
        auto_max_model_len,
        notes,
    )

    latency_section = data.get("latency") or {"model": "blackbox"}
    if isinstance(latency_section, str):
        latency_section = {"model": latency_section}
    latency_section = expect_mapping(latency_section, "latency")
    if "model" not in latency_section:
        raise ScenarioError(
            "latency.model", None, "missing; name a latency model (see `servesim list`)"
        )
    latency_name = latency_section["model"]
    latency_cls = registry.get("latency", latency_name, "latency.model")
    latency_params = {k: v for k, v in latency_section.items() if k != "model"}
    latency = PolicyChoice(name=latency_name, params=latency_params)
    # Build it once now so bad parameters (or a model/GPU/TP without coefficients) fail at load time.
    latency_cls.from_config(latency_params, latency_context(model, gpu, tp), "latency")

    pd = None
    # what every group or pool of instances is resolved against
    group_context = (
        model,
        gpu,
        tp,
        latency,
        base_dir,
        notes,
        (resolve_gpu, auto_kv_blocks, auto_max_model_len),
    )
    if cluster_section.get("pools") is not None:
        if cluster_section.get("groups") is not None:
            raise ScenarioError(
                "cluster.groups",
                cluster_section["groups"],
                "give either groups or pools (each pool takes the group fields itself)",
            )
        instance_specs, pool_routing = _pools(cluster_section, data, *group_context)
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
        instance_specs = _groups(cluster_section["groups"], data, *group_context)
        cluster_cfg = attrs.evolve(cluster_cfg, instances=len(instance_specs))
        instances = len(instance_specs)
    else:
        spec = InstanceSpec(group=0, gpu=gpu, tp=tp, engine=engine, latency=latency)
        instance_specs = (spec,) * instances

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
        registry.get(kind, choice.name).from_config(choice.params, where)
    flow_control = _flow_control(policies.get("flow_control"), notes)
    slo = _slo_targets(data.get("slo"))

    workload = workload_from_config(data["workload"], "workload", base_dir=base_dir)

    horizon_us = None
    if data.get("horizon") not in (None, "none"):
        horizon_us = parse_duration_us(data["horizon"], "horizon", minimum=1)

    exact_steps = as_bool(data.get("exact_steps", False), "exact_steps")

    audit_section = expect_mapping(data.get("audit"), "audit")
    check_keys(audit_section, AUDIT_FIELDS, "audit")
    audit = AuditConfig(
        enabled=as_bool(audit_section.get("enabled", True), "audit.enabled"),
        kv_every_step=as_bool(audit_section.get("kv_every_step", False), "audit.kv_every_step"),
    )

    output_section = expect_mapping(data.get("output"), "output")
    check_keys(output_section, OUTPUT_FIELDS, "output")
    out_dir = output_section.get("dir")
    if out_dir is not None and not isinstance(out_dir, str):
        raise ScenarioError("output.dir", out_dir, "expected a directory path")
    output = OutputConfig(
        dir=out_dir,
        timeseries_interval_us=parse_duration_us(
            output_section.get("timeseries_interval", "1s"), "output.timeseries_interval", minimum=1
        ),
        steps=as_bool(output_section.get("steps", True), "output.steps"),
        trace=as_str(
            output_section.get("trace", "none"), "output.trace", choices=("none", "decisions")
        ),
        workload_trace=as_bool(
            output_section.get("workload_trace", False), "output.workload_trace"
        ),
        counterfactual_k=as_int(
            output_section.get("counterfactual_k", 3), "output.counterfactual_k", minimum=1
        ),
    )

    log = get_logger("servesim.scenario")
    for event, fields in notes:
        log.warning(event, **fields)
    return Scenario(
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
    )


def latency_context(model: Any, gpu: Any, tp: int):
    from servesim.latency.base import LatencyContext

    return LatencyContext(
        model=model.hf_id or model.name, gpu=gpu.name, tp=tp, model_spec=model.spec, hardware=gpu
    )


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
    max_num_seqs = as_int(
        section.get("max_num_seqs", 256), f"{p}.max_num_seqs", minimum=1, maximum=1 << 20
    )
    max_batched = as_int(
        section.get("max_num_batched_tokens", 2048), f"{p}.max_num_batched_tokens", minimum=1
    )
    block_size = as_int(
        section.get("block_size", 16), f"{p}.block_size", minimum=1, maximum=1 << 20
    )
    threshold = as_int(
        section.get("long_prefill_token_threshold", 0),
        f"{p}.long_prefill_token_threshold",
        minimum=0,
    )
    prefill_first = as_bool(section.get("prefill_first", False), f"{p}.prefill_first")
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
    prefix = as_bool(section.get("enable_prefix_caching", True), f"{p}.enable_prefix_caching")
    utilisation = as_float(
        section.get("gpu_memory_utilization", 0.9),
        f"{p}.gpu_memory_utilization",
        exclusive_minimum=0.0,
        maximum=1.0,
    )

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
            path=f"{p}.kv_blocks",
        )
        kv_source = (
            f"auto: {gpu.name} x{tp}, gpu_memory_utilization {utilisation:g}, activation peak "
            f"of {max_batched} tokens"
        )
    else:
        kv_blocks = as_int(kv_raw, f"{p}.kv_blocks", minimum=1)
        kv_source = "explicit"

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
    cpu_raw = section.get("kv_cpu_blocks", 0)
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
    preemption_mode = as_str(
        section.get("preemption_mode", "recompute"),
        f"{p}.preemption_mode",
        choices=("recompute", "swap"),
    )
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
    return EngineConfig(
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


def _flow_control(value: Any, notes: list) -> FlowControl | None:
    """``policies.flow_control`` (absent or false = off): a gateway queue gated by a detector."""
    path = "policies.flow_control"
    if value is None or value is False:
        return None
    section = expect_mapping(value, path)
    check_keys(section, FLOW_CONTROL_FIELDS, path)
    if "detector" not in section:
        raise ScenarioError(
            f"{path}.detector",
            None,
            "missing; name a saturation detector, e.g. detector: utilization",
        )
    detector = _plugin(section["detector"], "saturation", f"{path}.detector", "never")
    built = registry.get("saturation", detector.name).from_config(
        detector.params, f"{path}.detector"
    )
    if getattr(built, "never_saturates", False):
        notes.append(
            (
                "flow control is on but its detector never saturates: the gateway queue will "
                "release every request at once",
                {"detector": detector.name, "fix": "use detector: utilization or concurrency"},
            )
        )
    from servesim.components.gateway import ORDERS

    return FlowControl(
        detector=detector,
        order=as_str(section.get("order", "priority"), f"{path}.order", choices=ORDERS),
        max_queue=as_int(section.get("max_queue", 0), f"{path}.max_queue", minimum=0),
        per_band_capacity=as_int(
            section.get("per_band_capacity", 0), f"{path}.per_band_capacity", minimum=0
        ),
        shedding=as_bool(section.get("shedding", False), f"{path}.shedding"),
        ttl_us=parse_duration_us(section.get("ttl", 0), f"{path}.ttl"),
        tick_us=parse_duration_us(section.get("tick", "1ms"), f"{path}.tick", minimum=1),
    )


def _slo_targets(value: Any) -> dict[str, SLOTarget]:
    """``slo: {class: {ttft: 200ms, itl: 50ms, e2e: 10s}}`` — goodput targets per SLO class."""
    section = expect_mapping(value, "slo")
    out: dict[str, SLOTarget] = {}
    from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES

    for cls, targets in section.items():
        where = f"slo.{cls}"
        if cls not in DEFAULT_SLO_PRIORITIES:
            raise ScenarioError(
                where, cls, f"unknown SLO class; use one of {', '.join(DEFAULT_SLO_PRIORITIES)}"
            )
        targets = expect_mapping(targets, where)
        check_keys(targets, SLO_TARGET_FIELDS, where)
        if not targets:
            raise ScenarioError(where, {}, "give at least one of ttft, itl, e2e (e.g. ttft: 500ms)")
        values = {
            key: parse_duration_us(targets[key], f"{where}.{key}", minimum=1)
            if key in targets
            else 0
            for key in SLO_TARGET_FIELDS
        }
        out[str(cls)] = SLOTarget(
            ttft_us=values["ttft"], itl_us=values["itl"], e2e_us=values["e2e"]
        )
    return out


def _pools(
    cluster: Mapping[str, Any],
    data: Mapping[str, Any],
    model: Any,
    gpu: Any,
    tp: int,
    latency: PolicyChoice,
    base_dir: str | None,
    notes: list,
    helpers: tuple,
) -> tuple[tuple[InstanceSpec, ...], dict[str, PolicyChoice]]:
    """``cluster.pools``: prefill, decode and mixed instances, each pool with the group fields
    (gpu, tp, latency, engine) and its own ``routing``. Instances are numbered pool by pool:
    prefill first, then decode, then mixed, then any unassigned ones (``allow_unassigned``)."""
    pools = expect_mapping(cluster["pools"], "cluster.pools")
    check_keys(pools, POOL_NAMES, "cluster.pools")
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
            registry.get("routing", choice.name).from_config(choice.params, f"{path}.routing")
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
    specs = _groups(
        groups,
        data,
        model,
        gpu,
        tp,
        latency,
        base_dir,
        notes,
        helpers,
        paths=[f"cluster.pools.{role}" for role in roles],
    )
    for role, spec in zip(roles, _first_of_each(specs, groups)):
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
        base = _groups(
            [{"count": 1}],
            data,
            model,
            gpu,
            tp,
            latency,
            base_dir,
            notes,
            helpers,
            paths=["cluster.instances"],
        )[0]
        out.extend([attrs.evolve(base, group=len(roles), role="none")] * (total - assigned))
    return tuple(out), routing


def _first_of_each(specs: Sequence[InstanceSpec], groups: Sequence[Mapping]) -> list[InstanceSpec]:
    """The first instance spec of each group (``specs`` holds every group's instances in order)."""
    out, k = [], 0
    for group in groups:
        out.append(specs[k])
        k += group["count"]
    return out


def _decider(value: Any, specs: Sequence[InstanceSpec]) -> PolicyChoice:
    """``policies.disaggregation``: a decider name or ``{decider: name, params...}``. With pools
    and no decider every request is split (``always``)."""
    path = "policies.disaggregation"
    if isinstance(value, Mapping) and "decider" in value:
        value = {("name" if k == "decider" else k): v for k, v in value.items()}
    default = "always" if any(s.role in ("prefill",) for s in specs) else "never"
    choice = _plugin(value, "disaggregation", path, default)
    registry.get("disaggregation", choice.name).from_config(choice.params, path)
    return choice


def _kv_transfer(value: Any) -> KVTransferConfig:
    path = "cluster.kv_transfer"
    section = expect_mapping(value, path)
    check_keys(section, KV_TRANSFER_FIELDS, path)
    bandwidth = parse_rate_bytes(section.get("bandwidth", "25GB/s"), f"{path}.bandwidth")
    if not bandwidth > 0:
        raise ScenarioError(
            f"{path}.bandwidth",
            section.get("bandwidth"),
            "must be positive, e.g. 25GB/s or 200Gbps",
        )
    return KVTransferConfig(
        bandwidth_bytes_s=bandwidth,
        base_latency_us=parse_duration_us(
            section.get("base_latency", "50us"), f"{path}.base_latency"
        ),
        topology=as_str(
            section.get("topology", "shared"), f"{path}.topology", choices=KV_TRANSFER_TOPOLOGIES
        ),
        sharing=as_str(
            section.get("sharing", "processor-sharing"),
            f"{path}.sharing",
            choices=KV_TRANSFER_SHARING,
        ),
        decode_full=as_str(
            section.get("decode_full", "wait"),
            f"{path}.decode_full",
            choices=("wait", "backpressure", "drop"),
        ),
        decode_queue_limit=as_float(
            section.get("decode_queue_limit", 0),
            f"{path}.decode_queue_limit",
            minimum=0.0,
            maximum=1.0,
        ),
        blocking=as_bool(section.get("blocking", False), f"{path}.blocking"),
    )


def _groups(
    value: Any,
    data: Mapping[str, Any],
    model: Any,
    gpu: Any,
    tp: int,
    latency: PolicyChoice,
    base_dir: str | None,
    notes: list,
    helpers: tuple,
    paths: Sequence[str] | None = None,
) -> tuple[InstanceSpec, ...]:
    """``cluster.groups``: instances that differ in GPU, TP, engine limits or latency model.

    Each group's fields override the scenario's own (``engine`` field by field); KV capacity
    ``auto`` is derived from the group's own GPU and TP.
    """
    resolve_gpu, auto_kv_blocks, auto_max_model_len = helpers
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
            resolve_gpu(group["gpu"], f"{path}.gpu", base_dir=base_dir) if "gpu" in group else gpu
        )
        g_tp = as_int(group["tp"], f"{path}.tp", minimum=1, maximum=1024) if "tp" in group else tp
        overrides = expect_mapping(group.get("engine"), f"{path}.engine")
        check_keys(overrides, ENGINE_FIELDS, f"{path}.engine")
        try:
            g_engine = _engine(
                {**base_engine, **overrides},
                model,
                g_gpu,
                g_tp,
                auto_kv_blocks,
                auto_max_model_len,
                notes,
            )
        except ScenarioError as exc:
            raise ScenarioError(f"{path}.{exc.path}", exc.value, exc.fix) from None
        g_latency = latency
        if group.get("latency") is not None:
            section = group["latency"]
            if isinstance(section, str):
                section = {"model": section}
            section = expect_mapping(section, f"{path}.latency")
            if "model" not in section:
                raise ScenarioError(f"{path}.latency.model", None, "missing; name a latency model")
            cls = registry.get("latency", section["model"], f"{path}.latency.model")
            params = {k: v for k, v in section.items() if k != "model"}
            g_latency = PolicyChoice(name=section["model"], params=params)
        else:
            cls = registry.get("latency", latency.name)
            params = dict(latency.params)
        cls.from_config(params, latency_context(model, g_gpu, g_tp), f"{path}.latency")
        if g_engine.block_size != int(base_engine.get("block_size", 16)):
            raise ScenarioError(
                f"{path}.engine.block_size",
                g_engine.block_size,
                "every instance must use the scenario's block_size (prefix-cache block ids are shared)",
            )
        spec = InstanceSpec(group=i, gpu=g_gpu, tp=g_tp, engine=g_engine, latency=g_latency)
        specs.extend([spec] * count)
    return tuple(specs)
