"""The post-run auditor: invariant checks over what a run recorded.

It reads plain arrays (a per-request table and one step log per server), so it can check a run
that just finished or one saved to disk (``servesim audit DIR``). Each check is a function that
yields :class:`Violation` s naming the invariant, the request or server, and the time.

Invariants (numbering follows the spec, §8.1):

* INV-1 request conservation — every arrived request is in exactly one bucket
  (completed / queued / running / dropped / in transit), and the buckets add up.
* INV-2 lifecycle — each bucket's timeline fields are set exactly as its state implies.
* INV-3 clock monotonicity — steps of one server have positive durations and never overlap.
* INV-4 KV-block conservation — used blocks within [0, capacity] at every step, plus the
  independent block recount the engine performs (``notes``); with preemption by swapping, the
  CPU swap space's books too (``swap``): never over its capacity, every block swapped out was
  swapped back in or is still there, nothing left in CPU memory after a drained run.
* INV-5 causality — arrival ≤ enqueue ≤ first scheduled ≤ first token ≤ completion.
* INV-8 work conservation — a server with work left after a step starts the next step at once,
  and a request reaching an idle server starts a step in the same instant.

Runs with LoRA adapters or several models (``AuditInput.lora``) add INV-LORA-1…3
(:mod:`servesim.audit.adapters`): adapters in GPU slots within ``max_loras``, every request on
an instance serving its model and adapter, every adapter load paid in its step.
Disaggregated runs (``AuditInput.pd``) add §8.2's INV-PD-1…5 and the transfer checks: transfer
conservation (started = completed + in flight), byte conservation (∫ rate dt = bytes for every
transfer) and fair share (at every change point the active transfers on a link have equal rates
summing to at most its bandwidth). The transfer checks are an independent recomputation from the
logged transfers and link change points, supplied by the caller as ``pd["check_transfers"]``
(the auditor knows nothing about the transfer log's layout).
"""

from __future__ import annotations

from servesim.audit import base
from servesim.audit.adapters import check_adapters
from servesim.audit.autoscaling import check_autoscaling
from servesim.audit.base import *  # noqa: F403 -- its public names, whole (base.__all__)
from servesim.audit.base import AuditInput, Violation, _limited
from servesim.audit.encode import check_encode
from servesim.audit.kv import check_kv
from servesim.audit.pd import check_pd
from servesim.audit.requests import (
    check_causality,
    check_conservation,
    check_lifecycle,
    check_sessions,
)
from servesim.audit.routing import check_signal_freshness
from servesim.audit.steps import check_clock, check_work_conservation
from servesim.audit.swap import check_swap
from servesim.audit.timeline import (
    check_output_budget,
    check_times_against_steps,
    check_tokens_against_steps,
)
from servesim.audit.transfers import check_transfers
from servesim.simcore.errors import AuditError

__all__ = [
    *base.__all__,  # the status codes, AuditInput, Violation
    "CHECKS",
    "audit",
    "audit_or_raise",
]

CHECKS = (
    check_conservation,
    check_lifecycle,
    check_causality,
    check_clock,
    check_kv,
    check_swap,
    check_work_conservation,
    check_signal_freshness,
    check_sessions,
    check_pd,
    check_transfers,
    check_times_against_steps,
    check_tokens_against_steps,
    check_output_budget,
    check_encode,
    check_autoscaling,
    check_adapters,  # LoRA adapters and several models: INV-LORA-1…3
)


def audit(data: AuditInput) -> list[Violation]:
    """Run every check; return all violations (empty list = the run is sound)."""
    found: list[Violation] = []
    for check in CHECKS:
        found.extend(_limited(check(data)))
    return found


def audit_or_raise(data: AuditInput) -> None:
    violations = audit(data)
    if violations:
        raise AuditError(violations)
