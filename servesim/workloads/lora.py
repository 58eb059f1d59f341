"""Requests that name a model or a LoRA adapter: ``workload.models`` and ``workload.adapters``
on top of any workload (synthetic, a spec's clients, a trace).

Scenario schema (the ``workload:`` section)::

    models: {llama-3.1-8b: 3, qwen3-14b: 1}     # or a list (equally likely), or one name
    adapters: [sql, chat, summarize]            # equally likely, every request uses one
    adapters: {sql: 5, chat: 3, summarize: 1}   # explicit weights
    adapters: {names: [a0, a1, a2, a3], popularity: {zipf: 1.1}, base_fraction: 0.2}

``base_fraction`` is the share of requests that use no adapter (the base model). Zipf popularity
is the prefix groups' (adapter ``k``, 0-based, has probability ``(k + 1)^-s / H``). Draws come
from their own random streams (``workload/models``, ``workload/adapters``), one per request in
arrival order, so naming adapters never shifts any other draw of the workload. A trace names
them per request in its ``model`` and ``adapter`` columns instead (the trace readers keep them).
Which instances serve what is checked at load time (:mod:`servesim.scenario.lora`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from servesim.simcore.config import as_float, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.base import RequestSpec
from servesim.workloads.prefix import PrefixGroups, _popularity

ADAPTER_KEYS = ("names", "popularity", "base_fraction")


class TaggedSpec(RequestSpec):
    """A request spec that names its model (``""``: the scenario's) and adapter (``""``: none)."""

    __slots__ = ("model", "adapter")  # made by tagged(), from a plain spec


def tagged(spec: RequestSpec, model: str, adapter: str) -> TaggedSpec:
    """``spec`` naming ``model`` and ``adapter``: a copy of every field it has."""
    out = TaggedSpec.__new__(TaggedSpec)
    for name in RequestSpec.__slots__:
        setattr(out, name, getattr(spec, name))
    out.model = model
    out.adapter = adapter
    return out


class Mix:
    """Names drawn with fixed probabilities (``""`` stands for none: the base model)."""

    def __init__(self, names: list[str], probabilities: np.ndarray):
        self.names = names
        self.cdf = np.cumsum(probabilities)
        self.cdf[-1] = 1.0
        self.probabilities = probabilities

    def draw(self, rng: np.random.Generator, n: int) -> list[str]:
        picks = np.searchsorted(self.cdf, rng.random(n), side="right")
        names = self.names
        return [names[k] for k in picks.tolist()]

    def describe(self) -> dict[str, float]:
        return {
            (name or "base"): round(float(p), 6) for name, p in zip(self.names, self.probabilities)
        }


def _weights(value: Any, path: str) -> tuple[list[str], np.ndarray]:
    """A name, a list of names (equally likely) or a mapping name -> positive weight."""
    if isinstance(value, str) and value:
        value = [value]
    if isinstance(value, (list, tuple)) and value:
        value = {name: 1.0 for name in value}
    if not isinstance(value, Mapping) or not value:
        raise ScenarioError(path, value, "expected a name, a list of names or {name: weight}")
    names = []
    for name in value:
        if not isinstance(name, str) or not name:
            raise ScenarioError(path, name, "a name must be a non-empty string")
        names.append(name)
    weights = np.array(
        [as_float(value[n], f"{path}.{n}", exclusive_minimum=0.0) for n in names], dtype=float
    )
    return names, weights / weights.sum()


def model_mix(value: Any, path: str) -> Mix:
    names, p = _weights(value, path)
    return Mix(names, p)


def adapter_mix(value: Any, path: str) -> Mix:
    """``workload.adapters`` (module docstring)."""
    if isinstance(value, Mapping) and "names" in value:
        section = expect_mapping(value, path)
        check_keys(section, ADAPTER_KEYS, path)
        names, _ = _weights(section["names"], f"{path}.names")
        zipf = _popularity(section.get("popularity"), f"{path}.popularity")
        p = PrefixGroups(groups=len(names), zipf=zipf).probabilities
        base = as_float(
            section.get("base_fraction", 0.0), f"{path}.base_fraction", minimum=0.0, maximum=1.0
        )
        if base >= 1.0:
            raise ScenarioError(
                f"{path}.base_fraction", base, "must be below 1 (1 means: remove adapters)"
            )
    elif isinstance(value, Mapping) and set(value) & {"popularity", "base_fraction"}:
        raise ScenarioError(path, dict(value), "give the adapters as names: [...] beside these")
    else:
        names, p = _weights(value, path)
        base = 0.0
    if base > 0.0:
        return Mix(["", *names], np.concatenate(([base], p * (1.0 - base))))
    return Mix(names, p)


class LoRAMixWorkload:
    """A workload whose requests name a model and/or an adapter drawn from a :class:`Mix`.
    Everything but the request stream is the wrapped workload's."""

    def __init__(self, inner: Any, models: Mix | None, adapters: Mix | None):
        self.inner = inner
        self.models = models
        self.adapters = adapters

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(self.models.names) if self.models else ()

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.adapters.names if n) if self.adapters else ()

    @property
    def name_pairs(self) -> tuple[tuple[str, str], ...]:
        """Every (model, adapter) a request may name ("": the default, none): drawn
        independently, so every combination."""
        models = self.models.names if self.models else [""]
        adapters = self.adapters.names if self.adapters else [""]
        return tuple((m, a) for m in models for a in adapters)

    def requests(self, streams: RandomStreams) -> Iterator[RequestSpec]:
        return self._tag(self.inner.requests(streams), streams)

    def _tag(self, specs: Iterator[RequestSpec], streams: RandomStreams):
        chunk = 4096
        models = self.models
        adapters = self.adapters
        m_rng = streams.fresh("workload/models") if models else None
        a_rng = streams.fresh("workload/adapters") if adapters else None
        m_names: list[str] = []
        a_names: list[str] = []
        k = 0
        for spec in specs:
            if k == len(m_names or a_names):
                k = 0
                m_names = models.draw(m_rng, chunk) if models else []
                a_names = adapters.draw(a_rng, chunk) if adapters else []
            yield tagged(spec, m_names[k] if models else "", a_names[k] if adapters else "")
            k += 1

    def describe(self) -> dict[str, Any]:
        out = dict(self.inner.describe())
        if self.models:
            out["models"] = self.models.describe()
        if self.adapters:
            out["adapters"] = self.adapters.describe()
        return out

    def __repr__(self) -> str:
        return f"LoRAMixWorkload({self.inner!r})"


def has_lora_mix(section: Mapping[str, Any]) -> bool:
    """Whether the section has ``models`` or ``adapters`` keys (null ones are dropped)."""
    return "models" in section or "adapters" in section


def with_lora_mix(section: Mapping[str, Any], path: str, build: Any) -> Any:
    """The workload of ``section`` without ``models``/``adapters`` (made by ``build``), each
    request naming a model and an adapter drawn from them."""
    models = model_mix(section["models"], f"{path}.models") if section.get("models") else None
    adapters = (
        adapter_mix(section["adapters"], f"{path}.adapters") if section.get("adapters") else None
    )
    rest = {k: v for k, v in section.items() if k not in ("models", "adapters")}
    inner = build(rest)
    if models is None and adapters is None:  # both null: the workload as it is
        return inner
    if getattr(inner, "sessions", None):
        raise ScenarioError(
            f"{path}.adapters" if adapters else f"{path}.models",
            section.get("adapters") or section.get("models"),
            "models and adapters are not combined with sessions (follow-up rounds); remove "
            "workload.sessions, or workload.models and workload.adapters",
        )
    return LoRAMixWorkload(inner, models, adapters)
