"""The search space of a plan beyond GPU, tp, ``max_num_seqs`` and routing: pipeline stages
(``search.pp``), expert parallelism (``search.ep``), the scheduler's token budget
(``search.max_num_batched_tokens``) and prefill:decode splits (``search.pd``), and the
:class:`Candidate` each combination becomes.

The space is explicit: every value is listed in the plan, and the number of combinations is
bounded (:data:`MAX_CANDIDATES`), so a plan's cost is known before it runs.

A **PD split** ``P:D`` makes each fleet of the candidate out of *units* of ``P`` prefill and
``D`` decode instances (``cluster.pools``); the instance-count search then counts units, so the
ratio holds at every size. ``none`` is the co-located fleet (no pools).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from servesim.simcore.config import as_int, as_str
from servesim.simcore.errors import ScenarioError

MAX_CANDIDATES = 500
"""The most combinations one plan may search; beyond it the plan is refused before it runs."""

EXTRA_DIMENSIONS = ("pp", "ep", "max_num_batched_tokens", "pd")
"""The search fields that appear in a candidate's label and the report's table only when the
plan lists them (plans without them print exactly as before)."""

NO_PD = ("none", "off", "colocated")
"""Values of ``search.pd`` that mean a co-located fleet (no prefill/decode pools)."""


@attrs.frozen
class Candidate:
    """One combination of the search space: what a fleet's every instance runs."""

    index: int
    """Position in the search order (the rejected candidates are listed in it)."""
    gpu: Any  # servesim.studies.plan.spec.GPUChoice
    tp: int
    pp: int
    ep: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    """None: the base scenario's own."""
    routing: tuple[str, Any]
    """(label, the value ``policies.routing`` takes)."""
    pd: tuple[int, int] | None
    """(prefill, decode) instances per unit; None: co-located."""
    cp: int = 1
    """The base scenario's context parallelism (not searched): it multiplies the GPUs."""
    shown: frozenset[str] = frozenset()
    """Which of :data:`EXTRA_DIMENSIONS` the plan lists (they go into the label)."""

    @property
    def gpus_per_instance(self) -> int:
        """GPUs of one instance (one data-parallel rank): tp × pp × cp."""
        return self.tp * self.pp * self.cp

    @property
    def unit(self) -> int:
        """Instances per step of the count search: P + D with a PD split, else 1."""
        return sum(self.pd) if self.pd else 1

    @property
    def pd_label(self) -> str:
        return f"{self.pd[0]}:{self.pd[1]}" if self.pd else "none"

    @property
    def label(self) -> str:
        """``H100 tp2 seqs256 least-loaded``, with ``pp2``, ``ep2``, ``mbt4096`` and
        ``pd1:2`` when the plan searches those fields."""
        parts = [self.gpu.name, f"tp{self.tp}"]
        if "pp" in self.shown:
            parts.append(f"pp{self.pp}")
        if "ep" in self.shown:
            parts.append(f"ep{self.ep}")
        parts.append(f"seqs{self.max_num_seqs}")
        if "max_num_batched_tokens" in self.shown:
            parts.append(f"mbt{self.max_num_batched_tokens}")
        parts.append(self.routing[0])
        if "pd" in self.shown:
            parts.append(f"pd{self.pd_label}")
        return " ".join(parts)

    @property
    def memory_key(self) -> tuple:
        """What the memory check depends on."""
        return (
            self.gpu.name,
            self.tp,
            self.pp,
            self.ep,
            self.max_num_seqs,
            self.max_num_batched_tokens,
        )

    def run_key(self, instances: int) -> tuple:
        """What a simulation of ``instances`` instances depends on. One co-located instance
        receives every request whatever the router, so routing drops out of the key there."""
        routing = "*" if instances == 1 and self.pd is None else self.routing[0]
        return (*self.memory_key, self.pd, routing, instances)


def as_list(value: Any, path: str) -> list[Any]:
    """A plan list (a single value is a list of one); None: empty; ``[]`` is refused."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ScenarioError(path, value, "expected a non-empty list")
    return items


def unique(items: Sequence[Any], keys: Sequence[Any], path: str) -> None:
    """Refuse a list that names one value twice (by ``keys``)."""
    seen: dict[Any, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            raise ScenarioError(
                f"{path}[{i}]", items[i], f"duplicate of {path}[{seen[key]}]; list each once"
            )
        seen[key] = i


def _int_list(
    value: Any, default: Any, path: str, minimum: int = 1, maximum: int = 4096
) -> tuple[int, ...]:
    items = as_list(value, path) or [default]
    out = tuple(
        as_int(v, f"{path}[{i}]", minimum=minimum, maximum=maximum) for i, v in enumerate(items)
    )
    unique(out, out, path)
    return out


def _pd_split(value: Any, path: str) -> tuple[int, int] | None:
    """``"1:2"`` → (1, 2); ``none``/``null`` → None (co-located)."""
    if value is None or value is False:
        return None
    text = as_str(value, path).strip().lower()
    if text in NO_PD:
        return None
    prefill, sep, decode = text.partition(":")
    if not sep:
        raise ScenarioError(
            path, value, 'expected PREFILL:DECODE instances per unit, e.g. "1:2", or none'
        )
    p = as_int(_digits(prefill, value, path), f"{path} (prefill)", minimum=1, maximum=1024)
    d = as_int(_digits(decode, value, path), f"{path} (decode)", minimum=1, maximum=1024)
    return (p, d)


def _digits(text: str, value: Any, path: str) -> int:
    if not text.strip().isdigit():
        raise ScenarioError(
            path, value, 'expected PREFILL:DECODE with whole numbers, e.g. "1:2", or none'
        )
    return int(text)


@attrs.frozen
class Space:
    """The values of the fields this module parses; ``shown``: the ones the plan lists."""

    pps: tuple[int, ...]
    eps: tuple[int, ...]
    batched_tokens: tuple[int | None, ...]
    pd_splits: tuple[tuple[int, int] | None, ...]
    shown: frozenset[str]
    cp: int


def parse_space(search: Mapping[str, Any], engine: Mapping[str, Any]) -> Space:
    """``search.pp``, ``search.ep``, ``search.max_num_batched_tokens`` and ``search.pd``
    (each defaulting to the base scenario's ``engine`` value, or co-located)."""
    pps = _int_list(search.get("pp"), engine.get("pp", 1), "search.pp")
    eps = _int_list(search.get("ep"), engine.get("ep", 1), "search.ep")
    if search.get("max_num_batched_tokens") is None:
        batched: tuple[int | None, ...] = (None,)
    else:
        batched = _int_list(
            search["max_num_batched_tokens"],
            None,
            "search.max_num_batched_tokens",
            maximum=10_000_000,
        )
    raw_pd = as_list(search.get("pd"), "search.pd") or [None]
    splits = tuple(_pd_split(v, f"search.pd[{i}]") for i, v in enumerate(raw_pd))
    unique(raw_pd, splits, "search.pd")
    shown = frozenset(k for k in EXTRA_DIMENSIONS if search.get(k) is not None)
    cp = as_int(engine.get("cp", 1), "scenario.engine.cp", minimum=1, maximum=4096)
    return Space(pps, eps, batched, splits, shown, cp)


def dimension_sizes(plan: Any) -> list[tuple[str, int]]:
    """(search field, how many values) for every dimension of ``plan``, in search order."""
    return [
        ("gpu", len(plan.gpus)),
        ("tp", len(plan.tps)),
        ("pp", len(plan.space.pps)),
        ("ep", len(plan.space.eps)),
        ("max_num_seqs", len(plan.max_num_seqs)),
        ("max_num_batched_tokens", len(plan.space.batched_tokens)),
        ("routing", len(plan.routings)),
        ("pd", len(plan.space.pd_splits)),
    ]


def candidate_total(sizes: Sequence[tuple[str, int]]) -> int:
    """How many combinations lists of these sizes make."""
    total = 1
    for _, n in sizes:
        total *= n
    return total


def check_bounded(sizes: Sequence[tuple[str, int]], limit: int = MAX_CANDIDATES) -> int:
    """The candidate count, or a ScenarioError naming the longest list and how to cut it."""
    total = candidate_total(sizes)
    if total <= limit:
        return total
    product = " × ".join(f"{n} {name}" for name, n in sizes if n > 1)
    name, longest = max(sizes, key=lambda s: s[1])
    others = total // longest
    keep = max(1, limit // others)
    raise ScenarioError(
        "search",
        total,
        f"{total} candidates ({product}) is more than the {limit} one plan searches; shorten "
        f"the lists (search.{name} has {longest} values: at most {keep} keep the others as they "
        "are), or split the search into several plans",
    )


def candidates(plan: Any) -> list[Candidate]:
    """Every combination of ``plan``'s search space, in search order: gpu, tp, pp, ep,
    max_num_seqs, max_num_batched_tokens, routing, pd (the last varies fastest)."""
    s = plan.space
    combos = itertools.product(
        plan.gpus,
        plan.tps,
        s.pps,
        s.eps,
        plan.max_num_seqs,
        s.batched_tokens,
        plan.routings,
        s.pd_splits,
    )
    return [
        Candidate(i, gpu, tp, pp, ep, seqs, mbt, routing, pd, cp=s.cp, shown=s.shown)
        for i, (gpu, tp, pp, ep, seqs, mbt, routing, pd) in enumerate(combos)
    ]
