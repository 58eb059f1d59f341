"""Fidelity: measured serving runs to validate servesim against.

:mod:`servesim.fidelity.measured` reads per-request results of real serving systems (DistServe's
``.exp`` files, LLMServingSim's vLLM runs, a documented generic CSV) into :class:`MeasuredRun`.
"""

from servesim.fidelity.measured import (
    MeasuredRun,
    read_distserve_exp,
    read_generic_csv,
    read_llmservingsim,
    read_measured,
    summarize,
)

__all__ = [
    "MeasuredRun",
    "read_distserve_exp",
    "read_generic_csv",
    "read_llmservingsim",
    "read_measured",
    "summarize",
]
