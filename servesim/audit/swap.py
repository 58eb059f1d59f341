"""KV-block conservation across GPU and CPU memory for preemption by swapping (INV-4)."""

from __future__ import annotations

from collections.abc import Iterator

from servesim.audit.base import AuditInput, Violation


def check_swap(data: AuditInput) -> Iterator[Violation]:
    """INV-4 across GPU and CPU memory for servers that preempt by swapping."""
    for server, books in enumerate(data.swap):
        if not books:
            continue
        space, peak = books["space"], books["peak"]
        out, back, left = books["out_blocks"], books["in_blocks"], books["used_end"]
        if peak > space:
            yield Violation(
                "INV-4", f"swap space held {peak} blocks, over its {space}", server=server
            )
        if out - back != left or left < 0:
            yield Violation(
                "INV-4",
                f"{out} blocks swapped out, {back} swapped in, but {left} in CPU memory",
                server=server,
            )
        if books["ins"] > books["outs"]:
            yield Violation(
                "INV-4",
                f"{books['ins']} swap-ins but only {books['outs']} swap-outs",
                server=server,
            )
        if left and not data.bounded:
            yield Violation(
                "INV-4", f"{left} blocks left in CPU memory after a drained run", server=server
            )
