"""The summary's per-request figures, read from slices of the request table one metric at a time.

A spilled run's request table lives on disk; reading its whole columns to compute the summary
would hold several of them at once (at ten million requests, 80 MB each). Here every count and
sum is accumulated over slices of :data:`~servesim.audit.chunks.CHUNK_ROWS` rows, and each
latency metric is built as one column of the completed requests' values, its statistics taken,
and the column dropped before the next. The figures are exact and equal to those of whole
columns: counts and integer sums add up, and each statistic sees the same values in the same
order (percentiles sort them; means are over them in id order, as before).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from servesim.analysis.metrics import (
    PERCENTILES,
    itl_gaps,
    sorted_ms,
    stats_of_sorted_ms,
    vllm_itl_stats,
    vllm_stats,
    vllm_throughputs,
    weighted_percentile,
)
from servesim.audit.chunks import chunks
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_NAMES,
    STATUS_REJECTED,
    STATUS_SHED,
)
from servesim.policies.metrics import (
    SloTally,
    class_names_by_code,
    class_stats,
    jain_index,
)

Row = Mapping[str, np.ndarray]

REFUSED = (STATUS_REJECTED, STATUS_SHED, STATUS_EXPIRED, STATUS_DROPPED)


def completed_column(
    req: Row,
    names: tuple[str, ...],
    compute: Callable[[Row], np.ndarray],
    where: Callable[[Row], np.ndarray] | None = None,
) -> np.ndarray:
    """``compute`` over the completed requests (and those ``where`` selects), in id order: one
    float64 column of values, built a slice of the table at a time. The rows kept are counted
    first, so the column is the only thing of its length held (no list of parts to join)."""
    names = (*names, "status")

    def kept(chunk: Row) -> np.ndarray:
        keep = chunk["status"] == STATUS_COMPLETED
        return keep & where(chunk) if where is not None else keep

    count = sum(int(kept(chunk).sum()) for _, chunk in chunks(req, names))
    column = np.empty(count, dtype=np.float64)
    at = 0
    for _, chunk in chunks(req, names):
        values = np.asarray(compute(chunk))[kept(chunk)]
        column[at : at + len(values)] = values
        at += len(values)
    return column


# per-request metrics (µs) over a slice of the table: the columns each reads, and the formula
def _ttft(c: Row) -> np.ndarray:
    return c["first_token_us"] - c["arrival_us"]


def _e2e(c: Row) -> np.ndarray:
    return c["completion_us"] - c["arrival_us"]


def _scheduling(c: Row) -> np.ndarray:
    return c["first_scheduled_us"] - c["arrival_us"]


def _tpot(c: Row) -> np.ndarray:
    """Each request's mean inter-token gap (0 with one output token)."""
    out = c["output_tokens"]
    return np.where(out > 1, c["itl_sum_us"] / np.maximum(out - 1, 1), 0.0)


TTFT = (("first_token_us", "arrival_us"), _ttft)
E2E = (("completion_us", "arrival_us"), _e2e)
SCHEDULING = (("first_scheduled_us", "arrival_us"), _scheduling)
TPOT = (("output_tokens", "itl_sum_us"), _tpot)


def _several_tokens(c: Row) -> np.ndarray:
    return c["output_tokens"] > 1


def request_totals(req: Row, n_instances: int, length_code: int) -> dict[str, Any]:
    """Counts and integer sums over every request, in one pass: requests per status, the
    completed requests' output, prompt and cached tokens, length-capped and preempted requests,
    and the requests each instance received and completed."""
    names = ("status", "instance", "output_tokens", "prompt_tokens", "cached_tokens")
    names += ("finish_reason", "preemptions")
    by_status = np.zeros(len(STATUS_NAMES), dtype=np.int64)
    received = np.zeros(n_instances, dtype=np.int64)
    served = np.zeros(n_instances, dtype=np.int64)
    sums = dict.fromkeys(("output", "prompt", "cached", "length_capped", "preempted"), 0)
    for _, c in chunks(req, names):
        status = c["status"]
        counts = np.bincount(status, minlength=len(by_status))
        if len(counts) > len(by_status):  # an unknown status: keep counting it
            by_status = np.concatenate([by_status, np.zeros(len(counts) - len(by_status), int)])
        by_status[: len(counts)] += counts
        done = status == STATUS_COMPLETED
        routed = c["instance"] >= 0
        received += np.bincount(c["instance"][routed], minlength=n_instances)[:n_instances]
        served += np.bincount(c["instance"][routed & done], minlength=n_instances)[:n_instances]
        sums["output"] += int(c["output_tokens"][done].sum())
        sums["prompt"] += int(c["prompt_tokens"][done].sum())
        sums["cached"] += int(c["cached_tokens"][done].sum())
        sums["length_capped"] += int(((c["finish_reason"] == length_code) & done).sum())
        sums["preempted"] += int((c["preemptions"] > 0).sum())
    return {"by_status": by_status, "received": received, "served": served, **sums}


def arrivals_and_departures(req: Row) -> tuple[np.ndarray, np.ndarray, int]:
    """When each request arrived, when those that left the system left (completed ones at
    completion, refused ones at arrival), and how many were refused: what the run's verdict
    reads. Counted first, then filled, so each array is held once."""
    names = ("status", "arrival_us", "completion_us")

    def leaving(status: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return status == STATUS_COMPLETED, np.isin(status, REFUSED)

    rows = refused = gone = 0
    for _, c in chunks(req, ("status",)):
        done, no = leaving(c["status"])
        rows, refused, gone = (
            rows + len(done),
            refused + int(no.sum()),
            gone + int((done | no).sum()),
        )
    arrivals = np.empty(rows, dtype=np.int64)
    left = np.empty(gone, dtype=np.int64)
    at_row = at_left = 0
    for _, c in chunks(req, names):
        done, no = leaving(c["status"])
        arrivals[at_row : at_row + len(done)] = c["arrival_us"]
        at_row += len(done)
        out = np.where(done, c["completion_us"], c["arrival_us"])[done | no]
        left[at_left : at_left + len(out)] = out
        at_left += len(out)
    return arrivals, left, refused


def latency(record: Any, req: Row, totals: Mapping[str, Any], duration_s: float) -> dict:
    """TTFT, ITL, TPOT, E2E and scheduling-delay statistics over the completed requests, and the
    vLLM benchmark names for them. Exact: each is computed from the full column of its values,
    one column held at a time."""

    def metric(spec: tuple, where: Callable[[Row], np.ndarray] | None = None) -> np.ndarray:
        names, compute = spec
        return sorted_ms(completed_column(req, names, compute, where), owned=True)

    values = metric(TTFT)
    ttft, vllm_ttft = stats_of_sorted_ms(values, "ttft"), vllm_stats("ttft", values)
    values = metric(TPOT)
    tpot = stats_of_sorted_ms(values, "tpot")
    values = metric(TPOT, _several_tokens)
    vllm_tpot = vllm_stats("tpot", values)
    values = metric(E2E)
    e2e, vllm_e2e = stats_of_sorted_ms(values, "e2e"), vllm_stats("e2el", values)
    values = metric(SCHEDULING)
    scheduling = stats_of_sorted_ms(values, "scheduling_delay")
    del values
    gaps, weights = itl_gaps(record)
    total_gaps = int(weights.sum())
    out: dict[str, Any] = dict(ttft)
    out["itl_mean_ms"] = float((gaps * weights).sum() / total_gaps / 1000.0) if total_gaps else 0.0
    for p in PERCENTILES:
        out[f"itl_p{p}_ms"] = weighted_percentile(gaps, weights, p) / 1000.0 if total_gaps else 0.0
    out["itl_gaps"] = total_gaps
    out.update(tpot)
    out.update(e2e)
    out.update(scheduling)
    completed = int(totals["by_status"][STATUS_COMPLETED])
    out.update(vllm_throughputs(totals["prompt"], totals["output"], completed, duration_s))
    out.update(vllm_ttft)
    out.update(vllm_tpot)
    out.update(vllm_e2e)
    out.update(vllm_itl_stats(gaps, weights))
    return out


def _ttft_ms(c: Row) -> np.ndarray:
    return (c["first_token_us"] - c["arrival_us"]) / 1000.0


def _itl_ms(c: Row) -> np.ndarray:
    """Each request's mean inter-token gap in ms (NaN with one output token: no gap)."""
    out = c["output_tokens"]
    return np.where(out > 1, c["itl_sum_us"] / np.maximum(out - 1, 1) / 1000.0, np.nan)


def _e2e_ms(c: Row) -> np.ndarray:
    return (c["completion_us"] - c["arrival_us"]) / 1000.0


def _gaps(c: Row) -> np.ndarray:
    return np.maximum(c["output_tokens"] - 1, 0)


CLASS_COLUMNS = ("arrival_us", "first_token_us", "completion_us", "output_tokens", "itl_sum_us")


def class_metrics(record: Any, req: Row, duration_s: float, scenario: Any) -> dict:
    """Per-SLO-class latency, goodput against the scenario's targets, and fairness (spec §7.4):
    :func:`servesim.policies.metrics.per_class_latency` and ``goodput`` over the completed
    requests, computed a slice (counts) or one class's metric column (statistics) at a time."""
    table = record.requests
    classes = table.labels("slo_class")
    tenants = table.labels("tenant")
    names = class_names_by_code(classes)
    targets = _slo_targets(scenario)
    tally = SloTally(targets) if targets is not None else None
    injected = np.zeros(max(len(classes), 1), dtype=np.int64)
    finished = np.zeros(max(len(classes), 1), dtype=np.int64)
    tokens = np.zeros(len(tenants), dtype=np.int64)
    for _, c in chunks(req, ("status", "slo_class", "tenant", *CLASS_COLUMNS)):
        done = c["status"] == STATUS_COMPLETED
        codes = c["slo_class"]
        injected[: len(classes)] += np.bincount(codes, minlength=len(classes))[: len(classes)]
        finished[: len(classes)] += np.bincount(codes[done], minlength=len(classes))[: len(classes)]
        for code in range(len(tenants)):
            tokens[code] += int(c["output_tokens"][done & (c["tenant"] == code)].sum())
        if tally is not None:
            rows = {k: v[done] for k, v in c.items()}
            tally.add(_ttft_ms(rows), _itl_ms(rows), _e2e_ms(rows), names[codes[done]])
    per_class = {
        name: _class_row(req, [code for code in range(len(classes)) if names[code] == name])
        for name in sorted({names[code] for code in range(len(classes)) if finished[code]})
    }
    out: dict[str, Any] = {"per_class": per_class}
    if tally is not None:
        g = tally.result(
            {name: int(injected[code]) for code, name in enumerate(classes)}, duration_s, per_class
        )
        out["goodput_rps"] = g["goodput_rps"]
        out["slo_attainment"] = g["slo_attainment"]
        out["goodput"] = g["per_class"]
    out["fairness"] = {
        "jain_tenants_output_tokens": jain_index(tokens.tolist()) if len(tenants) else 0.0,
        "tenant_output_tokens": dict(zip([t or "default" for t in tenants], tokens.tolist())),
        "jain_classes_completion_rate": jain_index(
            [float(finished[code]) / max(int(injected[code]), 1) for code in range(len(classes))]
        )
        if classes
        else 0.0,
    }
    return out


def _class_row(req: Row, codes: list[int]) -> dict[str, float]:
    """One class's latency row (see ``per_class_latency``), one metric column at a time."""

    def mine(c: Row) -> np.ndarray:
        return np.isin(c["slo_class"], codes)

    names = ("slo_class", *CLASS_COLUMNS)
    ttft = completed_column(req, names, _ttft_ms, mine)
    row: dict[str, float] = {"count": len(ttft)}
    row.update(class_stats("ttft", ttft))
    del ttft
    itl = completed_column(req, names, _itl_ms, mine)
    weighted = _gap_weighted_mean(req, names, mine)
    row.update(class_stats("tpot", itl))
    del itl
    row.update(class_stats("e2e", completed_column(req, names, _e2e_ms, mine)))
    row["itl_mean_ms"] = weighted
    return row


def _gap_weighted_mean(req: Row, names: tuple[str, ...], mine: Callable) -> float:
    """``gap_weighted_mean`` of one class without its two columns side by side: the products
    ``itl_ms × gaps`` of the requests with a gap, in id order (the same sum over the same values
    as over whole columns), and their gaps counted in integers (exact, as the float sum was)."""

    def has_gap(c: Row) -> np.ndarray:
        return mine(c) & (c["output_tokens"] > 1)

    products = completed_column(req, names, lambda c: _itl_ms(c) * _gaps(c), has_gap)
    total = completed_column(req, names, _gaps, has_gap).sum()
    return float(products.sum() / total) if total else 0.0


def _slo_targets(scenario: Any) -> dict | None:
    """The scenario's SLO targets per class in ms (None: it sets none)."""
    slo = getattr(scenario, "slo", None) if scenario is not None else None
    if not slo:
        return None
    return {
        cls: {
            "ttft_ms": t.ttft_us / 1000.0 if t.ttft_us else None,
            "itl_ms": t.itl_us / 1000.0 if t.itl_us else None,
            "e2e_ms": t.e2e_us / 1000.0 if t.e2e_us else None,
        }
        for cls, t in slo.items()
    }
