"""Capacity planning: the cheapest fleet that serves a workload within its SLOs (``servesim plan``).

A plan (``PLAN.yaml``) names a base scenario — the model, the workload (whose rate is the demand)
and the engine defaults — the SLO targets, the share of requests that must meet them, and the
search space: GPU types, tensor parallelism, ``max_num_seqs`` and routing policies. For each
combination (a *candidate*) :func:`run_plan`

1. checks memory first: the model's weights and reserves must fit the ``tp`` GPUs with room for
   KV blocks (:func:`~servesim.memory.memory_breakdown`, the arithmetic of
   ``engine.kv_blocks: auto``); a candidate that does not fit is rejected with the numbers;
2. picks the latency model: ``blackbox`` when bundled coefficients exist for the (model, GPU,
   tp), else ``trained-physics``, else ``roofline`` (the first that accepts the model and GPU);
3. finds the smallest instance count whose simulated run meets the SLO attainment in every
   class with a target: counts ``min, 2·min, 4·min, …`` up to ``max`` until one meets it, then
   bisection between the last count that failed and the first that met it. This assumes the
   attainment does not get worse with more instances (the demand is fixed). Both the count found
   and the count below it are simulated, so the answer is checked, not extrapolated. Every
   simulation is cached by (candidate, count); at one instance every routing policy sends every
   request to it, so candidates that differ only in routing share that simulation.

Feasible candidates are ranked by the objective (``cost`` per hour, ``throughput_per_gpu`` or
``goodput``); the Pareto front is over (cost per hour ↓, goodput ↑). Costs are USD per GPU-hour
from ``hardware.yaml`` (``cost_per_hour``: indicative list prices, see that file), overridden by
the plan's ``costs:``, ``--costs FILE`` and ``--cost GPU=USD``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from servesim.simcore.config import (
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    parse_duration_us,
)
from servesim.simcore.errors import ScenarioError, ServesimError
from servesim.simcore.files import write_atomic

__all__ = [
    "CSV_COLUMNS",
    "LATENCY_CHOICES",
    "OBJECTIVES",
    "PLAN_FIELDS",
    "SEARCH_FIELDS",
    "CandidateResult",
    "Plan",
    "PlanResult",
    "add_plan_parser",
    "cmd_plan",
    "format_plan",
    "load_plan",
    "pareto_front",
    "rank_results",
    "run_plan",
    "write_plan",
]

OBJECTIVES = ("cost", "throughput_per_gpu", "goodput")
"""Ranking objectives: cost per hour (lower first), output tokens/s per GPU (higher first),
goodput in requests/s within SLO (higher first)."""

PLAN_FIELDS = (
    "name",
    "scenario",
    "slo",
    "attainment",
    "search",
    "objective",
    "requests",
    "costs",
    "latency",
)
SEARCH_FIELDS = ("gpu", "tp", "instances", "max_num_seqs", "routing")
INSTANCE_FIELDS = ("min", "max")
LATENCY_CHOICES = ("auto", "scenario", "blackbox", "trained-physics", "roofline")
LATENCY_PREFERENCE = ("blackbox", "trained-physics", "roofline")
MAX_CANDIDATES = 500
SHORT_SPAN_S = 60.0
"""Below this arrival span the report suggests simulating more requests."""
MAX_INSTANCES = 4096
DEFAULT_ATTAINMENT = 0.95
DEFAULT_INSTANCES = (1, 16)
PLAN_VERSION = 1

CSV_COLUMNS = (
    "rank",
    "pareto",
    "status",
    "gpu",
    "tp",
    "max_num_seqs",
    "routing",
    "latency_model",
    "instances",
    "gpus",
    "usd_per_gpu_hour",
    "cost_per_hour",
    "throughput_per_gpu",
    "responses_per_sec",
    "goodput_rps",
    "attainment",
    "offered_rps",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "e2e_p99_ms",
    "kv_blocks",
    "rejected_by",
    "reason",
)


# ----------------------------------------------------------------------------------- the plan


@attrs.frozen
class GPUChoice:
    """A searched GPU: its spec, the value a scenario's ``gpu:`` takes, its price and where the
    price came from."""

    spec: Any  # servesim.latency.hardware.HardwareSpec
    scenario_value: str
    usd_per_gpu_hour: float
    cost_source: str

    @property
    def name(self) -> str:
        return str(self.spec.name)


@attrs.frozen
class Plan:
    """A validated plan; build it with :func:`load_plan`."""

    name: str
    base: Mapping[str, Any] = attrs.field(repr=False)
    """The base scenario as a dict (plan's ``slo`` and ``requests`` applied)."""
    base_dir: str | None
    model: Any  # servesim.latency.modelindex.ModelInfo
    slo: Mapping[str, Mapping[str, int]]
    """Per class: ``{ttft_us, itl_us, e2e_us}`` (0 = not judged)."""
    attainment: float
    gpus: tuple[GPUChoice, ...]
    tps: tuple[int, ...]
    instances_min: int
    instances_max: int
    max_num_seqs: tuple[int, ...]
    routings: tuple[tuple[str, Any], ...]
    """(label, the value ``policies.routing`` takes)."""
    objective: str
    requests: int | None
    """Requests per simulation (None: the base workload does not say, e.g. a whole trace)."""
    latency: str
    workload: Mapping[str, Any] = attrs.field(repr=False)
    seed: int = 0

    @property
    def candidate_count(self) -> int:
        return len(self.gpus) * len(self.tps) * len(self.max_num_seqs) * len(self.routings)


def _load_mapping(file: str | Path, path: str) -> dict[str, Any]:
    from servesim.scenario import read_yaml_file

    return read_yaml_file(file, path)


def _as_list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ScenarioError(path, value, "expected a non-empty list")
    return items


def _unique(items: Sequence[Any], keys: Sequence[Any], path: str) -> None:
    seen: dict[Any, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            raise ScenarioError(
                f"{path}[{i}]", items[i], f"duplicate of {path}[{seen[key]}]; list each once"
            )
        seen[key] = i


def _slo(value: Any, path: str) -> dict[str, dict[str, int]]:
    """``{class: {ttft, itl, e2e}}`` with durations in µs (the scenario's ``slo:`` format)."""
    from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES
    from servesim.scenario import SLO_TARGET_FIELDS

    section = expect_mapping(value, path)
    out: dict[str, dict[str, int]] = {}
    for cls, targets in section.items():
        where = f"{path}.{cls}"
        if cls not in DEFAULT_SLO_PRIORITIES:
            raise ScenarioError(
                where, cls, f"unknown SLO class; use one of {', '.join(DEFAULT_SLO_PRIORITIES)}"
            )
        targets = expect_mapping(targets, where)
        check_keys(targets, SLO_TARGET_FIELDS, where)
        if not targets:
            raise ScenarioError(where, {}, "give at least one of ttft, itl, e2e (e.g. ttft: 1s)")
        out[str(cls)] = {
            f"{key}_us": parse_duration_us(targets[key], f"{where}.{key}", minimum=1)
            if key in targets
            else 0
            for key in SLO_TARGET_FIELDS
        }
    return out


def _routing_label(value: Any) -> str:
    if isinstance(value, str):
        return value
    params = {k: v for k, v in value.items() if k != "name"}
    inner = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return f"{value['name']}{inner}"


def _routings(value: Any, default: Any, path: str) -> tuple[tuple[str, Any], ...]:
    from servesim.simcore import registry

    items = _as_list(value, path) or [default]
    out: list[tuple[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if isinstance(item, str):
            registry.get("routing", item, where)
            registry.get("routing", item).from_config({}, where)
            out.append((item, item))
            continue
        section = dict(expect_mapping(item, where))
        if "name" not in section:
            raise ScenarioError(f"{where}.name", None, "missing; name the routing policy")
        name = as_str(section["name"], f"{where}.name")
        registry.get("routing", name, f"{where}.name")
        params = {k: v for k, v in section.items() if k != "name"}
        registry.get("routing", name).from_config(params, where)
        out.append((_routing_label(section), section))
    _unique(items, [label for label, _ in out], path)
    return tuple(out)


def _parse_costs(value: Any, path: str, gpus: Sequence[Any], prefix: str) -> dict[str, float]:
    """``{GPU: USD}`` → ``{canonical GPU name: USD}``; names match the searched GPUs
    (case-insensitively) or any bundled GPU and its aliases. Errors are named ``prefix + GPU``."""
    from servesim.latency.hardware import resolve_gpu

    section = expect_mapping(value, path)
    out: dict[str, float] = {}
    for key, usd in section.items():
        where = f"{prefix}{key}"
        name = _gpu_key(key, gpus, resolve_gpu, where)
        out[name] = as_float(usd, where, minimum=0)
    return out


def _gpu_key(key: str, gpus: Sequence[Any], resolve_gpu: Callable[..., Any], where: str) -> str:
    text = str(key).strip()
    for spec in gpus:
        if text.lower() in (spec.name.lower(), *(a.lower() for a in spec.aliases)):
            return str(spec.name)
    try:
        return str(resolve_gpu(text, where).name)
    except ScenarioError as exc:
        raise ScenarioError(where, key, exc.fix) from None


def parse_cost_options(options: Sequence[str], gpus: Sequence[Any] = ()) -> dict[str, float]:
    """``["H100=2.49", ...]`` (the ``--cost`` flag) → ``{canonical GPU name: USD}``."""
    from servesim.latency.hardware import resolve_gpu

    out: dict[str, float] = {}
    for option in options:
        if "=" not in option:
            raise ScenarioError("--cost", option, "expected GPU=USD, e.g. --cost H100=2.49")
        key, _, usd = option.partition("=")
        name = _gpu_key(key.strip(), gpus, resolve_gpu, "--cost")
        out[name] = as_float(usd.strip(), f"--cost {key.strip()}", minimum=0)
    return out


def load_plan(
    source: str | Path | Mapping[str, Any],
    *,
    objective: str | None = None,
    requests: int | None = None,
    costs: Sequence[str] = (),
    cost_files: Sequence[str | Path] = (),
    base_dir: str | Path | None = None,
) -> Plan:
    """Read and validate a plan (a YAML file or a dict). Every error is a ScenarioError naming the
    plan field (``search.tp[1]``, ``attainment``; ``scenario.<field>`` for the base scenario).

    ``objective`` and ``requests`` override the plan's; ``costs`` are ``GPU=USD`` strings (the
    ``--cost`` flag) and ``cost_files`` YAML files of ``GPU: USD`` (``--costs``), applied after
    the plan's own ``costs:`` in that order (files first, then ``costs``). A relative ``scenario``
    path is resolved against the plan file's directory (``base_dir`` for a dict, default: the
    working directory).
    """
    from servesim.latency.hardware import bundled_gpus, resolve_gpu

    if isinstance(source, Mapping):
        data = copy.deepcopy(dict(expect_mapping(source, "plan")))
        plan_dir = Path(base_dir) if base_dir is not None else Path.cwd()
        default_name = "plan"
    else:
        data = _load_mapping(source, "plan")
        plan_dir = Path(source).resolve().parent
        default_name = Path(source).stem
    check_keys(data, PLAN_FIELDS, "")
    name = str(data.get("name") or default_name)

    # the base scenario: a path (relative to the plan) or an inline mapping
    raw_scenario = data.get("scenario")
    if raw_scenario is None:
        raise ScenarioError(
            "scenario",
            None,
            "missing; name the base scenario (model, workload, engine): scenario: default.yaml, "
            "or give it inline as a mapping",
        )
    scenario_dir: Path = plan_dir
    if isinstance(raw_scenario, str):
        file = Path(raw_scenario).expanduser()
        if not file.is_absolute():
            file = plan_dir / file
        if not file.is_file():
            raise ScenarioError(
                "scenario",
                raw_scenario,
                f"no such file: {file} (a relative path is resolved against the plan's directory "
                f"{plan_dir})",
            )
        base = _load_mapping(file, "scenario")
        scenario_dir = file.resolve().parent
    else:
        base = copy.deepcopy(dict(expect_mapping(raw_scenario, "scenario")))
    cluster = expect_mapping(base.get("cluster"), "scenario.cluster")
    for key in ("groups", "pools"):
        if cluster.get(key) is not None:
            raise ScenarioError(
                f"scenario.cluster.{key}",
                cluster[key],
                "servesim plan sizes a fleet of identical instances and searches gpu, tp and the "
                f"instance count itself; remove cluster.{key} from the base scenario",
            )

    slo_raw = data.get("slo")
    if slo_raw is None:
        slo_raw = base.get("slo")
        slo = _slo(slo_raw, "scenario.slo")
    else:
        slo = _slo(slo_raw, "slo")
    if not slo:
        raise ScenarioError(
            "slo",
            slo_raw,
            "no SLO targets: give slo: {standard: {ttft: 1s, itl: 50ms}} in the plan (or the "
            "scenario); plan finds the fleet that meets them",
        )
    attainment = as_float(
        data.get("attainment", DEFAULT_ATTAINMENT), "attainment", exclusive_minimum=0, maximum=1
    )
    objective = objective if objective is not None else data.get("objective", "cost")
    objective = as_str(objective, "objective", choices=OBJECTIVES)
    requests_raw = requests if requests is not None else data.get("requests")
    latency = as_str(data.get("latency", "auto"), "latency", choices=LATENCY_CHOICES)

    base["slo"] = copy.deepcopy(slo_raw)
    if requests_raw is not None:
        req = as_int(requests_raw, "requests", minimum=1, maximum=10_000_000)
        workload = base.get("workload")
        if isinstance(workload, str):
            workload = {"preset": workload}
        base["workload"] = {**dict(expect_mapping(workload, "scenario.workload")), "requests": req}
    search = dict(expect_mapping(data.get("search"), "search"))
    check_keys(search, SEARCH_FIELDS, "search")
    # relative paths inside the base (traces, GPU files) are resolved against its own directory
    scenario = _validate_base(base, str(scenario_dir), keep_latency=latency == "scenario")
    described = scenario.workload.describe()
    request_count = described.get("requests")
    engine = expect_mapping(base.get("engine"), "scenario.engine")
    if scenario.model.spec is None and engine.get("kv_blocks", "auto") == "auto":
        raise ScenarioError(
            "scenario.model",
            base.get("model"),
            f"servesim bundles no architecture config for {scenario.model.name}, which the memory "
            "check and engine.kv_blocks: auto need; give model: path/to/config.json, or "
            "engine.kv_blocks as an integer in the base scenario (memory then goes unchecked)",
        )

    gpu_items = _as_list(search.get("gpu"), "search.gpu") or [base.get("gpu", "H100")]
    specs = []
    for i, item in enumerate(gpu_items):
        if not isinstance(item, str):
            raise ScenarioError(f"search.gpu[{i}]", item, "expected a GPU name or GPU file path")
        specs.append(resolve_gpu(item, f"search.gpu[{i}]", base_dir=str(plan_dir)))
    _unique(gpu_items, [s.name for s in specs], "search.gpu")

    tps = tuple(
        as_int(v, f"search.tp[{i}]", minimum=1, maximum=1024)
        for i, v in enumerate(_as_list(search.get("tp"), "search.tp") or [base.get("tp", 1)])
    )
    _unique(tps, tps, "search.tp")
    seqs = tuple(
        as_int(v, f"search.max_num_seqs[{i}]", minimum=1)
        for i, v in enumerate(
            _as_list(search.get("max_num_seqs"), "search.max_num_seqs")
            or [engine.get("max_num_seqs", 256)]
        )
    )
    _unique(seqs, seqs, "search.max_num_seqs")
    default_routing = expect_mapping(base.get("policies"), "scenario.policies").get(
        "routing", "round-robin"
    )
    routings = _routings(search.get("routing"), default_routing, "search.routing")

    instances = search.get("instances")
    if instances is None:
        lo, hi = DEFAULT_INSTANCES
    elif isinstance(instances, Mapping):
        section = expect_mapping(instances, "search.instances")
        check_keys(section, INSTANCE_FIELDS, "search.instances")
        lo = as_int(
            section.get("min", DEFAULT_INSTANCES[0]),
            "search.instances.min",
            minimum=1,
            maximum=MAX_INSTANCES,
        )
        hi = as_int(
            section.get("max", max(lo, DEFAULT_INSTANCES[1])),
            "search.instances.max",
            minimum=1,
            maximum=MAX_INSTANCES,
        )
        if hi < lo:
            raise ScenarioError(
                "search.instances.max", hi, f"must be at least search.instances.min ({lo})"
            )
    else:
        lo = hi = as_int(instances, "search.instances", minimum=1, maximum=MAX_INSTANCES)

    total = len(specs) * len(tps) * len(seqs) * len(routings)
    if total > MAX_CANDIDATES:
        raise ScenarioError(
            "search",
            total,
            f"{total} candidates ({len(specs)} GPUs × {len(tps)} tp × {len(seqs)} max_num_seqs × "
            f"{len(routings)} routing) is more than {MAX_CANDIDATES}; shorten the lists",
        )

    # prices: table < plan costs < --costs files < --cost
    prices: dict[str, tuple[float, str]] = {}
    for spec in specs:
        if spec.cost_per_hour is not None:
            origin = "hardware table" if spec.name in bundled_gpus() else "GPU file"
            prices[spec.name] = (float(spec.cost_per_hour), origin)
    if data.get("costs") is not None:
        for gpu, usd in _parse_costs(data["costs"], "costs", specs, "costs.").items():
            prices[gpu] = (usd, "plan costs")
    for cost_file in cost_files:
        mapping = _load_mapping(cost_file, "--costs")
        where = f"--costs {cost_file}"
        for gpu, usd in _parse_costs(mapping, where, specs, f"{where}: ").items():
            prices[gpu] = (usd, where)
    for gpu, usd in parse_cost_options(costs, specs).items():
        prices[gpu] = (usd, "--cost")
    choices = []
    for i, spec in enumerate(specs):
        if spec.name not in prices:
            raise ScenarioError(
                f"search.gpu[{i}]",
                gpu_items[i],
                f"no price for {spec.name}: give --cost {spec.name}=USD (per GPU-hour), a "
                f"costs: entry in the plan, or cost_per_hour in its GPU file",
            )
        value = spec.name if spec.name in bundled_gpus() else _gpu_file(gpu_items[i], plan_dir)
        usd, origin = prices[spec.name]
        choices.append(GPUChoice(spec, value, usd, origin))

    return Plan(
        name=name,
        base=base,
        base_dir=str(scenario_dir),
        model=scenario.model,
        slo=slo,
        attainment=attainment,
        gpus=tuple(choices),
        tps=tps,
        instances_min=lo,
        instances_max=hi,
        max_num_seqs=seqs,
        routings=routings,
        objective=objective,
        requests=request_count,
        latency=latency,
        workload=described,
        seed=int(scenario.seed),
    )


def _gpu_file(value: str, plan_dir: Path) -> str:
    file = Path(value).expanduser()
    return str(file if file.is_absolute() else (plan_dir / file).resolve())


_PLACEHOLDER_LATENCY = {"model": "blackbox", "alpha": [0, 0, 0], "beta": [1, 0, 0]}
_PLACEHOLDER_KV_BLOCKS = 1_000_000


def _validate_base(raw: Mapping[str, Any], base_dir: str | None, keep_latency: bool) -> Any:
    """Load the base scenario once, so that its mistakes are reported up front with their field
    (``scenario.<field>``). What the search sets per candidate is neutralised first, so that the
    base's own gpu and tp need not fit: one instance at tp 1, a KV capacity given (when it is
    ``auto``) and, unless the plan keeps the scenario's latency model, a placeholder one."""
    from servesim.scenario import build_scenario

    data = copy.deepcopy(dict(raw))
    if not keep_latency:
        data["tp"] = 1
    data["cluster"] = {**dict(data.get("cluster") or {}), "instances": 1}
    engine = dict(data.get("engine") or {})
    if engine.get("kv_blocks", "auto") == "auto":
        engine["kv_blocks"] = _PLACEHOLDER_KV_BLOCKS
    data["engine"] = engine
    if not keep_latency:
        data["latency"] = copy.deepcopy(_PLACEHOLDER_LATENCY)
    try:
        return build_scenario(data, base_dir=base_dir)
    except ScenarioError as exc:
        raise ScenarioError(f"scenario.{exc.path}", exc.value, exc.fix) from None


# ----------------------------------------------------------------------------- the results


@attrs.frozen
class CandidateResult:
    """One candidate's outcome. ``status`` is ``feasible`` or ``rejected``; a rejected one says
    why (``rejected_by``: ``memory``, ``tp``, ``latency``, ``scenario``, ``slo`` or
    ``simulation``; ``reason``: the numbers). For a feasible one the metrics are those of the
    run at ``instances``, the smallest count that met the SLO attainment; for one rejected by
    ``slo`` they are those of the run at the search's maximum count."""

    gpu: str
    tp: int
    max_num_seqs: int
    routing: str
    status: str = "feasible"
    rejected_by: str | None = None
    reason: str = ""
    latency_model: str | None = None
    latency_note: str = ""
    kv_blocks: int | None = None
    usd_per_gpu_hour: float | None = None
    instances: int | None = None
    gpus: int | None = None
    cost_per_hour: float | None = None
    throughput_per_gpu: float | None = None
    """Output tokens per second per GPU at the offered load (``tokens_per_sec / gpus``)."""
    offered_rps: float | None = None
    """The rate at which the simulated requests arrived: (n − 1) / (last − first arrival)."""
    responses_per_sec: float | None = None
    """Completed requests per second at the offered load (offered rate × share completed)."""
    tokens_per_sec: float | None = None
    """Output tokens per second at the offered load (offered rate × output tokens per request)."""
    goodput_rps: float | None = None
    """Requests per second within SLO at the offered load: offered rate × the share of all
    simulated requests that met every target of their class."""
    attainment: float | None = None
    """The lowest per-class SLO attainment (the one the requirement binds)."""
    attainment_by_class: Mapping[str, float] = attrs.field(factory=dict)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    """p99 of each request's mean inter-token latency (what an ``itl`` target judges)."""
    itl_p99_ms: float | None = None
    """p99 over every inter-token gap of the run."""
    e2e_p99_ms: float | None = None
    evaluated: tuple[tuple[int, float, bool], ...] = ()
    """Every simulated count: (instances, attainment, met the requirement)."""
    rank: int | None = None
    pareto: bool = False

    @property
    def feasible(self) -> bool:
        return self.status == "feasible"

    @property
    def label(self) -> str:
        return f"{self.gpu} tp{self.tp} seqs{self.max_num_seqs} {self.routing}"

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=False)
        out["attainment_by_class"] = dict(self.attainment_by_class)
        out["evaluated"] = [
            {"instances": n, "attainment": a, "meets": ok} for n, a, ok in self.evaluated
        ]
        out["label"] = self.label
        return out


def pareto_front(results: Sequence[CandidateResult]) -> list[CandidateResult]:
    """The feasible results no other feasible result beats on both cost per hour (lower is
    better) and goodput (higher is better); sorted by cost, then goodput descending. Results
    with identical cost and goodput are all kept."""
    feasible = [
        r
        for r in results
        if r.feasible and r.cost_per_hour is not None and r.goodput_rps is not None
    ]
    points = [(r, _num(r.cost_per_hour), _num(r.goodput_rps)) for r in feasible]
    front = [
        r
        for r, cost, good in points
        if not any(c <= cost and g >= good and (c < cost or g > good) for _, c, g in points)
    ]
    return sorted(front, key=lambda r: (_num(r.cost_per_hour), -_num(r.goodput_rps), r.label))


def _num(value: float | int | None) -> float:
    """A metric of a feasible result (always set) as a sort key."""
    return float(value) if value is not None else 0.0


def _sort_key(objective: str) -> Callable[[CandidateResult], tuple]:
    if objective == "cost":
        return lambda r: (_num(r.cost_per_hour), -_num(r.goodput_rps), _num(r.gpus), r.label)
    if objective == "throughput_per_gpu":
        return lambda r: (
            -_num(r.throughput_per_gpu),
            _num(r.cost_per_hour),
            -_num(r.goodput_rps),
            r.label,
        )
    if objective == "goodput":
        return lambda r: (-_num(r.goodput_rps), _num(r.cost_per_hour), r.label)
    raise ScenarioError("objective", objective, f"must be one of: {', '.join(OBJECTIVES)}")


def rank_results(results: Sequence[CandidateResult], objective: str) -> list[CandidateResult]:
    """The feasible results, best first by ``objective``, each with its ``rank`` (1 = best) set.
    Ties: ``cost`` → more goodput, fewer GPUs, the label; ``throughput_per_gpu`` → cheaper, more
    goodput, the label; ``goodput`` → cheaper, the label."""
    key = _sort_key(objective)
    ranked = sorted((r for r in results if r.feasible), key=key)
    return [attrs.evolve(r, rank=i + 1) for i, r in enumerate(ranked)]


@attrs.frozen
class PlanResult:
    """What :func:`run_plan` found: every candidate (ranked feasible ones first, then the
    rejected ones in search order), the Pareto front and the search's cost."""

    plan: Plan
    candidates: tuple[CandidateResult, ...]
    simulations: int
    simulated_requests: int
    cache_hits: int
    wall_s: float
    arrival_span_s: float | None = None
    """How long the simulated requests took to arrive (first to last arrival)."""

    @property
    def ranked(self) -> list[CandidateResult]:
        return [c for c in self.candidates if c.feasible]

    @property
    def rejected(self) -> list[CandidateResult]:
        return [c for c in self.candidates if not c.feasible]

    @property
    def pareto(self) -> list[CandidateResult]:
        return pareto_front(self.candidates)

    @property
    def best(self) -> CandidateResult | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "plan_version": PLAN_VERSION,
            "name": plan.name,
            "model": plan.model.name,
            "workload": plan.workload,
            "seed": plan.seed,
            "requests_per_candidate": plan.requests,
            "slo": {
                cls: {k.replace("_us", "_ms"): v / 1000.0 if v else None for k, v in t.items()}
                for cls, t in plan.slo.items()
            },
            "attainment_required": plan.attainment,
            "objective": plan.objective,
            "pareto_axes": {"cost_per_hour": "minimise", "goodput_rps": "maximise"},
            "costs": {
                g.name: {"usd_per_gpu_hour": g.usd_per_gpu_hour, "source": g.cost_source}
                for g in plan.gpus
            },
            "search": {
                "gpu": [g.name for g in plan.gpus],
                "tp": list(plan.tps),
                "instances": {"min": plan.instances_min, "max": plan.instances_max},
                "max_num_seqs": list(plan.max_num_seqs),
                "routing": [label for label, _ in plan.routings],
                "latency": plan.latency,
                "candidates": plan.candidate_count,
            },
            "best": self.best.label if self.best else None,
            "ranking": [c.label for c in self.ranked],
            "pareto_front": [c.label for c in self.pareto],
            "rejected": [
                {"label": c.label, "rejected_by": c.rejected_by, "reason": c.reason}
                for c in self.rejected
            ],
            "candidates": [c.to_dict() for c in self.candidates],
            "simulations": self.simulations,
            "simulated_requests": self.simulated_requests,
            "cache_hits": self.cache_hits,
            "arrival_span_s": self.arrival_span_s,
            "wall_s": self.wall_s,
        }


# ------------------------------------------------------------------------------ the search


@attrs.frozen
class _Run:
    """One simulated (candidate, count)."""

    meets: bool
    attainment: float
    by_class: Mapping[str, float]
    worst_class: str
    by_dim: Mapping[str, float]
    offered_rps: float
    goodput_rps: float
    responses_per_sec: float
    tokens_per_sec: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    itl_p99_ms: float
    e2e_p99_ms: float
    kv_blocks: int
    injected: int
    error: str | None = None
    error_kind: str = "simulation"


class _Planner:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.cache: dict[tuple, _Run] = {}
        self.simulations = 0
        self.simulated_requests = 0
        self.cache_hits = 0
        self.arrival_span_s: float | None = None
        self._memory: dict[tuple[str, int], tuple[str | None, str, int | None]] = {}
        self._latency: dict[tuple[str, int], tuple[str | None, str]] = {}

    # -- checks that need no simulation

    def memory(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str, int | None]:
        """(rejected_by or None, reason, kv_blocks) for the model on ``tp`` × ``gpu``."""
        key = (gpu.name, tp)
        if key not in self._memory:
            self._memory[key] = self._check_memory(gpu, tp)
        return self._memory[key]

    def _check_memory(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str, int | None]:
        from servesim.memory import memory_breakdown

        spec = self.plan.model.spec
        if spec is None:
            return None, "memory not checked: the model has no architecture config", None
        engine = expect_mapping(self.plan.base.get("engine"), "engine")
        block_size = int(engine.get("block_size", 16))
        utilisation = float(engine.get("gpu_memory_utilization", 0.9))
        try:
            d = memory_breakdown(
                spec,
                gpu.spec,
                tp,
                block_size,
                utilisation,
                max_num_batched_tokens=int(engine.get("max_num_batched_tokens", 2048)),
                max_num_seqs=int(engine.get("max_num_seqs", 256)),
            )
        except ScenarioError as exc:
            return "tp", f"tp={tp}: {exc.fix}", None
        if d["feasible"]:
            return None, "", int(d["kv_blocks"])
        reserves = (d["activation_peak_gib"] + d["non_torch_gib"] + d["cuda_graph_gib"]) * tp
        reason = (
            f"memory: {d['model']} needs {d['overhead_gib']:.1f} GiB per instance (weights "
            f"{d['weights_gib']:.1f} + activation peak and reserves {reserves:.1f}) but "
            f"{tp} × {gpu.name} "
            f"({d['gpu_memory_gib']:g} GiB each) give {d['available_gib']:.1f} GiB at "
            f"gpu_memory_utilization {utilisation:g}"
        )
        if d.get("min_gpus") is None:
            reason += f"; no number of {gpu.name} GPUs holds it"
        else:
            min_tp = d.get("min_tp")
            reason += f"; it needs at least {d['min_gpus']} GPUs" + (
                f" (tp={min_tp})" if min_tp not in (None, d["min_gpus"]) else ""
            )
        return "memory", reason, None

    def latency(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str]:
        """(latency model name or None, note) for ``tp`` × ``gpu``."""
        key = (gpu.name, tp)
        if key not in self._latency:
            self._latency[key] = self._choose_latency(gpu, tp)
        return self._latency[key]

    def _choose_latency(self, gpu: GPUChoice, tp: int) -> tuple[str | None, str]:
        from servesim.scenario import latency_context
        from servesim.simcore import registry

        plan = self.plan
        context = latency_context(plan.model, gpu.spec, tp)
        if plan.latency == "scenario":
            section = plan.base.get("latency") or {"model": "blackbox"}
            if isinstance(section, str):
                section = {"model": section}
            name = str(section.get("model", "blackbox"))
            params = {k: v for k, v in section.items() if k != "model"}
            try:
                registry.get("latency", name).from_config(params, context, "latency")
            except ScenarioError as exc:
                return None, f"latency: the base scenario's {name} model refuses it: {exc.fix}"
            return name, "the base scenario's latency section"
        order = LATENCY_PREFERENCE if plan.latency == "auto" else (plan.latency,)
        refused = []
        for name in order:
            try:
                registry.get("latency", name).from_config({}, context, "latency")
            except ScenarioError as exc:
                refused.append(
                    "no bundled blackbox coefficients for this model, GPU and tp"
                    if name == "blackbox"
                    else f"{name} refuses it: {exc.fix}"
                )
                continue
            if name == "blackbox":
                return name, "bundled blackbox coefficients for this model, GPU and tp"
            return name, "; ".join(refused) or "named in the plan"
        return None, "latency: no latency model can price it: " + "; ".join(refused)

    # -- simulation

    def scenario_raw(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: Any, count: int, latency: str
    ) -> dict[str, Any]:
        raw = copy.deepcopy(dict(self.plan.base))
        raw["gpu"] = gpu.scenario_value
        raw["tp"] = tp
        cluster = dict(raw.get("cluster") or {})
        cluster["instances"] = count
        raw["cluster"] = cluster
        engine = dict(raw.get("engine") or {})
        engine["max_num_seqs"] = seqs
        raw["engine"] = engine
        policies = dict(raw.get("policies") or {})
        policies["routing"] = copy.deepcopy(routing)
        raw["policies"] = policies
        if self.plan.latency != "scenario":
            raw["latency"] = {"model": latency}
        raw.pop("output", None)  # nothing is written; a decision trace would only slow it down
        return raw

    def evaluate(
        self,
        gpu: GPUChoice,
        tp: int,
        seqs: int,
        routing: tuple[str, Any],
        count: int,
        latency: str,
    ) -> _Run:
        # one instance: every router sends every request to it, so routing does not matter
        key = (gpu.name, tp, seqs, routing[0] if count > 1 else "*", count)
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        run = self._simulate(gpu, tp, seqs, routing[1], count, latency)
        self.cache[key] = run
        return run

    def _simulate(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: Any, count: int, latency: str
    ) -> _Run:
        from servesim.run import simulate
        from servesim.scenario import build_scenario

        raw = self.scenario_raw(gpu, tp, seqs, routing, count, latency)
        try:
            scenario = build_scenario(raw, base_dir=self.plan.base_dir)
        except ScenarioError as exc:
            return _failed("scenario", f"at {count} instance(s): {exc}")
        self.simulations += 1
        try:
            results = simulate(scenario)
        except ServesimError as exc:
            return _failed("simulation", f"{type(exc).__name__} at {count} instance(s): {exc}")
        except Exception as exc:  # one broken candidate must not end the search
            return _failed(
                "simulation", f"internal {type(exc).__name__} at {count} instance(s): {exc}"
            )
        self.simulated_requests += int(results.summary["injected_requests"])
        return self._judge(results, scenario)

    def _judge(self, results: Any, scenario: Any) -> _Run:
        from servesim.components.record import STATUS_COMPLETED

        summary = results.summary
        goodput = summary.get("goodput") or {}
        judged = {cls: g for cls, g in goodput.items() if g["count"] > 0}
        if not judged:
            classes = sorted(summary.get("per_class") or {}) or ["(none completed)"]
            raise ScenarioError(
                "slo",
                sorted(self.plan.slo),
                "no simulated request belongs to a class with a target; the workload's "
                f"requests are in {', '.join(classes)}: give targets for those classes",
            )
        by_class = {cls: float(g["slo_attainment"]) for cls, g in judged.items()}
        worst = min(by_class, key=lambda c: (by_class[c], c))
        attainment = by_class[worst]
        # Rates at the offered load: the share of requests served (within SLO), times the rate
        # at which they arrived. (The summary's own rates divide by the whole run, which with a
        # few hundred requests is dominated by draining the last ones.)
        req = results.requests
        arrival = req["arrival_us"]
        n = len(arrival)
        span_us = float(arrival.max() - arrival.min()) if n else 0.0
        offered = (
            (n - 1) / span_us * 1e6 if n > 1 and span_us > 0 else n / summary["sim_duration_s"]
        )
        span_s = span_us / 1e6
        self.arrival_span_s = max(self.arrival_span_s or 0.0, span_s)
        done = req["status"] == STATUS_COMPLETED
        good = sum(int(g["good"]) for g in judged.values())
        per_request = offered / n if n else 0.0
        return _Run(
            meets=all(a >= self.plan.attainment - 1e-12 for a in by_class.values()),
            attainment=attainment,
            by_class=by_class,
            worst_class=worst,
            by_dim=dict(judged[worst].get("slo_attainment_by_dim") or {}),
            offered_rps=offered,
            goodput_rps=good * per_request,
            responses_per_sec=int(done.sum()) * per_request,
            tokens_per_sec=float(req["output_tokens"][done].sum()) * per_request,
            ttft_p99_ms=float(summary["ttft_p99_ms"]),
            tpot_p99_ms=float(summary["tpot_p99_ms"]),
            itl_p99_ms=float(summary["itl_p99_ms"]),
            e2e_p99_ms=float(summary["e2e_p99_ms"]),
            kv_blocks=int(scenario.engine.kv_blocks),
            injected=int(summary["injected_requests"]),
        )

    # -- one candidate

    def candidate(
        self, gpu: GPUChoice, tp: int, seqs: int, routing: tuple[str, Any]
    ) -> CandidateResult:
        plan = self.plan
        base = CandidateResult(
            gpu=gpu.name,
            tp=tp,
            max_num_seqs=seqs,
            routing=routing[0],
            usd_per_gpu_hour=gpu.usd_per_gpu_hour,
        )
        rejected_by, reason, kv_blocks = self.memory(gpu, tp)
        if rejected_by is not None:
            return attrs.evolve(base, status="rejected", rejected_by=rejected_by, reason=reason)
        latency, note = self.latency(gpu, tp)
        base = attrs.evolve(base, latency_model=latency, latency_note=note, kv_blocks=kv_blocks)
        if latency is None:
            return attrs.evolve(base, status="rejected", rejected_by="latency", reason=note)

        evaluated: dict[int, _Run] = {}

        def run(n: int) -> _Run:
            if n not in evaluated:
                evaluated[n] = self.evaluate(gpu, tp, seqs, routing, n, latency)
            return evaluated[n]

        lo, hi = plan.instances_min, plan.instances_max
        n, last_fail = lo, None
        while True:  # exponential search: min, 2·min, 4·min, ... up to max
            r = run(n)
            if r.error is not None:
                return self._error(base, r, evaluated)
            if r.meets:
                break
            last_fail = n
            if n == hi:
                return self._not_met(base, r, evaluated)
            n = min(max(2 * n, n + 1), hi)
        found = n
        if last_fail is not None:  # bisection: last_fail fails, found meets
            low = last_fail
            while found - low > 1:
                mid = (low + found) // 2
                r = run(mid)
                if r.error is not None:
                    return self._error(base, r, evaluated)
                if r.meets:
                    found = mid
                else:
                    low = mid
        # check: the count found meets the requirement and the one below it does not
        best = run(found)
        if found > lo:
            below = run(found - 1)
            if below.error is not None:
                return self._error(base, below, evaluated)
        gpus = found * tp
        return attrs.evolve(
            base,
            kv_blocks=best.kv_blocks,
            instances=found,
            gpus=gpus,
            cost_per_hour=gpus * gpu.usd_per_gpu_hour,
            throughput_per_gpu=best.tokens_per_sec / gpus,
            **_metrics(best),
            evaluated=_evaluated(evaluated),
        )

    def _not_met(
        self, base: CandidateResult, r: _Run, evaluated: Mapping[int, _Run]
    ) -> CandidateResult:
        hi = self.plan.instances_max
        dims = ", ".join(
            f"{dim.replace('_ms', '').upper()} {share:.0%}"
            for dim, share in sorted(r.by_dim.items())
        )
        reason = (
            f"SLO not met even at {hi} instance(s): attainment {r.attainment:.1%} "
            f"({r.worst_class}) < {self.plan.attainment:.0%}"
            + (f"; met per target: {dims}" if dims else "")
            + f"; p99 TTFT {r.ttft_p99_ms:.0f} ms, p99 TPOT {r.tpot_p99_ms:.1f} ms"
        )
        return attrs.evolve(
            base,
            status="rejected",
            rejected_by="slo",
            reason=reason,
            kv_blocks=r.kv_blocks,
            **_metrics(r),
            evaluated=_evaluated(evaluated),
        )

    def _error(
        self, base: CandidateResult, r: _Run, evaluated: Mapping[int, _Run]
    ) -> CandidateResult:
        return attrs.evolve(
            base,
            status="rejected",
            rejected_by=r.error_kind,
            reason=f"{r.error_kind} error: {r.error}",
            evaluated=_evaluated({n: e for n, e in evaluated.items() if e.error is None}),
        )


def _failed(kind: str, message: str) -> _Run:
    nan = float("nan")
    return _Run(
        False,
        nan,
        {},
        "",
        {},
        nan,
        nan,
        nan,
        nan,
        nan,
        nan,
        nan,
        nan,
        0,
        0,
        error=message,
        error_kind=kind,
    )


def _metrics(r: _Run) -> dict[str, Any]:
    return {
        "offered_rps": r.offered_rps,
        "responses_per_sec": r.responses_per_sec,
        "tokens_per_sec": r.tokens_per_sec,
        "goodput_rps": r.goodput_rps,
        "attainment": r.attainment,
        "attainment_by_class": dict(r.by_class),
        "ttft_p99_ms": r.ttft_p99_ms,
        "tpot_p99_ms": r.tpot_p99_ms,
        "itl_p99_ms": r.itl_p99_ms,
        "e2e_p99_ms": r.e2e_p99_ms,
    }


def _evaluated(evaluated: Mapping[int, _Run]) -> tuple[tuple[int, float, bool], ...]:
    return tuple((n, r.attainment, r.meets) for n, r in sorted(evaluated.items()))


def run_plan(
    plan: Plan,
    progress: Callable[[CandidateResult, int, int], None] | None = None,
) -> PlanResult:
    """Search every candidate of ``plan``; ``progress(result, done, total)`` is called as each
    candidate finishes."""
    started = time.perf_counter()
    planner = _Planner(plan)
    results = []
    total = plan.candidate_count
    for gpu in plan.gpus:
        for tp in plan.tps:
            for seqs in plan.max_num_seqs:
                for routing in plan.routings:
                    result = planner.candidate(gpu, tp, seqs, routing)
                    results.append(result)
                    if progress is not None:
                        progress(result, len(results), total)
    ranked = rank_results(results, plan.objective)
    front = {id(r) for r in pareto_front(ranked)}
    ranked = [attrs.evolve(r, pareto=id(r) in front) for r in ranked]
    rejected = [r for r in results if not r.feasible]
    return PlanResult(
        plan=plan,
        candidates=tuple(ranked + rejected),
        simulations=planner.simulations,
        simulated_requests=planner.simulated_requests,
        cache_hits=planner.cache_hits,
        wall_s=time.perf_counter() - started,
        arrival_span_s=planner.arrival_span_s,
    )


# ------------------------------------------------------------------------------ the output

_OBJECTIVE_TEXT = {
    "cost": "cost per hour, lowest first",
    "throughput_per_gpu": "output tokens/s per GPU, highest first",
    "goodput": "goodput (requests/s within SLO), highest first",
}


def _slo_text(slo: Mapping[str, Mapping[str, int]]) -> str:
    parts = []
    for cls, t in slo.items():
        limits = [
            f"{dim} ≤ {_duration(t[f'{dim}_us'])}"
            for dim in ("ttft", "itl", "e2e")
            if t[f"{dim}_us"]
        ]
        parts.append(f"{cls} {', '.join(limits)}")
    return "; ".join(parts)


def _duration(us: int) -> str:
    if us >= 1_000_000 and us % 1_000_000 == 0:
        return f"{us // 1_000_000} s"
    return f"{us / 1000:g} ms"


def _workload_text(w: Mapping[str, Any]) -> str:
    kind = w.get("kind", "workload")
    if kind == "synthetic":
        arrival = (w.get("arrival") or {}).get("process", "")
        return f"{w.get('preset') or 'synthetic'} at {w.get('rate', 0):g} req/s ({arrival})"
    return str(kind)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_plan(result: PlanResult) -> str:
    """The console report: header, ranked table, Pareto front, rejected candidates."""
    plan = result.plan
    lines = [
        f"plan {plan.name}: {plan.model.name}, {_workload_text(plan.workload)}, "
        f"{plan.requests if plan.requests is not None else 'all the'} requests per simulation, "
        f"seed {plan.seed}",
        f"SLO: {_slo_text(plan.slo)}; required attainment {plan.attainment:.0%} per class",
        "cost per GPU-hour (USD): "
        + ", ".join(f"{g.name} {g.usd_per_gpu_hour:.2f} ({g.cost_source})" for g in plan.gpus),
        f"searched {plan.candidate_count} candidates ({len(plan.gpus)} GPU × {len(plan.tps)} tp × "
        f"{len(plan.max_num_seqs)} max_num_seqs × {len(plan.routings)} routing), instances "
        f"{plan.instances_min}-{plan.instances_max}: {len(result.ranked)} feasible, "
        f"{len(result.rejected)} rejected; {result.simulations} simulations "
        f"({result.simulated_requests:,} requests, {result.cache_hits} cache hits) in "
        f"{result.wall_s:.1f} s wall ({result.simulated_requests / max(result.wall_s, 1e-9):,.0f} "
        "requests/s)",
    ]
    span = result.arrival_span_s
    if span is not None and span < SHORT_SPAN_S:
        lines.append(
            f"note: the simulated requests arrive over {span:.0f} s only; a fleet slightly too "
            "small shows once its queue has had time to grow, so check the answer with more "
            "requests (--requests)"
        )
    lines.append("")
    ranked = result.ranked
    if ranked:
        lines.append(f"ranked by {plan.objective} ({_OBJECTIVE_TEXT[plan.objective]}):")
        header = (
            f"{'rank':>4}  {'gpu':<12} {'tp':>2} {'seqs':>5}  {'routing':<14} {'latency':<15} "
            f"{'inst':>4} {'GPUs':>4} {'$/hour':>8} {'tok/s/GPU':>9} {'goodput':>8} "
            f"{'attain':>7} {'TTFT p99':>9} {'TPOT p99':>9} {'ITL p99':>8}"
        )
        lines.append(header)
        for r in ranked:
            lines.append(
                f"{r.rank:>4}  {r.gpu:<12} {r.tp:>2} {r.max_num_seqs:>5}  {r.routing:<14} "
                f"{r.latency_model or '-':<15} {r.instances:>4} {r.gpus:>4} "
                f"{_fmt(r.cost_per_hour, '.2f'):>8} {_fmt(r.throughput_per_gpu, '.0f'):>9} "
                f"{_fmt(r.goodput_rps, '.2f'):>8} {_fmt(r.attainment, '.1%'):>7} "
                f"{_fmt(r.ttft_p99_ms, '.0f'):>9} {_fmt(r.tpot_p99_ms, '.1f'):>9} "
                f"{_fmt(r.itl_p99_ms, '.1f'):>8}" + ("  *" if r.pareto else "")
            )
        lines.append(
            "  * on the Pareto front. goodput: requests/s within SLO at the offered "
            f"{ranked[0].offered_rps:.2f} req/s; tok/s/GPU: output tokens/s per GPU at that load;"
        )
        lines.append(
            "  latencies in ms; TPOT p99: of each request's mean inter-token time (what an itl "
            "target judges); ITL p99: of every gap"
        )
        lines.append("")
        lines.append("Pareto front over cost per hour (lower) and goodput (higher):")
        front: dict[tuple, list[CandidateResult]] = {}
        for r in result.pareto:  # one line for the fleets that differ only in seqs or routing
            key = (r.cost_per_hour, r.goodput_rps, r.instances, r.gpu, r.tp)
            front.setdefault(key, []).append(r)
        for (cost, goodput, instances, gpu, tp), members in front.items():
            seqs = "/".join(str(s) for s in sorted({m.max_num_seqs for m in members}))
            routings = "/".join(dict.fromkeys(m.routing for m in members))
            lines.append(
                f"  ${cost:.2f}/hour  goodput {goodput:.2f} req/s  {instances} × {gpu} tp{tp}, "
                f"max_num_seqs {seqs}, {routings}"
            )
        best = ranked[0]
        lines.append("")
        lines.append(
            f"best by {plan.objective}: {best.instances} × {best.gpu} (tp {best.tp}, "
            f"{best.gpus} GPU{'' if best.gpus == 1 else 's'}), max_num_seqs {best.max_num_seqs}, "
            f"routing {best.routing}: "
            f"${best.cost_per_hour:.2f}/hour, attainment {best.attainment:.1%}"
            + _below(best, plan.instances_min)
        )
    else:
        lines.append("no candidate meets the SLO: see the reasons below")
    if result.rejected:
        lines.append("")
        lines.append("rejected:")
        groups: dict[tuple[str, int, str], list[CandidateResult]] = {}
        for r in result.rejected:  # one line for the candidates one reason rejects alike
            groups.setdefault((r.gpu, r.tp, r.reason), []).append(r)
        for (gpu, tp, reason), members in groups.items():
            if len(members) == 1:
                lines.append(f"  {members[0].label}: {reason}")
                continue
            seq_list = "/".join(str(s) for s in sorted({m.max_num_seqs for m in members}))
            routing_list = "/".join(dict.fromkeys(m.routing for m in members))
            lines.append(f"  {gpu} tp{tp} (seqs {seq_list}, {routing_list}): {reason}")
    return "\n".join(lines)


def _below(r: CandidateResult, minimum: int) -> str:
    """What the count below the answer reached (it was simulated to check the answer)."""
    for n, attainment, _ in r.evaluated:
        if n == (r.instances or 0) - 1:
            return f" ({n} instance(s) reach {attainment:.1%})"
    return f" ({minimum} is the search's minimum count)"


def _csv_text(result: PlanResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in result.candidates:
        d = c.to_dict()
        row = []
        for column in CSV_COLUMNS:
            value = d.get(column)
            if isinstance(value, float):
                value = f"{value:.6g}"
            elif isinstance(value, bool):
                value = int(value)
            row.append("" if value is None else value)
        writer.writerow(row)
    return buffer.getvalue()


def _atomic_write(path: Path, text: str) -> None:
    write_atomic(path, text)


def write_plan(result: PlanResult, out_dir: str | Path) -> list[Path]:
    """Write ``plan.json`` (everything) and ``plan.csv`` (one row per candidate), each
    atomically (a temporary file renamed into place); returns the paths."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError("--out", str(out_dir), f"cannot create the directory ({exc})") from None
    if not out.is_dir():
        raise ScenarioError("--out", str(out_dir), "is not a directory")
    json_path, csv_path = out / "plan.json", out / "plan.csv"
    text = json.dumps(_finite(result.to_dict()), indent=2, sort_keys=False) + "\n"
    _atomic_write(json_path, text)
    _atomic_write(csv_path, _csv_text(result))
    return [json_path, csv_path]


def _finite(value: Any) -> Any:
    """NaN and infinities as null, so plan.json is strict JSON."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# --------------------------------------------------------------------------------- the CLI


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plan`` command to the CLI's subparsers; dispatch it to :func:`cmd_plan`."""
    p = subparsers.add_parser(
        "plan",
        help="find the cheapest fleet (GPU, tp, instances, max_num_seqs, routing) within SLOs",
        description=(
            "Search GPU types, tensor parallelism, max_num_seqs and routing policies for the "
            "smallest instance count that serves the base scenario's workload within the SLO "
            "attainment, rejecting what does not fit in memory; rank the feasible fleets by the "
            "objective, show the Pareto front over cost per hour and goodput and why each rejected "
            "candidate was rejected, and write plan.json and plan.csv. GPU prices are indicative "
            "(hardware.yaml cost_per_hour); override them with --cost or --costs."
        ),
    )
    p.add_argument("plan", metavar="PLAN.yaml", help="plan file (see docs/howto/plan-capacity.md)")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="where to write plan.json and plan.csv "
        "(default: results/plan-<plan name>)"
    )  # fmt: skip
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=None,
        help="rank by cost per hour, output tokens/s per GPU, or goodput (default: the plan's, "
        "else cost)",
    )
    p.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="GPU=USD",
        help="price of one GPU-hour in USD, e.g. --cost H100=2.49 (repeatable; wins over "
        "--costs, the plan's costs and the hardware table)",
    )
    p.add_argument(
        "--costs",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML file of GPU: USD per GPU-hour (repeatable; later files win)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        metavar="N",
        help="requests simulated per candidate and instance count (default: the plan's, else "
        "the scenario's)",
    )
    p.add_argument("--json", action="store_true", help="print plan.json instead of the report")
    p.set_defaults(handler=cmd_plan)
    return p


def cmd_plan(args: argparse.Namespace) -> int:
    """Run the plan, print the report, write plan.json and plan.csv; exit 0 when some candidate
    is feasible, 1 when none is."""
    if args.requests is not None and args.requests < 1:
        raise ScenarioError("--requests", args.requests, "must be a positive integer")
    plan = load_plan(
        args.plan,
        objective=args.objective,
        requests=args.requests,
        costs=args.cost,
        cost_files=args.costs,
    )
    show = not getattr(args, "json", False) and sys.stderr.isatty()

    def progress(result: CandidateResult, done: int, total: int) -> None:
        verdict = (
            f"{result.instances} instance(s), ${result.cost_per_hour:.2f}/hour"
            if result.feasible
            else f"rejected ({result.rejected_by})"
        )
        print(f"[{done}/{total}] {result.label}: {verdict}", file=sys.stderr, flush=True)

    result = run_plan(plan, progress if show else None)
    out = args.out or str(Path("results") / f"plan-{plan.name}")
    files = write_plan(result, out)
    if getattr(args, "json", False):
        print(json.dumps(_finite(result.to_dict()), indent=2))
    else:
        print(format_plan(result))
        print(f"wrote {', '.join(str(f) for f in files)}")
    return 0 if result.ranked else 1
