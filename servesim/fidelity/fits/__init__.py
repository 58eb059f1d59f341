"""Fit latency-model coefficients to measurements (``servesim calibrate``), one module per fit.

Two sources of measurements, one :class:`~servesim.fidelity.fits.report.CalibrationReport`:

* **Measured runs** (:func:`fit_blackbox_to_runs`): each :class:`MeasuredRun` is replayed through
  the simulator (:func:`servesim.fidelity.replay.simulate_run`) with candidate blackbox
  coefficients, and a derivative-free optimiser (scipy's Nelder-Mead, in log-coefficients so every
  coefficient stays > 0) minimises the mean over runs of the mean squared log-ratio
  simulated/measured of the mean and p90 of TTFT, TPOT and E2E. All six coefficients are fitted:
  α0 (µs added once before a request's first token: the per-request server overhead), α1 (µs per
  prompt token of that delay), α2 (µs per output token), β0 (µs per engine step: the per-step
  CPU/scheduling overhead), β1 (µs per prefill token) and β2 (µs per decode request). With
  ``folds=k`` the runs are split k ways (run ``i`` is held out in fold ``i mod k``) and every fold
  reports its training error and its held-out error separately. The same replay loop fits a few
  trained-physics betas (:func:`fit_trained_physics_to_runs`) and serving overheads on top of any
  model (:func:`fit_overheads_to_runs`).
* **Step tables** (:func:`fit_blackbox_to_steps`, :func:`fit_trained_physics_to_steps`): measured
  step times (Splitwise's ``perf_model.csv``, or LLMServingSim per-layer profiles or
  AIConfigurator's kernel database composed into steps) are fitted by least squared log-ratios
  model/measured with non-negative coefficients (Gauss-Newton steps of scipy's NNLS, Huber weights
  per kind of step, each measured point counted once), with k-fold held-out errors over measured points (repeats stay in one fold).

:func:`write_coefficients` writes the fit (coefficients, what they were fitted on, the objective,
train and held-out errors, servesim version, date) as a YAML file that a scenario names with
``latency: {model: blackbox, file: fitted.yaml}``. scipy does the fitting (Nelder-Mead, NNLS) and
is imported only when a fit runs: ``pip install servesim[fit]``.
"""

from servesim.fidelity.fits.blackbox_runs import fit_blackbox_to_runs, initial_guess
from servesim.fidelity.fits.overheads import fit_overheads_to_runs
from servesim.fidelity.fits.report import (
    BLACKBOX_PARAMS,
    TRAINED_BETA_NAMES,
    CalibrationReport,
    FoldResult,
    format_report,
    write_coefficients,
)
from servesim.fidelity.fits.steps import fit_blackbox_to_steps, fit_trained_physics_to_steps
from servesim.fidelity.fits.trained_runs import fit_trained_physics_to_runs

__all__ = [
    "BLACKBOX_PARAMS",
    "TRAINED_BETA_NAMES",
    "CalibrationReport",
    "FoldResult",
    "fit_blackbox_to_runs",
    "fit_blackbox_to_steps",
    "fit_overheads_to_runs",
    "fit_trained_physics_to_runs",
    "fit_trained_physics_to_steps",
    "format_report",
    "initial_guess",
    "write_coefficients",
]
