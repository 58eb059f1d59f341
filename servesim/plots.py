"""Figures of a run: ``servesim plot``, :func:`save_all` and the ``Results.plot`` shortcuts.

Every figure is drawn from a results directory (what ``servesim run`` or ``Results.write``
writes), loaded once by :class:`ResultsData` into numpy arrays. One function per figure takes the
loaded data and returns a :class:`matplotlib.figure.Figure`:

* :func:`latency_cdfs` — TTFT, ITL and E2E distributions, one line per SLO class;
* :func:`latency_over_time` — TTFT, TPOT and E2E of each request against its arrival time;
* :func:`instance_timeseries` — per-instance queue depth, batch size and KV utilisation;
* :func:`gateway_queue` — the gateway queue depth and the refused requests (flow control only);
* :func:`transfer_timeline` — KV transfers on each link (disaggregated serving only);
* :func:`step_gantt` — the engine steps of one instance in a time window.

matplotlib is imported only when a figure is drawn (``pip install 'servesim[plot]'``). Figures
are plain :class:`~matplotlib.figure.Figure` objects rendered with the Agg canvas: pyplot's global
state and backend are left alone, so they work in scripts, servers and notebooks alike.

The ITL distribution is rebuilt from ``steps.npz`` exactly as ``summary.json`` computes it (every
inter-token gap, α2 included); α2 is recovered from the summary and checked against its ITL mean
and percentiles. When that is impossible (no step log, or instances with different α2) the
per-request mean inter-token latency (TPOT) stands in, and the axis says so.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servesim.components.record import STEP_COLUMNS
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic

__all__ = [
    "FIGURES",
    "FigureNotApplicable",
    "ItlSample",
    "PlotAccessor",
    "ResultsData",
    "SavedFigures",
    "add_plot_parser",
    "build_figures",
    "cmd_plot",
    "figure_caption",
    "gateway_queue",
    "instance_timeseries",
    "latency_cdfs",
    "latency_over_time",
    "parse_window",
    "save_all",
    "save_figures",
    "step_gantt",
    "transfer_timeline",
]

INSTALL_HINT = "pip install 'servesim[plot]'"
GANTT_DEFAULT_STEPS = 200  # steps shown when no window end is given
GANTT_MAX_STEPS = 2000  # most steps a Gantt draws; a wider window is cut, with a note
TIMESERIES_BINS = 1000  # bins of the per-instance time series drawn from steps.npz
CDF_MAX_POINTS = 4000  # points per CDF line (more are thinned evenly in rank)
DPI = 110

_STRING_COLUMNS = frozenset(
    {"status", "finish_reason", "slo_class", "tenant", "client", "link", "top_k", "pd_decision"}
)
_REQUIRED = ("summary.json", "requests.csv", "timeseries.csv")


class FigureNotApplicable(ScenarioError):
    """The figure does not apply to this run (no gateway, not disaggregated, no step log)."""


# ---------------------------------------------------------------------- loading


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
        try:
            summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ScenarioError(
                str(root / "summary.json"), "", f"cannot read it ({exc}); re-run to regenerate it"
            ) from None
        if not isinstance(summary, dict) or "completed_requests" not in summary:
            raise ScenarioError(
                str(root / "summary.json"), "", "not a servesim summary (no completed_requests)"
            )
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
        decisions = _read_csv(root / "decisions.csv") if (root / "decisions.csv").is_file() else None
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
        """The scenario's SLO targets per class, in ms (``{"critical": {"ttft": 500.0}}``)."""
        from servesim.simcore.config import parse_duration_us

        out: dict[str, dict[str, float]] = {}
        section = self.scenario_section("slo")
        if not isinstance(section, dict):
            return out
        for cls, targets in section.items():
            if not isinstance(targets, dict):
                continue
            for key in ("ttft", "itl", "e2e"):
                if key in targets:
                    with contextlib.suppress(ScenarioError):
                        out.setdefault(str(cls), {})[key] = (
                            parse_duration_us(targets[key], f"slo.{cls}.{key}") / 1000.0
                        )
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
        from servesim.results import weighted_percentile

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


def _as_data(source: Any) -> ResultsData:
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


# ---------------------------------------------------------------------- matplotlib helpers


_FIGURE_CLASSES: dict[type, type] = {}


def _matplotlib() -> tuple[Any, Any]:
    """(figure class, FigureCanvasAgg), imported on use; a clear error if matplotlib is missing.

    The figure class is matplotlib's Figure with a ``_repr_png_``, so a figure returned in a
    notebook cell shows itself even when pyplot (and its inline backend) was never imported.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ScenarioError(
            "plot",
            "matplotlib",
            f"matplotlib is not installed; install the plotting extra: {INSTALL_HINT}",
        ) from None
    if Figure not in _FIGURE_CLASSES:

        class RunFigure(Figure):
            """A servesim figure: a matplotlib Figure on the Agg canvas that notebooks display."""

            def _repr_png_(self) -> bytes:
                buf = io.BytesIO()
                self.savefig(buf, format="png", dpi=DPI)
                return buf.getvalue()

        RunFigure.__qualname__ = "RunFigure"  # importable as servesim.plots.RunFigure (pickle)
        _FIGURE_CLASSES[Figure] = RunFigure
    return _FIGURE_CLASSES[Figure], FigureCanvasAgg


def __getattr__(name: str) -> Any:
    """``servesim.plots.RunFigure``: the figure class, created when matplotlib is first needed."""
    if name == "RunFigure":
        return _matplotlib()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _figure(nrows: int, ncols: int, size: tuple[float, float], **kw: Any) -> tuple[Any, Any]:
    figure_class, canvas_class = _matplotlib()
    fig = figure_class(figsize=size, dpi=DPI, layout="constrained")
    canvas_class(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _finish(fig: Any, title: str, data: ResultsData, caption: str, note: str = "") -> Any:
    """Title the figure, print ``note`` under it, remember the caption for reports."""
    fig.suptitle(f"{title} — {data.name}", fontsize=13, fontweight="bold")
    if note:
        fig.get_layout_engine().set(rect=(0, 0.045, 1, 0.955))
        fig.text(0.01, 0.008, note, fontsize=8, color="0.3", ha="left", va="bottom", wrap=True)
    fig.servesim_caption = caption + (f" Note: {note}" if note else "")
    return fig


def figure_caption(fig: Any) -> str:
    """The caption a figure function attached (what it shows and how it was derived)."""
    return str(getattr(fig, "servesim_caption", ""))


def _class_colors(classes: list[str]) -> dict[str, str]:
    return {c: f"C{i % 10}" for i, c in enumerate(classes)}


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


def _cdf(values: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of an empirical distribution, thinned to CDF_MAX_POINTS points."""
    order = np.argsort(values, kind="stable")
    x = values[order]
    w = np.ones(len(x)) if weights is None else weights[order].astype(np.float64)
    y = np.cumsum(w) / w.sum()
    if len(x) > CDF_MAX_POINTS:
        keep = np.unique(np.linspace(0, len(x) - 1, CDF_MAX_POINTS).astype(np.int64))
        x, y = x[keep], y[keep]
    return x, y


def _wide(values: np.ndarray) -> bool:
    """Whether values spread over more than 1.5 decades (then a log axis reads better)."""
    positive = values[np.isfinite(values) & (values > 0)]
    return len(positive) > 1 and float(positive.max()) / float(positive.min()) > 30.0


def _quantile_marks(ax: Any) -> None:
    for q, label in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        ax.axhline(q, color="0.75", lw=0.7, ls=":", zorder=0)
        ax.text(1.0, q, f" {label}", transform=ax.get_yaxis_transform(), fontsize=7, va="center")


# ---------------------------------------------------------------------- figures


def latency_cdfs(data: ResultsData) -> Any:
    """TTFT, ITL and E2E CDFs of completed requests, one line per SLO class (plus all classes).

    The ITL panel's solid black line is every inter-token gap of the run (as the summary's ITL
    percentiles); gaps cannot be attributed to a class, so with several classes each class is
    drawn as its per-request mean ITL (TPOT), dashed. Dotted vertical lines are SLO targets.
    """
    fig, axes = _figure(1, 3, (15, 4.8))
    done = data.completed
    classes = sorted({str(c) for c in data.column("slo_class")[done]})
    colors = _class_colors(data.slo_classes)
    cls = data.column("slo_class")
    targets = data.slo_targets_ms()
    itl = data.itl()
    tpot = data.column("tpot_ms")
    panels = (
        ("ttft", "Time to first token", "TTFT (ms)", data.column("ttft_ms")),
        ("itl", "Inter-token latency", itl.label, tpot),
        ("e2e", "End-to-end latency", "E2E latency (ms)", data.column("e2e_ms")),
    )
    for ax, (key, title, xlabel, values) in zip(axes[0], panels):
        drawn: list[np.ndarray] = []
        if key == "itl" and itl.exact and len(itl.values_ms):
            x, y = _cdf(itl.values_ms, itl.weights)
            ax.plot(
                x,
                y,
                color="black",
                lw=1.8,
                drawstyle="steps-post",
                label=f"all classes, every gap (n={int(itl.weights.sum()):,})",
            )
            drawn.append(itl.values_ms)
        per_class = key != "itl" or not itl.exact or len(classes) > 1
        if per_class:
            if key == "itl":
                keep = done & (data.column("output_tokens") > 1) & np.isfinite(values)
            else:
                keep = done & np.isfinite(values)
            if key != "itl" and len(classes) > 1 and keep.any():
                x, y = _cdf(values[keep])
                ax.plot(
                    x,
                    y,
                    color="black",
                    lw=1.8,
                    drawstyle="steps-post",
                    label=f"all classes (n={int(keep.sum()):,})",
                )
            for c in classes:
                mine = keep & (cls == c)
                if not mine.any():
                    continue
                x, y = _cdf(values[mine])
                label = f"{c} (n={int(mine.sum()):,})"
                if key == "itl" and itl.exact:
                    label = f"{c}: per-request mean, TPOT (n={int(mine.sum()):,})"
                ax.plot(
                    x,
                    y,
                    color=colors[c],
                    lw=1.3,
                    drawstyle="steps-post",
                    ls="--" if key == "itl" and itl.exact else "-",
                    label=label,
                )
                drawn.append(values[mine])
        if drawn:
            every = np.concatenate(drawn)
            every = every[np.isfinite(every)]
            log_x = _wide(every)
            if log_x:
                ax.set_xscale("log")
                low = float(every[every > 0].min()) / 1.2
                high = float(every.max()) * 1.2
            else:
                span = float(every.max() - every.min()) or 1.0
                low, high = float(every.min()) - 0.03 * span, float(every.max()) + 0.03 * span
            ax.set_xlim(low, high)
            for c in classes:
                target = targets.get(c, {}).get(key)
                if not target:
                    continue
                label = f"{c} {key.upper()} target {target:g} ms"
                if low <= target <= high:
                    ax.axvline(target, color=colors[c], ls=":", lw=1.2, label=label)
                else:
                    ax.plot([], [], color=colors[c], ls=":", label=label + " (off scale)")
            ax.legend(fontsize=7, loc="lower right")
        else:
            _empty(ax, "no completed requests")
        _quantile_marks(ax)
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction ≤ x" if key == "itl" else "fraction of completed requests ≤ x")
        ax.grid(True, alpha=0.3)
    note = ""
    if not itl.exact:
        note = (
            "ITL: the per-gap values could not be rebuilt (no steps.npz, or α2 not recoverable "
            "from summary.json), so the per-request mean inter-token latency (TPOT) is shown."
        )
    caption = (
        "Cumulative distributions of time to first token, inter-token latency and end-to-end "
        "latency of completed requests, per SLO class. Read a percentile off the dotted "
        "horizontal lines (p50, p90, p99): a line further right is slower. "
        + (
            "The black ITL line is every inter-token gap of the run, α2 included "
            f"(α2 = {itl.alpha2_us:g} µs), as summary.json's ITL percentiles; dashed class lines "
            "are per-request mean ITLs (TPOT), since gaps are not attributed to classes. "
            if itl.exact and itl.alpha2_us is not None
            else ""
        )
        + ("Dotted vertical lines are the scenario's SLO targets." if targets else "")
    )
    return _finish(fig, "Latency distributions", data, caption, note)


def latency_over_time(data: ResultsData, *, bins: int = 40) -> Any:
    """TTFT, TPOT and E2E of each completed request against its arrival time, with p50/p99 bands."""
    fig, axes = _figure(3, 1, (12, 9.5), sharex=True)
    done = data.completed
    arrival = data.column("arrival_s")
    cls = data.column("slo_class")
    classes = sorted({str(c) for c in cls[done]})
    colors = _class_colors(data.slo_classes)
    arrivals = arrival[np.isfinite(arrival)]
    end = float(arrivals.max()) * 1.01 if len(arrivals) else data.duration_s
    end = max(end, 1e-6)
    edges = np.linspace(0.0, end, bins + 1)
    panels = (
        ("ttft_ms", "Time to first token", "TTFT (ms)"),
        ("tpot_ms", "Time per output token (per-request mean inter-token latency)", "TPOT (ms)"),
        ("e2e_ms", "End-to-end latency", "E2E latency (ms)"),
    )
    not_done = ~done & np.isfinite(arrival)
    for row, (key, title, ylabel) in enumerate(panels):
        ax = axes[row, 0]
        values = data.column(key)
        keep = done & np.isfinite(values) & np.isfinite(arrival)
        if key == "tpot_ms":
            keep &= data.column("output_tokens") > 1
        for c in classes:
            mine = keep & (cls == c)
            if mine.any():
                ax.scatter(
                    arrival[mine],
                    values[mine],
                    s=5,
                    alpha=0.45,
                    color=colors[c],
                    lw=0,
                    rasterized=True,
                    label=f"{c} (n={int(mine.sum()):,})",
                )
        if keep.sum() >= 5:
            which = np.clip(np.searchsorted(edges, arrival[keep], side="right") - 1, 0, bins - 1)
            centers, p50, p99 = [], [], []
            for b in range(bins):
                v = values[keep][which == b]
                if len(v) >= 5:
                    centers.append((edges[b] + edges[b + 1]) / 2)
                    p50.append(np.percentile(v, 50))
                    p99.append(np.percentile(v, 99))
            if centers:
                ax.plot(centers, p50, color="black", lw=1.4, label="p50 per window (all classes)")
                ax.plot(
                    centers,
                    p99,
                    color="black",
                    lw=1.4,
                    ls="--",
                    label="p99 per window (all classes)",
                )
        if key == "ttft_ms" and not_done.any():
            ax.plot(
                arrival[not_done],
                np.full(int(not_done.sum()), 0.97),
                "|",
                color="red",
                ms=8,
                transform=ax.get_xaxis_transform(),
                label=f"not completed ({int(not_done.sum()):,}): arrival time",
            )
        if keep.any():
            if _wide(values[keep]):
                ax.set_yscale("log")
        else:
            _empty(ax, "no completed requests")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=2)
    axes[-1, 0].set_xlabel("arrival time (s)")
    axes[-1, 0].set_xlim(0, end)
    caption = (
        "Latency of each completed request (dots, coloured by SLO class) against its arrival "
        f"time; black lines are the p50 (solid) and p99 (dashed) of requests arriving in each "
        f"{end / bins:.3g} s window. Rising lines mean queues were building up; red ticks mark "
        "arrivals of requests that did not complete (refused, dropped, or unfinished at the end)."
    )
    return _finish(fig, "Latency over time", data, caption)


def _binned_max(
    starts: np.ndarray, ends: np.ndarray, values: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Per bin, the largest value of the steps that overlap it (0 where the instance was idle)."""
    nb = len(edges) - 1
    if not len(starts):
        return np.zeros(nb)
    lo = edges[:-1]
    idx = np.searchsorted(starts, lo, side="right") - 1
    safe = np.maximum(idx, 0)
    running = (idx >= 0) & (lo < ends[safe])
    out = np.where(running, values[safe], 0).astype(np.float64)
    which = np.searchsorted(edges, starts, side="right") - 1
    inside = (which >= 0) & (which < nb)
    np.maximum.at(out, which[inside], values[inside].astype(np.float64))
    return out


def instance_timeseries(data: ResultsData, *, instances: list[int] | None = None) -> Any:
    """Per-instance wait-queue depth, batch size and KV-cache utilisation over time."""
    chosen = data.instances if instances is None else list(instances)
    for i in chosen:
        data.check_instance(i)
    fig, axes = _figure(3, 1, (12, 9.5), sharex=True)
    end_s = data.duration_s
    panels = (
        ("waiting", "Wait-queue depth", "waiting requests (requests)"),
        ("batch_size", "Batch size", "running batch (requests)"),
        ("kv", "KV-cache utilisation", "KV blocks in use (%)"),
    )
    if data.steps is not None:
        nb = int(min(TIMESERIES_BINS, max(1, math.ceil(end_s * 1000))))
        edges = np.linspace(0.0, end_s * 1e6, nb + 1)
        x = edges[:-1] / 1e6
        width_ms = end_s * 1000 / nb
        source = (
            f"From steps.npz: each point is the largest value of the steps running in a "
            f"{width_ms:.3g} ms bin (0 = idle)."
        )
        for i in chosen:
            log = data.step_log(i)
            starts = log["start_us"]
            ends = starts + log["dt_us"]
            series = {
                "waiting": _binned_max(starts, ends, log["waiting"], edges),
                "batch_size": _binned_max(starts, ends, log["batch_size"], edges),
                "kv": _binned_max(starts, ends, log["kv_used"], edges) / data.kv_blocks(i) * 100,
            }
            for row, (key, _, _) in enumerate(panels):
                axes[row, 0].plot(
                    x, series[key], drawstyle="steps-post", lw=1.0, label=data.instance_label(i)
                )
    else:
        ts = data.timeseries
        interval = np.diff(np.unique(ts["time_s"]))
        source = "From timeseries.csv: the step in progress at each sample" + (
            f", every {interval[0]:g} s." if len(interval) else "."
        )
        for i in chosen:
            mine = ts["instance"] == i
            series = {
                "waiting": ts["waiting"][mine],
                "batch_size": ts["batch_size"][mine],
                "kv": ts["kv_utilization"][mine] * 100,
            }
            for row, (key, _, _) in enumerate(panels):
                axes[row, 0].plot(
                    ts["time_s"][mine],
                    series[key],
                    lw=1.0,
                    marker=".",
                    ms=4,
                    label=data.instance_label(i),
                )
    for row, (_, title, ylabel) in enumerate(panels):
        ax = axes[row, 0]
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", ncol=max(1, math.ceil(len(chosen) / 8)))
    axes[2, 0].set_ylim(0, 105)
    axes[-1, 0].set_xlabel("simulated time (s)")
    axes[-1, 0].set_xlim(0, end_s)
    caption = (
        "Per instance: requests in the wait queue, requests in the running batch, and the share "
        "of KV-cache blocks held. A queue that grows while the batch is at max_num_seqs, or KV "
        "near 100% (preemptions), marks saturation."
    )
    return _finish(fig, "Instance load over time", data, caption, source)


def _depth(enter: np.ndarray, leave: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step function (times, depth) of intervals [enter, leave): leaving sorts before entering."""
    times = np.concatenate([[0.0], enter, leave])
    delta = np.concatenate([[0], np.ones(len(enter), np.int64), -np.ones(len(leave), np.int64)])
    order = np.lexsort((delta, times))
    return times[order], np.cumsum(delta[order])


def gateway_queue(data: ResultsData, *, bins: int = 60) -> Any:
    """Gateway queue depth over time (derived from requests.csv) and the refused requests.

    Flow-control runs only. Requests released by the gateway count from arrival (+ admission
    latency) for ``gateway_wait_ms``; expired ones for the flow-control ``ttl``; requests still
    queued at the end until the end. Shed requests are not counted (when they left is not
    recorded); the gateway's recorded peak depth is given for comparison.
    """
    fc = data.flow_control
    if fc is None:
        raise FigureNotApplicable(
            "gateway_queue",
            str(data.root),
            "the run has no gateway queue (policies.flow_control is not set)",
        )
    from servesim.simcore.config import parse_duration_us

    fig, axes = _figure(2, 1, (12, 7.5), sharex=True)
    arrival = data.column("arrival_s")
    status = data.column("status")
    cls = data.column("slo_class")
    admission = data.summary.get("scenario", {}).get("cluster", {}).get("admission_latency_us", 0)
    enter = arrival + (admission or 0) / 1e6
    wait_s = data.column("gateway_wait_ms") / 1000.0
    released = np.isfinite(wait_s) & (wait_s > 0)
    leave = np.where(released, enter + np.nan_to_num(wait_s), np.nan)
    ttl_us = 0
    ttl = data.scenario_section("policies", "flow_control", "ttl")
    if ttl is not None:
        with contextlib.suppress(ScenarioError):
            ttl_us = parse_duration_us(ttl, "policies.flow_control.ttl")
    expired = status == "expired"
    if ttl_us:
        leave = np.where(expired, enter + ttl_us / 1e6, leave)
    leave = np.where(status == "gateway_queued", data.duration_s, leave)
    last = [float(np.nanmax(v)) for v in (arrival, leave) if np.isfinite(v).any()]
    end = max(max(last, default=0.0) * 1.01, 1e-6)
    counted = np.isfinite(leave) & np.isfinite(enter)
    ax = axes[0, 0]
    t, d = _depth(enter[counted], leave[counted])
    ax.plot(t, d, drawstyle="steps-post", color="black", lw=1.4, label="all classes")
    classes = sorted({str(c) for c in cls[counted]})
    colors = _class_colors(data.slo_classes)
    if len(classes) > 1:
        for c in classes:
            mine = counted & (cls == c)
            t, d = _depth(enter[mine], leave[mine])
            ax.plot(t, d, drawstyle="steps-post", color=colors[c], lw=1.0, label=c)
    max_queue = fc.get("max_queue") or 0
    if max_queue:
        ax.axhline(max_queue, color="red", ls="--", lw=1.0, label=f"max_queue = {max_queue}")
    peak = data.summary.get("anomalies", {}).get("gateway_peak_depth")
    ax.set_title(
        "Gateway queue depth (derived from requests.csv)"
        + (f"; recorded peak {peak}" if peak is not None else ""),
        fontsize=10,
    )
    ax.set_ylabel("queue depth (requests)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")

    ax = axes[1, 0]
    edges = np.linspace(0.0, end, bins + 1)
    width = end / bins
    bottom = np.zeros(bins)
    kinds = (
        ("rejected", "rejected (full queue or admission)", "C3"),
        ("shed", "shed (room made for a more important request)", "C1"),
        ("expired", "expired (waited the ttl)", "C4"),
    )
    for kind, label, color in kinds:
        mine = (status == kind) & np.isfinite(arrival)
        counts = np.histogram(arrival[mine], bins=edges)[0]
        ax.bar(
            edges[:-1],
            counts,
            width=width,
            bottom=bottom,
            align="edge",
            color=color,
            label=f"{label}: {int(mine.sum()):,}",
        )
        bottom += counts
    ax.set_title("Requests refused by the gateway, by arrival time", fontsize=10)
    ax.set_ylabel(f"requests per {width:.3g} s")
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(0, end)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    shed = int((status == "shed").sum())
    note = (
        "Queue depth derived from requests.csv (the run records no gateway time series): a "
        "released request counts from arrival"
        + (" + admission latency" if admission else "")
        + " for its gateway_wait_ms"
        + (f", an expired one for the ttl ({ttl_us / 1000:g} ms)" if ttl_us else "")
        + (
            f"; {shed} shed request(s) are not counted (when they left is not recorded)"
            if shed
            else ""
        )
        + "."
    )
    caption = (
        "Top: requests waiting in the flow-control gateway queue, in total and per SLO class. "
        "Bottom: requests the gateway refused (rejected when full, shed for a more important "
        "one, expired after the ttl), counted by arrival time. A queue pinned at max_queue with "
        "refusals below it means the cluster is saturated and flow control is shedding load."
    )
    return _finish(fig, "Gateway queue", data, caption, note)


def transfer_timeline(data: ResultsData) -> Any:
    """KV transfers of a disaggregated run: each transfer on its link, concurrency, durations."""
    if not data.is_pd or data.transfers is None:
        raise FigureNotApplicable(
            "transfer_timeline",
            str(data.root),
            "the run is not disaggregated (no cluster.pools), so it has no KV transfers",
        )
    from matplotlib.collections import LineCollection

    t = data.transfers
    fig, axes = _figure(3, 1, (12, 10), sharex=True)
    end = data.duration_s
    start, stop = t["start_s"], t["end_s"]
    slowdown = t["duration_ms"] / np.maximum(t["uncontended_ms"], 1e-9)
    links = list(dict.fromkeys(str(x) for x in t["link"]))
    ax = axes[0, 0]
    if len(start):
        # one row per link, lanes within it so that overlapping transfers stay visible
        lane = np.zeros(len(start), np.int64)
        offset = {}
        base = 0
        for link in links:
            lane_end: list[float] = []
            for i in np.flatnonzero(t["link"] == link)[np.argsort(start[t["link"] == link])]:
                free = next((k for k, e in enumerate(lane_end) if e <= start[i]), None)
                if free is None:
                    free = len(lane_end)
                    lane_end.append(0.0)
                lane_end[free] = stop[i]
                lane[i] = free
            offset[link] = base
            base += max(len(lane_end), 1) + 1
        y = np.array([offset[str(x)] for x in t["link"]]) + lane
        segments = np.stack([np.c_[start, y], np.c_[stop, y]], axis=1)
        collection = LineCollection(list(segments), array=slowdown, cmap="viridis", linewidths=5)
        collection.set_clim(1.0, max(1.0001, float(slowdown.max())))
        ax.add_collection(collection)
        fig.colorbar(collection, ax=ax, label="slowdown vs alone on the link (×)", pad=0.01)
        ax.set_ylim(-1, base)
        ax.set_yticks([offset[link] for link in links], links, fontsize=7)
    else:
        _empty(ax, "no KV transfer completed")
    ax.set_title("Each KV transfer on its link (one lane per overlapping transfer)", fontsize=10)
    ax.set_ylabel("link / lane")
    ax.grid(True, axis="x", alpha=0.3)

    ax = axes[1, 0]
    nb = int(min(200, max(1, math.ceil(end * 10))))
    edges = np.linspace(0.0, end, nb + 1)
    for k, link in enumerate(links):
        mine = t["link"] == link
        times, depth = _depth(start[mine], stop[mine])
        # time-average in flight per bin: the integral of the step function, differenced
        area = np.concatenate([[0.0], np.cumsum(depth[:-1] * np.diff(times))])
        mean = np.diff(np.interp(edges, times, area)) / np.diff(edges)
        peak = _binned_max(times, np.append(times[1:], times[-1]), depth, edges)
        color = f"C{k % 10}"
        ax.plot(
            edges[:-1],
            peak,
            drawstyle="steps-post",
            lw=0.8,
            color=color,
            alpha=0.5,
            label=f"{link}: most at once",
        )
        ax.plot(
            edges[:-1],
            mean,
            drawstyle="steps-post",
            lw=1.4,
            color=color,
            label=f"{link}: time-average",
        )
    ax.set_title(f"Transfers in flight, per {end / nb:.3g} s bin", fontsize=10)
    ax.set_ylabel("transfers in flight (transfers)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if links:
        ax.legend(fontsize=7, loc="upper right", ncol=max(1, math.ceil(len(links) / 8)))

    ax = axes[2, 0]
    for k, link in enumerate(links):
        mine = t["link"] == link
        ax.scatter(
            start[mine],
            t["duration_ms"][mine],
            s=8,
            color=f"C{k % 10}",
            lw=0,
            rasterized=True,
            label=f"{link}: duration",
        )
    if len(start):
        ax.scatter(
            start,
            t["uncontended_ms"],
            s=4,
            color="0.6",
            marker="_",
            rasterized=True,
            label="alone on the link (uncontended)",
        )
        ax.legend(fontsize=7, loc="upper right", ncol=max(1, math.ceil(len(links) / 8)))
    ax.set_title("Transfer duration by start time", fontsize=10)
    ax.set_ylabel("transfer duration (ms)")
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    pd = data.summary.get("pd", {})
    caption = (
        "KV-cache transfers from prefill to decode instances. Top: every transfer as a bar from "
        "start to end on its link, coloured by how much longer it took than alone on the link "
        "(sharing bandwidth). Middle: transfers in flight per link, the time-average and the "
        "most at once in each bin. Bottom: each transfer's "
        "duration (dots) against what it would take alone (grey). "
        f"{len(start):,} transfers; p50 {pd.get('transfer_p50_ms', 0):.1f} ms, "
        f"p99 {pd.get('transfer_p99_ms', 0):.1f} ms."
    )
    return _finish(fig, "KV transfer timeline", data, caption)


def parse_window(text: str | None) -> tuple[float | None, float | None]:
    """``"START:END"`` (seconds; either side may be empty) as (start_s, end_s)."""
    if text is None:
        return None, None
    fix = "give START:END in seconds of simulated time, e.g. 10:10.5 (either side may be empty)"
    if ":" not in text:
        raise ScenarioError("--window", text, fix)
    left, right = (part.strip() for part in text.split(":", 1))
    try:
        start = float(left) if left else None
        end = float(right) if right else None
    except ValueError:
        raise ScenarioError("--window", text, fix) from None
    _check_window(start, end, "--window", text)
    return start, end


def _check_window(start: float | None, end: float | None, path: str, shown: Any) -> None:
    for value in (start, end):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise ScenarioError(path, shown, "times must be finite and at least 0 s")
    if start is not None and end is not None and end <= start:
        raise ScenarioError(path, shown, "the end must be after the start")


def step_gantt(
    data: ResultsData,
    instance: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
    *,
    max_steps: int = GANTT_MAX_STEPS,
) -> Any:
    """The engine steps of one instance in ``[start_s, end_s]`` as a Gantt chart.

    Each step is a bar from its start to its end, split by the share of its tokens that were
    prompt (prefill) and decode tokens; below, the batch size, wait queue and tokens per step.
    Without a window it shows ``GANTT_DEFAULT_STEPS`` steps around the middle of the instance's
    run; with only ``start_s``, that many steps from there; with only ``end_s``, the steps from
    the instance's first. At most ``max_steps`` steps are drawn (the rest are cut, with a note).
    """
    _check_window(start_s, end_s, "window", (start_s, end_s))
    log = data.step_log(instance)
    from matplotlib.collections import PolyCollection

    starts = log["start_us"].astype(np.int64)
    ends = starts + log["dt_us"].astype(np.int64)
    n = len(starts)
    if start_s is None and end_s is None:
        first = max(0, n // 2 - GANTT_DEFAULT_STEPS // 2)
        lo_us = float(starts[first]) if n else 0.0
    else:
        lo_us = float(starts[0]) if start_s is None and n else (start_s or 0.0) * 1e6
        first = int(np.searchsorted(ends, lo_us, side="right"))
    if end_s is None:
        last = min(first + GANTT_DEFAULT_STEPS, n)
        hi_us = float(ends[last - 1]) if last > first else lo_us + 1.0
    else:
        hi_us = end_s * 1e6
        last = int(np.searchsorted(starts, hi_us, side="left"))
    count = last - first
    if count <= 0:
        span = f"{starts[0] / 1e6:.3f}–{ends[-1] / 1e6:.3f} s" if n else "nowhere (it ran no step)"
        raise ScenarioError(
            "window",
            f"{lo_us / 1e6:g}:{hi_us / 1e6:g}",
            f"instance {instance} ran no engine step in that window; its steps span {span}",
        )
    note = ""
    if count > max_steps:
        last = first + max_steps
        hi_us = float(ends[last - 1])
        note = (
            f"Capped: showing the first {max_steps:,} of the {count:,} steps in the window "
            f"(up to {hi_us / 1e6:.3f} s); narrow the window to see the rest."
        )
    sel = slice(first, last)
    x0, x1 = starts[sel] / 1e6, ends[sel] / 1e6
    prefill = log["prefill_tokens"][sel].astype(np.float64)
    decode = log["decode_tokens"][sel].astype(np.float64)
    tokens = prefill + decode
    share = np.divide(prefill, tokens, out=np.zeros_like(tokens), where=tokens > 0)
    top = (tokens > 0).astype(np.float64)
    zero = np.zeros_like(x0)

    fig, axes = _figure(2, 1, (13, 7.5), sharex=True, height_ratios=(1.2, 1))
    ax = axes[0, 0]
    pre = np.stack([np.c_[x0, zero], np.c_[x0, share], np.c_[x1, share], np.c_[x1, zero]], 1)
    dec = np.stack([np.c_[x0, share], np.c_[x0, top], np.c_[x1, top], np.c_[x1, share]], 1)
    edge = "white" if last - first <= 400 else "none"
    ax.add_collection(
        PolyCollection(
            list(pre),
            facecolors="C1",
            edgecolors=edge,
            linewidths=0.4,
            label="prefill (prompt) tokens",
        )
    )
    ax.add_collection(
        PolyCollection(
            list(dec), facecolors="C0", edgecolors=edge, linewidths=0.4, label="decode tokens"
        )
    )
    batch = log["batch_size"][sel]
    if last - first <= 40:
        for a, b, size in zip(x0, x1, batch):
            middle = (max(a, lo_us / 1e6) + min(b, hi_us / 1e6)) / 2  # of the visible part
            ax.text(middle, 1.02, str(int(size)), ha="center", va="bottom", fontsize=7)
    blocked = log.get("blocked_us")
    if blocked is not None and len(blocked):
        inside = blocked[(blocked >= lo_us) & (blocked <= hi_us)] / 1e6
        if len(inside):
            ax.vlines(
                inside, 0, 1, color="red", lw=0.8, label="idle with work blocked on a KV transfer"
            )
    ax.set_ylim(0, 1.12 if last - first <= 40 else 1.0)
    ax.set_ylabel("share of the step's tokens (fraction)")
    ax.set_title(
        "Steps as bars (width = duration; white gaps = idle); split by token kind"
        + ("; numbers = batch size" if last - first <= 40 else ""),
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="x", alpha=0.3)

    ax = axes[1, 0]
    # each step's value from its start; back to 0 only where the instance then went idle
    idle = np.append(x0[1:] > x1[:-1], True)
    xs = np.column_stack([x0, x1]).ravel()
    shown_points = np.column_stack([np.ones(len(x0), bool), idle]).ravel()
    xs = xs[shown_points]

    def held(values: np.ndarray) -> np.ndarray:
        return np.column_stack([values, np.zeros(len(values))]).ravel()[shown_points]

    ax.plot(
        xs, held(batch), drawstyle="steps-post", color="C2", lw=1.2, label="batch size (requests)"
    )
    ax.plot(
        xs,
        held(log["waiting"][sel]),
        drawstyle="steps-post",
        color="C3",
        lw=1.0,
        label="waiting (requests)",
    )
    ax.set_ylabel("requests (requests)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    right.plot(
        xs,
        held(tokens),
        drawstyle="steps-post",
        color="0.5",
        lw=0.8,
        alpha=0.8,
        label="tokens in the step (tokens)",
    )
    right.set_ylabel("tokens per step (tokens)")
    right.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(
        handles[0] + more[0],
        handles[1] + more[1],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.07, 1.0),
    )
    ax.set_xlabel("simulated time (s)")
    ax.set_xlim(lo_us / 1e6, hi_us / 1e6)
    shown = last - first
    caption = (
        f"Engine steps of {data.instance_label(instance)} from {lo_us / 1e6:.3f} s to "
        f"{hi_us / 1e6:.3f} s ({shown:,} steps, {int(tokens.sum()):,} tokens). Each bar is one "
        "step; its orange part is the share of prompt (prefill) tokens and its blue part the "
        "decode tokens, so long orange bars are prefill chunks that stall the decoding requests "
        "sharing the step. Below: batch size, wait queue and tokens per step."
    )
    return _finish(
        fig,
        f"Engine steps of {data.instance_label(instance)}, "
        f"{lo_us / 1e6:.3f}–{hi_us / 1e6:.3f} s ({shown:,} steps)",
        data,
        caption,
        note,
    )


# ---------------------------------------------------------------------- saving

FIGURES = (
    "latency_cdfs",
    "latency_over_time",
    "instance_timeseries",
    "gateway_queue",
    "transfer_timeline",
    "step_gantt",
)


class SavedFigures(list):
    """The PNG files written (a list of Paths); ``skipped`` maps figure name -> why not drawn."""

    def __init__(self, paths: list[Path], skipped: dict[str, str]):
        super().__init__(paths)
        self.skipped = skipped


def build_figures(
    data: ResultsData,
    *,
    instance: int = 0,
    window: tuple[float | None, float | None] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every figure that applies to the run, by name, and why the others were skipped."""
    start, end = window if window is not None else (None, None)
    data.check_instance(instance)
    builders = {
        "latency_cdfs": lambda: latency_cdfs(data),
        "latency_over_time": lambda: latency_over_time(data),
        "instance_timeseries": lambda: instance_timeseries(data),
        "gateway_queue": lambda: gateway_queue(data),
        "transfer_timeline": lambda: transfer_timeline(data),
        "step_gantt": lambda: step_gantt(data, instance, start, end),
    }
    figures: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in FIGURES:
        try:
            figures[name] = builders[name]()
        except FigureNotApplicable as exc:
            skipped[name] = exc.fix
    return figures, skipped


def _write_png(fig: Any, path: Path) -> Path:
    """Save a figure as PNG atomically (a temporary sibling replaces ``path`` in one rename)."""
    return write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=DPI))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_figures(
    data: ResultsData,
    out_dir: str | Path,
    *,
    instance: int = 0,
    window: tuple[float | None, float | None] | None = None,
) -> SavedFigures:
    """Write every applicable figure of loaded data as ``<figure>.png`` into ``out_dir``."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(
            "--out", str(out), f"cannot create the directory ({exc.strerror or exc})"
        ) from None
    figures, skipped = build_figures(data, instance=instance, window=window)
    paths = []
    try:
        for name, fig in figures.items():
            paths.append(_write_png(fig, out / f"{name}.png"))
    except OSError as exc:
        raise ScenarioError(
            "--out", str(out), f"cannot write the figures there ({exc.strerror or exc})"
        ) from None
    return SavedFigures(paths, skipped)


def save_all(
    results_dir: str | Path,
    out_dir: str | Path,
    *,
    instance: int = 0,
    window: tuple[float | None, float | None] | None = None,
) -> SavedFigures:
    """Load a results directory and write its figures as PNG files into ``out_dir``.

    Returns the paths written (a list); its ``skipped`` attribute maps each figure that does
    not apply to the run (no flow control, not disaggregated, no step log) to the reason.
    ``window`` is the Gantt's ``(start_s, end_s)`` (either may be None).
    """
    return save_figures(ResultsData.load(results_dir), out_dir, instance=instance, window=window)


# ---------------------------------------------------------------------- notebook shortcuts


class PlotAccessor:
    """Figures of one run, for notebooks: ``results.plot.latency_cdfs()`` and friends.

    ``source`` is a results directory, a :class:`servesim.run.Results` (written once to a
    temporary directory and loaded from there) or a :class:`ResultsData`. Data is loaded on
    first use and kept.
    """

    def __init__(self, source: Any):
        self._source = source
        self._data: ResultsData | None = None

    @property
    def data(self) -> ResultsData:
        if self._data is None:
            self._data = _as_data(self._source)
        return self._data

    def latency_cdfs(self) -> Any:
        """TTFT, ITL and E2E CDFs per SLO class."""
        return latency_cdfs(self.data)

    def latency_over_time(self) -> Any:
        """TTFT, TPOT and E2E against arrival time."""
        return latency_over_time(self.data)

    def instances(self) -> Any:
        """Per-instance queue depth, batch size and KV utilisation over time."""
        return instance_timeseries(self.data)

    def gateway(self) -> Any:
        """Gateway queue depth and refusals (flow-control runs)."""
        return gateway_queue(self.data)

    def transfers(self) -> Any:
        """KV transfer timeline (disaggregated runs)."""
        return transfer_timeline(self.data)

    def gantt(
        self, instance: int = 0, start_s: float | None = None, end_s: float | None = None
    ) -> Any:
        """Step-level Gantt of one instance in a window (seconds)."""
        return step_gantt(self.data, instance, start_s, end_s)

    def save_all(
        self,
        out_dir: str | Path,
        *,
        instance: int = 0,
        window: tuple[float | None, float | None] | None = None,
    ) -> SavedFigures:
        """Write every applicable figure as PNG into ``out_dir`` (see :func:`save_all`)."""
        return save_figures(self.data, out_dir, instance=instance, window=window)

    def report(self, out_file: str | Path) -> Path:
        """Write the self-contained HTML report (see :func:`servesim.report.write_report`)."""
        from servesim.report import render_report

        return render_report(self.data, out_file)

    def __repr__(self) -> str:
        return (
            "PlotAccessor: .latency_cdfs() .latency_over_time() .instances() .gateway() "
            ".transfers() .gantt(instance, start_s, end_s) .save_all(dir) .report(file)"
        )


# ---------------------------------------------------------------------- CLI


def add_plot_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plot`` command to the CLI's subparsers; dispatch it to :func:`cmd_plot`."""
    p = subparsers.add_parser(
        "plot",
        help="draw a saved run's figures as PNG files (needs servesim[plot])",
        description=(
            "Draw the figures of a results directory written by `servesim run`: latency CDFs "
            "per SLO class, latency over time, per-instance queue depth, batch size and KV "
            "utilisation, the gateway queue (flow control), the KV transfer timeline "
            "(disaggregated serving) and a step-level Gantt of one instance. Figures that do "
            "not apply to the run are skipped, with the reason. Needs matplotlib: "
            f"{INSTALL_HINT}."
        ),
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="directory written by servesim run")
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="directory for the PNG files (default: RESULTS_DIR/plots)",
    )
    p.add_argument(
        "--instance",
        type=int,
        default=0,
        metavar="N",
        help="instance drawn in the step Gantt (default 0)",
    )
    p.add_argument(
        "--window",
        metavar="START:END",
        default=None,
        help="time window of the step Gantt in simulated seconds, e.g. 10:10.5; either side may "
        "be empty (default: 200 steps around the middle of the instance's run)",
    )
    p.set_defaults(handler=cmd_plot)
    return p


def cmd_plot(args: argparse.Namespace) -> int:
    """Write the PNG files, print their paths and the figures skipped (and why)."""
    window = parse_window(args.window)
    out = Path(args.out) if args.out else Path(args.results_dir) / "plots"
    data = ResultsData.load(args.results_dir)
    try:
        saved = save_figures(data, out, instance=args.instance, window=window)
    except ScenarioError as exc:
        if exc.path in ("instance", "window"):
            raise ScenarioError("--" + exc.path, exc.value, exc.fix) from None
        raise
    for path in saved:
        print(path)
    for name, why in saved.skipped.items():
        print(f"skipped {name}: {why}")
    return 0
