"""LoRA adapters and several models, recomputed from the run's adapter books (runs whose
requests name a model or an adapter, or whose instances have ``engine.lora``).

* INV-LORA-1 residency — an instance never holds more adapters in GPU slots than its
  ``max_loras`` (checked after every load, the only moment the count grows).
* INV-LORA-2 serving — every request that reached an instance reached one that serves its model
  and, when it names an adapter, one whose ``engine.lora.adapters`` holds it.
* INV-LORA-3 loads charged — every adapter load is paid in the step that needed it: a step of
  that instance starts at the load's time and lasts at least the loads made for it.

The books (see :meth:`servesim.components.fleetmodels.FleetModels.close`) hold per request id a
model and an adapter code, per instance its model, adapter catalogue, counters and load log
(step start µs, adapter, load µs, adapters resident after the load).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from servesim.audit.base import Violation, _first_bad

__all__ = ["check_adapters", "check_lora_books"]


def check_adapters(data: Any) -> Iterator[Violation]:
    """The auditor's entry: nothing to check unless the run kept adapter books."""
    books = getattr(data, "lora", None)
    if books is None:
        return iter(())
    return check_lora_books(books, data.requests, data.steps)


def check_lora_books(
    books: Mapping[str, Any],
    requests: Mapping[str, np.ndarray],
    steps: Sequence[Mapping[str, np.ndarray]],
) -> Iterator[Violation]:
    """INV-LORA-1…3 over one run's adapter books, request table and step logs."""
    for k, counters in enumerate(books["instances"]):
        limit = counters.get("max_loras", 0)
        for t, adapter, _, resident in books["loads"][k]:
            if resident > limit:
                yield Violation(
                    "INV-LORA-1",
                    f"{resident} adapters in GPU slots after loading {adapter!r}, "
                    f"max_loras is {limit}",
                    server=k,
                    time_us=t,
                )
    yield from _check_serving(books, requests)
    yield from _check_charged(books, steps)


def _check_serving(books: Mapping[str, Any], requests: Mapping[str, np.ndarray]):
    """INV-LORA-2, over whole columns: each request's model against its instance's, its
    adapter against its instance's catalogue (a table of instance x adapter)."""
    ids = np.asarray(requests["id"], dtype=np.int64)
    where = np.asarray(requests["instance"], dtype=np.int64)
    model_code = np.asarray(books["model_code"], dtype=np.int64)
    adapter_code = np.asarray(books["adapter_code"], dtype=np.int64)
    models, adapters = books["models"], books["adapters"]
    served = np.array([models.index(m) if m in models else -1 for m in books["served"]])
    knows = np.array(
        [[not a or a in set(c) for a in adapters] for c in books["catalogs"]], dtype=bool
    ).reshape(len(served), len(adapters))
    keep = (where >= 0) & (ids < len(model_code))
    ids, where = ids[keep], where[keep]
    model, adapter = model_code[ids], adapter_code[ids]
    wrong_model = served[where] != model
    for i in _first_bad(wrong_model):
        yield Violation(
            "INV-LORA-2",
            f"names model {models[model[i]]} but ran where {books['served'][where[i]]} is served",
            request=int(ids[i]),
            server=int(where[i]),
        )
    for i in _first_bad(~wrong_model & ~knows[where, adapter]):
        yield Violation(
            "INV-LORA-2",
            f"names adapter {adapters[adapter[i]]!r}, which this instance cannot load",
            request=int(ids[i]),
            server=int(where[i]),
        )


def _check_charged(books: Mapping[str, Any], steps: Sequence[Mapping[str, np.ndarray]]):
    for k, loads in enumerate(books["loads"]):
        if not loads:
            continue
        owed: dict[int, int] = defaultdict(int)
        for t, _, cost, _ in loads:
            owed[t] += cost
        starts = np.asarray(steps[k]["start_us"], dtype=np.int64)
        durations = np.asarray(steps[k]["dt_us"], dtype=np.int64)
        for t, cost in sorted(owed.items()):
            i = int(np.searchsorted(starts, t))
            if i >= len(starts) or starts[i] != t:
                yield Violation(
                    "INV-LORA-3",
                    f"adapter loads of {cost} µs but no step starts then",
                    server=k,
                    time_us=t,
                )
            elif durations[i] < cost:
                yield Violation(
                    "INV-LORA-3",
                    f"the step lasts {durations[i]} µs, less than its adapter loads ({cost} µs)",
                    server=k,
                    time_us=t,
                )
