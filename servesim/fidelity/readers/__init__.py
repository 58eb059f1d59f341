"""Measured serving runs: per-request results of real systems, read into one shape.

Three sources, one module each, one :class:`~servesim.fidelity.readers.common.MeasuredRun`
(:mod:`~servesim.fidelity.readers.common`); :func:`read_measured` chooses the reader:

* :func:`read_distserve_exp` — DistServe's alignment ground truth (``<system>-<N>-<rate>.exp``):
  a Python-literal list of records (on one line upstream) with ``prompt_len, output_len,
  issue_time, first_token_time, complete_time, ttft_ms, tpot_ms, latency_ms``, optionally followed
  by a ``{ key: value }`` summary block. Parsed with :mod:`ast` (literals only, never evaluated).
* :func:`read_llmservingsim` — an LLMServingSim vLLM benchmark run: ``requests.jsonl`` (or
  ``vllm_requests.jsonl``), ``meta.json`` (vLLM engine arguments), ``config.json`` (cluster) and
  the validation ``summary.txt`` when present.
* :func:`read_generic_csv` — a CSV with the header columns ``arrival_s, input_tokens,
  output_tokens, ttft_s, e2e_s`` and optionally ``queued_s, tpot_s, request_id`` (other columns are
  ignored; an empty cell of a latency column means unknown). ``# key: value`` comment lines before
  the header may give settings (``system``, ``model``, ``gpu``, ``tp``, ...; see
  ``generic_csv._CSV_SETTINGS``).

Conventions of a :class:`MeasuredRun`: requests are sorted by arrival (stably); ``arrival_us`` is
int64 µs after the first arrival; latencies are float64 µs with ``-1`` for unknown; ``tpot_us =
(e2e − ttft) / (output_tokens − 1)``, unknown for single-token outputs; ``output_tokens`` counts
the first token. Settings are ``None`` when not known; ``inferred`` names the ones taken from a file
name or a documented convention rather than from the run's metadata, and ``notes`` says how.

Every malformed input raises :class:`ScenarioError` whose path is ``<file>:<line>`` and whose
message names the record (0-based) and the field, with what is allowed.
"""

from __future__ import annotations

from servesim.fidelity.readers.common import UNKNOWN, MeasuredRun, PathArg, _existing, summarize
from servesim.fidelity.readers.distserve import (
    EXP_FIELDS,
    needs_placement,
    parse_placement,
    read_distserve_exp,
)
from servesim.fidelity.readers.generic_csv import CSV_OPTIONAL, CSV_REQUIRED, read_generic_csv
from servesim.fidelity.readers.llmservingsim import (
    JSONL_OPTIONAL,
    JSONL_REQUIRED,
    _llmservingsim_files,
    read_llmservingsim,
)
from servesim.simcore.errors import ScenarioError


def read_measured(path: PathArg, *, placement: str | None = None) -> MeasuredRun:
    """Read a measured run, choosing the reader from what ``path`` is.

    A directory (or a ``.jsonl`` requests file) is an LLMServingSim run, a ``.exp`` file a DistServe
    run and a ``.csv`` file the generic CSV. ``placement`` (``cXYdZW``) gives a DistServe run's
    prefill/decode parallelism when its file name does not.
    """
    file = _existing(path)
    if placement is not None and not (file.is_file() and file.suffix.lower() == ".exp"):
        raise ScenarioError(
            "--placement",
            placement,
            f"{file.name} is not a DistServe .exp run; --placement applies to those only",
        )
    if file.is_dir():
        if _llmservingsim_files(file)["requests"] is None:
            raise ScenarioError(
                str(file),
                None,
                "a directory is read as an LLMServingSim run, which needs vllm_requests.jsonl or "
                "requests.jsonl; give a .exp (DistServe) or .csv (generic) file instead",
            )
        return read_llmservingsim(file)
    suffix = file.suffix.lower()
    if suffix == ".exp":
        return read_distserve_exp(file, placement=placement)
    if suffix == ".jsonl":
        return read_llmservingsim(file)
    if suffix == ".csv":
        return read_generic_csv(file)
    raise ScenarioError(
        str(file),
        file.suffix,
        "unknown kind of measured run; expected a DistServe .exp file, an LLMServingSim run "
        "directory (or its .jsonl requests file) or a generic .csv file",
    )


__all__ = [
    "CSV_OPTIONAL",
    "CSV_REQUIRED",
    "EXP_FIELDS",
    "JSONL_OPTIONAL",
    "JSONL_REQUIRED",
    "UNKNOWN",
    "MeasuredRun",
    "needs_placement",
    "parse_placement",
    "read_distserve_exp",
    "read_generic_csv",
    "read_llmservingsim",
    "read_measured",
    "summarize",
]
