"""Cluster figures: per-instance time series, the gateway queue (flow control), the KV transfer
timeline (disaggregated serving) and the step-level Gantt of one instance.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from servesim.analysis.plots.data import FigureNotApplicable, ResultsData
from servesim.analysis.plots.figure import (
    _class_colors,
    _empty,
    _figure,
    _finish,
)
from servesim.analysis.plots.scaling import mark_scale_events
from servesim.simcore.errors import ScenarioError

GANTT_DEFAULT_STEPS = 200  # steps shown when no window end is given
GANTT_MAX_STEPS = 2000  # most steps a Gantt draws; a wider window is cut, with a note
TIMESERIES_BINS = 1000  # bins of the per-instance time series drawn from steps.npz


def _binned_max(
    starts: np.ndarray, ends: np.ndarray, values: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Per bin, the largest value of the steps that overlap it (0 where the instance was idle)."""
    nb = len(edges) - 1
    if not len(starts):
        return np.zeros(nb)
    lo = edges[:-1]
    idx = np.searchsorted(starts, lo, side="right") - 1
    safe = np.maximum(idx, 0)
    running = (idx >= 0) & (lo < ends[safe])
    out = np.where(running, values[safe], 0).astype(np.float64)
    which = np.searchsorted(edges, starts, side="right") - 1
    inside = (which >= 0) & (which < nb)
    np.maximum.at(out, which[inside], values[inside].astype(np.float64))
    return out


def instance_timeseries(
    data: ResultsData, *, instances: list[int] | None = None, ax: Any = None
) -> Any:
    """Per-instance wait-queue depth, batch size and KV-cache utilisation over time."""
    chosen = data.instances if instances is None else list(instances)
    for i in chosen:
        data.check_instance(i)
    fig, axes = _figure(3, 1, (12, 9.5), ax, sharex=True)
    end_s = data.duration_s
    panels = (
        ("waiting", "Wait-queue depth", "waiting requests (requests)"),
        ("batch_size", "Batch size", "running batch (requests)"),
        ("kv", "KV-cache utilisation", "KV blocks in use (%)"),
    )
    if data.steps is not None:
        nb = int(min(TIMESERIES_BINS, max(1, math.ceil(end_s * 1000))))
        edges = np.linspace(0.0, end_s * 1e6, nb + 1)
        x = edges[:-1] / 1e6
        width_ms = end_s * 1000 / nb
        source = (
            f"From steps.npz: each point is the largest value of the steps running in a "
            f"{width_ms:.3g} ms bin (0 = idle)."
        )
        for i in chosen:
            log = data.step_log(i)
            starts = log["start_us"]
            ends = starts + log["dt_us"]
            series = {
                "waiting": _binned_max(starts, ends, log["waiting"], edges),
                "batch_size": _binned_max(starts, ends, log["batch_size"], edges),
                "kv": _binned_max(starts, ends, log["kv_used"], edges) / data.kv_blocks(i) * 100,
            }
            for row, (key, _, _) in enumerate(panels):
                axes[row, 0].plot(
                    x, series[key], drawstyle="steps-post", lw=1.0, label=data.instance_label(i)
                )
    else:
        ts = data.timeseries
        interval = np.diff(np.unique(ts["time_s"]))
        source = "From timeseries.csv: the step in progress at each sample" + (
            f", every {interval[0]:g} s." if len(interval) else "."
        )
        for i in chosen:
            mine = ts["instance"] == i
            series = {
                "waiting": ts["waiting"][mine],
                "batch_size": ts["batch_size"][mine],
                "kv": ts["kv_utilization"][mine] * 100,
            }
            for row, (key, _, _) in enumerate(panels):
                axes[row, 0].plot(
                    ts["time_s"][mine],
                    series[key],
                    lw=1.0,
                    marker=".",
                    ms=4,
                    label=data.instance_label(i),
                )
    for row, (_, title, ylabel) in enumerate(panels):
        ax = axes[row, 0]
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", ncol=max(1, math.ceil(len(chosen) / 8)))
    axes[2, 0].set_ylim(0, 105)
    axes[-1, 0].set_xlabel("simulated time (s)")
    axes[-1, 0].set_xlim(0, end_s)
    caption = (
        "Per instance: requests in the wait queue, requests in the running batch, and the share "
        "of KV-cache blocks held. A queue that grows while the batch is at max_num_seqs, or KV "
        "near 100% (preemptions), marks saturation."
    ) + mark_scale_events(axes, data.summary, chosen)
    return _finish(fig, "Instance load over time", data, caption, source)


def _depth(enter: np.ndarray, leave: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step function (times, depth) of intervals [enter, leave): leaving sorts before entering."""
    times = np.concatenate([[0.0], enter, leave])
    delta = np.concatenate([[0], np.ones(len(enter), np.int64), -np.ones(len(leave), np.int64)])
    order = np.lexsort((delta, times))
    return times[order], np.cumsum(delta[order])


def gateway_queue(data: ResultsData, *, bins: int = 60, ax: Any = None) -> Any:
    """Gateway queue depth over time (derived from requests.csv) and the refused requests.

    Flow-control runs only. Requests released by the gateway count from arrival (+ admission
    latency) for ``gateway_wait_ms``; expired ones for the flow-control ``ttl``; requests still
    queued at the end until the end. Shed requests are not counted (when they left is not
    recorded); the gateway's recorded peak depth is given for comparison.
    """
    fc = data.flow_control
    if fc is None:
        raise FigureNotApplicable(
            "gateway_queue",
            str(data.root),
            "the run has no gateway queue (policies.flow_control is not set)",
        )
    from servesim.simcore.config import parse_duration_us

    fig, axes = _figure(2, 1, (12, 7.5), ax, sharex=True)
    arrival = data.column("arrival_s")
    status = data.column("status")
    cls = data.column("slo_class")
    admission = data.summary.get("scenario", {}).get("cluster", {}).get("admission_latency_us", 0)
    enter = arrival + (admission or 0) / 1e6
    wait_s = data.column("gateway_wait_ms") / 1000.0
    released = np.isfinite(wait_s) & (wait_s > 0)
    leave = np.where(released, enter + np.nan_to_num(wait_s), np.nan)
    ttl_us = 0
    ttl = data.scenario_section("policies", "flow_control", "ttl")
    if ttl is not None:
        with contextlib.suppress(ScenarioError):
            ttl_us = parse_duration_us(ttl, "policies.flow_control.ttl")
    expired = status == "expired"
    if ttl_us:
        leave = np.where(expired, enter + ttl_us / 1e6, leave)
    leave = np.where(status == "gateway_queued", data.duration_s, leave)
    last = [float(np.nanmax(v)) for v in (arrival, leave) if np.isfinite(v).any()]
    end = max(max(last, default=0.0) * 1.01, 1e-6)
    counted = np.isfinite(leave) & np.isfinite(enter)
    ax = axes[0, 0]
    t, d = _depth(enter[counted], leave[counted])
    ax.plot(t, d, drawstyle="steps-post", color="black", lw=1.4, label="all classes")
    classes = sorted({str(c) for c in cls[counted]})
    colors = _class_colors(data.slo_classes)
    if len(classes) > 1:
        for c in classes:
            mine = counted & (cls == c)
            t, d = _depth(enter[mine], leave[mine])
            ax.plot(t, d, drawstyle="steps-post", color=colors[c], lw=1.0, label=c)
    max_queue = fc.get("max_queue") or 0
    if max_queue:
        ax.axhline(max_queue, color="red", ls="--", lw=1.0, label=f"max_queue = {max_queue}")
    peak = data.summary.get("anomalies", {}).get("gateway_peak_depth")
    ax.set_title(
        "Gateway queue depth (derived from requests.csv)"
        + (f"; recorded peak {peak}" if peak is not None else ""),
        fontsize=10,
    )
    ax.set_ylabel("queue depth (requests)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")

    ax = axes[1, 0]
    edges = np.linspace(0.0, end, bins + 1)
    width = end / bins
    bottom = np.zeros(bins)
    kinds = (
        ("rejected", "rejected (full queue or admission)", "C3"),
        ("shed", "shed (room made for a more important request)", "C1"),
        ("expired", "expired (waited the ttl)", "C4"),
    )
    for kind, label, color in kinds:
        mine = (status == kind) & np.isfinite(arrival)
        counts = np.histogram(arrival[mine], bins=edges)[0]
        ax.bar(
            edges[:-1],
            counts,
            width=width,
            bottom=bottom,
            align="edge",
            color=color,
            label=f"{label}: {int(mine.sum()):,}",
        )
        bottom += counts
    ax.set_title("Requests refused by the gateway, by arrival time", fontsize=10)
    ax.set_ylabel(f"requests per {width:.3g} s")
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(0, end)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    shed = int((status == "shed").sum())
    note = (
        "Queue depth derived from requests.csv (the run records no gateway time series): a "
        "released request counts from arrival"
        + (" + admission latency" if admission else "")
        + " for its gateway_wait_ms"
        + (f", an expired one for the ttl ({ttl_us / 1000:g} ms)" if ttl_us else "")
        + (
            f"; {shed} shed request(s) are not counted (when they left is not recorded)"
            if shed
            else ""
        )
        + "."
    )
    caption = (
        "Top: requests waiting in the flow-control gateway queue, in total and per SLO class. "
        "Bottom: requests the gateway refused (rejected when full, shed for a more important "
        "one, expired after the ttl), counted by arrival time. A queue pinned at max_queue with "
        "refusals below it means the cluster is saturated and flow control is shedding load."
    )
    return _finish(fig, "Gateway queue", data, caption, note)


def transfer_timeline(data: ResultsData, *, ax: Any = None) -> Any:
    """KV transfers of a disaggregated run: each transfer on its link, concurrency, durations."""
    if not data.is_pd or data.transfers is None:
        raise FigureNotApplicable(
            "transfer_timeline",
            str(data.root),
            "the run is not disaggregated (no cluster.pools), so it has no KV transfers",
        )
    from matplotlib.collections import LineCollection

    t = data.transfers
    fig, axes = _figure(3, 1, (12, 10), ax, sharex=True)
    end = data.duration_s
    start, stop = t["start_s"], t["end_s"]
    slowdown = t["duration_ms"] / np.maximum(t["uncontended_ms"], 1e-9)
    links = list(dict.fromkeys(str(x) for x in t["link"]))
    ax = axes[0, 0]
    if len(start):
        # one row per link, lanes within it so that overlapping transfers stay visible
        lane = np.zeros(len(start), np.int64)
        offset = {}
        base = 0
        for link in links:
            lane_end: list[float] = []
            for i in np.flatnonzero(t["link"] == link)[np.argsort(start[t["link"] == link])]:
                free = next((k for k, e in enumerate(lane_end) if e <= start[i]), None)
                if free is None:
                    free = len(lane_end)
                    lane_end.append(0.0)
                lane_end[free] = stop[i]
                lane[i] = free
            offset[link] = base
            base += max(len(lane_end), 1) + 1
        y = np.array([offset[str(x)] for x in t["link"]]) + lane
        segments = np.stack([np.c_[start, y], np.c_[stop, y]], axis=1)
        collection = LineCollection(list(segments), array=slowdown, cmap="viridis", linewidths=5)
        collection.set_clim(1.0, max(1.0001, float(slowdown.max())))
        ax.add_collection(collection)
        fig.colorbar(collection, ax=ax, label="slowdown vs alone on the link (×)", pad=0.01)
        ax.set_ylim(-1, base)
        ax.set_yticks([offset[link] for link in links], links, fontsize=7)
    else:
        _empty(ax, "no KV transfer completed")
    ax.set_title("Each KV transfer on its link (one lane per overlapping transfer)", fontsize=10)
    ax.set_ylabel("link / lane")
    ax.grid(True, axis="x", alpha=0.3)

    ax = axes[1, 0]
    nb = int(min(200, max(1, math.ceil(end * 10))))
    edges = np.linspace(0.0, end, nb + 1)
    for k, link in enumerate(links):
        mine = t["link"] == link
        times, depth = _depth(start[mine], stop[mine])
        # time-average in flight per bin: the integral of the step function, differenced
        area = np.concatenate([[0.0], np.cumsum(depth[:-1] * np.diff(times))])
        mean = np.diff(np.interp(edges, times, area)) / np.diff(edges)
        peak = _binned_max(times, np.append(times[1:], times[-1]), depth, edges)
        # one colour per link: the peak faint and thin, the time-average over it
        series = ((peak, 0.8, 0.5, "most at once"), (mean, 1.4, None, "time-average"))
        for values, lw, alpha, what in series:
            ax.plot(
                edges[:-1],
                values,
                drawstyle="steps-post",
                lw=lw,
                color=f"C{k % 10}",
                alpha=alpha,
                label=f"{link}: {what}",
            )
    ax.set_title(f"Transfers in flight, per {end / nb:.3g} s bin", fontsize=10)
    ax.set_ylabel("transfers in flight (transfers)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if links:
        ax.legend(fontsize=7, loc="upper right", ncol=max(1, math.ceil(len(links) / 8)))

    ax = axes[2, 0]
    for k, link in enumerate(links):
        mine = t["link"] == link
        ax.scatter(
            start[mine],
            t["duration_ms"][mine],
            s=8,
            color=f"C{k % 10}",
            lw=0,
            rasterized=True,
            label=f"{link}: duration",
        )
    if len(start):
        ax.scatter(
            start,
            t["uncontended_ms"],
            s=4,
            color="0.6",
            marker="_",
            rasterized=True,
            label="alone on the link (uncontended)",
        )
        ax.legend(fontsize=7, loc="upper right", ncol=max(1, math.ceil(len(links) / 8)))
    ax.set_title("Transfer duration by start time", fontsize=10)
    ax.set_ylabel("transfer duration (ms)")
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    pd = data.summary.get("pd", {})
    caption = (
        "KV-cache transfers from prefill to decode instances. Top: every transfer as a bar from "
        "start to end on its link, coloured by how much longer it took than alone on the link "
        "(sharing bandwidth). Middle: transfers in flight per link, the time-average and the "
        "most at once in each bin. Bottom: each transfer's "
        "duration (dots) against what it would take alone (grey). "
        f"{len(start):,} transfers; p50 {pd.get('transfer_p50_ms', 0):.1f} ms, "
        f"p99 {pd.get('transfer_p99_ms', 0):.1f} ms."
    )
    return _finish(fig, "KV transfer timeline", data, caption)


def parse_window(text: str | None) -> tuple[float | None, float | None]:
    """``"START:END"`` (seconds; either side may be empty) as (start_s, end_s)."""
    if text is None:
        return None, None
    fix = "give START:END in seconds of simulated time, e.g. 10:10.5 (either side may be empty)"
    if ":" not in text:
        raise ScenarioError("--window", text, fix)
    left, right = (part.strip() for part in text.split(":", 1))
    try:
        start = float(left) if left else None
        end = float(right) if right else None
    except ValueError:
        raise ScenarioError("--window", text, fix) from None
    _check_window(start, end, "--window", text)
    return start, end


def _check_window(start: float | None, end: float | None, path: str, shown: Any) -> None:
    for value in (start, end):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise ScenarioError(path, shown, "times must be finite and at least 0 s")
    if start is not None and end is not None and end <= start:
        raise ScenarioError(path, shown, "the end must be after the start")


def step_gantt(
    data: ResultsData,
    instance: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
    *,
    max_steps: int = GANTT_MAX_STEPS,
    ax: Any = None,
) -> Any:
    """The engine steps of one instance in ``[start_s, end_s]`` as a Gantt chart.

    Each step is a bar from its start to its end, split by the share of its tokens that were
    prompt (prefill) and decode tokens; below, the batch size, wait queue and tokens per step.
    Without a window it shows ``GANTT_DEFAULT_STEPS`` steps around the middle of the instance's
    run; with only ``start_s``, that many steps from there; with only ``end_s``, the steps from
    the instance's first. At most ``max_steps`` steps are drawn (the rest are cut, with a note).
    """
    _check_window(start_s, end_s, "window", (start_s, end_s))
    log = data.step_log(instance)
    from matplotlib.collections import PolyCollection

    starts = log["start_us"].astype(np.int64)
    ends = starts + log["dt_us"].astype(np.int64)
    n = len(starts)
    if start_s is None and end_s is None:
        first = max(0, n // 2 - GANTT_DEFAULT_STEPS // 2)
        lo_us = float(starts[first]) if n else 0.0
    else:
        lo_us = float(starts[0]) if start_s is None and n else (start_s or 0.0) * 1e6
        first = int(np.searchsorted(ends, lo_us, side="right"))
    if end_s is None:
        last = min(first + GANTT_DEFAULT_STEPS, n)
        hi_us = float(ends[last - 1]) if last > first else lo_us + 1.0
    else:
        hi_us = end_s * 1e6
        last = int(np.searchsorted(starts, hi_us, side="left"))
    count = last - first
    if count <= 0:
        span = f"{starts[0] / 1e6:.3f}–{ends[-1] / 1e6:.3f} s" if n else "nowhere (it ran no step)"
        raise ScenarioError(
            "window",
            f"{lo_us / 1e6:g}:{hi_us / 1e6:g}",
            f"instance {instance} ran no engine step in that window; its steps span {span}",
        )
    note = ""
    if count > max_steps:
        last = first + max_steps
        hi_us = float(ends[last - 1])
        note = (
            f"Capped: showing the first {max_steps:,} of the {count:,} steps in the window "
            f"(up to {hi_us / 1e6:.3f} s); narrow the window to see the rest."
        )
    sel = slice(first, last)
    x0, x1 = starts[sel] / 1e6, ends[sel] / 1e6
    prefill = log["prefill_tokens"][sel].astype(np.float64)
    decode = log["decode_tokens"][sel].astype(np.float64)
    tokens = prefill + decode
    share = np.divide(prefill, tokens, out=np.zeros_like(tokens), where=tokens > 0)
    top = (tokens > 0).astype(np.float64)
    zero = np.zeros_like(x0)

    fig, axes = _figure(2, 1, (13, 7.5), ax, sharex=True, height_ratios=(1.2, 1))
    ax = axes[0, 0]
    pre = np.stack([np.c_[x0, zero], np.c_[x0, share], np.c_[x1, share], np.c_[x1, zero]], 1)
    dec = np.stack([np.c_[x0, share], np.c_[x0, top], np.c_[x1, top], np.c_[x1, share]], 1)
    edge = "white" if last - first <= 400 else "none"
    ax.add_collection(
        PolyCollection(
            list(pre),
            facecolors="C1",
            edgecolors=edge,
            linewidths=0.4,
            label="prefill (prompt) tokens",
        )
    )
    ax.add_collection(
        PolyCollection(
            list(dec), facecolors="C0", edgecolors=edge, linewidths=0.4, label="decode tokens"
        )
    )
    batch = log["batch_size"][sel]
    if last - first <= 40:
        for a, b, size in zip(x0, x1, batch):
            middle = (max(a, lo_us / 1e6) + min(b, hi_us / 1e6)) / 2  # of the visible part
            ax.text(middle, 1.02, str(int(size)), ha="center", va="bottom", fontsize=7)
    blocked = log.get("blocked_us")
    if blocked is not None and len(blocked):
        inside = blocked[(blocked >= lo_us) & (blocked <= hi_us)] / 1e6
        if len(inside):
            ax.vlines(
                inside, 0, 1, color="red", lw=0.8, label="idle with work blocked on a KV transfer"
            )
    ax.set_ylim(0, 1.12 if last - first <= 40 else 1.0)
    ax.set_ylabel("share of the step's tokens (fraction)")
    ax.set_title(
        "Steps as bars (width = duration; white gaps = idle); split by token kind"
        + ("; numbers = batch size" if last - first <= 40 else ""),
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="x", alpha=0.3)

    ax = axes[1, 0]
    # each step's value from its start; back to 0 only where the instance then went idle
    idle = np.append(x0[1:] > x1[:-1], True)
    xs = np.column_stack([x0, x1]).ravel()
    shown_points = np.column_stack([np.ones(len(x0), bool), idle]).ravel()
    xs = xs[shown_points]

    def held(values: np.ndarray) -> np.ndarray:
        return np.column_stack([values, np.zeros(len(values))]).ravel()[shown_points]

    ax.plot(
        xs, held(batch), drawstyle="steps-post", color="C2", lw=1.2, label="batch size (requests)"
    )
    ax.plot(
        xs,
        held(log["waiting"][sel]),
        drawstyle="steps-post",
        color="C3",
        lw=1.0,
        label="waiting (requests)",
    )
    ax.set_ylabel("requests (requests)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    right.plot(
        xs,
        held(tokens),
        drawstyle="steps-post",
        color="0.5",
        lw=0.8,
        alpha=0.8,
        label="tokens in the step (tokens)",
    )
    right.set_ylabel("tokens per step (tokens)")
    right.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(
        handles[0] + more[0],
        handles[1] + more[1],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.07, 1.0),
    )
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(lo_us / 1e6, hi_us / 1e6)
    shown = last - first
    caption = (
        f"Engine steps of {data.instance_label(instance)} from {lo_us / 1e6:.3f} s to "
        f"{hi_us / 1e6:.3f} s ({shown:,} steps, {int(tokens.sum()):,} tokens). Each bar is one "
        "step; its orange part is the share of prompt (prefill) tokens and its blue part the "
        "decode tokens, so long orange bars are prefill chunks that stall the decoding requests "
        "sharing the step. Below: batch size, wait queue and tokens per step."
    )
    return _finish(
        fig,
        f"Engine steps of {data.instance_label(instance)}, "
        f"{lo_us / 1e6:.3f}–{hi_us / 1e6:.3f} s ({shown:,} steps)",
        data,
        caption,
        note,
    )
