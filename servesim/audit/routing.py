"""Routing-signal freshness (INV-7)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from servesim.audit.base import AuditInput, Violation, _first_bad


def check_signal_freshness(data: AuditInput) -> Iterator[Violation]:
    """INV-7: no routing decision read a snapshot older than the refresh interval allows."""
    if not len(data.snapshot_ages):
        return
    ages = np.asarray(data.snapshot_ages)
    limit = data.snapshot_interval
    for i in _first_bad(ages > max(limit, 0) if limit > 0 else ages > 0):
        yield Violation(
            "INV-7", f"routing decision {i} read a snapshot {ages[i]} µs old (interval {limit} µs)"
        )
