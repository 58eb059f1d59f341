"""Read a saved results directory back, for ``servesim audit`` (users audit their own runs)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from servesim.audit import AuditInput, Violation, audit
from servesim.components.record import STATUS_NAMES, STEP_COLUMNS
from servesim.simcore.errors import ScenarioError

_TIME_COLUMNS = {
    "arrival_s": "arrival_us",
    "enqueue_s": "enqueue_us",
    "first_scheduled_s": "first_scheduled_us",
    "first_token_s": "first_token_us",
    "completion_s": "completion_us",
}


# disaggregated serving (requests.csv has these columns when the run had cluster.pools)
_PD_TIME_COLUMNS = {
    "prefill_end_s": "prefill_end_us",
    "transfer_start_s": "transfer_start_us",
    "transfer_end_s": "transfer_end_us",
    "decode_enqueue_s": "decode_enqueue_us",
}


def _us(text: str) -> int:
    return -1 if text == "" else int(round(float(text) * 1e6))


def read_summary(root: Path, needs: str) -> dict[str, Any]:
    """A results directory's summary.json, refused with a one-line error naming the file when it
    cannot be read or is not a servesim summary (it lacks the ``needs`` field)."""
    file = root / "summary.json"
    try:
        summary = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScenarioError(
            str(file), "", f"cannot read it ({exc}); re-run to regenerate it"
        ) from None
    if not isinstance(summary, dict) or needs not in summary:
        raise ScenarioError(str(file), "", f"not a servesim summary (no {needs})")
    return summary


def load_audit_input(results_dir: str | Path) -> tuple[AuditInput, dict[str, Any]]:
    root = Path(results_dir)
    for name in ("summary.json", "requests.csv", "steps.npz"):
        if not (root / name).exists():
            raise ScenarioError(
                "results_dir",
                str(root),
                f"{name} is missing; give a directory written by `servesim run`"
                + (" with output.steps: true" if name == "steps.npz" else ""),
            )
    summary = read_summary(root, "injected_requests")
    status_code = {name: i for i, name in enumerate(STATUS_NAMES)}
    pd_summary = summary.get("pd")
    times = dict(_TIME_COLUMNS, **(_PD_TIME_COLUMNS if pd_summary is not None else {}))
    ints = ("instance", "output_tokens") + (("prefill_instance",) if pd_summary else ())
    cols: dict[str, list[int]] = {k: [] for k in ("id", "status", *ints, *times.values())}
    with open(root / "requests.csv", newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for line, row in enumerate(reader, start=2):
            try:
                cols["id"].append(int(row["id"]))
                cols["status"].append(status_code[row["status"]])
                for name in ints:
                    cols[name].append(int(row[name]))
                for src, dst in times.items():
                    cols[dst].append(_us(row[src]))
            except (KeyError, ValueError) as exc:
                raise ScenarioError(
                    f"requests.csv line {line}", row, f"malformed row ({exc})"
                ) from None
    requests = {k: np.array(v, dtype=np.int64) for k, v in cols.items()}
    steps, capacity = [], []
    instances = summary.get("scenario", {}).get("instances", 1)
    kv_blocks = summary.get("scenario", {}).get("engine", {}).get("kv_blocks", 0)
    per_instance = summary.get("per_instance") or []
    try:
        with np.load(root / "steps.npz") as npz:
            for i in range(instances):
                log = {name: np.array(npz[f"i{i}_{name}"]) for name in STEP_COLUMNS}
                if f"i{i}_blocked_us" in npz:
                    log["blocked_us"] = np.array(npz[f"i{i}_blocked_us"])
                steps.append(log)
                own = per_instance[i].get("kv_blocks") if i < len(per_instance) else None
                capacity.append(own if own is not None else kv_blocks)
    except (OSError, ValueError, KeyError) as exc:
        raise ScenarioError(
            str(root / "steps.npz"), "", f"cannot read it ({exc}); re-run to regenerate"
        ) from None
    # KV recounts happen during the run; keep their findings (without the stored "INV-4: " prefix)
    notes = [
        v.split(": ", 1)[1]
        for v in summary.get("audit", {}).get("violations", [])
        if v.startswith("INV-4: ")
    ]
    bounded = summary.get("scenario", {}).get("horizon_us") is not None or summary.get(
        "interrupted", False
    )
    pd = None
    if pd_summary is not None:
        # pools and transfer counters from the summary; the link log is not saved, so the
        # transfer-level checks (bytes, fair share) are not repeated here
        roles = ["none"] * instances
        for role, pool in pd_summary["pools"].items():
            for i in pool["instances"]:
                roles[i] = role
        pd = {
            "roles": tuple(roles),
            "roles_at_end": tuple(roles),
            "transfers_started": pd_summary["transfers_started"],
            "transfers_completed": pd_summary["transfers_completed"],
            "in_flight": pd_summary["transferring"],
        }
    data = AuditInput(
        requests=requests,
        arrived=int(summary["injected_requests"]),
        steps=steps,
        capacity=capacity,
        notes=notes,
        bounded=bool(bounded),
        pd=pd,
    )
    return data, summary


def audit_saved_run(results_dir: str | Path) -> tuple[list[Violation], dict[str, Any]]:
    data, summary = load_audit_input(results_dir)
    return audit(data), summary
