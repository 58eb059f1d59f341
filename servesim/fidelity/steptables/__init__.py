"""Step tables: measured step times to fit step-time models on, one module per source;
:func:`read_step_table` chooses the reader from what the path is."""

from __future__ import annotations

from servesim.fidelity.readers.common import PathArg, _existing
from servesim.fidelity.steptables.aiconfigurator import read_aiconfigurator
from servesim.fidelity.steptables.llmservingsim import read_llmservingsim_profile
from servesim.fidelity.steptables.splitwise import read_splitwise
from servesim.fidelity.steptables.table import StepTable
from servesim.simcore.errors import ScenarioError


def read_step_table(
    path: PathArg,
    *,
    model: str | None = None,
    hardware: str | None = None,
    tp: int | None = None,
    num_layers: int | None = None,
    max_context: int | None = None,
    llm: str | None = None,
) -> StepTable:
    """Read a step table, choosing the reader from what ``path`` is.

    A CSV with Splitwise's columns → :func:`read_splitwise`; an LLMServingSim ``perf/`` variant
    folder (or its ``meta.yaml`` or a ``tp<N>`` folder) → :func:`read_llmservingsim_profile`; an
    AIConfigurator database folder (``systems/data/<gpu>``, or a folder holding one) → steps of
    model ``llm`` composed by :func:`servesim.fidelity.steptables.aiconfigurator.read_aiconfigurator`.
    LLMServingSim ``v0`` ``layers.csv`` and AIConfigurator's CSV samples are refused with the
    reason (see ``docs/howto/calibrate.md``).
    """
    file = _existing(path)
    if file.is_dir() and not (file / "meta.yaml").is_file() and any(file.glob("**/gemm")):
        return read_aiconfigurator(file, llm=llm, tp=tp, max_context=max_context)
    if file.is_dir() or file.name == "meta.yaml":
        return read_llmservingsim_profile(
            file, tp=tp, num_layers=num_layers, max_context=max_context
        )
    try:
        with file.open(encoding="utf-8") as fh:
            header = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(file), None, f"cannot read the file ({exc})") from None
    columns = [c.strip() for c in header.split(",")]
    if "prompt_time" in columns and "token_time" in columns:
        return read_splitwise(file, model=model, hardware=hardware, tp=tp)
    if columns[:5] == ["layer_name", "input", "kv_cache", "tp_size", "latency(ns)"]:
        raise ScenarioError(
            str(file),
            None,
            "an LLMServingSim v0 layers.csv cannot be turned into step times honestly: its "
            "attention is profiled only with an empty KV cache (kv_cache 0), so decode steps "
            "would carry no context cost; give a perf/<hw>/<model>/<variant> profile instead",
        )
    if {"op_name", "latency"} <= set(columns):
        raise ScenarioError(
            str(file),
            None,
            "one AIConfigurator kernel table cannot price a step (it needs every GEMM of the "
            "model, attention at its batch and context, from one database), and the CSV samples "
            "are the first 2,000 rows of each table; give the database folder "
            "(aiconfigurator_core/systems/data/<gpu>, parquet) with --llm MODEL",
        )
    raise ScenarioError(
        str(file),
        header[:80],
        "unknown step table: expected Splitwise's perf_model.csv or an LLMServingSim "
        "perf/<hw>/<model>/<variant> folder",
    )


__all__ = [
    "StepTable",
    "read_aiconfigurator",
    "read_llmservingsim_profile",
    "read_splitwise",
    "read_step_table",
]
