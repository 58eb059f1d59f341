"""The sweep file: :func:`load_sweep` reads and validates it (every point's scenario included,
before anything runs) into a :class:`Sweep` of :class:`Point` s.

A bad value is a :class:`~servesim.simcore.errors.ScenarioError` naming the sweep field and the
point.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from servesim.simcore.config import as_int, as_str, check_keys, expect_mapping
from servesim.simcore.config import plain_data as _plain
from servesim.simcore.errors import ScenarioError
from servesim.studies.sweep.metrics import check_metric
from servesim.studies.sweep.points import _canonical, _cell, _point_id, override_strings

SWEEP_FIELDS = ("name", "scenario", "set", "grid", "random", "replicas", "metrics", "plot")
RANDOM_FIELDS = ("samples", "seed", "fields")
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")
PLOT_FIELDS = ("x", "y", "group")
DEFAULT_METRICS = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "responses_per_sec",
    "tokens_per_sec",
    "completed_requests",
    "preemption_count",
)
SIGNIFICANT_DIGITS = 6  # random uniform/loguniform samples are rounded to this many
_FIELD_PATH = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")


# ---------------------------------------------------------------------- the sweep


@attrs.frozen
class PlotSpec:
    """``y`` (a metric) against ``x`` (a swept field), a line per value of the ``group`` fields."""

    x: str
    y: str
    group: tuple[str, ...] = ()


@attrs.frozen
class Point:
    """One run: the swept ``fields`` of its combination and its replica ``seed``.

    ``overrides`` is everything applied to the base scenario, in order: ``set``, the swept
    fields, then ``seed``. ``combination`` numbers the field combinations (replicas share it).
    """

    index: int
    id: str
    combination: int
    replica: int
    seed: int
    fields: Mapping[str, Any]
    overrides: Mapping[str, Any]

    def describe_fields(self) -> str:
        return " ".join(f"{k}={_cell(v)}" for k, v in self.fields.items())

    def describe(self) -> str:
        return " ".join(filter(None, [self.describe_fields(), f"seed={self.seed}"]))


@attrs.frozen
class Sweep:
    """A validated sweep: the base scenario, the swept space and its expanded points.

    ``scenario`` is an absolute file path, an inline scenario mapping, or None (the default
    scenario). ``space`` holds the grid values or the random distributions, as validated.
    """

    name: str
    scenario: str | Mapping[str, Any] | None
    set: Mapping[str, Any]
    mode: str  # "grid", "random" or "single" (no swept field: the base scenario, replicated)
    fields: tuple[str, ...]
    space: Mapping[str, Any]
    replicas: int
    metrics: tuple[str, ...]
    plot: PlotSpec | None
    points: tuple[Point, ...]
    base_seed: int
    random_samples: int = 0
    random_seed: int = 0
    source: str | None = None

    @property
    def combinations(self) -> int:
        return len(self.points) // self.replicas if self.points else 0

    def to_yaml(self) -> str:
        """The resolved sweep, loadable with :func:`load_sweep` (what ``sweep.yaml`` holds)."""
        data: dict[str, Any] = {"name": self.name}
        if self.scenario is not None:
            data["scenario"] = _plain(self.scenario)
        if self.set:
            data["set"] = _plain(self.set)
        if self.mode == "grid":
            data["grid"] = _plain(self.space)
        elif self.mode == "random":
            data["random"] = {
                "samples": self.random_samples,
                "seed": self.random_seed,
                "fields": _plain(self.space),
            }
        data["replicas"] = self.replicas
        data["metrics"] = list(self.metrics)
        if self.plot is not None:
            data["plot"] = {"x": self.plot.x, "y": self.plot.y, "group": list(self.plot.group)}
        head = (
            f"# the resolved sweep{f' of {self.source}' if self.source else ''}: "
            f"{len(self.points)} points = {self.combinations} combinations x {self.replicas} "
            f"replicas, seeds {self.base_seed}..{self.base_seed + self.replicas - 1}\n"
        )
        return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def load_sweep(
    source: str | Path | Mapping[str, Any], *, base_dir: str | Path | None = None
) -> Sweep:
    """Load, validate and expand a sweep (a YAML file or a dict), checking every point's scenario.

    A ``scenario:`` path is relative to the sweep file (to ``base_dir``, or the working
    directory, for a dict). Every error is a ScenarioError naming the sweep field; an invalid
    point names its id and values too.
    """
    from servesim.scenario import read_yaml_file

    file: str | None = None
    if isinstance(source, Mapping):
        raw = dict(source)
        where = Path(base_dir) if base_dir is not None else Path.cwd()
        default_name = "sweep"
    else:
        raw = read_yaml_file(source, path="sweep")
        file = str(source)
        where = Path(source).resolve().parent
        default_name = Path(source).stem
    data = expect_mapping(raw, "sweep")
    check_keys(data, SWEEP_FIELDS, "")

    name = as_str(data["name"], "name") if data.get("name") is not None else default_name
    if "/" in name or name in (".", ".."):
        raise ScenarioError("name", name, "must not contain '/'; it names a results directory")
    scenario, base_content = _base_scenario(data.get("scenario"), where)
    fixed = {
        _field_path(k, f"set.{k}"): v for k, v in expect_mapping(data.get("set"), "set").items()
    }
    if "grid" in data and "random" in data:
        raise ScenarioError(
            "random",
            data["random"],
            "give either grid (every combination) or random (a sample), not both",
        )
    samples = random_seed = 0
    if "grid" in data:
        mode, space = "grid", _grid(data["grid"])
        combos = [dict(zip(space, values)) for values in itertools.product(*space.values())] or [{}]
    elif "random" in data:
        mode = "random"
        space, samples, random_seed = _random_space(data["random"])
        combos = _sample(space, samples, random_seed)
    else:
        mode, space, combos = "single", {}, [{}]
    fields = tuple(space)
    prefix = {"grid": "grid.", "random": "random.fields.", "single": ""}[mode]
    for key in fields:
        if key == "seed":
            raise ScenarioError(
                f"{prefix}seed",
                space[key],
                "seeds are not swept: set `replicas` (the seeds are the scenario's seed, seed+1, "
                "...) and the first seed with `set: {seed: N}`",
            )
        if key in fixed:
            raise ScenarioError(
                f"{prefix}{key}",
                space[key],
                "is also given in `set`; a field is either fixed (set) or swept, not both",
            )
    replicas = as_int(data.get("replicas", 1), "replicas", minimum=1, maximum=100_000)

    metrics = _metrics(data.get("metrics"))
    plot = _plot(data.get("plot"), fields, metrics)
    if plot is not None and plot.y not in metrics:
        metrics = (*metrics, plot.y)

    checker = _PointChecker(scenario, fixed, prefix)
    # Relative paths in the scenario resolve against its file's folder (an inline scenario:
    # the sweep file's); the point ids hash the files they name, so an edited trace or model
    # config is not mistaken for a finished point on resume.
    file_dirs = (Path(scenario).parent, where) if isinstance(scenario, str) else (where,)
    base_seed = checker.seed_of(combos[0])
    if base_seed + replicas - 1 > 2**63 - 1:
        raise ScenarioError("replicas", replicas, "the last seed would exceed 2**63 - 1")
    points: list[Point] = []
    for c, combo in enumerate(combos):
        for r in range(replicas):
            overrides = {**fixed, **combo, "seed": base_seed + r}
            points.append(
                Point(
                    index=len(points),
                    id=_point_id(base_content, overrides, file_dirs),
                    combination=c,
                    replica=r,
                    seed=base_seed + r,
                    fields=dict(combo),
                    overrides=overrides,
                )
            )
        checker.check(points[-replicas])
    return Sweep(
        name=name,
        scenario=scenario,
        set=fixed,
        mode=mode,
        fields=fields,
        space=space,
        replicas=replicas,
        metrics=metrics,
        plot=plot,
        points=tuple(points),
        base_seed=base_seed,
        random_samples=samples,
        random_seed=random_seed,
        source=file,
    )


def _base_scenario(value: Any, where: Path) -> tuple[str | Mapping[str, Any] | None, Any]:
    """(what load_scenario gets, the content the point ids hash) of the ``scenario`` field."""
    from servesim.scenario import read_yaml_file

    if value is None:
        return None, "default"
    if isinstance(value, Mapping):
        return _plain(expect_mapping(value, "scenario")), _plain(value)
    if not isinstance(value, str) or not value:
        raise ScenarioError(
            "scenario",
            value,
            "expected the path of a scenario YAML file (relative to the sweep file) or a mapping",
        )
    path = (where / value).resolve()
    return str(path), read_yaml_file(path, path="scenario")


def _field_path(key: Any, where: str) -> str:
    if not isinstance(key, str) or not _FIELD_PATH.fullmatch(key):
        raise ScenarioError(
            where, key, "expected a dotted scenario field path such as workload.rate"
        )
    return key


def _grid(value: Any) -> dict[str, list[Any]]:
    grid = expect_mapping(value, "grid")
    if not grid:
        raise ScenarioError(
            "grid",
            value,
            "empty; give at least one field and its values, e.g. workload.rate: [10, 20]",
        )
    out: dict[str, list[Any]] = {}
    for key, values in grid.items():
        path = f"grid.{_field_path(key, f'grid.{key}')}"
        if not isinstance(values, list):
            raise ScenarioError(path, values, "expected a list of values, e.g. [10, 20, 40]")
        if not values:
            raise ScenarioError(path, values, "empty; give at least one value")
        _no_duplicates(values, path)
        out[key] = _plain(values)
    return out


def _no_duplicates(values: list[Any], path: str) -> None:
    seen: set[str] = set()
    for v in values:
        text = _canonical(v)
        if text in seen:
            raise ScenarioError(path, v, "is listed twice; every value must differ")
        seen.add(text)


def _random_space(value: Any) -> tuple[dict[str, dict[str, Any]], int, int]:
    section = expect_mapping(value, "random")
    check_keys(section, RANDOM_FIELDS, "random")
    if "samples" not in section:
        raise ScenarioError("random.samples", None, "missing; how many points to draw, e.g. 20")
    samples = as_int(section["samples"], "random.samples", minimum=1, maximum=1_000_000)
    seed = as_int(section.get("seed", 0), "random.seed", minimum=0, maximum=2**63 - 1)
    fields = expect_mapping(section.get("fields"), "random.fields")
    if not fields:
        raise ScenarioError(
            "random.fields",
            section.get("fields"),
            "empty; give at least one field, e.g. workload.rate: {uniform: [5, 50]}",
        )
    space: dict[str, dict[str, Any]] = {}
    for key, spec in fields.items():
        path = f"random.fields.{_field_path(key, f'random.fields.{key}')}"
        spec = expect_mapping(spec, path)
        if len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
            raise ScenarioError(
                path,
                _plain(spec),
                f"expected one of {', '.join(DISTRIBUTIONS)}, e.g. {{uniform: [5, 50]}} or "
                "{choice: [64, 128]}",
            )
        kind, args = next(iter(spec.items()))
        where = f"{path}.{kind}"
        if not isinstance(args, list) or not args:
            raise ScenarioError(where, args, "expected a non-empty list")
        if kind == "choice":
            _no_duplicates(args, where)
        else:
            if len(args) != 2:
                raise ScenarioError(where, args, "expected [low, high]")
            if kind == "randint":
                low = as_int(args[0], f"{where}[0]")
                high = as_int(args[1], f"{where}[1]", minimum=low)
            else:
                low = _number(args[0], f"{where}[0]", positive=kind == "loguniform")
                high = _number(args[1], f"{where}[1]", positive=kind == "loguniform")
                if not high > low:
                    raise ScenarioError(where, args, "high must be greater than low")
            args = [low, high]
        space[key] = {kind: _plain(args)}
    return space, samples, seed


def _number(value: Any, path: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScenarioError(path, value, "expected a finite number")
    if positive and value <= 0:
        raise ScenarioError(path, value, "must be greater than 0 (loguniform)")
    return value


def _draw(rng: random.Random, spec: Mapping[str, Any]) -> Any:
    kind, args = next(iter(spec.items()))
    if kind == "choice":
        return rng.choice(args)
    if kind == "randint":
        return rng.randint(args[0], args[1])
    if kind == "uniform":
        value = rng.uniform(args[0], args[1])
    else:
        value = math.exp(rng.uniform(math.log(args[0]), math.log(args[1])))
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _sample(space: Mapping[str, Mapping[str, Any]], samples: int, seed: int) -> list[dict]:
    """``samples`` distinct combinations, drawn field by field (in file order) from Random(seed)."""
    size = 1
    for spec in space.values():
        kind, args = next(iter(spec.items()))
        if kind == "choice":
            size *= len(args)
        elif kind == "randint":
            size *= args[1] - args[0] + 1
        else:
            size = math.inf
    if samples > size:
        raise ScenarioError(
            "random.samples",
            samples,
            f"only {size} distinct combinations exist; draw at most {size}, or use grid",
        )
    rng = random.Random(seed)
    combos: list[dict] = []
    seen: set[str] = set()
    for _ in range(samples * 1000):
        combo = {key: _draw(rng, spec) for key, spec in space.items()}
        text = _canonical(combo)
        if text not in seen:
            seen.add(text)
            combos.append(combo)
            if len(combos) == samples:
                return combos
    raise ScenarioError(
        "random.samples",
        samples,
        f"found only {len(combos)} distinct combinations in {samples * 1000} draws; draw fewer",
    )


def _metrics(value: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_METRICS
    if not isinstance(value, list) or not value:
        raise ScenarioError(
            "metrics",
            value,
            "expected a non-empty list of summary fields, e.g. [ttft_p99_ms, responses_per_sec]",
        )
    for i, name in enumerate(value):
        check_metric(name, f"metrics[{i}]")
    _no_duplicates(value, "metrics")
    return tuple(value)


def _plot(value: Any, fields: tuple[str, ...], metrics: tuple[str, ...]) -> PlotSpec | None:
    if value is None:
        if not fields:
            return None
        return PlotSpec(x=fields[0], y=metrics[0], group=fields[1:])
    section = expect_mapping(value, "plot")
    check_keys(section, PLOT_FIELDS, "plot")
    if not fields:
        raise ScenarioError("plot", value, "a sweep without swept fields (grid or random) has no x")
    if "x" not in section:
        raise ScenarioError(
            "plot.x", None, f"missing; one of the swept fields: {', '.join(fields)}"
        )
    x = as_str(section["x"], "plot.x", choices=fields)
    y = section.get("y", metrics[0])
    check_metric(y, "plot.y")
    group = section.get("group", [f for f in fields if f != x])
    if isinstance(group, str):
        group = [group]
    if not isinstance(group, list):
        raise ScenarioError("plot.group", group, "expected a swept field or a list of them")
    others = [f for f in fields if f != x]
    for g in group:
        if g == x:
            raise ScenarioError("plot.group", g, "is the x field; group by another swept field")
        as_str(g, "plot.group", choices=others)
    _no_duplicates(group, "plot.group")
    return PlotSpec(x=x, y=y, group=tuple(group))


class _PointChecker:
    """Loads each point's scenario before anything runs; errors name the sweep field and point."""

    def __init__(self, scenario: Any, fixed: Mapping[str, Any], prefix: str):
        self.scenario = scenario
        self.fixed = fixed
        self.prefix = prefix

    def seed_of(self, combo: Mapping[str, Any]) -> int:
        """The base seed: the scenario's (after ``set``), read from the first combination."""
        return self._load({**self.fixed, **combo}, combo, None).seed

    def check(self, point: Point) -> None:
        self._load(point.overrides, point.fields, point)

    def _load(self, overrides: Mapping[str, Any], combo: Mapping[str, Any], point: Point | None):
        from servesim.scenario import load_scenario

        try:
            return load_scenario(self.scenario, override_strings(overrides))
        except ScenarioError as exc:
            raise self._explain(exc, combo, point) from None

    def _explain(
        self, exc: ScenarioError, combo: Mapping[str, Any], point: Point | None
    ) -> ScenarioError:
        def owns(key: str) -> bool:
            return (
                exc.path == key or exc.path.startswith(key + ".") or key.startswith(exc.path + ".")
            )

        swept = next((k for k in combo if owns(k)), None)
        fixed = next((k for k in self.fixed if owns(k)), None)
        if swept is not None:
            path = f"{self.prefix}{swept}"
        elif fixed is not None:
            path = f"set.{fixed}"
        else:
            path = exc.path
        detail = exc.fix if path == exc.path else f"{exc.path}: {exc.fix}"
        if point is not None:
            where = point.describe_fields() or "the base scenario"
            detail += f" (sweep point {point.id}: {where})"
        elif combo:
            detail += (
                f" (first sweep point: {' '.join(f'{k}={_cell(v)}' for k, v in combo.items())})"
            )
        return ScenarioError(path, exc.value, detail)
