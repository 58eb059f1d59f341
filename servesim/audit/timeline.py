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

from collections.abc import Iterator

import numpy as np

from servesim.audit.base import (
    COMPLETED,
    MAX_REPORTED_PER_CHECK,
    NEVER_SERVED,
    AuditInput,
    Violation,
    _first_bad,
)


def _on_server_boundary(
    servers: np.ndarray, instants: np.ndarray, boundaries: list[np.ndarray]
) -> np.ndarray:
    """Whether each (server, instant) is one of that server's sorted boundaries: one search over
    all servers' boundaries keyed ``server * span + time`` (no loop over servers)."""
    if not len(instants):
        return np.zeros(0, dtype=bool)
    top = max([int(b[-1]) for b in boundaries if len(b)] + [int(instants.max()), 0])
    span = top + 2
    keys = np.concatenate(
        [b + s * span for s, b in enumerate(boundaries)] + [np.zeros(0, np.int64)]
    )
    if not len(keys):
        return np.zeros(len(instants), dtype=bool)
    query = servers * span + instants
    at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return (keys[at] == query) & (instants >= 0)


def _phase_instances(data: AuditInput) -> tuple[np.ndarray, np.ndarray]:
    """(instance that ran each request's prefill, instance that decoded it)."""
    r = data.requests
    decode = r["instance"]
    prefill = decode
    if data.pd is not None and "prefill_instance" in r:
        prefill = np.where(r["prefill_instance"] >= 0, r["prefill_instance"], decode)
    return prefill, decode


def check_times_against_steps(data: AuditInput) -> Iterator[Violation]:
    """First scheduling, first token and completion fall on step boundaries of the right instance."""
    if not data.alpha2_us or not data.post_decode_us:
        return
    r = data.requests
    ids, status = r["id"], r["status"]
    n_servers = len(data.steps)
    prefill, decode = _phase_instances(data)
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
    checks = (
        (
            "first scheduled",
            served & (scheduled >= 0),
            scheduled,
            p,
            True,
            "the start of no step",
        ),
        ("first token", served & (first_end >= 0), first_end, p, False, "the end of no step"),
        ("completion", done, last_end, d, False, "the end of no step"),
    )
    starts = [np.sort(steps["start_us"]) for steps in data.steps]
    ends = [np.sort(steps["start_us"] + steps["dt_us"]) for steps in data.steps]
    # a step formed after the last logged one may still have been in flight at the horizon
    horizon_edge = np.array([e[-1] if len(e) else -1 for e in ends], dtype=np.int64)
    for what, mask, instants, where, boundaries, problem in checks:
        rows = np.flatnonzero(mask)
        ok = _on_server_boundary(where[rows], instants[rows], starts if boundaries else ends)
        bad = rows[~ok]
        if data.bounded:
            bad = bad[instants[bad] < horizon_edge[where[bad]]]
        for i in bad[:MAX_REPORTED_PER_CHECK]:
            yield Violation(
                "STEP-LOG",
                f"its {what} implies a step boundary at {instants[i]} µs, {problem} of "
                f"this instance",
                request=int(ids[i]),
                server=int(where[i]),
                time_us=int(instants[i]),
            )
    order = done & (first_end >= 0) & (last_end < first_end)
    for i in _first_bad(order):
        yield Violation(
            "STEP-LOG",
            f"its last token's step ends at {last_end[i]} µs, before its first token's "
            f"({first_end[i]} µs)",
            request=int(ids[i]),
            server=int(decode[i]),
        )


def check_tokens_against_steps(data: AuditInput) -> Iterator[Violation]:
    """Per instance, the output tokens its requests record after their first equal the tokens
    its step log counts (in-step tokens plus tokens after a multi-step gap)."""
    if len(data.irregular_tokens) != len(data.steps):
        return
    r = data.requests
    _, decode = _phase_instances(data)
    after_first = np.maximum(r["output_tokens"] - 1, 0)
    mine = (decode >= 0) & (decode < len(data.steps))
    per_server = np.bincount(decode[mine], weights=after_first[mine], minlength=len(data.steps))
    for server, steps in enumerate(data.steps):
        recorded = int(per_server[server])
        logged = (
            int(steps["regular_tokens"].sum())
            + int(steps["burst_tokens"].sum())
            + int(data.irregular_tokens[server])
        )
        if recorded != logged:
            yield Violation(
                "STEP-LOG",
                f"its requests record {recorded} output tokens after their first, its step log "
                f"{logged}",
                server=server,
            )


def check_output_budget(data: AuditInput) -> Iterator[Violation]:
    """No request outputs more than its budget (max_output_tokens), its sampled length, or what
    its instance's context window leaves after the prompt."""
    r = data.requests
    ids, out = r["id"], r["output_tokens"]
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
    for mask, what, limit in rules:
        for i in _first_bad(mask):
            yield Violation(
                "OUTPUT",
                f"{out[i]} output tokens, more than {what} ({limit[i]})",
                request=int(ids[i]),
                server=int(r["instance"][i]),
            )
