"""Fit trained-physics β corrections by replaying measured runs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from servesim.fidelity.fits.report import TRAINED_BETA_NAMES, CalibrationReport
from servesim.fidelity.fits.runs import (
    _check_run_fit,
    _fit_with_folds,
    _nelder_mead,
    _objective_metrics,
    _objective_text,
    _parse_free,
    _RunObjective,
    _runs_report,
)
from servesim.fidelity.readers.common import MeasuredRun
from servesim.simcore.errors import ScenarioError

DEFAULT_TRAINED_RUN_FREE = ("b1a", "b3")
"""Trained-physics betas a run fit moves by default: prefill compute (TTFT) and weight loading
(the bulk of a decode step); the others keep their bundled values. On one model, GPU and TP the
weight-loading, per-layer and per-step terms are all constants per step, so only one of them
(here β3) can be told apart by runs."""


def _trained_options(key: tuple[float, ...]) -> dict[str, Any]:
    """Replay options pricing steps with trained-physics betas ``key`` (bundled alpha)."""
    return {"overrides": {"latency": {"model": "trained-physics", "beta": list(key)}}}


def fit_trained_physics_to_runs(
    runs: Sequence[MeasuredRun],
    *,
    folds: int = 0,
    free: Iterable[str] | str | None = None,
    max_evals: int = 60,
    objective: str | Sequence[str] = "ttft,tpot,e2e",
    overrides: Mapping[str, Any] | None = None,
) -> CalibrationReport:
    """Fit trained-physics β corrections by replaying ``runs`` with the trained-physics model.

    Only the betas named by ``free`` move (default :data:`DEFAULT_TRAINED_RUN_FREE`; six summary
    statistics per run cannot pin all eleven), from their bundled values, by Nelder-Mead on their
    logarithms (each evaluation replays every run) minimising the mean squared log-ratio of the
    mean and p90 of TTFT, TPOT and E2E, as :func:`fit_blackbox_to_runs` does; ``folds`` as there.
    The α stay bundled (and off while replaying a run timed on the engine's clock, see
    :func:`servesim.fidelity.replay.load_replay`). Disaggregated runs are refused: their pools price steps with their own
    latency sections, which a trained-physics fit does not reach.
    """
    from servesim.latency.trained import default_coefficients

    runs = list(runs)
    if not runs:
        raise ScenarioError("runs", [], "give at least one measured run")
    for run in runs:
        if run.disaggregated:
            raise ScenarioError(
                f"runs: {run.name}",
                run.source,
                "a disaggregated run's pools price their steps with their own latency models; "
                "fit colocated runs (or fit overheads with --latency overheads)",
            )
    metric_keys = _objective_metrics(objective)
    free_index = _parse_free(
        DEFAULT_TRAINED_RUN_FREE if free is None else free, TRAINED_BETA_NAMES, "free"
    )
    _check_run_fit(folds, max_evals, 1)
    alpha, start, _ = default_coefficients()
    floors = tuple(1e-3 for _ in TRAINED_BETA_NAMES)

    def objective_for(part: list[MeasuredRun]) -> _RunObjective:
        return _RunObjective(part, metric_keys, overrides, _trained_options)

    def optimise(objective_: _RunObjective) -> tuple[Sequence[float], float]:
        return _nelder_mead(objective_, start, free_index, max_evals, floors)

    notes: list[str] = []
    best, loss, final, fold_run = _fit_with_folds(runs, folds, objective_for, optimise, 0, notes)
    per_run = final.errors(best)
    fixed = [TRAINED_BETA_NAMES[i] for i in range(len(start)) if i not in free_index]
    notes.append(f"held at the bundled fit: {', '.join(fixed)}; alpha bundled")
    engine = [r.name for r in runs if r.clock == "engine"]
    if engine:
        notes.append(
            "alpha not fitted and off in the replays of runs timed on the engine's clock ("
            + ", ".join(engine)
            + "): the front end it prices is outside their times; the written alpha is the "
            "bundled one, for simulating what a client sees"
        )
    return _runs_report(
        "trained-physics",
        runs,
        per_run,
        fold_run,
        alpha=tuple(alpha),
        beta=tuple(best),
        fitted_on={
            "kind": "runs",
            "runs": [{"name": r.name, "source": r.source, "requests": r.n} for r in runs],
        },
        objective=_objective_text(
            metric_keys, "mean over runs of the mean squared log(simulated/measured)"
        ),
        free=tuple(TRAINED_BETA_NAMES[i] for i in free_index),
        start={"beta": list(start)},
        loss=loss,
        evaluations=final.evaluations,
        notes=notes,
    )
