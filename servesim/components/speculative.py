"""Speculative decoding on top of the vLLM engine: k draft tokens verified per step.

Each step, every decoding request runs ``k`` draft passes and one target pass that verifies the
``k`` drafts plus its last token (``1 + k`` token slots of budget and KV). With per-token
acceptance rate ``a``, the expected number of tokens a verification yields is

    E = (1 − a^(k+1)) / (1 − a)              (Leviathan et al., 2023)

servesim gives every request exactly that rate, deterministically: in its j-th speculative step a
request accepts ``floor((j+1)·E) − floor(j·E)`` tokens (between 1 and k+1), so every request
follows the expected-value path and runs are reproducible without a random stream.

Step time = target step (the verification is priced as the plain decode step it replaces: a
memory-bound pass over the same weights) + ``k · c · `` a decode-only target step of the same
requests, where ``c`` is the draft's cost as a fraction of the target. ``c`` grows with ``a``: a
draft that is always right is as large as the target (``c → 1``), and a draft that is never right
costs nothing (so ``a → 0`` is plain decoding). With ``draft_cost: auto``, ``c = a^8`` — an
assumption about how draft size buys acceptance, not a calibration; give a measured ratio (e.g.
draft/target step time of your pair) when you have one.

Tokens accepted in one step reach the client together: the first with the step's gap, the others
with a gap of zero (α2 still applies to each). TPOT therefore falls by about E while step time
rises by ``1 + k·c``.

Modelled at the aggregate of one request per step, O(running requests) per step: steady-decode
fast-forward is off while speculation is on.
"""

from __future__ import annotations

import math
from bisect import insort

import numpy as np

from servesim.components.engine import _ORDER_KEY, Engine
from servesim.components.record import STEP_ROW
from servesim.components.request import RUNNING, Request
from servesim.latency.base import BatchSummary, StepTimeError


def expected_accepted(k: int, acceptance: float) -> float:
    """E = (1 − a^(k+1)) / (1 − a): expected tokens per verification of k drafts."""
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def auto_draft_cost(acceptance: float) -> float:
    """Draft cost as a fraction of a target step, rising to 1 as the acceptance rate nears 1."""
    return acceptance**8


class SpeculativeEngine(Engine):
    """An :class:`Engine` whose decoders verify ``k`` drafts per step (see module docstring)."""

    def __init__(self, *args, draft_tokens: int, acceptance: float, draft_cost: float, **kwargs):
        super().__init__(*args, **kwargs)
        if draft_tokens < 1 or not 0.0 < acceptance < 1.0 or not 0.0 < draft_cost <= 1.0:
            raise ValueError("need draft_tokens >= 1, 0 < acceptance < 1 and 0 < draft_cost <= 1")
        self.k = draft_tokens
        self.acceptance = acceptance
        self.draft_cost = draft_cost
        self.expected = expected_accepted(draft_tokens, acceptance)
        self.decoders: list[Request] = []  # batch order
        self._verify: list[tuple[Request, int]] = []  # decoders scheduled this step, with slots
        self.alloc: dict[int, int] = {}  # request id -> KV slots held by a decoder
        self.accepted_tokens = 0
        self.verifications = 0

    # ------------------------------------------------------------------ decoders
    def _add_decoder(self, r: Request, step: int, c: int) -> None:
        r.finish_step = 0  # marks "decoding" for the shared code paths
        r.anchor_step = 0  # speculative steps taken (indexes the acceptance schedule)
        # last_token_end_us is kept exact here; `irregular` stops the shared preemption code from
        # assuming the previous token ended as the step began
        r.irregular = True
        insort(self.decoders, r, key=_ORDER_KEY)
        self.alloc[r.id] = c

    def _remove_decoder(self, r: Request, c: int) -> None:
        self.decoders.remove(r)  # its slot count stays in `alloc` until the blocks are released
        r.finish_step = -1

    def _unschedule_decoder(self, r: Request, tokens: int) -> int:
        self._verify[:] = [(q, m) for q, m in self._verify if q is not r]
        return 0  # its slots are already counted in alloc

    def _materialize(self, r: Request, step: int) -> int:
        return r.num_computed

    def _allocated_tokens(self, r: Request, computed: int, allocated_now: int) -> int:
        return max(computed + allocated_now, self.alloc.pop(r.id, computed))

    def _decoder_slots(self, r: Request, c: int, budget: int) -> tuple[int, int]:
        """``1 + k`` slots (the last token and k drafts, within the budget); new blocks beyond
        the slots the decoder already holds (a rejected draft's slots stay allocated)."""
        bs = self.limits.block_size
        n = min(1 + self.k, budget)
        return n, max(0, -(-(c + n) // bs) - (-(-self.alloc[r.id] // bs)))

    def _schedule_decoder(self, r: Request, c: int, n: int, need: int) -> None:
        self.kv.pop_blocks(need)
        if c + n > self.alloc[r.id]:
            self.alloc[r.id] = c + n
        self._verify.append((r, n))

    def _accepted(self, j: int) -> int:
        e = self.expected
        return math.floor((j + 1) * e) - math.floor(j * e)

    # ------------------------------------------------------------------ one step
    def form_batch(self, now: int) -> int:
        budget = self.limits.max_num_batched_tokens
        verify = self._verify
        verify.clear()
        self._open_step(now)
        budget, preempted, got = self._schedule_running(budget)
        for r in self.decoders:
            if id(r) not in got:
                self._stalled.append(r)
        self._preempted_now = preempted
        self._in_flight = True

        self._admit_waiting(budget, preempted, now)
        items, prefill_tokens = self._prefill_items()
        decoders = len(verify)
        context = 0
        for r, _ in verify:
            context += r.num_computed
        self._decode_tokens = decoders
        latency = self.latency
        summary = BatchSummary(prefill_tokens, items, decoders, context)
        dt = latency.step_time_us(summary)
        if not (isinstance(dt, (int, np.integer)) and dt >= 1):
            raise StepTimeError.of(latency, dt, summary)
        if decoders:
            draft = latency.step_time_us(BatchSummary(0, (), decoders, context))
            if not (isinstance(draft, (int, np.integer)) and draft >= 1):
                raise StepTimeError.of(latency, draft, BatchSummary(0, (), decoders, context))
            dt = int(dt) + int(self.k * self.draft_cost * draft)
        return self._set_step_time(dt)

    def end_step(self, end: int, steps: int = 1, ends=None) -> None:
        s = self.step
        start = self._start
        log = self.log
        kv = self.kv
        kv_used = kv.total_blocks - kv.free_count  # after this step's allocation, before releases
        regular = 0
        burst = 0
        produced = 0
        done: list[tuple[Request, int]] = []
        prefill_tokens = self._end_prefills(s, end, done)
        # (request, computed, allocated): a prefill that finishes holds no speculative allocation
        finishing: list[tuple[Request, int, int]] = [(r, c, -1) for r, c in done]
        for r, n in self._verify:
            if r.state != RUNNING:
                continue
            m = self._accepted(r.anchor_step)
            if m > n:
                m = n
            left = r.target_output - r.num_generated
            if m > left:
                m = left
            r.anchor_step += 1
            self.verifications += 1
            self.accepted_tokens += m
            produced += m
            if r.last_token_end_us == start:
                regular += 1
            else:
                log.irregular_gaps_us.append(end - r.last_token_end_us)
            burst += m - 1
            r.num_generated += m
            r.num_computed += m
            r.last_token_end_us = end
            if r.num_generated >= r.target_output:
                allocated = self.alloc.pop(r.id)
                self._remove_decoder(r, r.num_computed)
                finishing.append((r, r.num_computed, allocated))
        finishing.sort(key=lambda item: item[0].order)  # free blocks in batch order, as vLLM does
        for r, c, allocated in finishing:
            self._finish(r, end, c, allocated)
        batch = len(self._verify) + len(self._scheduled)
        self.busy_us += end - start
        log.rows.frombytes(
            STEP_ROW(
                start,
                end - start,
                prefill_tokens,
                produced,
                regular,
                burst,
                batch,
                self._waiting_formed,
                kv_used,
                len(self.waiting) + len(self.running),
            )
        )
        self.step = s + 1
        self._in_flight = False
        self._scheduled.clear()
        self._stalled.clear()
        self._verify.clear()

    def window(self, max_steps: int, min_steps: int = 2):
        return None  # every step changes the batch's token counts: no fast-forward

    def kv_owners(self) -> list[tuple[int, list]]:
        bs = self.limits.block_size
        extra = {id(r): n for r, n in self._scheduled} if self._in_flight else {}
        owners = []
        for r in self.running:
            held = self.alloc.get(r.id, r.num_computed + extra.get(id(r), 0))
            owners.append((-(-held // bs) - len(r.blocks), r.blocks))
        return owners
