"""Request timelines and token counts cross-checked against the step log ("STEP-LOG").

A request's times are not free numbers: each is the end (or start) of a step of the instance that
served it, shifted by that instance's fixed output overheads. So the auditor recomputes, per
request, the step instants its row implies and looks them up in the step log:

* first scheduled = the start of a step of the instance that ran its prefill;
* first token = the end of a step of that instance + its α2;
* completion = the end of a step of the instance that decoded it + α2 of the first token's
  instance + (output tokens − 1) × its own α2 + its post-decode overhead.

A completion shifted later than its last step, or a request recorded on the wrong instance, lands
on no step boundary there. Token counts balance per instance: every output token after a
request's first is counted once in the log, either in its step (``regular_tokens``,
``burst_tokens``) or as a gap spanning several steps (``irregular_tokens``). Output counts also
respect the request's budget, its sampled length and the context window ("OUTPUT").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from servesim.audit.base import (
    COMPLETED,
    MAX_REPORTED_PER_CHECK,
    NEVER_SERVED,
    AuditInput,
    Violation,
    _first_bad,
)
from servesim.audit.chunks import ServerInstants, chunks, rows

# what the step-boundary checks read of the request table
_TIME_COLUMNS = (
    "id",
    "status",
    "instance",
    "first_scheduled_us",
    "first_token_us",
    "completion_us",
    "output_tokens",
)


# the times checked against the step log, in reporting order ("order": last token not before first)
_KINDS = ("first scheduled", "first token", "completion", "order")


def _phase_instances(r: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(instance that ran each request's prefill, instance that decoded it) over the rows ``r``."""
    decode = r["instance"]
    prefill = decode
    if "prefill_instance" in r:
        prefill = np.where(r["prefill_instance"] >= 0, r["prefill_instance"], decode)
    return prefill, decode


def _prefill_column(data: AuditInput) -> tuple[str, ...]:
    """The PD column naming where a split request's prefill ran, when the run has one."""
    return (
        ("prefill_instance",) if data.pd is not None and "prefill_instance" in data.requests else ()
    )


def _implied_instants(data: AuditInput, r: Mapping[str, np.ndarray]) -> dict[str, tuple]:
    """Per request of the rows ``r``: the step instant each of its times implies, which instance's
    step it must be, and whether the row says it happened (mask, instants, instance)."""
    status = r["status"]
    n_servers = len(data.steps)
    prefill, decode = _phase_instances(r)
    valid = (prefill >= 0) & (prefill < n_servers) & (decode >= 0) & (decode < n_servers)
    alpha2 = np.asarray(data.alpha2_us, dtype=np.int64)
    post = np.asarray(data.post_decode_us, dtype=np.int64)
    p, d = np.where(valid, prefill, 0), np.where(valid, decode, 0)
    served = valid & ~np.isin(status, NEVER_SERVED)
    scheduled = r["first_scheduled_us"]
    first_end = np.where(r["first_token_us"] >= 0, r["first_token_us"] - alpha2[p], -1)
    out = r["output_tokens"]
    last_end = r["completion_us"] - alpha2[p] - np.maximum(out - 1, 0) * alpha2[d] - post[d]
    done = served & (status == COMPLETED) & (r["completion_us"] >= 0)
    return {
        "first scheduled": (served & (scheduled >= 0), scheduled, p),
        "first token": (served & (first_end >= 0), first_end, p),
        "completion": (done, last_end, d),
        "order": (done & (first_end >= 0) & (last_end < first_end), last_end, d, first_end),
    }


def _step_bounds(data: AuditInput, ends: bool, top: int) -> ServerInstants:
    """Every instance's step starts (or ends), sorted and keyed by instance; ``top``: no start or
    end is later."""

    def instants(server: int) -> Iterator[tuple[np.ndarray, None]]:
        for _, chunk in chunks(data.steps[server], ("start_us", "dt_us")):
            yield (chunk["start_us"] + chunk["dt_us"] if ends else chunk["start_us"]), None

    return ServerInstants([rows(s) for s in data.steps], instants, top)


def _last_instants(steps: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """The latest start and the latest end of a step of one instance (-1, -1 without steps)."""
    last_start = last_end = -1
    for _, chunk in chunks(steps, ("start_us", "dt_us")):
        start = chunk["start_us"]
        if len(start):
            last_start = max(last_start, int(start.max()))
            last_end = max(last_end, int((start + chunk["dt_us"]).max()))
    return last_start, last_end


def check_times_against_steps(data: AuditInput) -> Iterator[Violation]:
    """First scheduling, first token and completion fall on step boundaries of the right instance.

    The request table is read a slice at a time (:mod:`servesim.audit.chunks`); what is held
    whole is one kind of step boundary (starts, then ends), 8 bytes per step."""
    if not data.alpha2_us or not data.post_decode_us:
        return
    names = _TIME_COLUMNS + _prefill_column(data)
    last = np.array([_last_instants(steps) for steps in data.steps], dtype=np.int64).reshape(-1, 2)
    top = int(last.max(initial=0))
    # a step formed after an instance's last logged one may still have been in flight at the
    # horizon: a bounded run's times from that instant on are not checked
    edges = last[:, 1]
    found: dict[str, list[Violation]] = {what: [] for what in _KINDS}
    for kinds, ends in (
        (("first scheduled",), False),
        (("first token", "completion", "order"), True),
    ):
        bounds = _step_bounds(data, ends, top)
        for _, r in chunks(data.requests, names):
            implied = _implied_instants(data, r)
            for what in kinds:
                if len(found[what]) < MAX_REPORTED_PER_CHECK:
                    found[what] += _misses(data, r, what, implied[what], bounds, edges)
        del bounds
    for what in _KINDS:
        yield from found[what][:MAX_REPORTED_PER_CHECK]


def _misses(
    data: AuditInput,
    r: Mapping[str, np.ndarray],
    what: str,
    implied: tuple,
    bounds: ServerInstants,
    edges: np.ndarray,
) -> list[Violation]:
    """The violations of one kind among the rows ``r`` (at most the reporting limit)."""
    ids = r["id"]
    if what == "order":
        mask, last_end, decode, first_end = implied
        return [
            Violation(
                "STEP-LOG",
                f"its last token's step ends at {last_end[i]} µs, before its first token's "
                f"({first_end[i]} µs)",
                request=int(ids[i]),
                server=int(r["instance"][i]),
            )
            for i in _first_bad(mask)
        ]
    mask, instants, where = implied
    rows_ = np.flatnonzero(mask)
    bad = rows_[~bounds.contains(where[rows_], instants[rows_])]
    if data.bounded:
        bad = bad[instants[bad] < edges[where[bad]]]
    problem = "the start of no step" if what == "first scheduled" else "the end of no step"
    return [
        Violation(
            "STEP-LOG",
            f"its {what} implies a step boundary at {instants[i]} µs, {problem} of this instance",
            request=int(ids[i]),
            server=int(where[i]),
            time_us=int(instants[i]),
        )
        for i in bad[:MAX_REPORTED_PER_CHECK]
    ]


def check_tokens_against_steps(data: AuditInput) -> Iterator[Violation]:
    """Per instance, the output tokens its requests record after their first equal the tokens
    its step log counts (in-step tokens plus tokens after a multi-step gap)."""
    if len(data.irregular_tokens) != len(data.steps):
        return
    n_servers = len(data.steps)
    per_server = np.zeros(n_servers, dtype=np.int64)
    for _, r in chunks(data.requests, ("instance", "output_tokens")):
        decode = r["instance"]
        mine = (decode >= 0) & (decode < n_servers)
        after_first = np.maximum(r["output_tokens"][mine] - 1, 0)
        per_server += np.bincount(decode[mine], weights=after_first, minlength=n_servers).astype(
            np.int64
        )
    for server, steps in enumerate(data.steps):
        recorded = int(per_server[server])
        logged = int(data.irregular_tokens[server])
        for _, chunk in chunks(steps, ("regular_tokens", "burst_tokens")):
            logged += int(chunk["regular_tokens"].sum()) + int(chunk["burst_tokens"].sum())
        if recorded != logged:
            yield Violation(
                "STEP-LOG",
                f"its requests record {recorded} output tokens after their first, its step log "
                f"{logged}",
                server=server,
            )


def check_output_budget(data: AuditInput) -> Iterator[Violation]:
    """No request outputs more than its budget (max_output_tokens), its sampled length, or what
    its instance's context window leaves after the prompt (the table read a slice at a time)."""
    r = data.requests
    names = ("id", "instance", "output_tokens") + tuple(
        n for n in ("max_output_tokens", "oracle_output_tokens", "prompt_tokens") if n in r
    )
    found: dict[str, list[Violation]] = {}
    for _, rows_ in chunks(r, names):
        for mask, what, limit in _output_rules(data, rows_):
            mine = found.setdefault(what, [])
            for i in _first_bad(mask)[: MAX_REPORTED_PER_CHECK - len(mine)]:
                mine.append(
                    Violation(
                        "OUTPUT",
                        f"{rows_['output_tokens'][i]} output tokens, more than {what} ({limit[i]})",
                        request=int(rows_["id"][i]),
                        server=int(rows_["instance"][i]),
                    )
                )
    for violations in found.values():
        yield from violations


def _output_rules(data: AuditInput, r: Mapping[str, np.ndarray]) -> list[tuple]:
    """(rows breaking it, what the limit is, the limit per row) for each output rule the rows
    ``r`` can be judged by, in reporting order."""
    out = r["output_tokens"]
    rules = []
    if "max_output_tokens" in r:
        budget = r["max_output_tokens"]
        rules.append(((budget > 0) & (out > budget), "max_output_tokens", budget))
    if "oracle_output_tokens" in r:
        oracle = r["oracle_output_tokens"]
        rules.append((out > oracle, "its sampled output length", oracle))
    if data.max_model_len and "prompt_tokens" in r:
        inst = r["instance"]
        window = np.asarray(data.max_model_len, dtype=np.int64)[np.maximum(inst, 0)]
        room = window - r["prompt_tokens"]
        rules.append(
            ((inst >= 0) & (out > 0) & (out > room), "the context window after its prompt", room)
        )
    return rules
