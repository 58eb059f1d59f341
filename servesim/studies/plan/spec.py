"""The plan file: :func:`load_plan` reads and validates ``PLAN.yaml`` (base scenario, SLO targets,
attainment, search space, objective, costs) into a :class:`Plan`.
"""

from __future__ import annotations

import copy
import json
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
)
from servesim.simcore.errors import ScenarioError
from servesim.studies.plan.objectives import _fitness, parse_objective
from servesim.studies.plan.space import Space, as_list, check_bounded, parse_space, unique

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
    "fitness",
    "budget",
    "power",
)
SEARCH_FIELDS = (
    "gpu",
    "tp",
    "pp",
    "ep",
    "instances",
    "max_num_seqs",
    "max_num_batched_tokens",
    "routing",
    "pd",
)
INSTANCE_FIELDS = ("min", "max")
LATENCY_CHOICES = ("auto", "scenario", "blackbox", "trained-physics", "roofline")
LATENCY_PREFERENCE = ("blackbox", "trained-physics", "roofline")
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
    "pp",
    "ep",
    "max_num_seqs",
    "max_num_batched_tokens",
    "routing",
    "pd",
    "latency_model",
    "instances",
    "gpus",
    "usd_per_gpu_hour",
    "cost_per_hour",
    "cost_per_million_tokens",
    "throughput_per_gpu",
    "responses_per_sec",
    "goodput_rps",
    "attainment",
    "offered_rps",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "e2e_p99_ms",
    "fitness",
    "watts_per_gpu",
    "energy_per_million_tokens",
    "objective_value",
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
    fitness: tuple[Any, ...] = ()
    """The fitness objectives (:class:`servesim.analysis.verdict.Objective`) when ranking by
    ``fitness``; empty otherwise."""
    prune_margin: float | None = 0.2
    """Reject unsimulated when the projected max rate < (1 − margin) · target (None: never)."""
    min_confidence: str | None = None
    """Reject candidates whose step times rank below this rung (servesim.projection.confidence)."""
    space: Space = Space((1,), (1,), (None,), (None,), frozenset(), 1)
    """pp, ep, max_num_batched_tokens and PD splits (:mod:`servesim.studies.plan.space`)."""
    budget: float | None = None
    """USD per hour no fleet may exceed (None: no budget)."""
    metric: tuple[str, str] | None = None
    """(summary field, ``lowest`` or ``highest``) when the objective is a summary metric."""
    power: Mapping[str, float] = attrs.field(factory=dict)
    """Watts per GPU by GPU name (the plan's ``power``, ``--power``), for the energy metric."""

    @property
    def candidate_count(self) -> int:
        from servesim.studies.plan.space import candidate_total, dimension_sizes

        return candidate_total(dimension_sizes(self))


def _load_mapping(file: str | Path, path: str) -> dict[str, Any]:
    from servesim.scenario import read_yaml_file

    return read_yaml_file(file, path)


def _slo(value: Any, path: str) -> dict[str, dict[str, int]]:
    """``{class: {ttft_us, itl_us, e2e_us}}``: the scenario's ``slo:`` format, read by the
    scenario's parser (:func:`servesim.scenario.parse_slo_targets`)."""
    from servesim.scenario import parse_slo_targets

    return {cls: attrs.asdict(t) for cls, t in parse_slo_targets(value, path).items()}


def _routing_label(value: Any) -> str:
    if isinstance(value, str):
        return value
    params = {k: v for k, v in value.items() if k != "name"}
    inner = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return f"{value['name']}{inner}"


def _routings(value: Any, default: Any, path: str) -> tuple[tuple[str, Any], ...]:
    from servesim.simcore import registry

    items = as_list(value, path) or [default]
    out: list[tuple[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if isinstance(item, str):
            registry.get("routing", item, where)
            registry.get("routing", item).from_config({}, registry.PluginContext(where))
            out.append((item, item))
            continue
        section = dict(expect_mapping(item, where))
        if "name" not in section:
            raise ScenarioError(f"{where}.name", None, "missing; name the routing policy")
        name = as_str(section["name"], f"{where}.name")
        registry.get("routing", name, f"{where}.name")
        params = {k: v for k, v in section.items() if k != "name"}
        registry.get("routing", name).from_config(params, registry.PluginContext(where))
        out.append((_routing_label(section), section))
    unique(items, [label for label, _ in out], path)
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
    fitness: str | None = None,
    costs: Sequence[str] = (),
    cost_files: Sequence[str | Path] = (),
    base_dir: str | Path | None = None,
    power: Sequence[str] = (),
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
                f"instance count itself; remove cluster.{key} from the base scenario"
                + (
                    ' (search.pd tries prefill:decode splits, e.g. [none, "1:1"])'
                    if key == "pools"
                    else ""
                ),
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
    weights = fitness if fitness is not None else data.get("fitness")
    default_objective = "fitness" if weights is not None else "cost"
    if fitness is not None and objective is None:
        objective = "fitness"  # --fitness implies --objective fitness, whatever the plan ranks by
    where = "--objective" if objective is not None else "objective"
    objective = objective if objective is not None else data.get("objective", default_objective)
    objective, metric = parse_objective(objective, where)
    fitness_objectives = _fitness(weights, objective, "--fitness" if fitness else "fitness")
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
    scenario = _validate_base(
        base,
        str(scenario_dir),
        keep_latency=latency == "scenario",
        pd_searched=search.get("pd") is not None,
    )
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

    gpu_items = as_list(search.get("gpu"), "search.gpu") or [base.get("gpu", "H100")]
    specs = []
    for i, item in enumerate(gpu_items):
        if not isinstance(item, str):
            raise ScenarioError(f"search.gpu[{i}]", item, "expected a GPU name or GPU file path")
        specs.append(resolve_gpu(item, f"search.gpu[{i}]", base_dir=str(plan_dir)))
    unique(gpu_items, [s.name for s in specs], "search.gpu")

    tps = tuple(
        as_int(v, f"search.tp[{i}]", minimum=1, maximum=1024)
        for i, v in enumerate(as_list(search.get("tp"), "search.tp") or [base.get("tp", 1)])
    )
    unique(tps, tps, "search.tp")
    seqs = tuple(
        as_int(v, f"search.max_num_seqs[{i}]", minimum=1)
        for i, v in enumerate(
            as_list(search.get("max_num_seqs"), "search.max_num_seqs")
            or [engine.get("max_num_seqs", 256)]
        )
    )
    unique(seqs, seqs, "search.max_num_seqs")
    default_routing = expect_mapping(base.get("policies"), "scenario.policies").get(
        "routing", "round-robin"
    )
    routings = _routings(search.get("routing"), default_routing, "search.routing")
    space = parse_space(search, engine)
    budget = None
    if data.get("budget") is not None:
        budget = as_float(data["budget"], "budget", exclusive_minimum=0)

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

    check_bounded(
        [
            ("gpu", len(specs)),
            ("tp", len(tps)),
            ("pp", len(space.pps)),
            ("ep", len(space.eps)),
            ("max_num_seqs", len(seqs)),
            ("max_num_batched_tokens", len(space.batched_tokens)),
            ("routing", len(routings)),
            ("pd", len(space.pd_splits)),
        ]
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
    from servesim.studies.plan.energy import parse_power

    watts = parse_power(data.get("power"), power, specs, objective)
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
        fitness=fitness_objectives,
        space=space,
        budget=budget,
        metric=metric,
        power=watts,
    )


def _gpu_file(value: str, plan_dir: Path) -> str:
    file = Path(value).expanduser()
    return str(file if file.is_absolute() else (plan_dir / file).resolve())


_PLACEHOLDER_LATENCY = {"model": "blackbox", "alpha": [0, 0, 0], "beta": [1, 0, 0]}
_PLACEHOLDER_KV_BLOCKS = 1_000_000


def _validate_base(
    raw: Mapping[str, Any], base_dir: str | None, keep_latency: bool, pd_searched: bool = False
) -> Any:
    """Load the base scenario once, so that its mistakes are reported up front with their field
    (``scenario.<field>``). What the search sets per candidate is neutralised first, so that the
    base's own gpu and tp need not fit: one instance at tp 1, a KV capacity given (when it is
    ``auto``) and, unless the plan keeps the scenario's latency model, a placeholder one. When the
    plan searches PD splits, the KV-transfer link and the disaggregation decider (which need
    pools) are checked by the candidates that have pools."""
    from servesim.scenario import build_scenario

    data = copy.deepcopy(dict(raw))
    if not keep_latency:
        data["tp"] = 1
    data["cluster"] = {**dict(data.get("cluster") or {}), "instances": 1}
    if pd_searched:
        data["cluster"].pop("kv_transfer", None)
        data["policies"] = dict(data.get("policies") or {})
        data["policies"].pop("disaggregation", None)
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
