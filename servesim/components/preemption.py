"""Preempt-for-tokens in an engine: phase 1 of batch formation request by request.

When not everything running fits the KV cache, running requests are scheduled one at a time in
batch order; one whose new blocks do not fit makes room by preempting victims chosen by the
preemption policy (``Engine.victim``). A victim frees its blocks and is recomputed from the head
of the wait queue, or, with ``preemption_mode: swap``, waits in CPU memory (``swap.py``).
"""

from __future__ import annotations

from servesim.components.request import WAITING, Request


class Preemption:
    """Engine mix-in: phase 1 with preemption, and the victims' KV."""

    def _phase1_general(self, s: int, budget: int) -> tuple[int, bool]:
        """Phase 1 request by request, with preemption (used when not everything running fits)."""
        running = self.running
        self._p1_decodes = 0
        # Materialise decoders' progress so each request can be handled individually.
        for r in running:
            if r.finish_step >= 0:
                self._materialize(r, s)
        budget, preempted, got = self._schedule_running(budget)
        # Decoders left without a token this step (budget ran out, or phase 1 stopped early).
        stalled = self._stalled
        for r in running:
            if r.finish_step >= 0 and id(r) not in got:
                stalled.append(r)
        self._decode_tokens = self._p1_decodes
        return budget, preempted

    def _schedule_running(self, budget: int) -> tuple[int, bool, dict[int, int]]:
        """Schedule the running requests one at a time in batch order until the token budget is
        spent; one whose new blocks do not fit makes room by preempting (:meth:`_make_room`).

        A prefilling request gets its remaining prompt (capped by the long-prefill threshold and
        the budget); a decoder gets :meth:`_decoder_slots` and is booked by
        :meth:`_schedule_decoder` (speculative decoding overrides both). Returns the budget left,
        whether anyone was preempted, and the tokens each scheduled request got (by ``id``).
        """
        limits = self.limits
        kv = self.kv
        bs = limits.block_size
        threshold = limits.long_prefill_token_threshold
        running = self.running
        scheduled = self._scheduled
        decoder_slots = self._decoder_slots
        schedule_decoder = self._schedule_decoder
        preempted = False
        got: dict[int, int] = {}  # id(request) -> tokens scheduled this step (for refunds)
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            c = r.num_computed
            decoding = r.finish_step >= 0
            if decoding:
                n, need = decoder_slots(r, c, budget)
            else:
                n = r.prompt_tokens + r.num_generated - c
                if 0 < threshold < n:
                    n = threshold
                if n > budget:
                    n = budget
                need = -(-(c + n) // bs) - (-(-c // bs))
            if need > kv.free_count:
                preempted = True
                fits, i, budget = self._make_room(r, i, need, got, budget)
                if not fits:
                    break
            if decoding:
                schedule_decoder(r, c, n, need)
            else:
                self._allocate_prefill(r, c, n)
                scheduled.append((r, n))
            got[id(r)] = n
            budget -= n
            i += 1
        return budget, preempted, got

    def _decoder_slots(self, r: Request, c: int, budget: int) -> tuple[int, int]:
        """A decoder's token slots this step (``budget`` > 0) and the new KV blocks they need:
        one token, after its ``c`` computed ones."""
        bs = self.limits.block_size
        return 1, -(-(c + 1) // bs) - (-(-c // bs))

    def _schedule_decoder(self, r: Request, c: int, n: int, need: int) -> None:
        """Book a decoder's ``n`` slots this step: take its ``need`` new blocks."""
        self.kv.pop_blocks(need)
        self._p1_decodes += 1

    def _make_room(
        self, r: Request, i: int, need: int, got: dict, budget: int
    ) -> tuple[bool, int, int]:
        """Preempt-for-tokens: evict victims until ``need`` blocks are free for ``r`` (at ``i``).

        Victims scheduled earlier this step give their tokens back. Returns (``r`` still runs,
        the cursor corrected for victims removed before it, the budget).
        """
        running = self.running
        while need > self.kv.free_count:
            vi = self.victim(running)
            victim = running[vi]
            refund = got.pop(id(victim), 0)
            if refund:
                budget += refund
                if victim.finish_step >= 0:
                    refund = self._unschedule_decoder(victim, refund)
                else:
                    self._scheduled[:] = [(q, m) for q, m in self._scheduled if q is not victim]
            self._preempt(victim, vi, refund)
            if vi < i:
                i -= 1
            if victim is r:
                return False, i, budget
        return True, i, budget

    def _unschedule_decoder(self, r: Request, tokens: int) -> int:
        """A decoder already given ``tokens`` this step is preempted; return the tokens whose KV
        it holds beyond its computed ones."""
        self._p1_decodes -= 1
        return tokens

    def _preempt(self, r: Request, index: int, allocated_now: int) -> None:
        """Preemption: free every block, keep generated tokens. By recompute (the default): requeue
        at the head of the wait queue. By swap (``engine.preemption_mode: swap``, decoders only;
        a victim still prefilling is recomputed): its KV is copied to CPU memory and it joins
        the swapped queue, to be copied back before any waiting request is admitted."""
        kv = self.kv
        bs = self.limits.block_size
        s = self.step
        del self.running[index]
        decoder = r.finish_step >= 0
        if decoder:
            c = self._materialize(r, s)
            self._remove_decoder(r, c)
            if not r.irregular:
                r.last_token_end_us = self._start  # its previous token ended as this step began
            r.irregular = False
        else:
            c = r.num_computed
            self.prefilling.remove(r)
            self.prefill_recomputes += 1
        allocated = self._allocated_tokens(r, c, allocated_now)
        swap_space = self.limits.swap_blocks
        if decoder and swap_space >= 0:
            # preemption by swapping: its computed KV goes to CPU memory, all its GPU blocks
            # are freed; it keeps its progress. No room left there: recompute (counted).
            copied = -(-c // bs)
            if self.swap_used + copied <= swap_space:
                kv.release(-(-allocated // bs) - len(r.blocks), r.blocks)
                r.blocks = []
                r.num_computed = c
                r.preemptions += 1
                self.preemptions += 1
                self._swap_out(r, copied)
                return
            self.swap_fallbacks += 1
        # Its full blocks become matchable by its own re-admission (vLLM keeps their hashes).
        full = allocated // bs
        known_full = (r.prompt_tokens + r.num_generated) // bs
        if full > known_full:
            full = known_full
        if self.limits.enable_prefix_caching and full > r.shareable_blocks:
            r.shareable_blocks = full
            self._register_full(r, full)
        kv.release(-(-allocated // bs) - len(r.blocks), r.blocks)
        r.blocks = []
        r.num_computed = 0
        r.state = WAITING
        r.order = -1
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _allocated_tokens(self, r: Request, computed: int, allocated_now: int) -> int:
        """Tokens whose KV slots ``r`` holds: computed ones plus this step's allocation."""
        return computed + allocated_now
