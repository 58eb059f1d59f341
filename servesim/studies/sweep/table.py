"""The console table of a sweep (metrics averaged over replicas) and its plot (``plot.png``)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.studies.sweep.points import _cell, _write_atomic
from servesim.studies.sweep.spec import Sweep


def _shape(sweep: Sweep) -> str:
    return (
        f"{_count(len(sweep.points), 'point')} ({_count(sweep.combinations, 'combination')} x "
        f"{_count(sweep.replicas, 'replica')})"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


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


FIELD_UNITS = {
    "workload.rate": "requests/s",
    "workload.requests": "requests",
    "workload.duration": "s",
    "cluster.instances": "instances",
    "tp": "GPUs per instance",
    "engine.max_num_seqs": "requests",
    "engine.max_num_batched_tokens": "tokens per step",
    "engine.block_size": "tokens per block",
    "engine.kv_blocks": "blocks",
    "engine.gpu_memory_utilization": "fraction",
    "engine.long_prefill_token_threshold": "tokens",
    "cluster.snapshot_interval": "s",
    "cluster.routing_latency": "s",
    "cluster.admission_latency": "s",
}
"""Units of the scenario fields a sweep most often varies (others are shown by name alone)."""
_SUFFIX_UNITS = (
    ("_ms", "ms"),
    ("_s", "s"),
    ("_per_sec", "per s"),
    ("_rps", "requests/s"),
    ("_throughput", "per s"),
    ("_fraction", "fraction"),
    ("_rate", "fraction"),
    ("_attainment", "fraction"),
)


def axis_label(name: str) -> str:
    """A sweep axis label: the field or metric name with its unit, e.g. ``ttft_p99 (ms)``,
    ``workload.rate (requests/s)``."""
    if name in FIELD_UNITS:
        return f"{name} ({FIELD_UNITS[name]})"
    leaf = name.rsplit(".", 1)[-1]
    for suffix, unit in _SUFFIX_UNITS:
        if leaf.endswith(suffix):
            return f"{name[: len(name) - len(suffix)] if unit in ('ms', 's') else name} ({unit})"
    return name


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
    ax.set_xlabel(axis_label(spec.x))
    ax.set_ylabel(axis_label(spec.y))
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
