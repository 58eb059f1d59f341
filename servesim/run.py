"""Run a scenario end to end: simulate, audit, summarise; the Python API behind the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from servesim.analysis.metrics import StepColumns, request_arrays
from servesim.analysis.summary import summarize
from servesim.audit import AuditInput, Violation, audit
from servesim.components.cluster import Cluster, RunRecord
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
        """Per-request columns (ids ascending), e.g. ``results.requests["first_token_us"]``.

        Every column in memory at once (24 × 8 bytes per request); to read one column of a very
        long run, ``servesim.analysis.metrics.request_arrays(results.record)[name]``."""
        return {name: np.array(column) for name, column in request_arrays(self.record).items()}

    @property
    def plot(self) -> Any:
        """Figures of this run (matplotlib, ``pip install 'servesim[plot]'``):
        ``results.plot.latency_cdfs()``, ``.latency_over_time()``, ``.instances()``,
        ``.gateway()``, ``.transfers()``, ``.gantt(instance, start_s, end_s)``,
        ``.save_all(dir)``, ``.report(file)``; each returns a matplotlib Figure."""
        accessor = self.__dict__.get("_plot")
        if accessor is None:
            from servesim.analysis.accessor import PlotAccessor

            accessor = self.__dict__["_plot"] = PlotAccessor(self)
        return accessor

    def to_pandas(self, table: str = "requests") -> Any:
        """A table of the run as a pandas DataFrame (``pip install pandas``).

        ``requests`` (the default): the integer-µs columns of :attr:`requests`, the coded
        columns (status, finish reason, SLO class, client, tenant) as their names, and
        ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` (NaN where a request did not get that far;
        ``tpot_ms`` is 0 for one output token, as in requests.csv). ``timeseries``,
        ``instances``, ``steps``, ``transfers``, ``decisions``: as the written results directory
        holds them (:meth:`servesim.analysis.plots.ResultsData.to_pandas`), with ``pd.NA`` for missing
        values."""
        if table != "requests":
            from servesim.analysis.plots.data import ResultsData

            return ResultsData.from_results(self).to_pandas(table)
        try:
            import pandas as pd
        except ImportError:
            from servesim.simcore.errors import ScenarioError

            raise ScenarioError(
                "to_pandas", None, "needs pandas: pip install pandas (or use .requests)"
            ) from None
        from servesim.components.record import STATUS_NAMES

        r = self.requests
        frame = pd.DataFrame(r)
        table = self.record.requests
        for name in table.CODED:
            labels = np.array(table.labels(name), dtype=object)
            frame[name] = labels[r[name]] if len(labels) else ""
        frame["status"] = np.array(STATUS_NAMES, dtype=object)[r["status"]]
        arrival = r["arrival_us"]
        first, done = r["first_token_us"], r["completion_us"]
        frame["ttft_ms"] = np.where(first >= 0, (first - arrival) / 1000.0, np.nan)
        frame["e2e_ms"] = np.where(done >= 0, (done - arrival) / 1000.0, np.nan)
        out = r["output_tokens"]
        tpot = np.where(out > 1, r["itl_sum_us"] / np.maximum(out - 1, 1) / 1000.0, 0.0)
        frame["tpot_ms"] = np.where(done >= 0, tpot, np.nan)  # 0 for one output token, as the CSV
        return frame.set_index("id")

    def write(self, out_dir: str | Path) -> Path:
        """Write summary.json, requests.csv, timeseries.csv, steps.npz, scenario.yaml atomically."""
        from servesim.analysis.writing import write_results  # not needed by --no-write runs

        return write_results(out_dir, self.summary, self.record, self.scenario)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"Results({s['completed_requests']}/{s['injected_requests']} completed, "
            f"ttft p50 {s['ttft_p50_ms']:.1f} ms, e2e p50 {s['e2e_p50_ms']:.1f} ms)"
        )


def _progress(scenario: Any, wanted: bool | None) -> Any:
    if wanted is False:
        return None
    from servesim.progress import RunProgress

    bar = RunProgress(getattr(scenario.workload, "num_requests", None), force=bool(wanted))
    return bar if bar.enabled else None


def audit_input(record: RunRecord) -> AuditInput:
    """The auditor's view of a run that just finished."""
    requests = request_arrays(record)
    return AuditInput(
        requests=requests,
        arrived=record.arrived,
        steps=[StepColumns(log) for log in record.step_logs],
        capacity=[info["kv_blocks"] for info in record.instances],
        notes=list(record.kv_problems),
        bounded=record.horizon_us is not None,
        decisions=_decisions(record),
        snapshot_interval=record.snapshot_interval_us,
        sessions=record.sessions,
        session_rounds=record.session_rounds,
        pd=_pd_audit(record, requests) if record.pd is not None else None,
        swap=[_swap_books(info) for info in record.instances],
        alpha2_us=record.instances_alpha2,
        post_decode_us=record.instances_post_decode,
        max_model_len=[info["max_model_len"] for info in record.instances],
        irregular_tokens=[len(log.irregular_gaps_us) for log in record.step_logs],
        encode=getattr(record, "encode", None),
        fleet=record.fleet,
        lora=getattr(record, "lora", None),  # LoRA / several models (servesim.audit.adapters)
    )


def _decisions(record: RunRecord) -> dict[str, np.ndarray] | None:
    """The traced routing decisions as the auditor reads them (None: not traced)."""
    if record.decisions is None:
        return None
    d = record.decisions
    columns = {
        "time_us": [x[0] for x in d],
        "request": [x[1] for x in d],
        "chosen": [x[2] for x in d],
        "age_us": [x[5] for x in d],
        "taken_us": record.snapshot_taken_us,
    }
    return {k: np.array(v, dtype=np.int64).reshape(-1) for k, v in columns.items()}


def _swap_books(info: dict) -> dict:
    """One instance's swap-space counters for the auditor (empty when it never swapped)."""
    if not info.get("swap_outs"):
        return {}
    return {
        "space": info["swap_blocks"],
        "peak": info["swap_peak_blocks"],
        "out_blocks": info["swap_out_blocks"],
        "in_blocks": info["swap_in_blocks"],
        "used_end": info["swap_used_blocks"],
        "outs": info["swap_outs"],
        "ins": info["swap_ins"],
    }


def _pd_audit(record: RunRecord, requests: dict) -> dict:
    """What the auditor needs to check a disaggregated run (INV-PD-1…5 and the links)."""
    from servesim.audit.transfer_schedule import check_transfers

    def transfers() -> list[str]:
        t = record.transfers.as_arrays()
        problems = check_transfers(
            t,
            record.transfers.changes_as_arrays(),
            record.links,
            started=record.pd["transfers_started"],
            in_flight=record.transfer_in_flight,
        )
        # every delivered transfer carried its request's blocks, sized by its prefill instance
        ids = requests["id"]
        rows = np.searchsorted(ids, t["id"])
        rows = np.minimum(rows, max(len(ids) - 1, 0))
        block_bytes = np.asarray(record.block_bytes, dtype=np.float64)
        expected = requests["transfer_blocks"][rows] * block_bytes[t["prefill_instance"]]
        wrong = (ids[rows] != t["id"]) | (
            np.abs(expected - t["bytes"]) > 1e-9 * np.maximum(expected, 1.0)
        )
        for i in np.flatnonzero(wrong)[:20]:
            problems.append(
                f"transfer of request {int(t['id'][i])} carried {t['bytes'][i]:.0f} bytes, "
                f"its request row implies {expected[i]:.0f}"
            )
        return problems

    return {
        "roles": record.roles,
        "roles_at_end": record.roles_at_end,
        "transfers_started": record.pd["transfers_started"],
        "transfers_completed": record.pd["transfers_completed"],
        "in_flight": record.transfer_in_flight,
        "check_transfers": transfers,
    }


def simulate(
    scenario: Any,
    *,
    check: bool | None = None,
    raise_on_violation: bool = True,
    progress: bool | None = None,
) -> Results:
    """Simulate ``scenario`` and audit the run (unless ``check`` is False or the scenario says so).

    A violated invariant raises :class:`~servesim.simcore.errors.AuditError` listing every finding
    (pass ``raise_on_violation=False`` to get the Results with the violations instead).
    ``progress``: show a progress bar (requests, simulated time, ETA) on stderr once the run has
    taken 2 s — by default only when stderr is a terminal; ``False`` never, ``True`` always.
    """
    record = Cluster(scenario, _progress(scenario, progress)).run()
    do_audit = scenario.audit.enabled if check is None else check
    violations = audit(audit_input(record)) if do_audit else None
    results = Results(scenario, record, violations)
    if violations and raise_on_violation:
        raise AuditError(violations)
    return results
