"""Fit the blackbox or trained-physics coefficients to a step table (Splitwise, LLMServingSim
profiles, AIConfigurator)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from servesim.fidelity.fits.report import TRAINED_BETA_NAMES, CalibrationReport, FoldResult
from servesim.fidelity.fits.runs import _parse_free
from servesim.fidelity.fits.solvers import _log_nnls
from servesim.fidelity.steptables.splitwise import SPLITWISE_GPU, SPLITWISE_LLM
from servesim.fidelity.steptables.table import StepTable
from servesim.simcore.errors import ScenarioError

DEFAULT_TRAINED_FREE = ("b1a", "b2a", "b6", "b7", "b10")
"""Trained-physics betas fitted by default; the others keep their bundled values (on one model,
GPU and TP, β3·weights, β5·layers and β7 are all constants, so only one of them is identifiable)."""
STEP_OBJECTIVE = (
    "step time: least squared log(model/measured), coefficients >= 0 (Gauss-Newton NNLS, "
    "Huber-weighted per kind of step, each measured point counted once)"
)
_BASIS_SCALE = 1e6
"""One-hot beta used to read a trained-physics basis term through its integer step time."""


def _fold_groups(group: np.ndarray, k: int) -> list[np.ndarray]:
    """Row masks of the held-out part of each fold: group ``g`` (in order of first appearance)
    is held out in fold ``g mod k``."""
    return [(group % k) == j for j in range(k)]


def _step_errors(
    table: StepTable, predicted: np.ndarray, mask: np.ndarray | None = None
) -> dict[str, float]:
    """Median and p90 |relative error| of each kind of step, over measured points: repeats of a
    point (one group) are averaged before comparing, so each point counts once."""
    rows = np.ones(table.n, dtype=bool) if mask is None else mask
    group = table.group[rows]
    ids, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
    measured = np.bincount(inverse, weights=table.time_us[rows]) / counts
    model = np.bincount(inverse, weights=predicted[rows]) / counts
    kinds = np.empty(ids.size, dtype=table.kind.dtype)
    kinds[inverse] = table.kind[rows]
    rel = np.abs(model / measured - 1.0)
    out: dict[str, float] = {}
    for name in ("prefill", "decode", "mixed"):
        pick = kinds == name
        if pick.any():
            out[f"{name}_step.median"] = float(np.median(rel[pick]))
            out[f"{name}_step.p90"] = float(np.percentile(rel[pick], 90))
    out["all_steps.median"] = float(np.median(rel))
    return out


def _kfold_linear(
    table: StepTable,
    design: np.ndarray,
    offset: np.ndarray,
    folds: int,
    coefficients: Callable[[np.ndarray], tuple[tuple[float, ...], tuple[float, ...]]],
    robust: bool = True,
) -> tuple[np.ndarray, list[FoldResult], dict[str, float] | None, str | None, list[str]]:
    """Fit ``time ≈ design · c + offset`` (c ≥ 0) by least squared log-ratios on all rows and per
    fold: each measured point (group of repeats) weighs as much as any other, and with
    ``robust`` Huber weights keep a few inconsistent points from dragging the fit."""
    y = table.time_us
    _, inverse, counts = np.unique(table.group, return_inverse=True, return_counts=True)
    weight = 1.0 / counts[inverse]

    def solve(mask: np.ndarray) -> np.ndarray:
        strata = table.kind[mask] if robust else None
        return _log_nnls(design[mask], offset[mask], y[mask], weight[mask], strata)

    everything = np.ones(table.n, dtype=bool)
    coef = solve(everything)
    notes: list[str] = []
    folds_out: list[FoldResult] = []
    heldout: dict[str, float] | None = None
    note: str | None = None
    groups = int(table.group.max()) + 1 if table.n else 0
    k = folds
    if k >= 2 and groups < 2:
        note = "held-out error unavailable: the table has a single measured point"
    elif k >= 2:
        if k > groups:
            notes.append(f"{k} folds asked for {groups} measured points: leave-one-out")
            k = groups
        predicted_all = np.empty(table.n)
        for j, held in enumerate(_fold_groups(table.group, k)):
            train = ~held
            c = solve(train)
            predicted = design @ c + offset
            predicted_all[held] = predicted[held]
            alpha, beta = coefficients(c)
            folds_out.append(
                FoldResult(
                    index=j,
                    train=[f"{np.unique(table.group[train]).size} points"],
                    heldout=[f"{np.unique(table.group[held]).size} points"],
                    alpha=alpha,
                    beta=beta,
                    train_error=_step_errors(table, predicted, train),
                    heldout_error=_step_errors(table, predicted, held),
                )
            )
        heldout = _step_errors(table, predicted_all)
    else:
        note = "held-out error not estimated: pass folds >= 2 (k-fold over measured points)"
    return coef, folds_out, heldout, note, notes


def fit_blackbox_to_steps(table: StepTable, *, folds: int = 5) -> CalibrationReport:
    """Fit β = (β0, β1, β2) of ``step = β0 + β1·prefill_tokens + β2·decode_requests`` to a step
    table of one (model, hardware, TP), by least squared log-ratios with β ≥ 0 (module doc).

    α is not observable in step times and is written as 0 (off). ``folds=k`` (≥ 2): k-fold over
    the table's measured points (repeats of a point stay together), reporting the median and p90
    absolute relative error of prefill, decode and mixed steps on training and held-out rows.
    """
    if len(table.tps) != 1:
        raise ScenarioError(
            "--tp",
            None,
            f"blackbox coefficients are per TP but the table holds tp {list(table.tps)}; choose one",
        )
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 0:
        raise ScenarioError("folds", folds, "expected a whole number >= 0")
    design = np.column_stack(
        [
            np.ones(table.n),
            table.prefill_tokens.astype(np.float64),
            table.decode_requests.astype(np.float64),
        ]
    )

    def as_coefficients(c: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return (0.0, 0.0, 0.0), tuple(float(x) for x in c)

    coef, fold_results, heldout, note, notes = _kfold_linear(
        table, design, np.zeros(table.n), folds, as_coefficients
    )
    predicted = design @ coef
    notes = [
        *table.notes,
        *notes,
        "alpha is not observable in step times: written as 0 (off); fit runs to calibrate it",
    ]
    return _step_report(
        "blackbox",
        tuple(float(x) for x in coef),
        ("beta0", "beta1", "beta2"),
        table,
        {"tp": table.tps[0]},
        predicted,
        (fold_results, heldout, note),
        notes,
    )


def _step_report(
    latency_model: str,
    beta: tuple[float, ...],
    free: tuple[str, ...],
    table: StepTable,
    fitted_on: dict[str, Any],
    predicted: np.ndarray,
    folds: tuple[list[FoldResult], dict[str, float] | None, str | None],
    notes: list[str],
) -> CalibrationReport:
    """The report of a fit to step times, whichever model: alpha is not observable in step times
    (written as 0), the objective is the step-time one, train error is over the whole table and
    ``folds`` is the cross-validation's (folds, held-out error, note)."""
    fold_results, heldout, note = folds
    return CalibrationReport(
        latency_model=latency_model,
        alpha=(0.0, 0.0, 0.0),
        beta=beta,
        kind="steps",
        fitted_on={**table.describe(), **fitted_on},
        objective=STEP_OBJECTIVE,
        train_error=_step_errors(table, predicted),
        heldout_error=heldout,
        heldout_note=note,
        folds=fold_results,
        free=free,
        notes=notes,
    )


def _trained_basis(
    table: StepTable, llm: str, gpu: str, n_beta: int, needed: Iterable[int] | None = None
) -> tuple[np.ndarray, list[str]]:
    """Rows × betas: each trained-physics term with its beta set to 1 (µs); only the ``needed``
    columns are evaluated (the others stay 0)."""
    from servesim.latency.base import BatchSummary
    from servesim.latency.hardware import resolve_gpu
    from servesim.latency.modelindex import resolve_model
    from servesim.latency.trained import TrainedPhysicsLatencyModel

    spec = resolve_model(llm, "--llm").require_spec("--llm", "the trained-physics model")
    hardware = resolve_gpu(gpu, "--gpu")
    basis = np.zeros((table.n, n_beta))
    columns = range(n_beta) if needed is None else sorted(set(needed))
    for tp in table.tps:
        rows = np.flatnonzero(table.tp == tp)
        for i in columns:
            beta = [0.0] * n_beta
            beta[i] = _BASIS_SCALE
            model = TrainedPhysicsLatencyModel(
                spec, hardware, tp, alpha=(0.0, 0.0, 0.0), beta=beta, path="--llm"
            )
            for r in rows:
                summary = BatchSummary(
                    int(table.prefill_tokens[r]),
                    table.prefill_items[r],
                    int(table.decode_requests[r]),
                    int(table.decode_context[r]),
                )
                basis[r, i] = model.step_time_us(summary) / _BASIS_SCALE
    return basis, [spec.name, hardware.name]


def fit_trained_physics_to_steps(
    table: StepTable,
    *,
    llm: str | None = None,
    gpu: str | None = None,
    free: Iterable[str] | str | None = None,
    start_beta: Sequence[float] | None = None,
    folds: int = 5,
) -> CalibrationReport:
    """Fit the trained-physics β corrections to a step table (least squared log-ratios with
    β ≥ 0; the roofline terms are evaluated by the model itself, one beta at a time).

    ``llm``/``gpu`` name the servesim model and GPU whose roofline terms price the table's steps
    (defaults for Splitwise: :data:`SPLITWISE_LLM`, :data:`SPLITWISE_GPU`). ``free`` names the
    betas fitted (:data:`TRAINED_BETA_NAMES`; default :data:`DEFAULT_TRAINED_FREE`); the others
    keep ``start_beta`` (default: the bundled fit), and their terms are subtracted first. α is not
    observable in step times and is written as 0. All 11 betas are written.
    """
    from servesim.latency.trained import default_coefficients

    notes = list(table.notes)
    if llm is None:
        llm = SPLITWISE_LLM.get(table.model.lower())
        if llm is None:
            raise ScenarioError(
                "--llm",
                None,
                f"no bundled config known for {table.model}; give --llm (a servesim model name "
                "or a config.json path) whose layer shapes match it",
            )
        notes.append(
            f"{table.model} priced with the {llm} config (same layer shapes: 80 layers, hidden "
            "8192, 64 heads / 8 KV heads, FFN 28672; only the vocabulary differs, which the "
            "trained-physics terms do not use)"
        )
    if gpu is None:
        gpu = SPLITWISE_GPU.get(table.hardware.lower(), table.hardware)
        if table.hardware.lower().endswith("-pcap"):
            notes.append(
                f"{table.hardware} is power-capped; its roofline terms use {gpu}'s nominal peak rates"
            )
    n_beta = len(TRAINED_BETA_NAMES)
    free_index = _parse_free(
        DEFAULT_TRAINED_FREE if free is None else free, TRAINED_BETA_NAMES, "free"
    )
    base = list(default_coefficients()[1] if start_beta is None else start_beta)
    if len(base) != n_beta:
        raise ScenarioError(
            "start_beta", base, f"expected {n_beta} betas (the 11-term trained-physics form)"
        )
    fixed = [i for i in range(n_beta) if i not in free_index and base[i] != 0]
    basis, names = _trained_basis(table, llm, gpu, n_beta, [*free_index, *fixed])
    offset = basis[:, fixed] @ np.asarray([base[i] for i in fixed]) if fixed else np.zeros(table.n)
    design = basis[:, list(free_index)]
    weighted = design / table.time_us[:, None]
    rank = int(
        np.linalg.matrix_rank(weighted / np.maximum(np.linalg.norm(weighted, axis=0), 1e-300))
    )
    if rank < len(free_index):
        notes.append(
            f"the free terms {', '.join(TRAINED_BETA_NAMES[i] for i in free_index)} span only "
            f"{rank} independent directions over this table: their split is not identifiable"
        )
    for i in free_index:
        if not np.any(basis[:, i] > 1e-9):
            notes.append(
                f"{TRAINED_BETA_NAMES[i]}'s term is 0 on every row: its value is arbitrary"
            )

    def as_coefficients(c: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
        beta = list(base)
        for j, i in enumerate(free_index):
            beta[i] = float(c[j])
        return (0.0, 0.0, 0.0), tuple(beta)

    coef, fold_results, heldout, note, kfold_notes = _kfold_linear(
        table, design, offset, folds, as_coefficients
    )
    notes.extend(kfold_notes)
    _, beta = as_coefficients(coef)
    predicted = design @ coef + offset
    notes.append("alpha is not observable in step times: written as 0 (off)")
    held = [i for i in range(n_beta) if i not in free_index]
    if held:
        notes.append(
            "held at "
            + ("the bundled fit" if start_beta is None else "start_beta")
            + f": {', '.join(TRAINED_BETA_NAMES[i] for i in held)}"
        )
    return _step_report(
        "trained-physics",
        beta,
        tuple(TRAINED_BETA_NAMES[i] for i in free_index),
        table,
        {"llm": names[0], "gpu": names[1]},
        predicted,
        (fold_results, heldout, note),
        notes,
    )
