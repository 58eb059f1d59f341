"""The result of a fit (:class:`CalibrationReport`), its text form and its coefficients file."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import yaml

from servesim.fidelity.readers.common import PathArg
from servesim.latency.blackbox import COEFFICIENTS_FILE_FORMAT
from servesim.simcore.config import plain_data
from servesim.simcore.files import write_atomic

BLACKBOX_PARAMS = ("alpha0", "alpha1", "alpha2", "beta0", "beta1", "beta2")
"""Names of the blackbox coefficients, in ``alpha + beta`` order."""
BLACKBOX_UNITS = {
    "alpha": ["us per request", "us per prompt token", "us per output token"],
    "beta": ["us per step", "us per prefill token", "us per decode request"],
}
TRAINED_BETA_NAMES = ("b1a", "b2a", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11")
"""The 11 trained-physics betas (``servesim/latency/trained.py``): prefill compute, decode compute,
weight loading, TP all-reduce, per layer, per request, per step, per MoE layer, prefill KV write,
decode KV access, MoE dispatch."""


@attrs.define(eq=False)
class FoldResult:
    """One k-fold split: coefficients fitted on ``train`` and their errors on both parts.

    Errors map a statistic (``ttft_ms.mean`` for runs, ``prefill_step.median`` for step tables)
    to the median absolute relative error over the runs (or rows) of that part.
    """

    index: int
    train: list[str]
    heldout: list[str]
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    train_error: dict[str, float]
    heldout_error: dict[str, float]
    loss: float | None = None
    evaluations: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fold": self.index,
            "train": list(self.train),
            "heldout": list(self.heldout),
            "alpha": [float(x) for x in self.alpha],
            "beta": [float(x) for x in self.beta],
            "train_error": _rounded(self.train_error),
            "heldout_error": _rounded(self.heldout_error),
        }
        if self.loss is not None:
            out["loss"] = float(self.loss)
        if self.evaluations is not None:
            out["evaluations"] = int(self.evaluations)
        return out


@attrs.define(eq=False)
class CalibrationReport:
    """A fit: the coefficients (final fit on all the data), what they were fitted on, and the
    training and held-out errors (``heldout_error`` is None when it could not be estimated, and
    ``heldout_note`` then says why)."""

    latency_model: str
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    kind: str  # "runs" or "steps"
    fitted_on: dict[str, Any]
    objective: str
    train_error: dict[str, float]
    heldout_error: dict[str, float] | None
    heldout_note: str | None = None
    folds: list[FoldResult] = attrs.field(factory=list)
    free: tuple[str, ...] = ()
    start: dict[str, list[float]] | None = None
    loss: float | None = None
    evaluations: int | None = None
    per_item: dict[str, dict[str, float]] = attrs.field(factory=dict)
    """Runs: signed relative error of each statistic of each run under the final fit."""
    notes: list[str] = attrs.field(factory=list)

    def latency_section(self) -> dict[str, Any]:
        """The scenario ``latency`` mapping with these coefficients inline."""
        return {
            "model": self.latency_model,
            "alpha": [float(x) for x in self.alpha],
            "beta": [float(x) for x in self.beta],
        }

    def to_dict(self) -> dict[str, Any]:
        errors: dict[str, Any] = {
            "train": _rounded(self.train_error),
            "heldout": None if self.heldout_error is None else _rounded(self.heldout_error),
        }
        if self.heldout_note:
            errors["heldout_note"] = self.heldout_note
        if self.folds:
            errors["folds"] = [f.to_dict() for f in self.folds]
        if self.per_item:
            errors["per_run"] = {k: _rounded(v) for k, v in self.per_item.items()}
        fitted_on = dict(self.fitted_on)
        fitted_on["free"] = list(self.free)
        if self.start is not None:
            fitted_on["start"] = self.start
        if self.loss is not None:
            fitted_on["loss"] = float(self.loss)
        if self.evaluations is not None:
            fitted_on["evaluations"] = int(self.evaluations)
        return {
            "model": self.latency_model,
            "alpha": [float(x) for x in self.alpha],
            "beta": [float(x) for x in self.beta],
            "fitted_on": fitted_on,
            "objective": self.objective,
            "errors": errors,
            "notes": list(self.notes),
        }


def _rounded(errors: Mapping[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.6g}") for k, v in errors.items()}


def write_coefficients(report: CalibrationReport, path: PathArg) -> Path:
    """Write ``report`` as a coefficients YAML (atomically: a temporary file, then a rename).

    A blackbox file is read by ``latency: {model: blackbox, file: PATH}``; a trained-physics
    file carries its ``scenario.latency`` mapping to paste into a scenario.
    """
    import servesim

    out = Path(path)
    body = report.to_dict()
    if report.latency_model == "overheads":
        return _write_overheads(report, body, out)
    data: dict[str, Any] = {
        "format": COEFFICIENTS_FILE_FORMAT,
        "model": body["model"],
        "alpha": body["alpha"],
        "beta": body["beta"],
    }
    if report.latency_model == "blackbox":
        data["units"] = BLACKBOX_UNITS
    else:
        data["units"] = {
            "alpha": ["us queueing", "us post-decode", "us per output token"],
            "beta": list(TRAINED_BETA_NAMES),
        }
        data["scenario"] = {"latency": report.latency_section()}
    data["fitted_on"] = body["fitted_on"]
    data["objective"] = body["objective"]
    data["errors"] = body["errors"]
    data["servesim_version"] = servesim.__version__
    data["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data["notes"] = body["notes"]
    text = (
        "# Latency coefficients fitted by `servesim calibrate`; use with\n"
        + (
            f"#   latency: {{model: blackbox, file: {out.name}}}\n"
            if report.latency_model == "blackbox"
            else "#   the `scenario.latency` mapping below as a scenario's latency section\n"
        )
        + yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=None, width=100)
    )
    return _write_atomically(out, text)


def _write_overheads(report: CalibrationReport, body: dict[str, Any], out: Path) -> Path:
    """An overheads file, read by ``latency: {model: overheads, base: ..., file: PATH}``."""
    import servesim
    from servesim.latency.overheads import OVERHEADS_FILE_FORMAT

    data = {
        "format": OVERHEADS_FILE_FORMAT,
        "model": "overheads",
        "first_token_us": float(report.alpha[0]),
        "step_us": float(report.beta[0]),
        "fitted_on": body["fitted_on"],
        "objective": body["objective"],
        "errors": body["errors"],
        "servesim_version": servesim.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "notes": body["notes"],
    }
    text = (
        "# Serving overheads fitted by `servesim calibrate --latency overheads`; use with\n"
        f"#   latency: {{model: overheads, base: <the latency model they were fitted on>, "
        f"file: {out.name}}}\n"
        + yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=None, width=100)
    )
    return _write_atomically(out, text)


def _write_atomically(out: Path, text: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(out, text)


def _plain(value: Any) -> Any:
    """Plain data for YAML, numpy numbers as Python ones."""
    return plain_data(value, _python_number)


def _python_number(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    return value


def format_report(report: CalibrationReport) -> str:
    """Coefficients and a table of training vs held-out error per statistic."""
    lines = [
        f"{report.latency_model} coefficients fitted on "
        + (
            f"{len(report.fitted_on.get('runs', []))} run(s)"
            if report.kind == "runs"
            else f"{report.fitted_on.get('format')} step table {report.fitted_on.get('source')}"
        ),
        *(
            [
                f"  first-token overhead = {report.alpha[0]:.0f} us per request",
                f"  per-step overhead    = {report.beta[0]:.0f} us per step",
            ]
            if report.latency_model == "overheads"
            else [
                f"  alpha = [{', '.join(f'{x:.6g}' for x in report.alpha)}]",
                f"  beta  = [{', '.join(f'{x:.6g}' for x in report.beta)}]",
            ]
        ),
        f"  objective: {report.objective}",
    ]
    if report.evaluations is not None:
        lines.append(f"  final fit: {report.evaluations} evaluations, loss {report.loss:.4g}")
    lines.append("")
    if report.kind == "runs":
        lines.append(
            "  |simulated/measured - 1| of each statistic, median over runs (train: the final "
            "fit on all runs; held-out: each run predicted by the fold that left it out)"
        )
    else:
        lines.append(
            "  |model/measured - 1| over measured points, median and p90 (train: the final fit "
            "on all points; held-out: each point predicted by the fold that left it out)"
        )
    lines.append(f"  {'statistic':<22}{'train':>10}{'held-out':>10}")
    keys = list(report.train_error)
    for key in report.heldout_error or {}:
        if key not in keys:
            keys.append(key)
    for key in keys:
        train = report.train_error.get(key)
        held = (report.heldout_error or {}).get(key)
        lines.append(
            f"  {key:<22}{_pct(train):>10}{_pct(held) if report.heldout_error else 'n/a':>10}"
        )
    if report.heldout_note:
        lines.append(f"  {report.heldout_note}")
    for fold in report.folds:
        train_med = _overall(fold.train_error)
        held_med = _overall(fold.heldout_error)
        lines.append(
            f"  fold {fold.index}: held out {', '.join(fold.heldout)}: train {_pct(train_med)}, "
            f"held-out {_pct(held_med)} (median over statistics)"
        )
    for note in report.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _overall(errors: Mapping[str, float]) -> float | None:
    return float(np.median(list(errors.values()))) if errors else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
