"""A results directory loaded for figures and reports: :class:`ResultsData` (numpy arrays of
every table, the summary, the step log) and :func:`load_results`.

The ITL distribution is rebuilt from ``steps.npz`` exactly as ``summary.json`` computes it (every
inter-token gap, α2 included); α2 is recovered from the summary and checked against its ITL mean
and percentiles. When that is impossible (no step log, or instances with different α2) the
per-request mean inter-token latency (TPOT) stands in, and the axis says so.
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servesim.analysis.saved import read_summary
from servesim.components.record import STEP_COLUMNS
from servesim.simcore.errors import ScenarioError

_STRING_COLUMNS = frozenset(
    {"status", "finish_reason", "slo_class", "tenant", "client", "link", "top_k", "pd_decision"}
    | {"state"}  # timeseries.csv of an autoscaled run: each instance's state
)
_REQUIRED = ("summary.json", "requests.csv", "timeseries.csv")


class FigureNotApplicable(ScenarioError):
    """The figure does not apply to this run (no gateway, not disaggregated, no step log)."""


@dataclass(frozen=True)
class ItlSample:
    """The inter-token latency distribution: values (ms) with multiplicities.

    ``exact`` is True when the values are every inter-token gap (as ``summary.json`` counts them),
    False when they are per-request means (TPOT) standing in; ``label`` is the axis label.
    """

    values_ms: np.ndarray
    weights: np.ndarray
    exact: bool
    alpha2_us: float | None
    label: str


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    """Columns of a CSV file: text columns as str arrays, the others as float (NaN = empty)."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ScenarioError(
            str(path), "", f"cannot read it ({exc}); re-run `servesim run` to regenerate it"
        ) from None
    if not header:
        raise ScenarioError(
            str(path), "", "the file is empty; re-run `servesim run` to regenerate it"
        )
    for line, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ScenarioError(
                f"{path.name} line {line}",
                row,
                f"has {len(row)} cells, the header {len(header)}; re-run `servesim run` to regenerate it",
            )
    columns = list(zip(*rows)) if rows else [()] * len(header)
    out: dict[str, np.ndarray] = {}
    for name, values in zip(header, columns):
        if name in _STRING_COLUMNS:
            out[name] = np.array(values, dtype=str) if values else np.zeros(0, dtype=str)
            continue
        try:
            out[name] = np.array([v if v != "" else "nan" for v in values], dtype=float)
        except ValueError:
            raise ScenarioError(
                f"{path.name} column {name}",
                next((v for v in values if not _is_number(v)), ""),
                "is not a number; re-run `servesim run` to regenerate the file",
            ) from None
    return out


def _is_number(text: str) -> bool:
    try:
        float(text or "nan")
    except ValueError:
        return False
    return True


@dataclass
class ResultsData:
    """A results directory in memory: the summary, per-request and per-step arrays.

    ``requests`` and ``transfers`` map CSV columns to arrays (times in s, latencies in ms, NaN
    for empty cells; text columns as str arrays); ``timeseries`` likewise; ``steps`` is the
    ``steps.npz`` archive (integer µs) or None if the run did not write it.
    """

    root: Path
    summary: dict[str, Any]
    requests: dict[str, np.ndarray]
    timeseries: dict[str, np.ndarray]
    steps: dict[str, np.ndarray] | None
    transfers: dict[str, np.ndarray] | None
    scenario_yaml: str = ""
    decisions: dict[str, np.ndarray] | None = None

    TABLES = ("requests", "timeseries", "instances", "steps", "transfers", "decisions")
    """The tables :meth:`to_pandas` returns."""

    def to_pandas(self, table: str = "requests") -> Any:
        """One of the run's tables as a pandas DataFrame (``pip install pandas``), with pandas'
        missing value (``pd.NA``) where a cell is empty: ``requests`` (requests.csv, by request
        id), ``timeseries`` (timeseries.csv), ``instances`` (summary.json's ``per_instance``),
        ``steps`` (steps.npz: one row per logged step, an ``instance`` column added),
        ``transfers`` (transfers.csv, disaggregated runs) and ``decisions`` (decisions.csv, runs
        with ``output.trace: decisions``). A table the run did not record is a ScenarioError."""
        try:
            import pandas as pd
        except ImportError:
            raise ScenarioError(
                "to_pandas", table, "needs pandas: pip install pandas (or servesim[pandas])"
            ) from None
        if table not in self.TABLES:
            raise ScenarioError("table", table, f"must be one of: {', '.join(self.TABLES)}")
        if table == "instances":
            frame = pd.DataFrame(self.summary.get("per_instance") or [])
        elif table == "steps":
            frame = pd.DataFrame(self._step_rows())
        else:
            columns = getattr(self, table)
            if columns is None:
                why = {
                    "transfers": "the run is not disaggregated (no transfers.csv)",
                    "decisions": "the run did not trace its decisions (output.trace: decisions)",
                }[table]
                raise ScenarioError("table", table, f"not recorded: {why}")
            frame = pd.DataFrame(columns)
        frame = frame.convert_dtypes()
        if table == "requests" and "id" in frame:
            frame = frame.set_index("id")
        return frame

    def _step_rows(self) -> dict[str, np.ndarray]:
        if self.steps is None:
            raise ScenarioError(
                "table", "steps", "not recorded: the run was written with output.steps: false"
            )
        rows: dict[str, list[np.ndarray]] = {"instance": []}
        for i in self.instances:
            prefix = f"i{i}_"
            names = [
                k[len(prefix) :]
                for k in self.steps
                if k.startswith(prefix) and k[len(prefix) :] in STEP_COLUMNS
            ]
            if not names:
                continue
            n = len(self.steps[prefix + names[0]])
            rows["instance"].append(np.full(n, i, dtype=np.int64))
            for name in names:
                rows.setdefault(name, []).append(self.steps[prefix + name])
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in rows.items()}

    @classmethod
    def load(cls, results_dir: str | Path) -> ResultsData:
        """Read a results directory; a missing or unreadable file raises a ScenarioError."""
        root = Path(results_dir)
        if not root.is_dir():
            # a run killed while replacing this directory left the previous result aside
            from servesim.analysis.writing import recover_results_dir

            recover_results_dir(root.absolute())
        if not root.is_dir():
            raise ScenarioError(
                "results_dir",
                str(root),
                "is not a directory; give a results directory written by `servesim run` (its --out)",
            )
        for name in _REQUIRED:
            if not (root / name).is_file():
                raise ScenarioError(
                    "results_dir",
                    str(root),
                    f"{name} is missing; give a directory written by `servesim run` (or "
                    "Results.write), or re-run the scenario to regenerate it",
                )
        summary = read_summary(root, "completed_requests")
        steps = None
        if (root / "steps.npz").is_file():
            try:
                with np.load(root / "steps.npz") as npz:
                    steps = {key: np.array(npz[key]) for key in npz.files}
            except (OSError, ValueError) as exc:
                raise ScenarioError(
                    str(root / "steps.npz"), "", f"cannot read it ({exc}); re-run to regenerate it"
                ) from None
        transfers = None
        if "pd" in summary:
            if not (root / "transfers.csv").is_file():
                raise ScenarioError(
                    "results_dir",
                    str(root),
                    "transfers.csv is missing (the run is disaggregated); re-run the scenario "
                    "to regenerate the results directory",
                )
            transfers = _read_csv(root / "transfers.csv")
        decisions = (
            _read_csv(root / "decisions.csv") if (root / "decisions.csv").is_file() else None
        )
        scenario_yaml = ""
        if (root / "scenario.yaml").is_file():
            scenario_yaml = (root / "scenario.yaml").read_text(encoding="utf-8")
        return cls(
            root=root,
            summary=summary,
            requests=_read_csv(root / "requests.csv"),
            timeseries=_read_csv(root / "timeseries.csv"),
            steps=steps,
            transfers=transfers,
            scenario_yaml=scenario_yaml,
            decisions=decisions,
        )

    @classmethod
    def from_results(cls, results: Any) -> ResultsData:
        """Load an in-memory ``servesim.run.Results`` (written to a temporary directory once)."""
        tmp = Path(tempfile.mkdtemp(prefix="servesim-plot-"))
        try:
            return cls.load(results.write(tmp / "run"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------ facts
    @property
    def name(self) -> str:
        return str(self.summary.get("scenario", {}).get("name") or self.root.name)

    @property
    def instances(self) -> list[int]:
        per = self.summary.get("per_instance") or []
        if per:
            return [int(p["index"]) for p in per]
        return sorted({int(i) for i in self.timeseries.get("instance", np.zeros(0))})

    @property
    def is_pd(self) -> bool:
        return "pd" in self.summary

    @property
    def flow_control(self) -> dict[str, Any] | None:
        return self.summary.get("scenario", {}).get("policies", {}).get("flow_control")

    @property
    def duration_s(self) -> float:
        """The end of the run: the summary's duration, or the last event if later."""
        end = float(self.summary.get("sim_duration_s", 0.0))
        for key in ("completion_s", "arrival_s"):
            column = self.requests.get(key)
            if column is not None and np.isfinite(column).any():
                end = max(end, float(np.nanmax(column)))
        return max(end, 1e-6)

    def column(self, name: str) -> np.ndarray:
        """A requests.csv column (NaN, or empty strings, if the file does not have it)."""
        n = len(self.requests.get("id", ()))
        if name in self.requests:
            return self.requests[name]
        return np.full(n, "", dtype=str) if name in _STRING_COLUMNS else np.full(n, np.nan)

    @property
    def completed(self) -> np.ndarray:
        return self.column("status") == "completed"

    @property
    def slo_classes(self) -> list[str]:
        return sorted({str(c) for c in self.column("slo_class")})

    def role(self, instance: int) -> str:
        """The instance's disaggregation pool (``prefill``, ``decode`` ...) or ``""``."""
        for role, pool in (self.summary.get("pd") or {}).get("pools", {}).items():
            if instance in pool.get("instances", ()):
                return role
        return ""

    def instance_label(self, instance: int) -> str:
        role = self.role(instance)
        return f"instance {instance}" + (f" ({role})" if role else "")

    def kv_blocks(self, instance: int) -> int:
        for p in self.summary.get("per_instance") or []:
            if int(p["index"]) == instance and p.get("kv_blocks"):
                return int(p["kv_blocks"])
        return int(self.summary.get("scenario", {}).get("engine", {}).get("kv_blocks") or 1)

    def check_instance(self, instance: int) -> None:
        known = self.instances
        if isinstance(instance, bool) or not isinstance(instance, (int, np.integer)):
            raise ScenarioError("instance", instance, "must be an instance index (an integer)")
        if instance not in known:
            raise ScenarioError(
                "instance",
                instance,
                f"the run has instances {_ranges(known)}; choose one of them",
            )

    def step_log(self, instance: int) -> dict[str, np.ndarray]:
        """One instance's step log (integer µs), or FigureNotApplicable without steps.npz."""
        self.check_instance(instance)
        if self.steps is None:
            raise FigureNotApplicable(
                "results_dir",
                str(self.root),
                "steps.npz was not written (output.steps: false); re-run with "
                "--set output.steps=true for the step-level figures",
            )
        prefix = f"i{instance}_"
        log = {k[len(prefix) :]: v for k, v in self.steps.items() if k.startswith(prefix)}
        if "start_us" not in log:
            raise ScenarioError(
                str(self.root / "steps.npz"),
                f"{prefix}start_us",
                "is missing from the archive; re-run the scenario to regenerate it",
            )
        return log

    def scenario_section(self, *keys: str) -> Any:
        """A section of scenario.yaml (None if absent or unreadable)."""
        if not self.scenario_yaml:
            return None
        import yaml

        try:
            node: Any = yaml.safe_load(self.scenario_yaml)
        except yaml.YAMLError:
            return None
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def slo_targets_ms(self) -> dict[str, dict[str, float]]:
        """The scenario's SLO targets per class, in ms (``{"critical": {"ttft": 500.0}}``), read
        by the scenario's own SLO parser; a saved ``slo`` section it refuses draws no target."""
        from servesim.scenario.policies import parse_slo_targets

        section = self.scenario_section("slo")
        if not isinstance(section, dict):
            return {}
        try:
            targets = parse_slo_targets(section)
        except ScenarioError:
            return {}
        out: dict[str, dict[str, float]] = {}
        for cls, target in targets.items():
            for key, us in (
                ("ttft", target.ttft_us),
                ("itl", target.itl_us),
                ("e2e", target.e2e_us),
            ):
                if us:
                    out.setdefault(cls, {})[key] = us / 1000.0
        return out

    # ------------------------------------------------------------------ ITL
    def _raw_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap without α2 (µs) and its multiplicity, as results.itl_gaps."""
        values, weights = [], []
        for i in self.instances:
            log = self.step_log(i)
            if len(log["dt_us"]):
                values.append(log["dt_us"].astype(np.float64))
                weights.append(log["regular_tokens"].astype(np.int64))
                burst = log.get("burst_tokens")
                if burst is not None and burst.any():
                    values.append(np.zeros(len(burst)))
                    weights.append(burst.astype(np.int64))
            irregular = log.get("irregular_gaps_us")
            if irregular is not None and len(irregular):
                values.append(irregular.astype(np.float64))
                weights.append(np.ones(len(irregular), np.int64))
        if not values:
            return np.zeros(0), np.zeros(0, np.int64)
        return np.concatenate(values), np.concatenate(weights)

    def _alpha2(self, raw: np.ndarray, weights: np.ndarray) -> float | None:
        """α2 (µs) such that raw gaps + α2 reproduce the summary's ITL statistics, if one does."""
        from servesim.analysis.metrics import weighted_percentile

        s = self.summary
        if "itl_mean_ms" not in s:
            return None
        total = weights.sum()
        mean_raw = float((raw * weights).sum() / total)
        candidates = []
        latency = s.get("scenario", {}).get("latency") or {}
        for described in (latency, latency.get("base") or {}):
            alpha = described.get("alpha") if isinstance(described, dict) else None
            if isinstance(alpha, list) and len(alpha) >= 3:
                candidates.append(float(int(alpha[2])))
        candidates.append(float(round(s["itl_mean_ms"] * 1000.0 - mean_raw)))
        for alpha2 in candidates:
            if alpha2 < 0:
                continue
            checks = [(mean_raw + alpha2) / 1000.0 - s["itl_mean_ms"]]
            for p in (50, 90, 99):
                if f"itl_p{p}_ms" in s:
                    got = weighted_percentile(raw + alpha2, weights, p) / 1000.0
                    checks.append(got - s[f"itl_p{p}_ms"])
            if all(abs(c) <= 1e-6 for c in checks):
                return alpha2
        return None

    def itl(self) -> ItlSample:
        """The ITL distribution: every gap from steps.npz, or per-request TPOT as a proxy."""
        if self.steps is not None:
            raw, weights = self._raw_gaps()
            keep = weights > 0
            raw, weights = raw[keep], weights[keep]
            if not len(raw):
                return ItlSample(raw, weights, True, None, "ITL, every inter-token gap (ms)")
            alpha2 = self._alpha2(raw, weights)
            if alpha2 is not None:
                return ItlSample(
                    (raw + alpha2) / 1000.0,
                    weights,
                    True,
                    alpha2,
                    "ITL, every inter-token gap (ms)",
                )
        tpot = self.column("tpot_ms")
        keep = self.completed & (self.column("output_tokens") > 1) & np.isfinite(tpot)
        return ItlSample(
            tpot[keep],
            np.ones(int(keep.sum()), np.int64),
            False,
            None,
            "TPOT: per-request mean inter-token latency (ms), standing in for ITL",
        )


def _ranges(values: list[int]) -> str:
    if not values:
        return "(none)"
    if values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}" if len(values) > 1 else str(values[0])
    return ", ".join(str(v) for v in values)


def load_results(results_dir: str | Path) -> ResultsData:
    """A results directory written by ``servesim run`` (or :meth:`Results.write`), loaded:
    ``.summary``, the tables (``.to_pandas("requests" | "timeseries" | "instances" | "steps" |
    "transfers" | "decisions")``) and the figures (``servesim.analysis.plots``). A missing or
    unreadable file is a ScenarioError naming it."""
    return ResultsData.load(results_dir)


def as_results_data(source: Any) -> ResultsData:
    """A run to plot: a :class:`ResultsData`, a results directory, or a ``servesim.Results``."""
    if isinstance(source, ResultsData):
        return source
    if isinstance(source, (str, os.PathLike)):
        return ResultsData.load(Path(source))
    if hasattr(source, "write") and hasattr(source, "summary"):
        return ResultsData.from_results(source)
    raise ScenarioError(
        "results",
        type(source).__name__,
        "give a results directory, a servesim Results object or a ResultsData",
    )
