"""How sure a prediction is: where its step times come from, on a four-rung ladder.

======================  ====  =================================================================
rung                    rank  meaning
======================  ====  =================================================================
``measured``            4     coefficients or a profile measured on this model, GPU and tp
``transported``         3     measured on a nearby configuration and scaled to this one
``fitted``              2     a fit over other models (a family or a global fit), or coefficients
                              whose origin servesim cannot check
``physics``             1     first principles only (roofline: FLOPs and bytes over datasheet peaks)
``unknown``             0     a plugin model that does not say
======================  ====  =================================================================

The rung is read from the latency model's own provenance (``describe()``); wrappers that add
overheads or interference take their base model's rung; the ``anchored`` model is
``transported`` (the anchor's rung when the anchor is the target, or when the anchor itself is
below ``measured``).
"""

from __future__ import annotations

from typing import Any

import attrs

RUNGS = {"unknown": 0, "physics": 1, "fitted": 2, "transported": 3, "measured": 4}
"""Rung name -> rank (higher is surer); ``plan --min-confidence`` compares ranks."""


@attrs.frozen
class Confidence:
    """A rung of the ladder and a sentence saying why."""

    level: str
    detail: str

    @property
    def rank(self) -> int:
        return RUNGS[self.level]

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "rank": self.rank, "detail": self.detail}


def confidence_of(latency: Any, spec: Any = None) -> Confidence:
    """The rung of ``latency`` (a built latency model; bundled blackbox coefficients exist only
    for the exact model, GPU and tp they were measured on, so ``spec`` is not needed to tell)."""
    return confidence_of_description(latency.describe())


def run_confidence(descriptions: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's ``confidence``: the weakest rung over the instances' latency models
    (their ``describe()``), as ``{level, rank, detail}``."""
    rungs = [confidence_of_description(d) for d in descriptions]
    if not rungs:
        return Confidence("unknown", "no instance").to_dict()
    return min(rungs, key=lambda c: c.rank).to_dict()


def confidence_of_description(d: dict[str, Any]) -> Confidence:
    """The rung from a latency model's ``describe()`` (as summary.json keeps it)."""
    name = d.get("model", "")
    base = d.get("base")
    if isinstance(base, dict) and "model" in base:  # overheads / interference wrappers
        inner = confidence_of_description(base)
        return Confidence(inner.level, f"{name} over {inner.detail}")
    if name == "anchored":
        return _transported(d.get("transport") or {})
    provenance = d.get("provenance") or {}
    source = provenance.get("source")
    if name == "blackbox":
        if source == "bundled":
            return Confidence(
                "measured",
                f"blackbox coefficients fitted on measured vLLM runs of {provenance.get('model')} "
                f"on {provenance.get('gpu')} with tp {provenance.get('tp')}",
            )
        if source == "file":
            return Confidence(
                "fitted",
                f"blackbox coefficients from {provenance.get('file')} (servesim cannot check "
                "they were measured on this model, GPU and tp)",
            )
        return Confidence("fitted", "blackbox coefficients given in the scenario")
    if name == "distserve-profile":
        return Confidence(
            "measured",
            f"a measured step-time profile of {d.get('profile_model')} on {d.get('profile_gpu')}",
        )
    if name == "trained-physics":
        if source == "bundled":
            return Confidence(
                "fitted",
                "trained-physics: roofline terms weighted by one global fit across models and "
                "GPUs (BLIS), not fitted on this model",
            )
        return Confidence("fitted", "trained-physics with coefficients given in the scenario")
    if name == "roofline":
        return Confidence("physics", "roofline: FLOPs and bytes over the GPU's datasheet peaks")
    return Confidence("unknown", f"latency model {name or '?'} states no provenance servesim reads")


def _transported(t: dict[str, Any]) -> Confidence:
    """An anchored model: the anchor's rung, ``transported`` when the target differs from it
    (the changes say how far), never above the anchor's own rung."""
    anchor = t.get("anchor") or {}
    inner = confidence_of_description(anchor.get("latency") or {})
    changes = list(t.get("changes") or [])
    where = f"{anchor.get('model')} on {anchor.get('gpu')} with tp {anchor.get('tp')}"
    if not changes:
        return Confidence(inner.level, f"anchor = target ({where}): {inner.detail}")
    level = "transported" if inner.rank >= RUNGS["transported"] else inner.level
    return Confidence(
        level,
        f"transported from {where} by the {t.get('physics')} ratio ({'; '.join(changes)}); "
        f"anchor: {inner.detail}",
    )
