"""vLLM v1 batch formation and step execution for one instance (mechanism only, no SimPy).

One engine step, as vLLM's ``Scheduler.schedule`` does it:

1. **Running requests, in batch order** (the order they were admitted). Each asks for the tokens it
   still has to compute: 1 while decoding, the rest of its prompt while prefilling, capped by
   ``long_prefill_token_threshold`` and by the remaining token budget (``max_num_batched_tokens``).
   When the KV cache cannot hold the new tokens, the preemption policy picks a victim (by default
   the last running request), which frees all its blocks and goes back to the head of the wait
   queue (preemption by recompute). If the victim is the request itself, phase 1 stops.
2. **Waiting requests, head first**, only if phase 1 preempted nothing: while a sequence slot
   (``max_num_seqs``) and budget remain, look the head up in the prefix cache, schedule as much of
   its prompt as fits, allocate its blocks, admit it. A head that does not fit blocks the queue
   (head-of-line blocking).

The cost of a step is independent of the number of tokens and, in the common case, of the number
of decoding requests: steady decoders are kept in aggregate (their progress is a function of the
step index), per-block work happens only for requests whose block table grows this step, and
completions come from a heap of precomputed finish steps. ``Engine.window`` extends this to many
steps at once (fast-forward, DESIGN §4.1).

Whole mechanisms live in their own modules and are mixed into :class:`Engine`: the fast-forward
window (``fastforward.py``), phase 1 with preemption (``preemption.py``), preemption by swapping
(``swap.py``), vLLM v0's prefill-first scheduling (``prefill_first.py``) and the decode side of
disaggregated serving, KV received by transfer (``remote_kv.py``).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from collections.abc import Callable
from operator import attrgetter

import numpy as np

from servesim.components.fastforward import FastForward
from servesim.components.kvcache import ContentIds, KVCache
from servesim.components.kvtiers import tiers_for
from servesim.components.preemption import Preemption
from servesim.components.prefill_first import PrefillFirst
from servesim.components.record import STEP_ROW, StepLog
from servesim.components.remote_kv import RemoteKV
from servesim.components.request import (
    DROP_BUDGET_TOO_LONG,
    DROP_KV_TOO_SMALL,
    DROP_PROMPT_TOO_LONG,
    DROPPED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISHED,
    RUNNING,
    WAITING,
    Request,
)
from servesim.components.swap import SwapPreemption
from servesim.latency.base import BatchSummary, LatencyModel, StepTimeError

_ORDER_KEY = attrgetter("order")  # running order = admission order
_FINISH_ORDER = lambda item: item[0].order  # noqa: E731
_NO_SWAP = (0, 0)  # (blocks, µs) of swap copies priced in a step that copies nothing


class EngineLimits:
    """The vLLM knobs an engine obeys (validated by the scenario loader)."""

    __slots__ = (
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "total_blocks",
        "max_model_len",
        "long_prefill_token_threshold",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "prefill_first",
        "watermark_blocks",
        "kv_cpu_blocks",
        "cpu_reload_base_us",
        "cpu_reload_us_per_block",
        "kv_tiers",
        "swap_blocks",
        "swap_us_per_block",
    )

    def __init__(
        self,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        block_size: int = 16,
        total_blocks: int = 10_000,
        max_model_len: int = 0,
        long_prefill_token_threshold: int = 0,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        prefill_first: bool = False,
        watermark_blocks: int = 0,
        kv_cpu_blocks: int = 0,
        cpu_reload_base_us: float = 0.0,
        cpu_reload_us_per_block: float = 0.0,
        swap_blocks: int = -1,
        swap_us_per_block: float = 0.0,
        kv_tiers: tuple = (),
    ):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = block_size
        self.total_blocks = total_blocks
        self.max_model_len = max_model_len if max_model_len > 0 else total_blocks * block_size
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.enable_chunked_prefill = enable_chunked_prefill
        self.enable_prefix_caching = enable_prefix_caching
        # vLLM v0's scheduler: prefill-only steps first, admissions keep watermark_blocks free
        self.prefill_first = prefill_first
        self.watermark_blocks = watermark_blocks
        # CPU KV tier (0 = none): reloading n blocks costs base + n * per_block µs, added to the step
        self.kv_cpu_blocks = kv_cpu_blocks
        self.cpu_reload_base_us = cpu_reload_base_us
        self.cpu_reload_us_per_block = cpu_reload_us_per_block
        # engine.preemption_mode: swap (vLLM v0, DistServe's decode engine). -1: recompute only;
        # otherwise a decoding victim's KV is copied to CPU memory holding this many blocks, at
        # swap_us_per_block µs per block each way (PCIe), added to the step that copies it
        self.swap_blocks = swap_blocks
        self.swap_us_per_block = swap_us_per_block
        # offload tiers below the GPU, fastest first: (name, blocks, latency µs, µs per block,
        # block bytes) each (kvtiers.py); when given, they replace the kv_cpu_* tier
        self.kv_tiers = kv_tiers


class Engine(FastForward, Preemption, SwapPreemption, PrefillFirst, RemoteKV):
    """Wait queue, running batch and KV cache of one instance, advanced one step (or window) at a time."""

    def __init__(
        self,
        limits: EngineLimits,
        latency: LatencyModel,
        *,
        index: int = 0,
        on_finish: Callable[[Request], None] | None = None,
        victim: Callable[[list[Request]], int] | None = None,
        order_waiting: Callable[[deque], None] | None = None,
        content_ids: ContentIds | None = None,
    ):
        self.limits = limits
        self.latency = latency
        self.index = index
        self.kv = KVCache(limits.total_blocks, limits.block_size, tiers=tiers_for(limits))
        self._reload_us = 0.0  # CPU→GPU copy time owed by this step's admissions
        self.reload_us_total = 0
        self._copy_us = 0  # blocking KV transfers received by this step's admissions
        self.copy_us_total = 0
        # multimodal: the colocated encoder (servesim.components.encode), set by the cluster;
        # the encoder time owed by this step's first chunks, and in all
        self.encoder = None
        self._encode_us = 0
        self.encode_us_total = 0
        self.log = StepLog()
        self.on_finish = on_finish or (lambda r: None)
        self.victim = victim or (lambda running: len(running) - 1)
        self.order_waiting = order_waiting
        self.alpha2 = int(latency.output_token_time_us)
        self.post_decode = int(latency.post_decode_overhead_us)
        self.content_ids = content_ids if content_ids is not None else ContentIds()

        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # batch order (ascending .order)
        self.prefilling: list[Request] = []  # running requests not in steady decode, batch order
        bs = limits.block_size
        self.phases: list[list[Request]] = [[] for _ in range(bs)]  # decoders by block phase
        self.n_decoders = 0
        self.decode_context = 0  # Σ computed tokens of decoders at the start of step `self.step`
        self.finish_heap: list[tuple[int, int, Request]] = []
        self.irregular: list[Request] = []  # decoders whose next gap spans more than one step
        self.step = 0  # index of the next step to form
        self._order = 0

        # counters
        self.preemptions = 0
        self.dropped = 0
        self.completed = 0
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.busy_us = 0

        # the step being executed
        self._start = 0
        self._dt = 0
        self._scheduled: list[tuple[Request, int]] = []  # non-decoder requests and their new tokens
        self._stalled: list[Request] = []  # decoders that got no token this step
        self._decode_tokens = 0
        self._preempted_now = False
        self._in_flight = False  # formed, not yet ended
        self._waiting_formed = 0
        # disaggregated serving: requests whose KV is reserved here while it is transferred in
        self.reserved: dict[int, Request] = {}
        self.received_blocks = 0
        # cluster.kv_transfer.decode_full: backpressure -- finished prefills whose KV stays here
        # until its transfer to the decode instance completes
        self.held: dict[int, tuple[Request, int]] = {}  # id -> (request, its anonymous blocks)
        # prompt blocks of transfers accepted here and not yet running (reserved or received),
        # and the most they may hold before transfers wait (0: no limit; the cluster sets it)
        self.remote_queue_blocks = 0
        self.remote_queue_limit = 0.0
        # set when this step made room for transfers waiting to start: with a queue limit, a
        # received request ran; without one, the last swapped-out request came back
        self.room_for_transfers = False
        # engine.preemption_mode: swap -- requests whose KV is in CPU memory, in swap-out order
        self.swapped: deque[Request] = deque()
        self.swap_used = 0  # CPU blocks held by swapped requests
        self.swap_peak = 0
        self.swap_outs = 0
        self.swap_ins = 0
        self.swap_out_blocks = 0
        self.swap_in_blocks = 0
        self.swap_fallbacks = 0  # victims recomputed because the swap space was full
        self.prefill_recomputes = 0  # victims still prefilling (always recomputed, never swapped)
        self._swap_now = 0  # blocks copied (either way) by the step being formed
        self._step_swap = (0, 0)  # (blocks, µs) of swap copies priced in the formed step
        self.swap_us_total = 0
        self._lora = None  # LoRA adapters: a components.adapters.LoRAState (None: off)

    # ------------------------------------------------------------------ arrivals
    def add_request(self, req: Request, now: int) -> bool:
        """Enqueue guards (vLLM's input checks), then append to the wait queue.

        Guards read the prompt length and the client's budget, never the oracle output length.
        Returns False when the request was dropped as unservable.
        """
        limits = self.limits
        req.enqueue_us = now
        req.instance = self.index
        reason = self.guard(req)
        if reason:
            req.state = DROPPED
            req.finish_reason = reason
            self.dropped += 1
            self.on_finish(req)
            return False
        self.set_target(req)
        if not limits.enable_prefix_caching:
            req.shareable_blocks = 0
        self.total_input_tokens += req.prompt_tokens
        req.state = WAITING
        self.waiting.append(req)
        return True

    def guard(self, req: Request) -> str:
        """vLLM's input checks (prompt and budget against the context window and KV capacity):
        the reason ``req`` cannot be served here, or "" when it can."""
        limits = self.limits
        prompt = req.prompt_tokens
        max_len = limits.max_model_len
        budget = req.max_output_tokens
        if prompt >= max_len:
            return DROP_PROMPT_TOO_LONG
        if budget > 0 and prompt + budget > max_len:
            return DROP_BUDGET_TOO_LONG
        if -(-prompt // limits.block_size) > limits.total_blocks - limits.watermark_blocks:
            return DROP_KV_TOO_SMALL
        return ""

    def set_target(self, req: Request) -> int:
        """Output tokens ``req`` will produce here: its sampled length capped by its budget
        (no budget: vLLM fills max_tokens up to the context window)."""
        budget = req.max_output_tokens
        if budget <= 0:
            budget = self.limits.max_model_len - req.prompt_tokens
        oracle = req.oracle_output_tokens
        req.target_output = oracle if oracle <= budget else budget
        req.length_capped = oracle > budget
        return req.target_output

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting) or bool(self.swapped)

    # ------------------------------------------------------------------ batch formation
    def _open_step(self, now: int) -> None:
        """Start forming a step at ``now`` (every engine's form_batch does this first): forget
        the last step's schedule, date the cache's block touches, and put the waiting queue in
        the scheduler's order."""
        self._scheduled.clear()
        self._stalled.clear()
        self._start = now
        self.kv.now = now
        if self.order_waiting is not None and len(self.waiting) > 1:
            self.order_waiting(self.waiting)

    def form_batch(self, now: int) -> int:
        """Schedule step ``self.step`` starting at ``now``; allocate its KV; return its duration (µs)."""
        limits = self.limits
        kv = self.kv
        bs = limits.block_size
        s = self.step
        threshold = limits.long_prefill_token_threshold
        budget = limits.max_num_batched_tokens
        scheduled = self._scheduled
        self._open_step(now)
        prefill_first = limits.prefill_first
        # vLLM v0 schedules new prompts only while nothing is swapped out
        if prefill_first and self.waiting and not self.swapped and self._prefill_only(now):
            return self._finish_forming()

        # -------- phase 1: running requests
        phase_list = self.phases[s % bs]
        demand = self.n_decoders
        need = len(phase_list)
        for r in self.prefilling:
            c = r.num_computed
            n = r.prompt_tokens + r.num_generated - c
            if 0 < threshold < n:
                n = threshold
            demand += n
            need += -(-(c + n) // bs) - (-(-c // bs))
        preempted = False
        if demand <= budget and need <= kv.free_count:
            # Everything running fits: every request gets its whole demand, nobody is preempted.
            if phase_list:
                kv.pop_blocks(len(phase_list))
            for r in self.prefilling:
                c = r.num_computed
                n = r.prompt_tokens + r.num_generated - c
                if 0 < threshold < n:
                    n = threshold
                self._allocate_prefill(r, c, n)
                scheduled.append((r, n))
            budget -= demand
            self._decode_tokens = self.n_decoders
        else:
            budget, preempted = self._phase1_general(s, budget)
        self._preempted_now = preempted
        self._in_flight = True

        # -------- phase 2: swapped-out requests come back before any waiting one (vLLM v0 and
        # DistServe); waiting requests are admitted only when none is left in CPU memory, or
        # when nothing runs (the swapped head then waits for KV that waiting requests hold)
        if self.swapped and not preempted:
            budget = self._swap_in(budget)
        if prefill_first or (self.swapped and self.running):
            self._waiting_formed = len(self.waiting)
        elif not self.waiting:  # (most decode steps)
            self._waiting_formed = 0
        else:
            self._admit_waiting(budget, preempted, now)
            if not self.running and self.waiting:
                self._unblock_remote(budget, now)
        return self._finish_forming()

    def _finish_forming(self) -> int:
        """The formed step's duration from the latency model."""
        if self._scheduled:
            items, prefill_tokens = self._prefill_items()
        else:  # a step that admits and prefills nothing (most steps): no scan
            items, prefill_tokens = [], 0
        context = self._decode_context_scheduled() if self._stalled else self.decode_context
        summary = BatchSummary(prefill_tokens, items, self._decode_tokens, context)
        dt = self.latency.step_time_us(summary)
        if not (type(dt) is int and dt >= 1):
            if not (isinstance(dt, (int, np.integer)) and dt >= 1):
                raise StepTimeError.of(self.latency, dt, summary)
            dt = int(dt)
        if self._reload_us or self._copy_us or self._swap_now or self._encode_us:
            return self._set_step_time(dt)
        # nothing owed by this step (most steps): _set_step_time's result, without its checks
        self._step_swap = _NO_SWAP
        self._dt = dt
        return dt

    def _admit_waiting(self, budget: int, preempted: bool, now: int) -> None:
        """Phase 2: admit waiting requests head first (none in a step that preempted)."""
        if self._lora is not None:  # LoRA: vLLM's max_loras rule and adapter loads
            return self._lora.admit_waiting(self, budget, preempted, now)
        waiting = self.waiting
        if waiting and not preempted:
            limits = self.limits
            running = self.running
            scheduled = self._scheduled
            max_seqs = limits.max_num_seqs
            chunked = limits.enable_chunked_prefill
            threshold = limits.long_prefill_token_threshold
            while waiting and budget > 0 and len(running) < max_seqs:
                r = waiting[0]
                remote = r.remote_kv  # its KV arrived by transfer: admitted as a decoder
                n = self._admit(r, budget, threshold, chunked, now)
                if n == 0:
                    break  # head-of-line blocking
                waiting.popleft()
                budget -= n
                if not remote:
                    scheduled.append((r, n))
        self._waiting_formed = len(waiting)

    def _prefill_items(self) -> tuple[list[tuple[int, int, int]], int]:
        """The batch summary's prefill part: (context, new tokens, known tokens) per request."""
        items = []
        tokens = 0
        for r, n in self._scheduled:
            tokens += n
            items.append((r.num_computed, n, r.prompt_tokens + r.num_generated))
        return items, tokens

    def _set_step_time(self, dt: int) -> int:
        """Add CPU-tier reload time, blocking KV-transfer time and swap copy time owed by this
        step's preemptions and admissions; floor at 1 µs."""
        self._step_swap = _NO_SWAP
        if self._reload_us:
            reload_us = int(self._reload_us)
            self._reload_us = 0.0
            dt += reload_us
            self.reload_us_total += reload_us
        if self._copy_us:
            dt += self._copy_us
            self.copy_us_total += self._copy_us
            self._copy_us = 0
        if self._encode_us:  # the colocated encoder runs before this step's forward pass
            dt += self._encode_us
            self.encode_us_total += self._encode_us
            self._encode_us = 0
        if self._swap_now:
            # swap-outs and swap-ins of this step are cache operations before its forward pass
            # (vLLM v0's worker), serialised with it: blocks x block bytes / PCIe bandwidth
            swap_us = round(self._swap_now * self.limits.swap_us_per_block)
            self._step_swap = (self._swap_now, swap_us)
            self._swap_now = 0
            dt += swap_us
            self.swap_us_total += swap_us
        if dt < 1:
            dt = 1
        self._dt = dt
        return dt

    def _decode_context_scheduled(self) -> int:
        """Σ context of the decoders that compute a token this step."""
        if not self._stalled:
            return self.decode_context
        s = self.step
        stalled_ctx = 0
        for r in self._stalled:
            stalled_ctx += r.anchor_computed + (s - r.anchor_step)
        return self.decode_context - stalled_ctx

    def _allocate_prefill(self, r: Request, c: int, n: int) -> None:
        """Blocks for prompt tokens [c, c+n) of a running request; register newly full shared blocks."""
        kv = self.kv
        bs = self.limits.block_size
        kv.pop_blocks(-(-(c + n) // bs) - (-(-c // bs)))
        self._register_full(r, (c + n) // bs)

    def _register_full(self, r: Request, full_blocks: int) -> None:
        blocks = r.blocks
        upto = r.shareable_blocks if r.shareable_blocks < full_blocks else full_blocks
        if len(blocks) >= upto:
            return
        kv = self.kv
        bs = self.limits.block_size
        for j in range(len(blocks), upto):
            block = kv.register(r.block_hash(j, bs, self.content_ids))
            if block is None:  # someone else holds this content: ours stays a private duplicate
                r.shareable_blocks = j
                return
            blocks.append(block)

    def _admit(self, r: Request, budget: int, threshold: int, chunked: bool, now: int) -> int:
        """Try to schedule the head of the wait queue; return its new tokens (0 = blocked)."""
        if r.remote_kv:
            return self._admit_remote(r, now)
        kv = self.kv
        bs = self.limits.block_size
        known = r.prompt_tokens + r.num_generated
        hits = []
        reload: list[int] = []
        if r.shareable_blocks:
            # vLLM caps hits at known-1 tokens: the last token is always recomputed for its logits.
            limit = min(r.shareable_blocks, (known - 1) // bs)
            ids = self.content_ids
            hits = self._cached_prefix(r, limit)
            j = len(hits)
            if kv.tiers is not None and j < limit:
                # blocks evicted from the GPU but still in an offload tier are copied back, not
                # recomputed
                while j < limit:
                    block_hash = r.block_hash(j, bs, ids)
                    if not kv.offloaded(block_hash) or kv.is_cached(block_hash):
                        break
                    reload.append(block_hash)
                    j += 1
        cached = (len(hits) + len(reload)) * bs
        n = known - cached
        if 0 < threshold < n:
            n = threshold
        if n > budget:
            if not chunked:
                return 0
            n = budget
        new_blocks = -(-(cached + n) // bs) - len(hits) - len(reload)
        revived = 0
        for block in hits:
            if block.ref == 0:
                revived += 1
        # v0's watermark keeps room for running requests to grow; with none running it protects
        # nothing (and would strand a preempted request grown past it), so it does not apply
        reserve = self.limits.watermark_blocks if self.running else 0
        if new_blocks + revived + len(reload) > kv.free_count - reserve:
            return 0
        kv.claim(hits)
        if reload:
            reloaded, reload_us = kv.reload(reload)
            hits.extend(reloaded)
            self._reload_us += reload_us
        r.blocks = hits
        kv.pop_blocks(new_blocks)
        r.num_computed = cached
        self._register_full(r, (cached + n) // bs)
        self._start_running(r, cached, now)
        return n

    def _start_running(self, r: Request, cached: int, now: int) -> None:
        """``r`` is admitted at ``now`` with ``cached`` prompt tokens found in the cache: it
        joins the batch (last in batch order) to prefill the rest."""
        r.state = RUNNING
        r.order = self._order
        self._order += 1
        if r.first_scheduled_us < 0:
            r.first_scheduled_us = now
            r.cached_tokens = cached
            if self.encoder is not None:  # multimodal: its media are encoded in this step
                self._encode_us += self.encoder.first_chunk(r, now)
        self.running.append(r)
        self.prefilling.append(r)

    def batch_empty(self) -> bool:
        """The step just formed computes nothing and nothing can change before a transfer lands:
        nothing runs and the queue head's KV is held by transfers in flight (disaggregated
        serving only). Also after a preemption emptied the batch while transfers hold KV: vLLM
        would re-admit the head and preempt it again every other step until a transfer lands;
        the instance waits for that instead (the head keeps one preemption, not one per loop)."""
        return (
            not self._scheduled
            and not self.running
            and (not self._preempted_now or bool(self.reserved))
        )

    def cancel_step(self, now: int) -> None:
        """Undo an empty formation: the instance idles until a request or a transfer arrives."""
        self._in_flight = False
        self.log.blocked_us.append(now)
        blocks, us = self._step_swap
        if blocks:  # a copy made while forming it is owed by the next step that runs
            self._swap_now += blocks
            self.swap_us_total -= us

    def _cached_prefix(self, r: Request, limit: int) -> list:
        """The cached blocks of ``r``'s first ``limit`` blocks, from the first, up to a miss."""
        kv = self.kv
        bs = self.limits.block_size
        ids = self.content_ids
        hits = []
        for j in range(limit):
            block = kv.lookup(r.block_hash(j, bs, ids))
            if block is None:
                break
            hits.append(block)
        return hits

    def _materialize(self, r: Request, step: int) -> int:
        """Write a steady decoder's implicit progress at the start of ``step`` into its fields."""
        c = r.anchor_computed + (step - r.anchor_step)
        r.num_computed = c
        r.num_generated = c - r.prompt_tokens + 1
        return c

    def _remove_decoder(self, r: Request, c: int) -> None:
        bs = self.limits.block_size
        self.phases[(r.anchor_step - r.anchor_computed) % bs].remove(r)
        self.n_decoders -= 1
        self.decode_context -= c
        r.finish_step = -1  # invalidates its heap entry
        if r.irregular:
            self.irregular.remove(r)

    def _add_decoder(self, r: Request, step: int, c: int) -> None:
        """``r`` decodes steadily from ``step`` on, with ``c`` computed tokens at that step's start."""
        bs = self.limits.block_size
        r.anchor_step = step
        r.anchor_computed = c
        insort(self.phases[(step - c) % bs], r, key=_ORDER_KEY)
        self.n_decoders += 1
        self.decode_context += c
        # last token is produced in the step where computed == prompt + target - 2
        f = step + (r.prompt_tokens + r.target_output - 2 - c)
        r.finish_step = f
        heapq.heappush(self.finish_heap, (f, r.order, r))

    # ------------------------------------------------------------------ execution
    def end_step(self, end: int, steps: int = 1, ends: np.ndarray | None = None) -> None:
        """Apply the step(s) formed at ``self._start``: ``steps`` > 1 ends a fast-forwarded window.

        ``ends`` holds the end time of every step of a window (the last one is ``end``).
        """
        s = self.step
        log = self.log
        kv = self.kv
        D = self._decode_tokens
        if steps > 1:
            self._bulk_steps(s, steps, ends)
            s = self.step
        start = self._start if steps == 1 else int(ends[-2])
        kv_used = kv.total_blocks - kv.free_count  # after this step's allocation, before releases
        regular = D
        finishing: list[tuple[Request, int]] = []
        # steady decoders that were irregular produce a token whose gap spans several steps
        if self.irregular:
            keep = []
            stalled = {id(r) for r in self._stalled} if self._stalled else ()
            for r in self.irregular:
                if id(r) in stalled:
                    keep.append(r)
                    continue
                log.irregular_gaps_us.append(end - r.last_token_end_us)
                r.last_token_end_us = end
                r.irregular = False
                regular -= 1
            self.irregular = keep
        prefill_tokens = self._end_prefills(s, end, finishing) if self._scheduled else 0
        # decoders: all but the stalled ones advanced one token
        self.decode_context += D
        stalled = self._stalled
        if stalled:
            irregular = self.irregular
            for r in stalled:
                c = r.anchor_computed + (s - r.anchor_step)
                # already irregular: it stays in the list (kept above), so no O(n) removal
                was_irregular = r.irregular
                r.irregular = False
                self._remove_decoder(r, c)
                self._add_decoder(r, s + 1, c)
                r.irregular = True
                if not was_irregular:
                    r.last_token_end_us = self._start
                    irregular.append(r)
        heap = self.finish_heap
        while heap and heap[0][0] <= s:
            f, _, r = heapq.heappop(heap)
            if r.finish_step != f or r.state != RUNNING:
                continue  # stale entry (the request stalled, was preempted, or re-anchored)
            c = r.prompt_tokens + r.target_output - 1
            self._remove_decoder(r, c)
            r.num_generated = r.target_output
            r.last_token_end_us = end
            finishing.append((r, c))
        if finishing:
            # requests finishing together free their blocks in batch order, as vLLM does (the
            # order decides which cached blocks the LRU evicts first)
            if len(finishing) > 1:
                finishing.sort(key=_FINISH_ORDER)
            for r, c in finishing:
                self._finish(r, end, c)
        batch = D + len(self._scheduled)
        self.busy_us += end - start
        log.rows.frombytes(
            STEP_ROW(
                start,
                end - start,
                prefill_tokens,
                D,
                regular,
                0,
                batch,
                self._waiting_formed,
                kv_used,
                len(self.waiting) + len(self.running) + len(self.swapped),
            )
        )
        self.step = s + 1
        self._in_flight = False
        self._scheduled.clear()
        self._stalled.clear()

    def _end_prefills(self, s: int, end: int, finishing: list[tuple[Request, int]]) -> int:
        """Advance step ``s``'s prefill-type requests (continuing chunks and admissions) by their
        scheduled tokens; returns the prefill tokens computed. One whose prompt (or recompute)
        is now computed produces a token: it finishes (appended to ``finishing`` as (request,
        computed tokens)) or joins the decoders from step ``s + 1``. Every engine's step end
        goes through here, so a prefill completes the same way with or without speculation."""
        log = self.log
        prefilling = self.prefilling
        prefill_tokens = 0
        for r, n in self._scheduled:
            prefill_tokens += n
            c = r.num_computed + n
            r.num_computed = c
            if c == r.prompt_tokens + r.num_generated:
                g = r.num_generated + 1
                r.num_generated = g
                if g == 1:
                    r.first_token_end_us = end
                else:
                    log.irregular_gaps_us.append(end - r.last_token_end_us)
                r.last_token_end_us = end
                prefilling.remove(r)
                if g >= r.target_output:
                    finishing.append((r, c))
                else:
                    self._add_decoder(r, s + 1, c)
        return prefill_tokens

    def _finish(self, r: Request, end: int, computed: int, allocated: int = -1) -> None:
        bs = self.limits.block_size
        self.running.remove(r)
        kv = self.kv
        if r.continues and self.limits.enable_prefix_caching:
            # the session's next round starts with this conversation: keep its blocks findable
            full = computed // bs
            if full > r.shareable_blocks:
                r.shareable_blocks = full
            self._register_full(r, full)
        if allocated < computed:
            allocated = computed
        if r.hold_kv:
            # a prefill part under back-pressure: its KV stays until the decode side has it
            self.held[r.id] = (r, -(-allocated // bs) - len(r.blocks))
        else:
            kv.release(-(-allocated // bs) - len(r.blocks), r.blocks)
            r.blocks = []
        r.num_computed = computed
        r.state = FINISHED
        # "length": stopped by max_tokens / the context limit before the sampled output length
        r.finish_reason = FINISH_LENGTH if r.length_capped else FINISH_STOP
        r.finish_us = end
        self.completed += 1
        self.total_output_tokens += r.num_generated
        self.on_finish(r)

    # ------------------------------------------------------------------ audit support
    def kv_owners(self) -> list[tuple[int, list]]:
        """(anonymous blocks, registered blocks) held by every running request, for INV-4."""
        bs = self.limits.block_size
        s = self.step
        owners = []
        # A step can be in flight (a run stopped at a horizon): its allocations are already made.
        extra = {id(r): n for r, n in self._scheduled} if self._in_flight else {}
        stalled = {id(r) for r in self._stalled} if self._in_flight else set()
        for r in self.running:
            if r.finish_step >= 0:
                c = r.anchor_computed + (s - r.anchor_step)
                if self._in_flight and id(r) not in stalled:
                    c += 1
            else:
                c = r.num_computed + extra.get(id(r), 0)
            owners.append((-(-c // bs) - len(r.blocks), r.blocks))
        # disaggregated serving: reservations being transferred into, and arrived transfers
        for r in self.reserved.values():
            owners.append((-(-r.num_computed // bs) - len(r.blocks), r.blocks))
        for r in self.waiting:
            if r.remote_kv:
                owners.append((-(-r.num_computed // bs) - len(r.blocks), r.blocks))
        # back-pressure: finished prefills holding their KV until it is transferred
        for r, anonymous in self.held.values():
            owners.append((anonymous, r.blocks))
        return owners
