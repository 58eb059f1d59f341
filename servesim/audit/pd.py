"""Disaggregated serving (INV-PD-1…5): phase ordering, pools and the transfer log."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from servesim.audit.base import AuditInput, Violation, _disaggregated_only, _first_bad


@_disaggregated_only
def check_pd(
    data: AuditInput, pd: Mapping[str, object], r: Mapping[str, np.ndarray]
) -> Iterator[Violation]:
    """INV-PD-1, 2, 4 and 5 over the request table and the pools (INV-PD-3: transfers.py)."""
    ids = r["id"]
    roles = np.array(pd["roles"])
    prefill = r["prefill_instance"]
    split = prefill >= 0
    chain = (
        "arrival_us",
        "enqueue_us",
        "prefill_end_us",
        "transfer_start_us",
        "transfer_end_us",
        "decode_enqueue_us",
        "completion_us",
    )
    # INV-PD-1: the decode part is enqueued exactly when its KV has arrived, never before
    te, de = r["transfer_end_us"], r["decode_enqueue_us"]
    for i in _first_bad(split & ((te >= 0) != (de >= 0)) | ((de >= 0) & (de < te))):
        yield Violation(
            "INV-PD-1",
            f"decode enqueue {de[i]} µs vs transfer end {te[i]} µs",
            request=int(ids[i]),
            server=int(r["instance"][i]),
        )
    # INV-PD-2: prefill parts on prefill-capable pods, everything decoded on decode-capable pods
    inst = r["instance"]
    decoded_here = (inst >= 0) & (r["first_scheduled_us"] >= 0) & (~split | (de >= 0))
    for did, done, server, role in (
        ("prefill ran", split, prefill, "prefill"),
        ("decoded", decoded_here, inst, "decode"),
    ):
        capable = np.isin(roles, (role, "mixed"))
        for i in _first_bad(done & ~capable[np.maximum(server, 0)]):
            yield Violation(
                "INV-PD-2",
                f"{did} on a {roles[server[i]]} instance",
                request=int(ids[i]),
                server=int(server[i]),
            )
    for server in np.flatnonzero(roles == "none").tolist():
        if len(data.steps[server]["start_us"]):
            yield Violation("INV-PD-2", "an instance in no pool ran steps", server=server)
    # INV-PD-4: phase causality along the split request's chain
    for earlier, later in zip(chain, chain[1:]):
        a, b = r[earlier], r[later]
        for i in _first_bad(split & (a >= 0) & (b >= 0) & (b < a)):
            yield Violation(
                "INV-PD-4",
                f"{later} ({b[i]}) precedes {earlier} ({a[i]})",
                request=int(ids[i]),
                time_us=int(b[i]),
            )
    # INV-PD-5: pool membership fixed for the run
    if tuple(pd["roles"]) != tuple(pd["roles_at_end"]):
        yield Violation(
            "INV-PD-5", f"pools changed: {list(pd['roles'])} -> {list(pd['roles_at_end'])}"
        )
