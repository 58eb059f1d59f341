"""DistServe's alignment ground truth (``<system>-<N>-<rate>.exp``) read into a :class:`MeasuredRun`."""

from __future__ import annotations

import ast
import csv
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from servesim.fidelity.readers.common import (
    MeasuredRun,
    PathArg,
    _agrees,
    _canonical_gpu,
    _existing,
    _number,
    _read_text,
    _run_from_timestamps,
    _timed_columns,
)
from servesim.fidelity.readers.vllm_log import _log_kv_blocks
from servesim.simcore.errors import ScenarioError

EXP_FIELDS = (
    "prompt_len",
    "output_len",
    "issue_time",
    "first_token_time",
    "complete_time",
    "ttft_ms",
    "tpot_ms",
    "latency_ms",
)
DISTSERVE_GPU = "A100-80"
"""DistServe's alignment runs were measured on A100-80GB SXM nodes (upstream README)."""
_EXP_NAME = re.compile(
    r"^(?P<system>[A-Za-z][A-Za-z0-9_]*?)"
    r"(?:-c(?P<ptp>\d)(?P<ppp>\d)d(?P<dtp>\d)(?P<dpp>\d))?"
    r"-(?P<n>\d+)-(?P<rate>\d+(?:\.\d+)?)$"
)
_OPT_IN_PATH = re.compile(r"opt-?(\d+(?:\.\d+)?b)", re.IGNORECASE)
_TRAILER_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\S.*?)\s*,?\s*$")


def read_distserve_exp(
    path: PathArg,
    *,
    model: str | None = None,
    gpu: str | None = None,
    placement: str | None = None,
) -> MeasuredRun:
    """Read DistServe's measured ``<system>[-cXYdZW]-<N>-<rate>.exp`` file.

    Times (client clock, seconds) become µs after the first ``issue_time``; TTFT and E2E come
    from the timestamps and must agree with the file's ``ttft_ms``/``latency_ms`` (and ``tpot_ms``
    for outputs of 2+ tokens) within 1 ms. The file name gives the system, the nominal request
    count and rate, and for ``cXYdZW`` the prefill (TP X, PP Y) and decode (TP Z, PP W) instances.
    ``model`` and ``gpu`` override what is inferred from the directory names and DistServe's README.
    A disaggregated run whose name has no ``cXYdZW`` code needs ``placement`` (e.g. ``c21d11``):
    the reader refuses to guess it.
    """
    file = _existing(path)
    text = _read_text(file)
    records, trailer = _exp_records(file, text)
    if not records:
        raise ScenarioError(str(file), None, "the file has no records; expected a list of dicts")

    columns = _timed_columns(
        records,
        file,
        EXP_FIELDS,
        ("prompt_len", "output_len"),
        _EXP_TIMES,
        _exp_latencies_agree,
    )
    run, order, out_of_order = _run_from_timestamps(
        **columns,
        request_ids=[f"record {i}" for i in range(len(records))],
        name=file.stem,
        source=str(file),
        system="unknown",
        reported=trailer,
    )
    notes = run.notes
    notes.append(
        "times: issue_time/first_token_time/complete_time (seconds) -> µs after the first "
        "issue_time; TTFT/E2E/TPOT computed from them (they agree with ttft_ms/latency_ms/tpot_ms)"
    )
    if out_of_order:
        notes.append(
            f"records are listed in completion order ({out_of_order} out of issue order); "
            "sorted by issue_time, request_ids give the original record index"
        )
    single = int(np.count_nonzero(run.output_tokens < 2))
    if single:
        notes.append(
            f"{single} request(s) with output_len 1 have no TPOT (-1; DistServe reports 0 for them)"
        )
    _exp_settings(run, file, model, gpu, placement)
    return run


_EXP_TIMES = (
    ("arrival_s", "issue_time"),
    ("first_token_s", "first_token_time"),
    ("last_token_s", "complete_time"),
)


def _exp_latencies_agree(
    index: int, rec: Mapping[str, Any], times: Mapping[str, Any], output: int
) -> None:
    """The record's own ``ttft_ms``/``latency_ms`` (and ``tpot_ms`` for 2+ output tokens) agree
    with its timestamps (all three required, so none is None)."""
    t0, t1, t2 = times["arrival_s"], times["first_token_s"], times["last_token_s"]
    ttft_ms = _number(rec, "ttft_ms")
    tpot_ms = _number(rec, "tpot_ms")
    latency_ms = _number(rec, "latency_ms")
    _agrees(rec, "ttft_ms", ttft_ms, (t1 - t0) * 1e3, "first_token_time - issue_time")
    _agrees(rec, "latency_ms", latency_ms, (t2 - t0) * 1e3, "complete_time - issue_time")
    if output >= 2:
        derived = (t2 - t1) * 1e3 / (output - 1)
        _agrees(rec, "tpot_ms", tpot_ms, derived, "(complete - first token) / (output_len - 1)")


def _exp_records(
    file: Path, text: str
) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, float]]:
    """(line, record) pairs of the literal list, and the trailing summary block as numbers."""
    literal, trailer_lines = _split_exp_trailer(text)
    try:
        tree = ast.parse(literal, mode="eval")
    except SyntaxError as exc:
        line = exc.lineno or 1
        shown = (exc.text or "").strip()[:60] or None
        raise ScenarioError(
            f"{file}:{line}",
            shown,
            f"not a Python literal ({exc.msg}, column {exc.offset}); expected a list of dicts "
            f"with the fields {', '.join(EXP_FIELDS)}",
        ) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ScenarioError(str(file), None, f"cannot parse the records ({exc!r})") from None
    body = tree.body
    if not isinstance(body, (ast.List, ast.Tuple)):
        raise ScenarioError(
            f"{file}:{getattr(body, 'lineno', 1)}",
            type(body).__name__,
            f"expected a list of records [{{'prompt_len': ..., ...}}, ...] with the fields "
            f"{', '.join(EXP_FIELDS)}",
        )
    records = []
    for i, node in enumerate(body.elts):
        line = getattr(node, "lineno", 1)
        rec = _literal_record(file, literal, node, i)
        records.append((line, rec))

    trailer: dict[str, float] = {}
    for line, content in trailer_lines:
        m = _TRAILER_LINE.match(content)
        if m is None:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if not math.isfinite(value):
            raise ScenarioError(
                f"{file}:{line}", m.group(2), f"summary field {m.group(1)}: not finite"
            )
        trailer[m.group(1)] = value
    return records, trailer


def _literal_record(file: Path, source: str, node: ast.expr, index: int) -> dict[str, Any]:
    """One record of the list, evaluated as a literal only; errors name the field when they can."""
    fields = ", ".join(EXP_FIELDS)
    if not isinstance(node, ast.Dict):
        shown = ast.get_source_segment(source, node) or type(node).__name__
        raise ScenarioError(
            f"{file}:{getattr(node, 'lineno', 1)}",
            shown[:60],
            f"record {index}: expected a dict with the fields {fields}",
        )
    rec: dict[str, Any] = {}
    for key_node, value_node in zip(node.keys, node.values):
        where = f"{file}:{getattr(value_node, 'lineno', node.lineno)}"
        try:
            key = ast.literal_eval(key_node) if key_node is not None else None
        except (ValueError, TypeError, SyntaxError, RecursionError):
            key = None
        if not isinstance(key, str):
            shown = ast.get_source_segment(source, key_node) if key_node is not None else "**"
            raise ScenarioError(
                where, shown, f"record {index}: keys must be quoted field names ({fields})"
            )
        try:
            rec[key] = ast.literal_eval(value_node)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            shown = ast.get_source_segment(source, value_node) or ast.dump(value_node)
            raise ScenarioError(
                where,
                shown[:60],
                f"record {index}, field {key}: not a plain literal (expressions are not "
                "evaluated); expected a number",
            ) from None
    return rec


def _split_exp_trailer(text: str) -> tuple[str, list[tuple[int, str]]]:
    """Split off DistServe's ``{ key: value ... }`` block after the record list (not a literal)."""
    lines = text.splitlines()
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    if end >= 3 and lines[end - 1].strip() == "}":
        i = end - 2
        while (
            i >= 0 and _TRAILER_LINE.match(lines[i]) and "'" not in lines[i] and '"' not in lines[i]
        ):
            i -= 1
        if i >= 1 and lines[i].strip() == "{":
            body = [(j + 1, lines[j]) for j in range(i + 1, end - 1)]
            return "\n".join(lines[:i]), body
    return text, []


_PLACEMENT = re.compile(r"^c(?P<ptp>\d)(?P<ppp>\d)d(?P<dtp>\d)(?P<dpp>\d)$")


def parse_placement(value: str, path: str = "--placement") -> tuple[int, int, int, int]:
    """(prefill TP, prefill PP, decode TP, decode PP) of a DistServe ``cXYdZW`` code."""
    m = _PLACEMENT.match(str(value).strip().lower())
    if m is None or "0" in m.groups():
        raise ScenarioError(
            path,
            value,
            "expected cXYdZW: prefill instance TP X / PP Y and decode instance TP Z / PP W, "
            "digits 1-9 (e.g. c21d11 = prefill TP2 + decode TP1)",
        )
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


def _placement_code(p: tuple[int, ...]) -> str:
    return f"c{p[0]}{p[1]}d{p[2]}{p[3]}"


def needs_placement(path: PathArg) -> bool:
    """True for a disaggregated DistServe ``.exp`` file whose name has no ``cXYdZW`` code."""
    file = Path(path)
    if file.suffix.lower() != ".exp":
        return False
    m = _EXP_NAME.match(file.stem)
    return m is not None and m.group("system").lower() == "distserve" and not m.group("ptp")


def _exp_settings(
    run: MeasuredRun,
    file: Path,
    model: str | None,
    gpu: str | None,
    placement: str | None = None,
) -> None:
    notes, inferred = run.notes, run.inferred
    m = _EXP_NAME.match(file.stem)
    given = parse_placement(placement) if placement is not None else None
    if m is None:
        notes.append(
            f"file name {file.name!r} is not <system>[-cXYdZW]-<requests>-<rate>.exp: system, "
            "rate and parallelism unknown"
        )
        if given is not None:
            run.prefill_tp, run.prefill_pp, run.decode_tp, run.decode_pp = given
            run.extra["placement_source"] = "--placement"
            notes.append(f"disaggregated: {_placement_code(given)}, as given by --placement")
    else:
        run.system = m.group("system").lower()
        run.request_rate = float(m.group("rate"))
        nominal = int(m.group("n"))
        run.extra["nominal_requests"] = nominal
        if nominal != run.n:
            notes.append(f"the file name says {nominal} requests but the file has {run.n}")
        if m.group("ptp"):
            named = tuple(int(m.group(k)) for k in ("ptp", "ppp", "dtp", "dpp"))
            if given is not None and given != named:
                raise ScenarioError(
                    "--placement",
                    placement,
                    f"the file name {file.name} says {_placement_code(named)}; drop "
                    "--placement or give the same placement",
                )
            run.prefill_tp, run.prefill_pp, run.decode_tp, run.decode_pp = named
            run.extra["placement_source"] = f"the file name {file.name}"
            notes.append(
                f"disaggregated: prefill instance TP{run.prefill_tp}/PP{run.prefill_pp}, decode "
                f"instance TP{run.decode_tp}/PP{run.decode_pp}, from the file name "
                f"(c{m.group('ptp')}{m.group('ppp')}d{m.group('dtp')}{m.group('dpp')})"
            )
        elif run.system == "distserve":
            if given is None:
                raise ScenarioError(
                    str(file),
                    file.name,
                    "the file name has no cXYdZW placement code, so the prefill and decode "
                    "instances' parallelism is unknown; give it with --placement cXYdZW (e.g. "
                    "--placement c21d11: simdistserve's README gives c21d11 as the best "
                    "OPT-13B/ShareGPT placement on one 4xA100-80GB node) or rename the file",
                )
            run.prefill_tp, run.prefill_pp, run.decode_tp, run.decode_pp = given
            run.extra["placement_source"] = "--placement (the file name has no cXYdZW code)"
            notes.append(
                f"disaggregated: prefill instance TP{given[0]}/PP{given[1]}, decode instance "
                f"TP{given[2]}/PP{given[3]}, as given by --placement "
                f"{_placement_code(given)}; the file name has no cXYdZW code"
            )
        elif given is not None:
            raise ScenarioError(
                "--placement",
                placement,
                f"{file.name} is a {run.system} run, not a disaggregated DistServe one",
            )
        elif run.system == "vllm":
            run.tp, run.pp, run.num_instances = 1, 1, 1
            inferred.extend(["tp", "pp", "num_instances"])
            notes.append(
                "assumed one colocated vLLM instance with TP1/PP1, as simdistserve's "
                "align_with_real.py simulates the vllm-N-R runs"
            )
            notes.append(
                "vLLM engine limits (max_num_seqs, max_num_batched_tokens, block size, KV blocks) "
                "are not recorded in .exp files"
            )
    if model is not None:
        run.model = model
    else:
        hit = next(
            (_OPT_IN_PATH.search(p) for p in reversed(file.parent.parts) if _OPT_IN_PATH.search(p)),
            None,
        )
        if hit is not None:
            run.model = f"facebook/opt-{hit.group(1).lower()}"
            inferred.append("model")
            notes.append(f"model {run.model} inferred from the directory name")
        else:
            notes.append("model unknown: not in the file and no opt-<size>b directory name")
    if gpu is not None:
        run.gpu = _canonical_gpu(gpu)
    else:
        run.gpu = DISTSERVE_GPU
        inferred.append("gpu")
        notes.append(
            f"gpu {DISTSERVE_GPU} assumed: DistServe's alignment runs used A100-80GB SXM nodes "
            "(upstream README); the .exp file does not record it"
        )
    measured = run.measured_rate()
    if measured is not None:
        run.extra["measured_rate"] = measured
    reported = run.reported.get("num_requests")
    if reported is not None and int(reported) != run.n:
        notes.append(f"the summary block says num_requests {reported:g} but the file has {run.n}")
    _distserve_capacity(run, file)
    if not run.disaggregated:
        _log_kv_blocks(run, file.parent, file.stem)


def _distserve_capacity(run: MeasuredRun, file: Path) -> None:
    """KV capacity per instance from simdistserve's ``max_num_tokens.csv`` when it is nearby."""
    table = None
    for folder in list(file.parents)[:3]:
        for candidate in (
            folder / "profile_data" / "max_num_tokens.csv",
            folder / "max_num_tokens.csv",
        ):
            if candidate.is_file():
                table = candidate
                break
        if table is not None:
            break
    if table is None:
        searched = [
            str(folder / "profile_data" / "max_num_tokens.csv") for folder in list(file.parents)[:3]
        ]
        run.extra["kv_capacity_table_missing"] = searched
        run.notes.append(
            "KV capacity unknown: no profile_data/max_num_tokens.csv (simdistserve's capacity "
            "table) next to the run; looked for " + ", ".join(searched)
        )
        return
    run.extra["kv_capacity_table"] = str(table)
    if run.model is None:
        run.notes.append(f"KV capacity unknown: {table} is per model and the model is unknown")
        return
    capacity: dict[tuple[int, int], int] = {}
    try:
        with table.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if (row.get("model") or "").strip().lower() == run.model.lower():
                    capacity[(int(row["tp"]), int(row["pp"]))] = int(row["max_num_tokens"])
    except (OSError, KeyError, ValueError, TypeError, csv.Error) as exc:
        run.notes.append(f"could not read {table} ({exc!r}); KV capacity unknown")
        return
    where = f"from {table.name} (simdistserve's memory model, not measured)"
    if run.tp is not None and (run.tp, run.pp or 1) in capacity:
        run.kv_capacity_tokens = capacity[(run.tp, run.pp or 1)]
        run.inferred.append("kv_capacity_tokens")
        run.notes.append(f"kv_capacity_tokens {run.kv_capacity_tokens} {where}")
    for role in ("prefill", "decode"):
        tp, pp = getattr(run, f"{role}_tp"), getattr(run, f"{role}_pp")
        if tp is not None and (tp, pp or 1) in capacity:
            run.extra[f"{role}_kv_capacity_tokens"] = capacity[(tp, pp or 1)]
    if run.disaggregated and "decode_kv_capacity_tokens" in run.extra:
        run.notes.append(
            f"per-instance KV capacity (extra.prefill_/decode_kv_capacity_tokens) {where}"
        )
