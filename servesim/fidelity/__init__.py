"""Fidelity: measured serving runs to validate and calibrate servesim against.

* :mod:`servesim.fidelity.readers` — per-request results of real serving systems (DistServe's
  ``.exp`` files, LLMServingSim's vLLM runs, a documented generic CSV), one module per format,
  read into :class:`MeasuredRun`.
* :mod:`servesim.fidelity.steptables` — measured step times (Splitwise, LLMServingSim profiles,
  AIConfigurator's kernel database) read into a :class:`StepTable`.
* :mod:`servesim.fidelity.fits` — latency-model fits to either, one module per fit, reported as a
  :class:`CalibrationReport`; :mod:`servesim.fidelity.calibrate` is the ``servesim calibrate``
  command.
* :mod:`servesim.fidelity.replay` and :mod:`servesim.fidelity.validate` — replay a measured run
  through the simulator and compare.
"""

from servesim.fidelity import fits
from servesim.fidelity.fits import *  # noqa: F403 -- everything fits exports (fits.__all__)
from servesim.fidelity.readers import (
    MeasuredRun,
    needs_placement,
    read_distserve_exp,
    read_generic_csv,
    read_llmservingsim,
    read_measured,
    summarize,
)
from servesim.fidelity.steptables import (
    StepTable,
    read_aiconfigurator,
    read_llmservingsim_profile,
    read_splitwise,
    read_step_table,
)

__all__ = [
    *fits.__all__,
    "MeasuredRun",
    "StepTable",
    "needs_placement",
    "read_aiconfigurator",
    "read_distserve_exp",
    "read_generic_csv",
    "read_llmservingsim",
    "read_llmservingsim_profile",
    "read_measured",
    "read_splitwise",
    "read_step_table",
    "summarize",
]
