"""Measured serving runs: per-request results of real systems, read into one shape.

Three sources, one :class:`MeasuredRun`:

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
  the header may give settings (``system``, ``model``, ``gpu``, ``tp``, ...; see ``_CSV_SETTINGS``).

Conventions of a :class:`MeasuredRun`: requests are sorted by arrival (stably); ``arrival_us`` is
int64 µs after the first arrival; latencies are float64 µs with ``-1`` for unknown; ``tpot_us =
(e2e − ttft) / (output_tokens − 1)``, unknown for single-token outputs; ``output_tokens`` counts
the first token. Settings are ``None`` when not known; ``inferred`` names the ones taken from a file
name or a documented convention rather than from the run's metadata, and ``notes`` says how.

Every malformed input raises :class:`ScenarioError` whose path is ``<file>:<line>`` and whose
message names the record (0-based) and the field, with what is allowed.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from servesim.simcore.errors import ScenarioError

PathArg = str | PathLike[str]
UNKNOWN = -1.0
"""Latency value meaning "not measured"."""

CONSISTENCY_TOLERANCE_MS = 1.0
"""How far a reported ``ttft_ms``/``latency_ms``/``tpot_ms`` may stray from its timestamps."""

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
JSONL_REQUIRED = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
JSONL_OPTIONAL = ("request_id", "arrival_time", "scheduled_ts")
CSV_REQUIRED = ("arrival_s", "input_tokens", "output_tokens", "ttft_s", "e2e_s")
CSV_OPTIONAL = ("queued_s", "tpot_s", "request_id")

DISTSERVE_GPU = "A100-80"
"""DistServe's alignment runs were measured on A100-80GB SXM nodes (upstream README)."""

_EXP_NAME = re.compile(
    r"^(?P<system>[A-Za-z][A-Za-z0-9_]*?)"
    r"(?:-c(?P<ptp>\d)(?P<ppp>\d)d(?P<dtp>\d)(?P<dpp>\d))?"
    r"-(?P<n>\d+)-(?P<rate>\d+(?:\.\d+)?)$"
)
_OPT_IN_PATH = re.compile(r"opt-?(\d+(?:\.\d+)?b)", re.IGNORECASE)
_TRAILER_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\S.*?)\s*,?\s*$")
_SPS = re.compile(r"sps(\d+(?:\.\d+)?)")
_SUMMARY_ROW = re.compile(
    r"^(TTFT|TPOT|Latency|ITL|E2E)\s+(Mean|Median|P\d+)\s+"
    r"([-+]?\d+(?:\.\d+)?)\s+([-+]?\d+(?:\.\d+)?)",
    re.IGNORECASE,
)


# ====================================================================== the run


def _array(dtype: type) -> Callable[[Any], np.ndarray]:
    def convert(value: Any) -> np.ndarray:
        return np.asarray(value, dtype=dtype)

    return convert


@attrs.define(eq=False, kw_only=True)
class MeasuredRun:
    """One measured serving run: per-request arrays plus what is known of the server."""

    name: str
    source: str
    system: str
    arrival_us: np.ndarray = attrs.field(converter=_array(np.int64))
    input_tokens: np.ndarray = attrs.field(converter=_array(np.int64))
    output_tokens: np.ndarray = attrs.field(converter=_array(np.int64))
    ttft_us: np.ndarray = attrs.field(converter=_array(np.float64))
    e2e_us: np.ndarray = attrs.field(converter=_array(np.float64))
    tpot_us: np.ndarray = attrs.field(converter=_array(np.float64))
    queued_us: np.ndarray | None = attrs.field(
        default=None, converter=attrs.converters.optional(_array(np.float64))
    )
    request_ids: tuple[str, ...] = ()
    # ---- server settings (None = unknown)
    model: str | None = None
    model_config: str | None = None
    gpu: str | None = None
    engine_version: str | None = None
    dtype: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    expert_parallel: bool | None = None
    num_instances: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_blocks: int | None = None
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    prefill_tp: int | None = None
    prefill_pp: int | None = None
    decode_tp: int | None = None
    decode_pp: int | None = None
    request_rate: float | None = None
    """Nominal offered rate (req/s) as the run was configured; see :meth:`measured_rate`."""
    # ---- provenance
    reported: dict[str, float] = attrs.field(factory=dict)
    """Summary figures the source itself reported (its own means/percentiles), for cross-checks."""
    extra: dict[str, Any] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    inferred: list[str] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        n = len(self.arrival_us)
        arrays = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "ttft_us": self.ttft_us,
            "e2e_us": self.e2e_us,
            "tpot_us": self.tpot_us,
        }
        if self.queued_us is not None:
            arrays["queued_us"] = self.queued_us
        for field, values in arrays.items():
            if values.shape != (n,):
                raise ValueError(
                    f"MeasuredRun {self.name}: {field} has shape {values.shape}, not ({n},)"
                )
        if self.request_ids and len(self.request_ids) != n:
            raise ValueError(
                f"MeasuredRun {self.name}: {len(self.request_ids)} request ids for {n} requests"
            )

    @property
    def n(self) -> int:
        """Number of requests."""
        return len(self.arrival_us)

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode ran on separate instances (DistServe)."""
        return self.prefill_tp is not None or self.decode_tp is not None

    def measured_rate(self) -> float | None:
        """Requests per second over the arrival span, (n − 1) / span; None below 2 requests."""
        if self.n < 2 or self.arrival_us[-1] <= self.arrival_us[0]:
            return None
        return (self.n - 1) / ((int(self.arrival_us[-1]) - int(self.arrival_us[0])) / 1e6)

    def metrics(self) -> dict[str, dict[str, float | int | None]]:
        """:func:`summarize` of TTFT, TPOT, E2E (and queueing when known), in milliseconds."""
        out = {
            "ttft_ms": summarize(_ms(self.ttft_us)),
            "tpot_ms": summarize(_ms(self.tpot_us)),
            "e2e_ms": summarize(_ms(self.e2e_us)),
        }
        if self.queued_us is not None:
            out["queued_ms"] = summarize(_ms(self.queued_us))
        return out

    def settings(self) -> dict[str, Any]:
        """The known server settings (None fields left out), for reports."""
        names = (
            "model", "model_config", "gpu", "engine_version", "dtype", "tp", "pp", "dp",
            "expert_parallel", "num_instances", "max_num_seqs", "max_num_batched_tokens",
            "kv_blocks", "block_size", "kv_capacity_tokens", "prefill_tp", "prefill_pp",
            "decode_tp", "decode_pp", "request_rate",
        )  # fmt: skip
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def write_trace_csv(self, path: PathArg) -> Path:
        """Write the arrivals and lengths as a servesim ``csv`` trace (``arrival_us, input_tokens,
        output_tokens``), to replay this run's workload in a simulation."""
        out = Path(path)
        with out.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["arrival_us", "input_tokens", "output_tokens"])
            writer.writerows(
                zip(
                    self.arrival_us.tolist(),
                    self.input_tokens.tolist(),
                    self.output_tokens.tolist(),
                )
            )
        return out

    def __repr__(self) -> str:
        return (
            f"MeasuredRun(name={self.name!r}, system={self.system!r}, n={self.n}, "
            f"source={self.source!r})"
        )


def _ms(values_us: np.ndarray) -> np.ndarray:
    return np.where(values_us >= 0, values_us / 1000.0, UNKNOWN)


def summarize(values: Iterable[float] | np.ndarray) -> dict[str, float | int | None]:
    """``count``, ``mean``, ``p50``, ``p90``, ``p95``, ``p99`` of the known values.

    Negative values (the ``-1`` unknown marker) and NaN are ignored; percentiles interpolate
    linearly (numpy's default). With no known value every statistic is None.
    """
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    arr = arr.ravel()
    known = arr[np.isfinite(arr) & (arr >= 0)]
    if known.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    p50, p90, p95, p99 = np.percentile(known, [50, 90, 95, 99])
    return {
        "count": int(known.size),
        "mean": float(known.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
    }


# ====================================================================== shared checks


class _Bad(Exception):
    """A bad field in a record; turned into a ScenarioError naming file, line and record."""

    def __init__(self, field: str, value: Any, what: str):
        super().__init__(field)
        self.field = field
        self.value = value
        self.what = what


def _number(rec: Mapping[str, Any], key: str, *, minimum: float = 0.0) -> float:
    if key not in rec:
        raise _Bad(key, None, "missing")
    value = rec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(key, value, f"expected a number >= {minimum:g}")
    value = float(value)
    if not math.isfinite(value):
        raise _Bad(key, value, "expected a finite number (not NaN or infinity)")
    if value < minimum:
        raise _Bad(key, value, f"must be >= {minimum:g}")
    return value


def _count(rec: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    value = _number(rec, key, minimum=minimum)
    if value != int(value):
        raise _Bad(key, rec[key], "expected a whole number of tokens")
    return int(value)


def _ordered(rec: Mapping[str, Any], times: Iterable[tuple[str, float | None]]) -> None:
    """Timestamps must not decrease in the given order (None = absent, skipped)."""
    previous: tuple[str, float] | None = None
    for key, value in times:
        if value is None:
            continue
        if previous is not None and value < previous[1]:
            raise _Bad(
                key,
                rec.get(key, value),
                f"earlier than {previous[0]} ({previous[1]!r}); the times must not decrease",
            )
        previous = (key, value)


def _agrees(
    rec: Mapping[str, Any], key: str, reported_ms: float, derived_ms: float, how: str
) -> None:
    if abs(reported_ms - derived_ms) > CONSISTENCY_TOLERANCE_MS:
        raise _Bad(
            key,
            rec.get(key),
            f"disagrees with {how} = {derived_ms:.3f} ms (more than "
            f"{CONSISTENCY_TOLERANCE_MS:g} ms apart)",
        )


def _record_error(where: str, index: int, err: _Bad) -> ScenarioError:
    return ScenarioError(where, err.value, f"record {index}, field {err.field}: {err.what}")


def _sorted_by_arrival(times: np.ndarray) -> tuple[np.ndarray, int]:
    """Stable arrival order and the number of records that came earlier than their predecessor."""
    order = np.argsort(times, kind="stable")
    out_of_order = int(np.count_nonzero(np.diff(times) < 0)) if times.size > 1 else 0
    return order, out_of_order


def _tpot_us(ttft_us: np.ndarray, e2e_us: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    ok = (output_tokens >= 2) & (ttft_us >= 0) & (e2e_us >= 0)
    tpot = np.full(ttft_us.shape, UNKNOWN)
    tpot[ok] = (e2e_us[ok] - ttft_us[ok]) / (output_tokens[ok] - 1)
    return tpot


def _relative_us(seconds: np.ndarray) -> np.ndarray:
    return (
        np.rint((seconds - seconds[0]) * 1e6).astype(np.int64)
        if seconds.size
        else seconds.astype(np.int64)
    )


def _existing(path: PathArg) -> Path:
    file = Path(path)
    if not file.exists():
        raise ScenarioError(str(file), None, "no such file or directory")
    return file


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(file), None, f"cannot read the file ({exc})") from None


def _canonical_gpu(name: str) -> str:
    """servesim's canonical GPU name when known (``RTXPRO6000`` → ``RTX-PRO-6000``)."""
    from servesim.latency.hardware import resolve_gpu

    try:
        return resolve_gpu(name).name
    except ScenarioError:
        return name


# ====================================================================== DistServe .exp


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

    n = len(records)
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    issue = np.empty(n, dtype=np.float64)
    first = np.empty(n, dtype=np.float64)
    complete = np.empty(n, dtype=np.float64)
    for i, (line, rec) in enumerate(records):
        try:
            missing = [k for k in EXP_FIELDS if k not in rec]
            if missing:
                raise _Bad(
                    missing[0],
                    None,
                    f"missing; every record needs {', '.join(EXP_FIELDS)} (missing: "
                    f"{', '.join(missing)})",
                )
            prompt[i] = _count(rec, "prompt_len")
            output[i] = _count(rec, "output_len")
            t0 = _number(rec, "issue_time")
            t1 = _number(rec, "first_token_time")
            t2 = _number(rec, "complete_time")
            _ordered(rec, (("issue_time", t0), ("first_token_time", t1), ("complete_time", t2)))
            ttft_ms = _number(rec, "ttft_ms")
            tpot_ms = _number(rec, "tpot_ms")
            latency_ms = _number(rec, "latency_ms")
            _agrees(rec, "ttft_ms", ttft_ms, (t1 - t0) * 1e3, "first_token_time - issue_time")
            _agrees(rec, "latency_ms", latency_ms, (t2 - t0) * 1e3, "complete_time - issue_time")
            if output[i] >= 2:
                derived = (t2 - t1) * 1e3 / (output[i] - 1)
                _agrees(
                    rec, "tpot_ms", tpot_ms, derived, "(complete - first token) / (output_len - 1)"
                )
        except _Bad as err:
            raise _record_error(f"{file}:{line}", i, err) from None
        issue[i], first[i], complete[i] = t0, t1, t2

    order, out_of_order = _sorted_by_arrival(issue)
    prompt, output = prompt[order], output[order]
    issue, first, complete = issue[order], first[order], complete[order]
    ttft = (first - issue) * 1e6
    e2e = (complete - issue) * 1e6
    tpot = _tpot_us(ttft, e2e, output)

    run = MeasuredRun(
        name=file.stem,
        source=str(file),
        system="unknown",
        arrival_us=_relative_us(issue),
        input_tokens=prompt,
        output_tokens=output,
        ttft_us=ttft,
        e2e_us=e2e,
        tpot_us=tpot,
        request_ids=tuple(f"record {int(i)}" for i in order),
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
    single = int(np.count_nonzero(output < 2))
    if single:
        notes.append(
            f"{single} request(s) with output_len 1 have no TPOT (-1; DistServe reports 0 for them)"
        )
    _exp_settings(run, file, model, gpu, placement)
    return run


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


# ====================================================================== LLMServingSim


def _llmservingsim_files(path: Path) -> dict[str, Path | None]:
    """Locate requests/meta/config/summary for a run directory (or its requests file)."""
    if path.is_file():
        requests: Path | None = path
        folder = path.parent
    else:
        folder = path
        requests = next(
            (
                p
                for p in (
                    folder / "vllm_requests.jsonl",
                    folder / "requests.jsonl",
                    folder / "vllm" / "requests.jsonl",
                )
                if p.is_file()
            ),
            None,
        )
    found: dict[str, Path | None] = {
        "requests": requests,
        "meta": None,
        "config": None,
        "summary": None,
    }
    if requests is None:
        return found
    home = requests.parent
    root = home.parent if home.name == "vllm" and not (home / "config.json").is_file() else home
    prefix = "vllm_" if requests.name.startswith("vllm_") else ""
    for key, names in (
        ("meta", (home / f"{prefix}meta.json", home / "meta.json", home / "vllm_meta.json")),
        ("config", (home / "config.json", root / "config.json")),
        (
            "summary",
            (
                root / "validation_summary.txt",
                root / "validation" / "summary.txt",
                home / "summary.txt",
            ),
        ),
    ):
        found[key] = next((p for p in names if p.is_file()), None)
    found["root"] = root
    return found


def read_llmservingsim(run_dir: PathArg) -> MeasuredRun:
    """Read an LLMServingSim vLLM benchmark run (a directory, or its requests JSONL file).

    Per request (JSONL): ``input_toks``, ``output_toks``, ``queued_ts``, ``first_token_ts``,
    ``last_token_ts`` (engine clock, s) and optionally ``request_id``, ``arrival_time`` (client wall
    clock), ``scheduled_ts``. As in LLMServingSim's validation, TTFT = first_token − queued and
    E2E = last_token − queued, so arrivals are the ``queued_ts`` (one clock for all three);
    ``queued_us`` = scheduled − queued. Settings come from ``meta.json`` (vLLM engine arguments)
    and ``config.json`` (hardware, instances); the validation summary's vLLM column goes to
    ``reported`` (ms) and its simulator column to ``extra['llmservingsim_sim_ms']``.
    """
    path = _existing(run_dir)
    files = _llmservingsim_files(path)
    requests = files["requests"]
    if requests is None:
        raise ScenarioError(
            str(path),
            None,
            "no requests file: expected vllm_requests.jsonl, requests.jsonl or vllm/requests.jsonl "
            "in the run directory",
        )
    rows = _jsonl_records(requests)
    n = len(rows)
    inp = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    queued = np.empty(n, dtype=np.float64)
    scheduled = np.full(n, np.nan)
    first = np.empty(n, dtype=np.float64)
    last = np.empty(n, dtype=np.float64)
    client = np.full(n, np.nan)
    ids: list[str] = []
    for i, (line, rec) in enumerate(rows):
        try:
            missing = [k for k in JSONL_REQUIRED if k not in rec]
            if missing:
                raise _Bad(
                    missing[0],
                    None,
                    f"missing; every record needs {', '.join(JSONL_REQUIRED)} (missing: "
                    f"{', '.join(missing)})",
                )
            inp[i] = _count(rec, "input_toks")
            out[i] = _count(rec, "output_toks")
            q = _number(rec, "queued_ts")
            s = _number(rec, "scheduled_ts") if "scheduled_ts" in rec else None
            f = _number(rec, "first_token_ts")
            last_ts = _number(rec, "last_token_ts")
            _ordered(
                rec,
                (
                    ("queued_ts", q),
                    ("scheduled_ts", s),
                    ("first_token_ts", f),
                    ("last_token_ts", last_ts),
                ),
            )
            if "arrival_time" in rec:
                client[i] = _number(rec, "arrival_time")
        except _Bad as err:
            raise _record_error(f"{requests}:{line}", i, err) from None
        queued[i], first[i], last[i] = q, f, last_ts
        if s is not None:
            scheduled[i] = s
        ids.append(str(rec.get("request_id", f"line {line}")))

    order, out_of_order = _sorted_by_arrival(queued)
    inp, out = inp[order], out[order]
    queued, scheduled, first, last, client = (
        queued[order],
        scheduled[order],
        first[order],
        last[order],
        client[order],
    )
    ttft = (first - queued) * 1e6
    e2e = (last - queued) * 1e6
    wait = np.where(np.isnan(scheduled), UNKNOWN, (scheduled - queued) * 1e6)
    root = files.get("root") or requests.parent
    run = MeasuredRun(
        name=root.name,
        source=str(root),
        system="vllm",
        arrival_us=_relative_us(queued),
        input_tokens=inp,
        output_tokens=out,
        ttft_us=ttft,
        e2e_us=e2e,
        tpot_us=_tpot_us(ttft, e2e, out),
        queued_us=None if np.isnan(scheduled).all() else wait,
        request_ids=tuple(ids[int(i)] for i in order),
    )
    run.notes.append(
        f"per-request times from {requests.name}: arrival = queued_ts (engine clock), TTFT = "
        "first_token_ts - queued_ts, E2E = last_token_ts - queued_ts (LLMServingSim's definitions)"
    )
    if out_of_order:
        run.notes.append(f"{out_of_order} record(s) out of queued_ts order; sorted by queued_ts")
    if not np.isnan(client).any() and n:
        lag = (queued - queued[0]) - (client - client[0])
        run.extra["client_to_queue_lag_ms_median"] = float(np.median(lag) * 1e3)
        run.notes.append(
            "arrival_time (client wall clock) is not used: relative to the first request the "
            f"engine queued requests a median {np.median(lag) * 1e3:.1f} ms later than the "
            "client sent them"
        )
    if files["meta"] is not None:
        _llmservingsim_meta(run, files["meta"])
    else:
        run.notes.append("no meta.json: vLLM engine settings unknown")
    if files["config"] is not None:
        _llmservingsim_config(run, files["config"])
    else:
        run.notes.append("no config.json: hardware unknown")
    if files["summary"] is not None:
        _llmservingsim_summary(run, files["summary"])
    if run.kv_blocks is None:
        _log_kv_blocks(run, root)
        if requests.parent != root:
            _log_kv_blocks(run, requests.parent)
    if run.kv_blocks is None:
        run.notes.append(
            "KV block count not recorded (no kv_cache in meta.json, no vLLM log with '# GPU "
            "blocks' or 'GPU KV cache size'; vllm_timeseries.csv has only kv_cache_pct)"
        )
    measured = run.measured_rate()
    if measured is not None:
        run.extra["measured_rate"] = measured
    return run


def _jsonl_records(file: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    text = _read_text(file)
    for line, content in enumerate(text.splitlines(), start=1):
        if not content.strip():
            continue
        try:
            rec = json.loads(content)  # NaN/Infinity parse, then fail the field check
        except ValueError as exc:
            raise ScenarioError(
                f"{file}:{line}",
                content.strip()[:60],
                f"record {len(rows)}: not valid JSON ({exc})",
            ) from None
        if not isinstance(rec, dict):
            raise ScenarioError(
                f"{file}:{line}", rec, f"record {len(rows)}: expected a JSON object"
            )
        rows.append((line, rec))
    if not rows:
        raise ScenarioError(str(file), None, "the file has no records (one JSON object per line)")
    return rows


def _load_json(file: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(_read_text(file))
    except ValueError as exc:
        raise ScenarioError(str(file), None, f"not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ScenarioError(str(file), type(data).__name__, "expected a JSON object")
    return data


def _meta_int(value: Any, where: str, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScenarioError(where, value, f"expected an integer >= {minimum} or null")
    return value


def _llmservingsim_meta(run: MeasuredRun, file: Path) -> None:
    meta = _load_json(file)
    kwargs = meta.get("engine_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ScenarioError(f"{file}: engine_kwargs", kwargs, "expected a JSON object")
    model = kwargs.get("model") or meta.get("model")
    if model is not None:
        run.model = str(model)
    version = meta.get("vllm_version")
    if version is not None:
        run.engine_version = f"vllm {version}"
    where = f"{file}: engine_kwargs"
    run.tp = _meta_int(kwargs.get("tensor_parallel_size"), f"{where}.tensor_parallel_size")
    run.dp = _meta_int(kwargs.get("data_parallel_size"), f"{where}.data_parallel_size")
    if "pipeline_parallel_size" in kwargs:
        run.pp = _meta_int(kwargs["pipeline_parallel_size"], f"{where}.pipeline_parallel_size")
    elif kwargs:
        run.pp = 1
        run.inferred.append("pp")
        run.notes.append(
            "pp 1: the engine arguments set no pipeline_parallel_size (vLLM's default)"
        )
    ep = kwargs.get("enable_expert_parallel")
    if ep is not None:
        if not isinstance(ep, bool):
            raise ScenarioError(f"{where}.enable_expert_parallel", ep, "expected true or false")
        run.expert_parallel = ep
    run.max_num_seqs = _meta_int(kwargs.get("max_num_seqs"), f"{where}.max_num_seqs")
    run.max_num_batched_tokens = _meta_int(
        kwargs.get("max_num_batched_tokens"), f"{where}.max_num_batched_tokens"
    )
    run.block_size = _meta_int(kwargs.get("block_size"), f"{where}.block_size")
    run.kv_blocks = _meta_int(
        kwargs.get("num_gpu_blocks_override"), f"{where}.num_gpu_blocks_override"
    )
    if run.kv_blocks is not None:
        run.extra["kv_blocks_source"] = f"{file} (engine_kwargs.num_gpu_blocks_override)"
    else:
        _meta_kv_cache(run, meta, file)
    if kwargs.get("dtype") is not None:
        run.dtype = str(kwargs["dtype"])
    for key in (
        "max_model_len",
        "kv_cache_dtype",
        "seed",
        "gpu_memory_utilization",
        "enable_chunked_prefill",
        "enable_prefix_caching",
    ):
        if kwargs.get(key) is not None:
            run.extra[key] = kwargs[key]
    dataset = meta.get("dataset_path")
    if isinstance(dataset, str):
        run.extra["dataset_path"] = dataset
        m = _SPS.search(Path(dataset).name)
        if m is not None:
            run.request_rate = float(m.group(1))
            run.inferred.append("request_rate")
            run.notes.append(
                f"request_rate {m.group(1)} req/s from the dataset name {Path(dataset).name} "
                "(sps = requests per second)"
            )
    nominal = meta.get("num_requests")
    if isinstance(nominal, int) and not isinstance(nominal, bool):
        run.extra["nominal_requests"] = nominal
        if nominal != run.n:
            run.notes.append(f"meta.json says {nominal} requests but the requests file has {run.n}")
    for key in ("started_at", "finished_at"):
        if isinstance(meta.get(key), str):
            run.extra[key] = meta[key]


def _meta_kv_cache(run: MeasuredRun, meta: Mapping[str, Any], file: Path) -> None:
    """vLLM's own KV block count, as newer LLMServingSim harnesses record it: ``kv_cache``
    (``num_gpu_blocks``, ``block_size``, ``gpu_memory_utilization``) and, per engine,
    ``resolved_config.cache_config.kv_cache_size_tokens``. With data parallelism
    ``kv_cache.num_gpu_blocks`` counts every rank's blocks; the replay needs one rank's."""
    kv = meta.get("kv_cache")
    if not isinstance(kv, Mapping):
        return
    where = f"{file}: kv_cache"
    blocks = _meta_int(kv.get("num_gpu_blocks"), f"{where}.num_gpu_blocks")
    block_size = _meta_int(kv.get("block_size"), f"{where}.block_size")
    if block_size is not None:
        run.block_size = block_size
    utilisation = kv.get("gpu_memory_utilization")
    if isinstance(utilisation, (int, float)) and not isinstance(utilisation, bool):
        run.extra["gpu_memory_utilization"] = float(utilisation)
    resolved = meta.get("resolved_config")
    cache = resolved.get("cache_config") if isinstance(resolved, Mapping) else None
    per_engine = None
    if isinstance(cache, Mapping) and run.block_size:
        tokens = _meta_int(
            cache.get("kv_cache_size_tokens"),
            f"{file}: resolved_config.cache_config.kv_cache_size_tokens",
        )
        if tokens is not None:
            per_engine = tokens // run.block_size
    dp = run.dp or 1
    if per_engine is not None:
        run.kv_blocks = per_engine
        run.extra["kv_blocks_source"] = (
            f"{file} (resolved_config.cache_config.kv_cache_size_tokens {tokens} / block size "
            f"{run.block_size}, per engine)"
        )
    elif blocks is not None and dp > 1:
        run.kv_blocks = blocks // dp
        run.extra["kv_blocks_source"] = (
            f"{file} (kv_cache.num_gpu_blocks {blocks} over {dp} data-parallel ranks)"
        )
    elif blocks is not None:
        run.kv_blocks = blocks
        run.extra["kv_blocks_source"] = f"{file} (kv_cache.num_gpu_blocks)"


_LOG_V0_BLOCKS = re.compile(r"#\s*GPU blocks:\s*([\d,]+)")
_LOG_V1_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")


def _log_kv_blocks(run: MeasuredRun, folder: Path, stem: str | None = None) -> None:
    """vLLM's block count from a server log next to the run: ``# GPU blocks: N`` (v0) or
    ``GPU KV cache size: N tokens`` (v1, divided by the block size). Each engine (data-parallel
    rank) logs its own; the smallest is kept."""
    if run.kv_blocks is not None or not folder.is_dir():
        return
    names = [f"{stem}.log"] if stem else []
    logs = [folder / n for n in names if (folder / n).is_file()]
    logs += sorted(p for p in folder.glob("*.log") if p not in logs)
    for log in logs:
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        v0 = [int(x.replace(",", "")) for x in _LOG_V0_BLOCKS.findall(text)]
        v1 = [int(x.replace(",", "")) for x in _LOG_V1_TOKENS.findall(text)]
        if v0:
            run.kv_blocks = min(v0)
            run.extra["kv_blocks_source"] = f"{log} ('# GPU blocks: {run.kv_blocks}', vLLM v0)"
        elif v1:
            block = run.block_size or 16
            run.kv_blocks = min(v1) // block
            run.extra["kv_blocks_source"] = (
                f"{log} ('GPU KV cache size: {min(v1):,} tokens' / block size {block}"
                + ("" if run.block_size else ", vLLM's default")
                + ")"
            )
            if run.block_size is None:
                run.block_size = block
                run.inferred.append("block_size")
        else:
            continue
        if len(set(v0 or v1)) > 1:
            run.notes.append(
                f"{log.name} logs several KV sizes {sorted(set(v0 or v1))}; kept the smallest"
            )
        return


def _llmservingsim_config(run: MeasuredRun, file: Path) -> None:
    config = _load_json(file)
    nodes = config.get("nodes")
    if not isinstance(nodes, list):
        raise ScenarioError(f"{file}: nodes", nodes, "expected a list of nodes")
    instances: list[Mapping[str, Any]] = []
    for i, node in enumerate(nodes):
        inner = node.get("instances") if isinstance(node, Mapping) else None
        if not isinstance(inner, list) or not all(isinstance(x, Mapping) for x in inner):
            raise ScenarioError(
                f"{file}: nodes[{i}].instances", inner, "expected a list of objects"
            )
        instances.extend(inner)
    if not instances:
        raise ScenarioError(f"{file}: nodes", nodes, "no instances")
    run.num_instances = len(instances)
    hardware = {str(x.get("hardware")) for x in instances if x.get("hardware") is not None}
    if len(hardware) == 1:
        (name,) = hardware
        run.gpu = _canonical_gpu(name)
    elif hardware:
        run.notes.append(f"mixed hardware across instances: {sorted(hardware)}")
    first = instances[0]
    if run.model is None and first.get("model_name") is not None:
        run.model = str(first["model_name"])
    if run.tp is None and isinstance(first.get("tp_size"), int):
        run.tp = first["tp_size"]
    if isinstance(first.get("ep_size"), int):
        run.extra["ep_size"] = first["ep_size"]
    memory = first.get("npu_mem")
    if isinstance(memory, Mapping):
        if memory.get("mem_size") is not None:
            run.extra["gpu_memory_gb"] = memory["mem_size"]
        if memory.get("mem_util") is not None:
            run.extra.setdefault("gpu_memory_utilization", memory["mem_util"])
    roles = {x.get("pd_type") for x in instances}
    if roles - {None}:
        run.extra["pd_types"] = sorted(str(r) for r in roles)
        run.notes.append(f"instances have prefill/decode roles {sorted(str(r) for r in roles)}")


def _llmservingsim_summary(run: MeasuredRun, file: Path) -> None:
    names = {"ttft": "ttft", "tpot": "tpot", "latency": "e2e", "e2e": "e2e", "itl": "itl"}
    sim: dict[str, float] = {}
    for content in _read_text(file).splitlines():
        m = _SUMMARY_ROW.match(content.strip())
        if m is None:
            continue
        stat = m.group(2).lower()
        key = f"{names[m.group(1).lower()]}_{'p50' if stat == 'median' else stat}_ms"
        run.reported[key] = float(m.group(3))
        sim[key] = float(m.group(4))
    if sim:
        run.extra["llmservingsim_sim_ms"] = sim
        run.notes.append(
            f"reported: the vLLM column of {file.name}; extra.llmservingsim_sim_ms: "
            "LLMServingSim's own simulated figures"
        )


# ====================================================================== generic CSV

_CSV_SETTINGS: dict[str, Callable[[str], Any]] = {
    "name": str,
    "system": str,
    "model": str,
    "model_config": str,
    "gpu": str,
    "engine_version": str,
    "dtype": str,
    "tp": int,
    "pp": int,
    "dp": int,
    "num_instances": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "kv_blocks": int,
    "block_size": int,
    "kv_capacity_tokens": int,
    "prefill_tp": int,
    "prefill_pp": int,
    "decode_tp": int,
    "decode_pp": int,
    "request_rate": float,
}
"""Settings a generic CSV may give in ``# key: value`` comment lines before its header."""


def read_generic_csv(path: PathArg, *, system: str | None = None) -> MeasuredRun:
    """Read a measured run from a CSV (header required; times in seconds; module doc).

    Required columns ``arrival_s, input_tokens, output_tokens, ttft_s, e2e_s``; optional
    ``queued_s`` (time waiting before first scheduled), ``tpot_s`` (else derived) and
    ``request_id``. Latency cells may be empty (unknown); present values must be finite and
    ≥ 0, with ``queued_s ≤ ttft_s ≤ e2e_s``. Rows are sorted by arrival.
    """
    file = _existing(path)
    text = _read_text(file)
    settings: dict[str, Any] = {}
    extra: dict[str, str] = {}
    lines = text.splitlines()
    start = 0
    while start < len(lines) and (
        not lines[start].strip() or lines[start].lstrip().startswith("#")
    ):
        content = lines[start].strip().lstrip("#").strip()
        if ":" in content:
            key, _, value = content.partition(":")
            key, value = key.strip(), value.strip()
            if key in _CSV_SETTINGS:
                try:
                    settings[key] = _CSV_SETTINGS[key](value)
                except ValueError:
                    kind = _CSV_SETTINGS[key].__name__
                    raise ScenarioError(
                        f"{file}:{start + 1}", value, f"setting {key}: expected a {kind}"
                    ) from None
            elif key:
                extra[key] = value
        start += 1
    if start >= len(lines):
        raise ScenarioError(
            str(file), None, f"no header row; expected the columns {', '.join(CSV_REQUIRED)}"
        )

    reader = csv.reader(lines[start:])
    try:
        header = [c.strip() for c in next(reader)]
    except csv.Error as exc:
        raise ScenarioError(f"{file}:{start + 1}", None, f"malformed CSV ({exc})") from None
    header_line = start + 1
    index: dict[str, int] = {}
    for i, column in enumerate(header):
        if column in index:
            raise ScenarioError(f"{file}:{header_line}", column, "the column is given twice")
        index[column] = i
    missing = [c for c in CSV_REQUIRED if c not in index]
    if missing:
        raise ScenarioError(
            f"{file}:{header_line}",
            ",".join(header),
            f"missing column(s) {', '.join(missing)}; the header must name "
            f"{', '.join(CSV_REQUIRED)} (optional: {', '.join(CSV_OPTIONAL)})",
        )
    ignored = [c for c in header if c not in CSV_REQUIRED and c not in CSV_OPTIONAL]

    arrival: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    ttft: list[float] = []
    e2e: list[float] = []
    queued: list[float] = []
    tpot: list[float] = []
    ids: list[str] = []
    try:
        for cells in reader:
            line = header_line + reader.line_num - 1
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ScenarioError(
                    f"{file}:{line}",
                    ",".join(cells),
                    f"expected {len(header)} columns (as in the header), got {len(cells)}",
                )
            record = len(arrival)
            try:
                arrival.append(_cell(cells, index, "arrival_s", required=True))
                inp.append(_cell_count(cells, index, "input_tokens"))
                out.append(_cell_count(cells, index, "output_tokens"))
                t = _cell(cells, index, "ttft_s")
                e = _cell(cells, index, "e2e_s")
                q = _cell(cells, index, "queued_s")
                p = _cell(cells, index, "tpot_s")
                row = {k: cells[index[k]] for k in ("queued_s", "ttft_s", "e2e_s") if k in index}
                _ordered(row, (("queued_s", q), ("ttft_s", t), ("e2e_s", e)))
            except _Bad as err:
                raise ScenarioError(
                    f"{file}:{line}", err.value, f"record {record}, column {err.field}: {err.what}"
                ) from None
            ttft.append(UNKNOWN if t is None else t * 1e6)
            e2e.append(UNKNOWN if e is None else e * 1e6)
            queued.append(UNKNOWN if q is None else q * 1e6)
            tpot.append(UNKNOWN if p is None else p * 1e6)
            ids.append(
                cells[index["request_id"]].strip() if "request_id" in index else f"line {line}"
            )
    except csv.Error as exc:
        raise ScenarioError(
            f"{file}:{header_line + reader.line_num - 1}", None, f"malformed CSV ({exc})"
        ) from None
    if not arrival:
        raise ScenarioError(str(file), None, "the file has a header but no rows")

    times = np.asarray(arrival, dtype=np.float64)
    order, out_of_order = _sorted_by_arrival(times)
    ttft_us = np.asarray(ttft)[order]
    e2e_us = np.asarray(e2e)[order]
    outputs = np.asarray(out, dtype=np.int64)[order]
    tpot_us = np.asarray(tpot)[order] if "tpot_s" in index else _tpot_us(ttft_us, e2e_us, outputs)
    run = MeasuredRun(
        name=str(settings.pop("name", file.stem)),
        source=str(file),
        system=str(settings.pop("system", system or "unknown")),
        arrival_us=_relative_us(times[order]),
        input_tokens=np.asarray(inp, dtype=np.int64)[order],
        output_tokens=outputs,
        ttft_us=ttft_us,
        e2e_us=e2e_us,
        tpot_us=tpot_us,
        queued_us=np.asarray(queued)[order] if "queued_s" in index else None,
        request_ids=tuple(ids[int(i)] for i in order),
        extra=dict(extra),
    )
    for key, value in settings.items():
        setattr(run, key, value)
    if run.kv_blocks is not None:
        run.extra["kv_blocks_source"] = f"{file} ('# kv_blocks:' line)"
    else:
        _log_kv_blocks(run, file.parent, file.stem)
    if system is not None and run.system != system:
        run.notes.append(f"the file's '# system:' line ({run.system}) overrides system={system!r}")
    if ignored:
        run.notes.append(f"columns ignored: {', '.join(ignored)}")
    if out_of_order:
        run.notes.append(f"{out_of_order} row(s) out of arrival order; sorted by arrival_s")
    if "tpot_s" not in index:
        run.notes.append("TPOT derived as (e2e_s - ttft_s) / (output_tokens - 1)")
    measured = run.measured_rate()
    if measured is not None:
        run.extra["measured_rate"] = measured
    return run


def _cell(
    cells: list[str], index: Mapping[str, int], column: str, *, required: bool = False
) -> float | None:
    if column not in index:
        return None
    text = cells[index[column]].strip()
    if not text:
        if required:
            raise _Bad(column, text, "a value is required")
        return None
    try:
        value = float(text)
    except ValueError:
        raise _Bad(column, text, "expected a number (seconds)") from None
    if not math.isfinite(value):
        raise _Bad(column, text, "expected a finite number (not NaN or infinity)")
    if value < 0:
        raise _Bad(column, text, "must be >= 0 (leave the cell empty when unknown)")
    return value


def _cell_count(cells: list[str], index: Mapping[str, int], column: str) -> int:
    text = cells[index[column]].strip()
    try:
        value = float(text)
    except ValueError:
        raise _Bad(column, text, "expected a whole number of tokens >= 1") from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise _Bad(column, text, "expected a whole number of tokens >= 1")
    return int(value)


# ====================================================================== dispatch


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
