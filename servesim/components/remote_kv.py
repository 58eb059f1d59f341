"""The decode side of disaggregated serving in an engine: KV received by transfer.

Before a prompt's KV is transferred in, the engine reserves blocks for it (``reserve_remote``);
when it has arrived the request joins the wait queue with its prompt computed (``add_remote``)
and is admitted as a decoder (``_admit_remote``). Under back-pressure a prefill engine keeps a
finished prompt's KV until its transfer is done (``release_held``). When waiting requests hold
received KV that blocks the queue head, it is given back (``_unblock_remote``).
The transfer itself, and when it starts, are decided outside the engine (link and PD flow).
"""

from __future__ import annotations

from servesim.components.request import DROP_DECODE_KV_FULL, RUNNING, WAITING, Request


class RemoteKV:
    """Engine mix-in: reservations for, and requests with, KV transferred in."""

    def reserve_remote(self, req: Request, now: int, free_blocks: int) -> int:
        """Decode side of a disaggregated request: hold KV for its whole prompt before the
        prompt's KV is transferred in (as the llm-d/vLLM connector does before pulling).

        Blocks of the prompt this instance already caches are reused (prefix-cache hits; they
        need no transfer); the rest are allocated now. ``free_blocks`` is what the instance can
        give at ``now``. Returns the number of blocks to transfer, or -1 with
        ``req.finish_reason`` set when the request cannot be served here (guards, or no room).
        """
        reason = self.guard(req)
        if reason:
            req.finish_reason = reason
            return -1
        limits = self.limits
        bs = limits.block_size
        kv = self.kv
        prompt = req.prompt_tokens
        total = -(-prompt // bs)
        hits = []
        if limits.enable_prefix_caching and req.shareable_blocks:
            hits = self._cached_prefix(req, min(req.shareable_blocks, prompt // bs))
        revived = 0
        for block in hits:
            if block.ref == 0:
                revived += 1
        transfer = total - len(hits)
        limit = self.remote_queue_limit
        if limit > 0:
            # DistServe: accept while the prompts accepted but not yet running hold less than a
            # fraction of the cache (its waiting_block_prop_threshold)
            full = self.remote_queue_blocks >= limit
        else:
            # with requests swapped out, they come back first (vLLM v0's order: running,
            # swapped, then new work): room taken by a new transfer would starve them
            full = bool(self.swapped)
        if full or transfer + revived > free_blocks:
            req.finish_reason = DROP_DECODE_KV_FULL
            return -1
        kv.now = now
        kv.claim(hits)
        kv.pop_blocks(transfer)
        kv.miss_blocks -= transfer  # received, not computed
        self.received_blocks += transfer
        req.blocks = hits
        req.num_computed = prompt
        req.instance = self.index
        if not limits.enable_prefix_caching:
            req.shareable_blocks = 0
        self.reserved[req.id] = req
        self.remote_queue_blocks += total
        return transfer

    def add_remote(self, req: Request, now: int) -> None:
        """The transfer into the reserved blocks is complete: ``req`` joins the wait queue with
        its prompt computed and its first token (made by the prefill instance) known."""
        del self.reserved[req.id]
        self.kv.now = now
        self._register_full(req, req.prompt_tokens // self.limits.block_size)
        req.state = WAITING
        req.remote_kv = True
        self.total_output_tokens -= 1  # its first token was produced (and counted) elsewhere
        self.waiting.append(req)

    def release_reserved(self, req: Request) -> None:
        """Give back a reservation whose transfer will not complete (the run ended)."""
        del self.reserved[req.id]
        self.remote_queue_blocks -= -(-req.prompt_tokens // self.limits.block_size)
        self.kv.release(
            -(-req.num_computed // self.limits.block_size) - len(req.blocks), req.blocks
        )
        req.blocks = []

    def release_held(self, req: Request, now: int) -> None:
        """Back-pressure: the KV a finished prefill kept here has reached the decode instance
        (or will never be needed): free it."""
        r, anonymous = self.held.pop(req.id)
        self.kv.now = now
        self.kv.release(anonymous, r.blocks)
        r.blocks = []
        r.hold_kv = False

    def _admit_remote(self, r: Request, now: int) -> int:
        """Admit a request whose prompt KV arrived by transfer: it joins the decoders at once."""
        bs = self.limits.block_size
        c = r.num_computed
        need = -(-(c + 1) // bs) - (-(-c // bs))
        if need > self.kv.free_count:
            return 0
        self.kv.pop_blocks(need)
        self.remote_queue_blocks -= -(-r.prompt_tokens // bs)
        if self.remote_queue_limit > 0:
            self.room_for_transfers = True
        if r.copy_us:  # kv_transfer.blocking: the instance stalled while it received this KV
            self._copy_us += r.copy_us
            r.copy_us = 0
        r.remote_kv = False
        r.state = RUNNING
        r.order = self._order
        self._order += 1
        self.running.append(r)
        # A steady decoder from this step on. Its previous token came from the prefill instance,
        # so this step's gap is irregular (it spans the transfer and the wait here).
        self._add_decoder(r, self.step, c)
        r.irregular = True
        self.irregular.append(r)
        self._decode_tokens += 1
        return 1

    def _unblock_remote(self, budget: int, now: int) -> None:
        """Nothing runs and the queue head does not fit (or fits only to preempt itself): when
        requests waiting behind it hold transferred KV, give it back (latest first; they will
        recompute, as after a preemption, or with ``preemption_mode: swap`` wait in CPU memory)
        until something is admitted. Without this, KV held by
        waiting requests could block the head forever (vLLM only preempts running requests).
        Runs without disaggregation never get here with such requests."""
        waiting = self.waiting
        bs = self.limits.block_size
        swap_space = self.limits.swap_blocks
        for k in range(len(waiting) - 1, -1, -1):
            r = waiting[k]
            if not r.remote_kv:
                continue
            self.kv.release(-(-r.num_computed // bs) - len(r.blocks), r.blocks)
            r.blocks = []
            r.remote_kv = False
            self.remote_queue_blocks -= -(-r.prompt_tokens // bs)
            r.preemptions += 1
            self.preemptions += 1
            copied = -(-r.num_computed // bs)
            if swap_space >= 0 and self.swap_used + copied <= swap_space:
                # preemption by swapping: its received KV waits in CPU memory instead, and
                # swapped-out requests come back first
                del waiting[k]
                self._swap_out(r, copied)
                budget = self._swap_in(budget)
            else:
                if swap_space >= 0:
                    self.swap_fallbacks += 1
                r.num_computed = 0
            if not self.running:
                self._admit_waiting(budget, False, now)
            if self.running:
                return
