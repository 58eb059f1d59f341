"""Scale events on the per-instance figures: when an autoscaled instance started loading, became
ready and stopped (from ``summary.json``'s ``autoscaling.events``)."""

from __future__ import annotations

from typing import Any

# state -> line style of its marker; the other states (warming, draining) are not marked
MARKERS = {"loading": ":", "ready": "-", "stopped": "--"}


def mark_scale_events(axes: Any, summary: dict[str, Any], instances: list[int]) -> str:
    """Draw a vertical line on every panel at each of ``instances``' scale events; return the
    caption's sentence about them ("" when the run was not autoscaled or has none to show)."""
    events = [
        e
        for e in (summary.get("autoscaling") or {}).get("events", ())
        if e["instance"] in instances and e["state"] in MARKERS and e["time_s"] > 0
    ]
    if not events:
        return ""
    for ax in axes.flat:
        for e in events:
            ax.axvline(e["time_s"], color="0.35", lw=0.8, ls=MARKERS[e["state"]], alpha=0.7)
    return (
        " Vertical lines: scale events (dotted: an instance starts loading; solid: it is ready; "
        "dashed: it stopped)."
    )
