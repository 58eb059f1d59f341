"""Splitwise's ``perf_model.csv`` read into a :class:`~servesim.fidelity.steptables.table.StepTable`."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.fidelity.readers.common import PathArg
from servesim.fidelity.steptables.table import (
    StepTable,
    _choose,
    _table_from_rows,
)
from servesim.simcore.csvcells import BadCell, cell_number, cell_whole
from servesim.simcore.errors import ScenarioError

SPLITWISE_COLUMNS = (
    "model",
    "hardware",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
    "tensor_parallel",
)
SPLITWISE_LLM = {"llama2-70b": "llama-3.1-70b-instruct"}
"""Bundled configs with the same layer shapes as a Splitwise model (trained-physics pricing)."""
SPLITWISE_GPU = {"a100-80gb": "A100-80", "h100-80gb": "H100", "h100-80gb-pcap": "H100"}


def read_splitwise(
    path: PathArg,
    *,
    model: str | None = None,
    hardware: str | None = None,
    tp: int | None = None,
) -> StepTable:
    """Splitwise's measured ``perf_model.csv`` as steps, for one model and hardware.

    Each row gives two steps: ``prompt_time`` (ms) is one prefill step of ``batch_size`` prompts
    of ``prompt_size`` tokens; ``token_time`` (ms) is one decode iteration of ``batch_size``
    requests, averaged over ``token_size`` tokens (so each request's context is taken as
    ``prompt_size + token_size / 2``). ``model``/``hardware`` may be left out when the file has
    only one; ``tp`` None keeps every TP of the selection.
    """
    file = Path(path)
    if not file.is_file():
        raise ScenarioError(str(file), None, "no such file")
    with file.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in SPLITWISE_COLUMNS if c not in header]
        if missing:
            raise ScenarioError(
                f"{file}:1",
                ",".join(header),
                f"not a Splitwise perf_model.csv: missing column(s) {', '.join(missing)}",
            )
        records = []
        for line, rec in enumerate(reader, start=2):
            try:
                records.append(
                    {
                        "model": rec["model"].strip(),
                        "hardware": rec["hardware"].strip(),
                        "tp": _whole(rec, "tensor_parallel"),
                        "prompt": _whole(rec, "prompt_size"),
                        "batch": _whole(rec, "batch_size"),
                        "tokens": _whole(rec, "token_size"),
                        "prompt_ms": _positive(rec, "prompt_time"),
                        "token_ms": _positive(rec, "token_time"),
                    }
                )
            except BadCell as bad:
                raise ScenarioError(
                    f"{file}:{line}", bad.value, f"column {bad.column}: {bad.what}"
                ) from None
    if not records:
        raise ScenarioError(str(file), None, "the file has a header but no rows")
    model = _choose(records, "model", model, file)
    records = [r for r in records if r["model"] == model]
    hardware = _choose(records, "hardware", hardware, file, context=f"for {model}")
    records = [r for r in records if r["hardware"] == hardware]
    if tp is not None:
        available = sorted({r["tp"] for r in records})
        if tp not in available:
            raise ScenarioError(
                "--tp",
                tp,
                f"no rows for {model} on {hardware} with tensor_parallel={tp}; available: "
                f"{', '.join(map(str, available))}",
            )
        records = [r for r in records if r["tp"] == tp]
    rows: list[dict[str, Any]] = []
    for r in records:
        p, b, t, rtp = r["prompt"], r["batch"], r["tokens"], r["tp"]
        rows.append(
            {
                "kind": "prefill",
                "prefill_tokens": b * p,
                "decode_requests": 0,
                "decode_context": 0,
                "prefill_items": ((0, p, p),) * b,
                "time_us": r["prompt_ms"] * 1000.0,
                "group": ("prefill", p, b, rtp),  # the same prefill whatever token_size
                "tp": rtp,
            }
        )
        rows.append(
            {
                "kind": "decode",
                "prefill_tokens": 0,
                "decode_requests": b,
                "decode_context": b * (p + t // 2),
                "prefill_items": (),
                "time_us": r["token_ms"] * 1000.0,
                "group": ("decode", p, b, t, rtp),
                "tp": rtp,
            }
        )
    table = _table_from_rows(
        rows, source=str(file), fmt="splitwise", model=model, hardware=hardware
    )
    table.notes.append(
        "Splitwise token_time is the mean decode iteration over token_size tokens; each request's "
        "decode context is taken as prompt_size + token_size/2"
    )
    return table


def _whole(rec: Mapping[str, str], column: str) -> int:
    return cell_whole((rec.get(column) or "").strip(), column, minimum=1)


def _positive(rec: Mapping[str, str], column: str) -> float:
    """A time in ms > 0."""
    return cell_number((rec.get(column) or "").strip(), column, strict=True)
