"""Transfer conservation (INV-PD-3) and the transfer log's own checks (bytes, fair share).

The transfer-level checks are an independent recomputation from the logged transfers and the
links' change points; the caller supplies it as ``pd["check_transfers"]`` (it reads the transfer
log's layout, which the components own).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from servesim.audit.base import AuditInput, Violation, _disaggregated_only


@_disaggregated_only
def check_transfers(
    data: AuditInput, pd: Mapping[str, object], r: Mapping[str, np.ndarray]
) -> Iterator[Violation]:
    """INV-PD-3 on the counters and on the request table, then the transfer log's checks."""
    te = r["transfer_end_us"]
    started, completed = int(pd["transfers_started"]), int(pd["transfers_completed"])
    in_flight = int(pd["in_flight"])
    if started != completed + in_flight:
        yield Violation(
            "INV-PD-3",
            f"{started} transfers started, {completed} completed, {in_flight} in flight",
        )
    if started != int((r["transfer_start_us"] >= 0).sum()) or completed != int((te >= 0).sum()):
        yield Violation(
            "INV-PD-3",
            f"the request table shows {int((r['transfer_start_us'] >= 0).sum())} transfers "
            f"started and {int((te >= 0).sum())} completed; the counters {started} and {completed}",
        )
    if not data.bounded and in_flight:
        yield Violation("INV-PD-3", f"{in_flight} transfers in flight after a drained run")
    checker = pd.get("check_transfers")
    if checker is not None:
        for problem in checker():
            yield Violation("INV-PD-3" if "conservation" in problem else "TRANSFER", problem)
