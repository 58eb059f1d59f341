"""Run a scenario end to end: simulate, audit, summarise; the Python API behind the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from servesim.components.cluster import Cluster, RunRecord
from servesim.results import request_arrays, summarize, write_results
from servesim.simcore.audit import AuditInput, Violation, audit
from servesim.simcore.errors import AuditError


class Results:
    """A finished run: ``summary`` (dict), per-request arrays, the raw record, the audit verdict."""

    def __init__(self, scenario: Any, record: RunRecord, violations: list[Violation] | None):
        self.scenario = scenario
        self.record = record
        self.violations = violations
        verdict = (
            {"checked": False}
            if violations is None
            else {
                "checked": True,
                "passed": not violations,
                "violations": [str(v) for v in violations],
            }
        )
        self.summary = summarize(record, scenario, verdict)

    @property
    def requests(self) -> dict[str, np.ndarray]:
        """Per-request columns (ids ascending), e.g. ``results.requests["first_token_us"]``."""
        return request_arrays(self.record)

    def write(self, out_dir: str | Path) -> Path:
        """Write summary.json, requests.csv, timeseries.csv, steps.npz, scenario.yaml atomically."""
        return write_results(out_dir, self.summary, self.record, self.scenario)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"Results({s['completed_requests']}/{s['injected_requests']} completed, "
            f"ttft p50 {s['ttft_p50_ms']:.1f} ms, e2e p50 {s['e2e_p50_ms']:.1f} ms)"
        )


def audit_input(record: RunRecord) -> AuditInput:
    """The auditor's view of a run that just finished."""
    return AuditInput(
        requests=request_arrays(record),
        arrived=record.arrived,
        steps=[log.as_arrays() for log in record.step_logs],
        capacity=[info["kv_blocks"] for info in record.instances],
        notes=list(record.kv_problems),
        bounded=record.horizon_us is not None,
        snapshot_ages=[d[5] for d in record.decisions] if record.decisions is not None else (),
        snapshot_interval=record.snapshot_interval_us,
        sessions=record.sessions,
        session_rounds=record.session_rounds,
    )


def simulate(
    scenario: Any, *, check: bool | None = None, raise_on_violation: bool = True
) -> Results:
    """Simulate ``scenario`` and audit the run (unless ``check`` is False or the scenario says so).

    A violated invariant raises :class:`~servesim.simcore.errors.AuditError` listing every finding
    (pass ``raise_on_violation=False`` to get the Results with the violations instead).
    """
    record = Cluster(scenario).run()
    do_audit = scenario.audit.enabled if check is None else check
    violations = audit(audit_input(record)) if do_audit else None
    results = Results(scenario, record, violations)
    if violations and raise_on_violation:
        raise AuditError(violations)
    return results
