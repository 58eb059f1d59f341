"""Run one scenario over a grid or a random sample of field values: ``servesim sweep SWEEP.yaml``.

A sweep file names a base scenario, fixed overrides (``set``), the swept fields (``grid``: every
combination; or ``random``: a seeded sample), the seeds of each point (``replicas``), the summary
metrics to tabulate and an optional plot::

    scenario: cluster-weighted.yaml           # relative to the sweep file; omitted: the default
    set: {workload.requests: 500}
    grid: {workload.rate: [10, 20, 40], policies.routing: [round-robin, least-loaded]}
    replicas: 3                               # seeds: the scenario's seed, seed + 1, seed + 2
    metrics: [ttft_p99_ms, e2e_p50_ms, responses_per_sec]
    plot: {x: workload.rate, y: ttft_p99_ms, group: policies.routing}

:func:`load_sweep` validates the file and every point's scenario before anything runs (a bad value
is a :class:`~servesim.simcore.errors.ScenarioError` naming the sweep field and the point).
:func:`run_sweep` runs the points that have no result yet on a process pool (default), serially,
or as Ray tasks. Every backend calls the same pure function, :func:`run_point`, so a point's
metrics depend only on the base scenario, its overrides and its seed, never on the backend.

The results directory holds ``points.csv`` (one row per point, rewritten atomically as points
finish), ``points.parquet`` (with pyarrow), ``points/<id>.json`` (each finished point's full
summary: the resume marker), ``sweep.yaml`` (the resolved sweep) and ``plot.png`` (with
matplotlib). A point id is a short hash of the base scenario's content, the point's overrides and
its seed, so an unchanged point keeps its id, and its result, across edits of the sweep.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import hashlib
import io
import itertools
import json
import math
import numbers
import os
import random
import re
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from servesim.simcore.config import as_int, as_str, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic

__all__ = [
    "BACKENDS",
    "DEFAULT_METRICS",
    "PlotSpec",
    "Point",
    "Sweep",
    "SweepRun",
    "add_sweep_parser",
    "check_metric",
    "cmd_sweep",
    "dry_run",
    "format_table",
    "load_sweep",
    "metric_value",
    "plot_sweep",
    "run_point",
    "run_sweep",
]

SWEEP_FIELDS = ("name", "scenario", "set", "grid", "random", "replicas", "metrics", "plot")
RANDOM_FIELDS = ("samples", "seed", "fields")
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")
PLOT_FIELDS = ("x", "y", "group")
BACKENDS = ("process", "serial", "ray")
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
ID_LENGTH = 10
SIGNIFICANT_DIGITS = 6  # random uniform/loguniform samples are rounded to this many
RAY_HINT = "pip install 'servesim[ray]'"
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


def override_strings(overrides: Mapping[str, Any]) -> list[str]:
    """``{"workload.rate": 10}`` as the ``FIELD=VALUE`` strings load_scenario takes."""
    return [f"{key}={_yaml_value(value)}" for key, value in overrides.items()]


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(
        value, default_flow_style=True, sort_keys=False, width=2**31, allow_unicode=True
    )
    return text.removesuffix("\n...\n").strip()


def _point_id(
    base_content: Any, overrides: Mapping[str, Any], file_dirs: Sequence[Path] = ()
) -> str:
    """A point's id: a hash of the base scenario, its overrides and the content of every file
    they name (a trace, a model config, a coefficients file); ids of scenarios that name no
    file are as before."""
    identity: dict[str, Any] = {"scenario": base_content, "overrides": overrides}
    files = _referenced_files({"scenario": base_content, "overrides": overrides}, file_dirs)
    if files:
        identity["files"] = files
    text = _canonical(identity)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:ID_LENGTH]


def _referenced_files(value: Any, dirs: Sequence[Path]) -> dict[str, str]:
    """{text: sha256 of the file's bytes} for every string in ``value`` that names an existing
    file (absolute, or relative to one of ``dirs``)."""
    found: dict[str, str] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, str) and item not in found and 0 < len(item) < 4096 and "\n" not in item:
            file = _existing_file(item, dirs)
            if file is not None:
                found[item] = _file_digest(file)
    return found


def _existing_file(text: str, dirs: Sequence[Path]) -> Path | None:
    try:
        candidate = Path(text).expanduser()
        for file in [candidate] if candidate.is_absolute() else [d / candidate for d in dirs]:
            if file.is_file():
                return file
    except (OSError, ValueError):
        return None
    return None


def _file_digest(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), default=str)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------- metrics


_PROBE: dict[str, Any] = {}


def _probe_summary() -> dict[str, Any]:
    """A summary with every optional section (SLO goodput, decisions, sessions, disaggregation),
    from a 20-request run of the default scenario: the summary fields a metric may name."""
    if not _PROBE:
        from servesim.run import simulate
        from servesim.scenario import load_scenario

        scenario = load_scenario(
            None,
            [
                "workload.requests=20",
                "workload.sessions={rounds: 2, think_time: 1s}",
                "slo={standard: {ttft: 1s}}",
                "output.trace=decisions",
                "cluster.pools={prefill: {instances: 1}, decode: {instances: 1}}",
                "policies.disaggregation=always",
            ],
        )
        _PROBE.update(simulate(scenario, check=False).summary)
    return _PROBE


def check_metric(name: Any, path: str) -> str:
    """Check that ``name`` is a numeric summary field, or a dotted path into a summary section."""
    if not isinstance(name, str) or not name or any(not p for p in name.split(".")):
        raise ScenarioError(path, name, "expected a summary field name such as ttft_p99_ms")
    probe = _probe_summary()
    parts = name.split(".")
    if parts[0] not in probe:
        import difflib

        close = difflib.get_close_matches(parts[0], list(probe), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ScenarioError(
            path,
            name,
            f"not a summary.json field{hint}; e.g. ttft_p99_ms, e2e_p50_ms, responses_per_sec, "
            "goodput.standard.slo_attainment (docs/reference/outputs.md)",
        )
    node: Any = probe
    for depth, part in enumerate(parts):
        if isinstance(node, Mapping):
            if part not in node:
                return name  # a section keyed by data (class, tenant, pool): checked per run
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit():
                raise ScenarioError(
                    path, name, f"{'.'.join(parts[:depth])} is a list; index it, e.g. .0"
                )
            if int(part) >= len(node):
                return name
            node = node[int(part)]
        else:
            raise ScenarioError(
                path, name, f"{'.'.join(parts[:depth])} is a number; it has no field {part!r}"
            )
    if isinstance(node, Mapping):
        example = next(iter(node), "count")
        raise ScenarioError(
            path, name, f"is a section, not a number; name one of its fields, e.g. {name}.{example}"
        )
    if isinstance(node, list):
        raise ScenarioError(path, name, f"is a list, not a number; index it, e.g. {name}.0")
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ScenarioError(path, name, "is not a number")
    return name


def metric_value(summary: Mapping[str, Any], name: str) -> float | int | None:
    """The value of a (dotted) summary field, or None when this run's summary has no such field."""
    node: Any = summary
    for part in name.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if isinstance(node, numbers.Integral):  # bool included: 0 or 1
        return int(node)
    return float(node) if isinstance(node, numbers.Real) else None


# ---------------------------------------------------------------------- running one point


def run_point(
    base_source: str | Path | Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    metrics: Sequence[str],
) -> dict[str, Any]:
    """Simulate one point: the base scenario with ``overrides`` (seed included) applied in order.

    Pure: the result depends only on the arguments, whatever process or machine runs it.
    Returns ``{"metrics": {name: value}, "summary": the full summary, "wall_s": seconds}``.
    Raises what the run raises (AuditError for a broken invariant), and KeyboardInterrupt if
    the run was interrupted (its partial summary is not a result).
    """
    from servesim.run import simulate
    from servesim.scenario import load_scenario

    started = time.perf_counter()
    scenario = load_scenario(base_source, override_strings(overrides))
    summary = simulate(scenario).summary
    if summary.get("interrupted"):
        raise KeyboardInterrupt
    return {
        "metrics": {m: metric_value(summary, m) for m in metrics},
        "summary": summary,
        "wall_s": time.perf_counter() - started,
    }


def _attempt(
    base_source: Any, overrides: Mapping[str, Any], metrics: Sequence[str], log_level: str | None
) -> dict[str, Any]:
    """run_point, with an exception turned into ``{"error": one line, "traceback": text}``.

    ``log_level`` configures the logs of a Ray worker (None: leave this process's logging be).
    """
    if log_level is not None:
        from servesim.simcore.log import configure

        configure(log_level)
    try:
        return run_point(base_source, overrides, metrics)
    except Exception as exc:
        message = " ".join(f"{exc.__class__.__name__}: {exc}".split())
        return {"error": message, "traceback": traceback.format_exc()}


def _init_worker(log_level: str) -> None:
    """Pool workers leave Ctrl-C to the driver, which lets running points finish, and exit on
    their own if the driver dies (killed with SIGKILL, nothing left to collect their work)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="servesim-orphan-watch", daemon=True).start()
    from servesim.simcore.log import configure

    configure(log_level)


# ---------------------------------------------------------------------- backends


_ORPHAN_CHECK_S = 0.5
"""How often a pool worker checks that the sweep driving it is still alive."""


class _Lost(Exception):
    """The worker running a point died (the process pool broke)."""


class _SerialBackend:
    """Runs a point when it is submitted, in this process."""

    limit = 1

    def __init__(self, job: Callable[[Point], tuple]):
        self.job = job
        self.done: dict[int, dict] = {}

    def submit(self, point: Point) -> int:
        self.done[point.index] = _attempt(*self.job(point), None)
        return point.index

    def wait(self, handles: list) -> list:
        return handles

    def outcome(self, handle: int) -> dict:
        return self.done.pop(handle)

    def restart(self) -> None:
        self.done.clear()

    def abandon(self, handles: Iterable) -> None:
        self.done.clear()

    def close(self) -> None:
        self.done.clear()


class _PoolBackend:
    """A ProcessPoolExecutor; a broken pool (a worker died) is replaced by a new one."""

    def __init__(self, job: Callable[[Point], tuple], log_level: str, workers: int):
        self.job = job
        self.log_level = log_level
        self.limit = workers
        self.abandoned = False
        self.executor = self._new()

    def _new(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=self.limit, initializer=_init_worker, initargs=(self.log_level,)
        )

    def submit(self, point: Point) -> concurrent.futures.Future:
        return self.executor.submit(_attempt, *self.job(point), None)  # _init_worker configured

    def wait(self, handles: list) -> list:
        done, _ = concurrent.futures.wait(handles, return_when=concurrent.futures.FIRST_COMPLETED)
        return list(done)

    def outcome(self, handle: concurrent.futures.Future) -> dict:
        try:
            return handle.result()
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise _Lost(str(exc)) from None

    def restart(self) -> None:
        self.executor.shutdown(wait=True)
        self.executor = self._new()

    def abandon(self, handles: Iterable) -> None:
        """Stop now: cancel what has not started and terminate the workers."""
        workers = dict(getattr(self.executor, "_processes", None) or {})
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in workers.values():
            with contextlib.suppress(Exception):
                process.terminate()
        self.abandoned = True

    def close(self) -> None:
        self.executor.shutdown(wait=not self.abandoned, cancel_futures=True)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ScenarioError(
            "--backend", "ray", f"Ray is not installed: {RAY_HINT} (or use --backend process)"
        ) from None
    return ray


class _RayBackend:
    """Ray tasks (one CPU each) calling the same function as the other backends."""

    def __init__(
        self,
        job: Callable[[Point], tuple],
        log_level: str,
        workers: int | None,
        address: str | None,
    ):
        ray = _import_ray()
        self.ray = ray
        self.job = job
        self.log_level = log_level
        self.started = not ray.is_initialized()
        if self.started:
            import logging

            options: dict[str, Any] = {"logging_level": logging.WARNING}
            if address is None:
                options["include_dashboard"] = False
            try:
                ray.init(address=address, **options)
            except Exception as exc:
                raise ScenarioError(
                    "--ray-address" if address else "--backend",
                    address or "ray",
                    f"cannot start or reach a Ray cluster ({exc.__class__.__name__}: {exc})",
                ) from None
        self.task = ray.remote(num_cpus=1)(_attempt)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.limit = workers or max(1, cpus)

    def submit(self, point: Point) -> Any:
        return self.task.remote(*self.job(point), self.log_level)

    def wait(self, handles: list) -> list:
        done, _ = self.ray.wait(handles, num_returns=1)
        return done

    def outcome(self, handle: Any) -> dict:
        try:
            return self.ray.get(handle)
        except Exception as exc:  # the task never returned (a worker or node died, cancelled)
            message = " ".join(f"{exc.__class__.__name__}: {exc}".split())
            return {"error": message, "traceback": message}

    def restart(self) -> None:
        return None

    def abandon(self, handles: Iterable) -> None:
        for ref in handles:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


# ---------------------------------------------------------------------- running a sweep


@attrs.define
class SweepRun:
    """What :func:`run_sweep` did: the table rows, counts, the files written and notes."""

    out: Path
    rows: list[dict[str, Any]]
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    interrupted: bool = False
    wall_s: float = 0.0
    files: list[Path] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    *,
    backend: str = "process",
    workers: int | None = None,
    force: bool = False,
    ray_address: str | None = None,
    log_level: str = "warning",
    echo: Callable[[str], Any] | None = print,
) -> SweepRun:
    """Run every point of ``sweep`` that has no result in ``out`` yet; write the table and plot.

    ``backend`` is ``process`` (a pool of ``workers`` processes, default one per CPU),
    ``serial`` (one point at a time in this process) or ``ray`` (Ray tasks; ``ray_address``
    names a running cluster, default: a local one). ``force`` discards earlier results of the
    sweep's points. Ctrl-C stops scheduling: running points finish (a second Ctrl-C abandons
    them), finished points are kept, and the result says ``interrupted``.
    """
    say = echo or (lambda _text: None)
    if backend not in BACKENDS:
        raise ScenarioError("--backend", backend, f"must be one of: {', '.join(BACKENDS)}")
    if workers is not None and workers < 1:
        raise ScenarioError("--workers", workers, "must be at least 1")
    if backend == "ray":
        _import_ray()  # before anything is written
    started = time.perf_counter()
    out = _results_dir(out)
    (out / "points").mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "sweep.yaml", sweep.to_yaml())

    state = _State(sweep, out)
    skipped = state.resume(force)
    todo = [p for p in sweep.points if p.id not in state.records]
    run = SweepRun(out=out, rows=[], skipped=skipped)
    base = sweep.scenario

    def job(point: Point) -> tuple:
        return (base, dict(point.overrides), list(sweep.metrics))

    engine: Any = None
    finish_interrupted = False
    if todo:
        if backend == "serial":
            engine = _SerialBackend(job)
        elif backend == "ray":
            engine = _RayBackend(job, log_level, workers, ray_address)
        else:
            engine = _PoolBackend(job, log_level, min(workers or os.cpu_count() or 1, len(todo)))
    where = {
        "serial": "serially",
        "process": f"on {getattr(engine, 'limit', 0)} worker process(es)",
        "ray": f"as Ray tasks ({getattr(engine, 'limit', 0)} at a time)",
    }[backend]
    say(
        f"sweep {sweep.name}: {_shape(sweep)}; {skipped} already finished (skipped), "
        f"{len(todo)} to run" + (f" {where}" if todo else "") + f" -> {out}"
    )
    state.write_table(final=True)
    try:
        if engine is not None:
            run.interrupted = _drive(engine, todo, state, say)
    finally:
        if engine is not None:
            try:
                engine.close()
            except KeyboardInterrupt:
                engine.abandon([])
                run.interrupted = True
        try:
            run.files = state.finish()
        except KeyboardInterrupt:
            finish_interrupted = run.interrupted = True
            run.files = [out / "points.csv", out / "sweep.yaml"]
            state.notes.append(
                "interrupted while writing the final outputs; run the command again to write them"
            )
    run.rows = state.rows()
    if len(run.rows) == len(sweep.points) and not finish_interrupted:
        run.interrupted = False  # Ctrl-C came after the last point had finished
    run.ran = state.ran
    run.failed = sum(1 for r in run.rows if r["status"] == "failed")
    run.wall_s = time.perf_counter() - started
    run.notes = state.notes
    say("")
    say(format_table(sweep, run.rows))
    for row in run.rows:
        if row["status"] == "failed":
            say(f"failed {row['point']}: {row['error']}")
    for note in run.notes:
        say(note)
    written = ", ".join(p.name for p in run.files)
    ok = sum(1 for r in run.rows if r["status"] == "ok")
    say(
        f"{ok} of {len(sweep.points)} points finished ({run.ran} run now in "
        f"{run.wall_s:.1f} s wall, {skipped} earlier), {run.failed} failed; "
        f"wrote {written} in {out}"
    )
    if run.interrupted:
        say("interrupted: the finished points are kept; run the same command again to resume")
    return run


def _drive(engine: Any, todo: list[Point], state: _State, say: Callable[[str], Any]) -> bool:
    """Submit points (at most ``engine.limit`` at once), record each outcome; True if interrupted.

    A point whose worker died is run again, alone; if its worker dies again it is failed.
    """
    queue: deque[Point] = deque(todo)
    retry: deque[Point] = deque()
    suspects: set[str] = set()
    inflight: dict[Any, Point] = {}
    broken = stopping = False
    total = len(todo)
    while True:
        try:
            if not stopping:
                if broken and not inflight:
                    engine.restart()
                    broken = False
                if not broken:
                    if retry:
                        if not inflight:
                            point = retry.popleft()
                            inflight[engine.submit(point)] = point
                    else:
                        while queue and len(inflight) < engine.limit:
                            point = queue.popleft()
                            inflight[engine.submit(point)] = point
            if not inflight:
                return stopping
            for handle in engine.wait(list(inflight)):
                point = inflight.pop(handle)
                try:
                    result = engine.outcome(handle)
                except _Lost as exc:
                    broken = True
                    if point.id not in suspects:
                        suspects.add(point.id)
                        retry.append(point)
                        continue
                    result = {
                        "error": f"the worker process died while running this point ({exc}); "
                        "run it with --backend serial to see why",
                        "traceback": str(exc),
                    }
                say(state.record(point, result, total))
        except KeyboardInterrupt:
            if stopping:
                say(f"abandoning {len(inflight)} running point(s)")
                engine.abandon(list(inflight))
                return True
            stopping = True
            queue.clear()
            retry.clear()
            if inflight:
                say(
                    f"stopping: waiting for {len(inflight)} running point(s) to finish "
                    "(Ctrl-C again to abandon them)"
                )


class _State:
    """The sweep's results: earlier ones read back, new ones recorded and written as they come."""

    def __init__(self, sweep: Sweep, out: Path):
        self.sweep = sweep
        self.out = out
        self.records: dict[str, dict[str, Any]] = {}
        self.ran = 0
        self.notes: list[str] = []
        self._write_cost = 0.0
        self._last_write = 0.0

    def _json(self, point: Point) -> Path:
        return self.out / "points" / f"{point.id}.json"

    def _error_file(self, point: Point) -> Path:
        return self.out / "points" / f"{point.id}.error.txt"

    def resume(self, force: bool) -> int:
        """Read the finished points back (or, with ``force``, delete them); how many were read."""
        for point in self.sweep.points:
            path = self._json(point)
            if force:
                path.unlink(missing_ok=True)
                self._error_file(point).unlink(missing_ok=True)
                continue
            if not path.exists():
                continue
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                summary = saved["summary"]
                wall = float(saved.get("wall_s", 0.0))
            except (OSError, ValueError, KeyError, TypeError):
                self.notes.append(f"{path} is unreadable; point {point.id} was run again")
                continue
            self.records[point.id] = {
                "metrics": {m: metric_value(summary, m) for m in self.sweep.metrics},
                "wall_s": wall,
                "status": "ok",
                "error": "",
            }
        return len(self.records)

    def record(self, point: Point, result: Mapping[str, Any], total: int) -> str:
        """Store one outcome (points/<id>.json or .error.txt, the table); the progress line."""
        self.ran += 1
        if "error" in result:
            _write_atomic(self._error_file(point), str(result.get("traceback") or result["error"]))
            self.records[point.id] = {
                "metrics": {},
                "wall_s": None,
                "status": "failed",
                "error": result["error"],
            }
            shown = f"FAILED: {result['error']}"
        else:
            payload = {
                "point": point.id,
                "fields": _plain(point.fields),
                "seed": point.seed,
                "overrides": _plain(point.overrides),
                "scenario": self.sweep.scenario
                if not isinstance(self.sweep.scenario, Mapping)
                else "(inline)",
                "wall_s": result["wall_s"],
                "summary": result["summary"],
            }
            _write_atomic(self._json(point), json.dumps(payload, indent=1, allow_nan=False) + "\n")
            self._error_file(point).unlink(missing_ok=True)
            metrics = {m: metric_value(result["summary"], m) for m in self.sweep.metrics}
            self.records[point.id] = {
                "metrics": metrics,
                "wall_s": result["wall_s"],
                "status": "ok",
                "error": "",
            }
            shown = ", ".join(f"{m} {_number_text(metrics[m])}" for m in self.sweep.metrics[:3])
            shown += f" ({result['wall_s']:.2f} s)"
        self.write_table()
        width = len(str(total))
        return f"[{self.ran:>{width}}/{total}] {point.id} {point.describe()}: {shown}"

    def rows(self) -> list[dict[str, Any]]:
        """The table: one row per point with a result, in the sweep's order."""
        rows = []
        for point in self.sweep.points:
            rec = self.records.get(point.id)
            if rec is None:
                continue
            row: dict[str, Any] = {"point": point.id, **point.fields, "seed": point.seed}
            for m in self.sweep.metrics:
                row[m] = rec["metrics"].get(m)
            row.update(wall_s=rec["wall_s"], status=rec["status"], error=rec["error"])
            rows.append(row)
        return rows

    def columns(self) -> list[str]:
        return [
            "point",
            *self.sweep.fields,
            "seed",
            *self.sweep.metrics,
            "wall_s",
            "status",
            "error",
        ]

    def write_table(self, final: bool = False) -> None:
        """Rewrite points.csv atomically; skipped when the last write was recent and slow."""
        now = time.perf_counter()
        if not final and now - self._last_write < 10 * self._write_cost:
            return
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        columns = self.columns()
        writer.writerow(columns)
        for row in self.rows():
            writer.writerow([_cell(row[c]) for c in columns])
        _write_atomic(self.out / "points.csv", buffer.getvalue())
        self._last_write = time.perf_counter()
        self._write_cost = self._last_write - now

    def finish(self) -> list[Path]:
        """The final points.csv, points.parquet (with pyarrow) and plot.png (with matplotlib)."""
        self.write_table(final=True)
        files = [self.out / "points.csv"]
        rows = self.rows()
        parquet = _write_parquet(self.out / "points.parquet", self.columns(), rows)
        if parquet is None:
            self.notes.append("points.parquet not written: pyarrow is not installed")
        else:
            files.append(parquet)
        missing = [
            f"{m} ({n} of {len(rows)} points)"
            for m in self.sweep.metrics
            if (n := sum(1 for r in rows if r["status"] == "ok" and r[m] is None))
        ]
        if missing:
            self.notes.append(
                "no value in some points' summaries (blank cells): " + ", ".join(missing)
            )
        if self.sweep.plot is not None:
            plotted, note = plot_sweep(self.sweep, rows, self.out / "plot.png")
            if plotted is not None:
                files.append(plotted)
            if note:
                self.notes.append(note)
        files.append(self.out / "sweep.yaml")
        return files


def _results_dir(out: str | Path) -> Path:
    path = Path(out)
    if path.exists() and (
        not path.is_dir() or (any(path.iterdir()) and not (path / "sweep.yaml").exists())
    ):
        raise ScenarioError(
            "--out",
            str(out),
            "exists and is not a sweep results directory, so nothing is written there; "
            "choose another --out",
        )
    return path


def _write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary sibling and a rename: a reader never sees half a file."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise ScenarioError(
            "--out", str(path), f"cannot write it ({exc.strerror or exc}); choose another --out"
        ) from None


def _write_parquet(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> Path | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    arrays = {}
    for c in columns:
        values = [_plain(r[c]) for r in rows]
        try:
            arrays[c] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            arrays[c] = pa.array([None if v is None else _cell(v) for v in values], pa.string())
    buffer = io.BytesIO()
    pq.write_table(pa.table(arrays), buffer)
    _write_atomic(path, buffer.getvalue())
    return path


def _shape(sweep: Sweep) -> str:
    return (
        f"{_count(len(sweep.points), 'point')} ({_count(sweep.combinations, 'combination')} x "
        f"{_count(sweep.replicas, 'replica')})"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _cell(value: Any) -> str:
    """A table cell: exact numbers (shortest round-trip), JSON for lists and mappings."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, (list, tuple, Mapping)):
        return json.dumps(_plain(value), separators=(",", ":"))
    return str(value)


def _number_text(value: Any) -> str:
    """A metric for the console: about four significant digits, no exponent below a million."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value:.3e}"
    if magnitude >= 100:
        return f"{value:.1f}" if magnitude < 1000 else f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.2f}" if magnitude < 10 else f"{value:.1f}"
    return f"{value:.3f}" if magnitude >= 0.001 or value == 0 else f"{value:.2e}"


def format_table(sweep: Sweep, rows: list[dict[str, Any]]) -> str:
    """The console table: one line per field combination, metrics averaged over its replicas."""
    by_combo: dict[int, list[dict[str, Any]]] = {}
    ids = {p.id: p for p in sweep.points}
    for row in rows:
        by_combo.setdefault(ids[row["point"]].combination, []).append(row)
    header = [*sweep.fields, "ok", *sweep.metrics]
    lines = [header]
    for _, group in sorted(by_combo.items()):
        first = ids[group[0]["point"]]
        ok = [r for r in group if r["status"] == "ok"]
        cells = [_cell(first.fields[f]) for f in sweep.fields]
        cells.append(f"{len(ok)}/{sweep.replicas}")
        for m in sweep.metrics:
            values = [r[m] for r in ok if r[m] is not None]
            mean = sum(values) / len(values) if values else None
            if mean is not None and all(isinstance(v, int) for v in values) and mean.is_integer():
                mean = int(mean)
            cells.append(_number_text(mean))
        lines.append(cells)
    if len(lines) == 1:
        return "no finished points yet"
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = [i >= len(sweep.fields) for i in range(len(header))]
    text = []
    for line in lines:
        text.append(
            "  ".join(
                cell.rjust(w) if right else cell.ljust(w)
                for cell, w, right in zip(line, widths, numeric)
            ).rstrip()
        )
    if sweep.replicas > 1:
        text.append("(metrics: mean over the finished replicas of each combination)")
    return "\n".join(text)


# ---------------------------------------------------------------------- plot


def plot_sweep(
    sweep: Sweep, rows: list[dict[str, Any]], path: str | Path
) -> tuple[Path | None, str]:
    """Draw ``plot.y`` against ``plot.x``, one line per group: the mean over the runs at each x,
    with a min-max band. Returns (the file, or None, and a note saying why there is no plot)."""
    spec = sweep.plot
    if spec is None:
        return None, ""
    ok = [r for r in rows if r["status"] == "ok" and r[spec.y] is not None]
    if not ok:
        return None, "plot.png not drawn: no finished point has a value of " + spec.y
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return (
            None,
            "plot.png not drawn: matplotlib is not installed (pip install 'servesim[plot]')",
        )

    xs = list(dict.fromkeys(_hashable(r[spec.x]) for r in ok))
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    position = {x: float(x) for x in xs} if numeric else {x: float(i) for i, x in enumerate(xs)}
    series: dict[tuple, dict[Any, list[float]]] = {}
    for r in ok:
        key = tuple(_hashable(r[g]) for g in spec.group)
        series.setdefault(key, {}).setdefault(_hashable(r[spec.x]), []).append(float(r[spec.y]))

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (key, points) in enumerate(series.items()):
        order = sorted(points, key=lambda x: position[x])
        at = [position[x] for x in order]
        means = [sum(points[x]) / len(points[x]) for x in order]
        label = ", ".join(f"{g}={_cell(v)}" for g, v in zip(spec.group, key)) or spec.y
        color = f"C{i % 10}"
        ax.plot(at, means, "o-", color=color, label=label)
        ax.fill_between(
            at,
            [min(points[x]) for x in order],
            [max(points[x]) for x in order],
            color=color,
            alpha=0.2,
        )
    if not numeric:
        ax.set_xticks([position[x] for x in xs], [_cell(x) for x in xs])
    ax.set_xlabel(spec.x)
    ax.set_ylabel(spec.y)
    pooled = len(spec.group) < len(sweep.fields) - 1
    if pooled:
        runs = "mean over the runs at each x (other fields pooled); band: min to max"
    elif sweep.replicas > 1:
        runs = f"mean over {sweep.replicas} seeds per point; band: min to max"
    else:
        runs = "one seed per point"
    ax.set_title(f"{sweep.name}: {spec.y} against {spec.x}\n{runs}", fontsize=10)
    ax.grid(True, alpha=0.3)
    if spec.group or len(series) > 1:
        ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    target = Path(path)
    _write_atomic(target, buffer.getvalue())
    return target, ""


def _hashable(value: Any) -> Any:
    return _cell(value) if isinstance(value, (list, tuple, Mapping)) else value


# ---------------------------------------------------------------------- command line


def add_sweep_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sweep`` command to the CLI's subparsers; dispatch it to :func:`cmd_sweep`."""
    p = subparsers.add_parser(
        "sweep",
        help="run a scenario over a grid or random sample of field values, with seed replicas",
        description=(
            "Run a scenario over a grid (every combination) or a random sample of field values, "
            "each point with `replicas` seeds, on a process pool (default), serially or on Ray. "
            "Every point is validated before any runs. Results go to the --out directory: "
            "points.csv (one row per point), points.parquet (with pyarrow), points/<id>.json "
            "(each point's full summary), sweep.yaml and plot.png (with matplotlib). Points "
            "that already have a result there are not run again (--force reruns them). Exit 0 "
            "when every point finished, 1 when some failed, 2 for an invalid sweep, 130 on "
            "Ctrl-C."
        ),
    )
    p.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file (docs/howto/sweep.md)")
    p.add_argument("--out", metavar="DIR", help="results directory (default: results/<sweep name>)")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="process",
        help="process: a local process pool (default); serial: one point at a time in this "
        f"process; ray: Ray tasks ({RAY_HINT})",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="points run at once (default: one per CPU; with ray: the cluster's CPUs)",
    )
    p.add_argument(
        "--force", action="store_true", help="discard the points' earlier results and rerun them"
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to connect to, e.g. ray://head:10001 or auto (default: start a local "
        "one); only with --backend ray",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the sweep and list its points and which would run; run nothing",
    )
    p.set_defaults(handler=cmd_sweep)
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run ``servesim sweep``: 0 all points finished, 1 some failed, 130 interrupted."""
    if args.ray_address is not None and args.backend != "ray":
        raise ScenarioError("--ray-address", args.ray_address, "only used with --backend ray")
    if args.workers is not None and args.workers < 1:
        raise ScenarioError("--workers", args.workers, "must be at least 1")
    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("results") / sweep.name
    if args.dry_run:
        print(dry_run(sweep, out, force=args.force))
        return 0
    with _terminate_as_interrupt():
        run = run_sweep(
            sweep,
            out,
            backend=args.backend,
            workers=args.workers,
            force=args.force,
            ray_address=args.ray_address,
            log_level=getattr(args, "log_level", "warning"),
        )
    if run.interrupted:
        return 130
    return 1 if run.failed else 0


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterable[None]:
    """While a sweep runs from the command line, SIGTERM (``kill``) stops it like Ctrl-C: the
    finished points are kept and the worker processes are stopped, not left running."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def dry_run(sweep: Sweep, out: str | Path, *, force: bool = False) -> str:
    """What ``--dry-run`` prints: every point, and whether it has a result in ``out``."""
    done = {
        p.id for p in sweep.points if not force and (Path(out) / "points" / f"{p.id}.json").exists()
    }
    lines = [
        f"sweep {sweep.name}: {_shape(sweep)}, all valid; {len(done)} finished in {out}, "
        f"{len(sweep.points) - len(done)} to run"
    ]
    for p in sweep.points:
        lines.append(f"  {p.id} {p.describe()}{'  (finished)' if p.id in done else ''}")
    return "\n".join(lines)
