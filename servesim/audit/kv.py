"""KV-block conservation (INV-4): used GPU blocks within capacity at every step, and the
engine's own block recounts (``notes``), which cover the GPU's free list and references and every
KV offload tier below it (within capacity, blocks stored - evicted = held, the tiers' reloads
adding up to the blocks the GPU took back)."""

from __future__ import annotations

from collections.abc import Iterator

from servesim.audit.base import AuditInput, Violation, _first_bad


def check_kv(data: AuditInput) -> Iterator[Violation]:
    for note in data.notes:
        yield Violation("INV-4", note)
    for server, steps in enumerate(data.steps):
        used = steps["kv_used"]
        total = data.capacity[server]
        for i in _first_bad((used < 0) | (used > total)):
            yield Violation(
                "INV-4",
                f"step {i} uses {used[i]} of {total} KV blocks",
                server=server,
                time_us=int(steps["start_us"][i]),
            )
