"""Latency figures: :func:`latency_cdfs` (TTFT, ITL and E2E per SLO class) and
:func:`latency_over_time` (each request's latency against its arrival time).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servesim.analysis.plots.data import ResultsData, as_results_data
from servesim.analysis.plots.figure import (
    _cdf,
    _class_colors,
    _empty,
    _figure,
    _finish,
    _quantile_marks,
    _wide,
)
from servesim.simcore.errors import ScenarioError


def latency_cdfs(data: ResultsData, *, ax: Any = None) -> Any:
    """TTFT, ITL and E2E CDFs of completed requests, one line per SLO class (plus all classes).

    The ITL panel's solid black line is every inter-token gap of the run (as the summary's ITL
    percentiles); gaps cannot be attributed to a class, so with several classes each class is
    drawn as its per-request mean ITL (TPOT), dashed. Dotted vertical lines are SLO targets.
    """
    fig, axes = _figure(1, 3, (15, 4.8), ax)
    done = data.completed
    classes = sorted({str(c) for c in data.column("slo_class")[done]})
    colors = _class_colors(data.slo_classes)
    cls = data.column("slo_class")
    targets = data.slo_targets_ms()
    itl = data.itl()
    tpot = data.column("tpot_ms")
    panels = (
        ("ttft", "Time to first token", "TTFT (ms)", data.column("ttft_ms")),
        ("itl", "Inter-token latency", itl.label, tpot),
        ("e2e", "End-to-end latency", "E2E latency (ms)", data.column("e2e_ms")),
    )
    for ax, (key, title, xlabel, values) in zip(axes[0], panels):
        drawn: list[np.ndarray] = []
        if key == "itl" and itl.exact and len(itl.values_ms):
            x, y = _cdf(itl.values_ms, itl.weights)
            ax.plot(
                x,
                y,
                color="black",
                lw=1.8,
                drawstyle="steps-post",
                label=f"all classes, every gap (n={int(itl.weights.sum()):,})",
            )
            drawn.append(itl.values_ms)
        per_class = key != "itl" or not itl.exact or len(classes) > 1
        if per_class:
            if key == "itl":
                keep = done & (data.column("output_tokens") > 1) & np.isfinite(values)
            else:
                keep = done & np.isfinite(values)
            if key != "itl" and len(classes) > 1 and keep.any():
                x, y = _cdf(values[keep])
                ax.plot(
                    x,
                    y,
                    color="black",
                    lw=1.8,
                    drawstyle="steps-post",
                    label=f"all classes (n={int(keep.sum()):,})",
                )
            for c in classes:
                mine = keep & (cls == c)
                if not mine.any():
                    continue
                x, y = _cdf(values[mine])
                label = f"{c} (n={int(mine.sum()):,})"
                if key == "itl" and itl.exact:
                    label = f"{c}: per-request mean, TPOT (n={int(mine.sum()):,})"
                ax.plot(
                    x,
                    y,
                    color=colors[c],
                    lw=1.3,
                    drawstyle="steps-post",
                    ls="--" if key == "itl" and itl.exact else "-",
                    label=label,
                )
                drawn.append(values[mine])
        if drawn:
            every = np.concatenate(drawn)
            every = every[np.isfinite(every)]
            log_x = _wide(every)
            if log_x:
                ax.set_xscale("log")
                low = float(every[every > 0].min()) / 1.2
                high = float(every.max()) * 1.2
            else:
                span = float(every.max() - every.min()) or 1.0
                low, high = float(every.min()) - 0.03 * span, float(every.max()) + 0.03 * span
            ax.set_xlim(low, high)
            for c in classes:
                target = targets.get(c, {}).get(key)
                if not target:
                    continue
                label = f"{c} {key.upper()} target {target:g} ms"
                if low <= target <= high:
                    ax.axvline(target, color=colors[c], ls=":", lw=1.2, label=label)
                else:
                    ax.plot([], [], color=colors[c], ls=":", label=label + " (off scale)")
            ax.legend(fontsize=7, loc="lower right")
        else:
            _empty(ax, "no completed requests")
        _quantile_marks(ax)
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction ≤ x" if key == "itl" else "fraction of completed requests ≤ x")
        ax.grid(True, alpha=0.3)
    note = ""
    if not itl.exact:
        note = (
            "ITL: the per-gap values could not be rebuilt (no steps.npz, or α2 not recoverable "
            "from summary.json), so the per-request mean inter-token latency (TPOT) is shown."
        )
    caption = (
        "Cumulative distributions of time to first token, inter-token latency and end-to-end "
        "latency of completed requests, per SLO class. Read a percentile off the dotted "
        "horizontal lines (p50, p90, p99): a line further right is slower. "
        + (
            "The black ITL line is every inter-token gap of the run, α2 included "
            f"(α2 = {itl.alpha2_us:g} µs), as summary.json's ITL percentiles; dashed class lines "
            "are per-request mean ITLs (TPOT), since gaps are not attributed to classes. "
            if itl.exact and itl.alpha2_us is not None
            else ""
        )
        + ("Dotted vertical lines are the scenario's SLO targets." if targets else "")
    )
    return _finish(fig, "Latency distributions", data, caption, note)


def latency_over_time(data: ResultsData, *, bins: int = 40, ax: Any = None) -> Any:
    """TTFT, TPOT and E2E of each completed request against its arrival time, with p50/p99 bands."""
    fig, axes = _figure(3, 1, (12, 9.5), ax, sharex=True)
    done = data.completed
    arrival = data.column("arrival_s")
    cls = data.column("slo_class")
    classes = sorted({str(c) for c in cls[done]})
    colors = _class_colors(data.slo_classes)
    arrivals = arrival[np.isfinite(arrival)]
    end = float(arrivals.max()) * 1.01 if len(arrivals) else data.duration_s
    end = max(end, 1e-6)
    edges = np.linspace(0.0, end, bins + 1)
    panels = (
        ("ttft_ms", "Time to first token", "TTFT (ms)"),
        ("tpot_ms", "Time per output token (per-request mean inter-token latency)", "TPOT (ms)"),
        ("e2e_ms", "End-to-end latency", "E2E latency (ms)"),
    )
    not_done = ~done & np.isfinite(arrival)
    for row, (key, title, ylabel) in enumerate(panels):
        ax = axes[row, 0]
        values = data.column(key)
        keep = done & np.isfinite(values) & np.isfinite(arrival)
        if key == "tpot_ms":
            keep &= data.column("output_tokens") > 1
        for c in classes:
            mine = keep & (cls == c)
            if mine.any():
                ax.scatter(
                    arrival[mine],
                    values[mine],
                    s=5,
                    alpha=0.45,
                    color=colors[c],
                    lw=0,
                    rasterized=True,
                    label=f"{c} (n={int(mine.sum()):,})",
                )
        if keep.sum() >= 5:
            which = np.clip(np.searchsorted(edges, arrival[keep], side="right") - 1, 0, bins - 1)
            centers, p50, p99 = [], [], []
            for b in range(bins):
                v = values[keep][which == b]
                if len(v) >= 5:
                    centers.append((edges[b] + edges[b + 1]) / 2)
                    p50.append(np.percentile(v, 50))
                    p99.append(np.percentile(v, 99))
            if centers:
                ax.plot(centers, p50, color="black", lw=1.4, label="p50 per window (all classes)")
                ax.plot(
                    centers,
                    p99,
                    color="black",
                    lw=1.4,
                    ls="--",
                    label="p99 per window (all classes)",
                )
        if key == "ttft_ms" and not_done.any():
            ax.plot(
                arrival[not_done],
                np.full(int(not_done.sum()), 0.97),
                "|",
                color="red",
                ms=8,
                transform=ax.get_xaxis_transform(),
                label=f"not completed ({int(not_done.sum()):,}): arrival time",
            )
        if keep.any():
            if _wide(values[keep]):
                ax.set_yscale("log")
        else:
            _empty(ax, "no completed requests")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=2)
    axes[-1, 0].set_xlabel("arrival time (s)")
    axes[-1, 0].set_xlim(0, end)
    caption = (
        "Latency of each completed request (dots, coloured by SLO class) against its arrival "
        f"time; black lines are the p50 (solid) and p99 (dashed) of requests arriving in each "
        f"{end / bins:.3g} s window. Rising lines mean queues were building up; red ticks mark "
        "arrivals of requests that did not complete (refused, dropped, or unfinished at the end)."
    )
    return _finish(fig, "Latency over time", data, caption)


OVERLAY_METRICS = {
    "ttft": ("ttft_ms", "TTFT (ms)"),
    "tpot": ("tpot_ms", "TPOT, each request's mean inter-token gap (ms)"),
    "e2e": ("e2e_ms", "E2E latency (ms)"),
}


def latency_cdf_overlay(
    runs: Any, metric: str = "ttft", *, ax: Any = None, labels: Any = None
) -> Any:
    """The CDF of one latency (``ttft``, ``tpot`` or ``e2e``) of several runs on one axis, to
    compare them: each run a results directory, a ``servesim.Results`` or a
    :class:`ResultsData`, labelled by ``labels`` (default: each run's name). Draws into ``ax``
    (a matplotlib Axes) when given, else into a new figure; returns the figure."""
    if metric not in OVERLAY_METRICS:
        raise ScenarioError("metric", metric, f"must be one of: {', '.join(OVERLAY_METRICS)}")
    column, xlabel = OVERLAY_METRICS[metric]
    datas = [as_results_data(run) for run in runs]
    if not datas:
        raise ScenarioError("runs", [], "give at least one run")
    names = [d.name for d in datas] if labels is None else [str(x) for x in labels]
    if len(names) != len(datas):
        raise ScenarioError("labels", labels, f"give one label per run ({len(datas)})")
    if ax is None:
        fig, axes = _figure(1, 1, (7.5, 4.5))
        ax = axes[0][0]
    else:
        fig = ax.figure
    for i, (data, name) in enumerate(zip(datas, names)):
        values = data.column(column)[data.completed]
        values = values[np.isfinite(values)]
        if not len(values):
            continue
        x, y = _cdf(values)
        ax.plot(
            x, y, drawstyle="steps-post", color=f"C{i % 10}", label=f"{name} (n={len(values):,})"
        )
    if _wide(np.concatenate([data.column(column)[data.completed] for data in datas])):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of completed requests ≤ x")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig
