"""Preemption by swapping (``engine.preemption_mode: swap``; vLLM v0, DistServe's decode engine).

A decoding victim's KV is copied to CPU memory (``_swap_out``) and the request waits in the
swapped queue; swapped requests come back (``_swap_in``) before any waiting request is admitted.
Both copies are priced in the step that makes them. ``check_swap`` balances the swap-space books
for the auditor.
"""

from __future__ import annotations

from servesim.components.request import RUNNING, WAITING, Request


class SwapPreemption:
    """Engine mix-in: the swapped queue and its CPU blocks."""

    def _swap_in(self, budget: int) -> int:
        """Copy swapped-out requests back from CPU memory, head first, while the GPU has room
        for their KV and their next token (v0 keeps its watermark free while requests run) and
        a sequence slot and budget remain. Each rejoins the decoders and computes a token this
        step; the copy lengthens the step (``_set_step_time``). Returns the budget left."""
        limits = self.limits
        kv = self.kv
        bs = limits.block_size
        swapped = self.swapped
        running = self.running
        max_seqs = limits.max_num_seqs
        while swapped and budget > 0 and len(running) < max_seqs:
            r = swapped[0]
            c = r.num_computed
            reserve = limits.watermark_blocks if running else 0
            need = -(-(c + 1) // bs)
            if need > kv.free_count - reserve:
                break
            swapped.popleft()
            copied = r.swapped_blocks
            kv.pop_blocks(need)
            kv.miss_blocks -= copied  # copied back, not computed
            self.swap_used -= copied
            self.swap_ins += 1
            self.swap_in_blocks += copied
            self._swap_now += copied
            r.swapped_blocks = 0
            if r.copy_us:  # swapped out before its first admission (_unblock_remote)
                self._copy_us += r.copy_us
                r.copy_us = 0
            r.state = RUNNING
            r.order = self._order
            self._order += 1
            running.append(r)
            # a steady decoder again; the gap to its previous token spans its time in CPU memory
            self._add_decoder(r, self.step, c)
            r.irregular = True
            self.irregular.append(r)
            self._decode_tokens += 1
            budget -= 1
        if not swapped and self.remote_queue_limit <= 0:
            self.room_for_transfers = True
        return budget

    def _swap_out(self, r: Request, copied: int) -> None:
        """``r`` (its GPU blocks already freed) joins the swapped queue with ``copied`` blocks of
        KV in CPU memory; the copy is priced in the step being formed."""
        r.swapped_blocks = copied
        r.state = WAITING
        r.order = -1
        self.swap_outs += 1
        self.swap_out_blocks += copied
        self._swap_now += copied
        used = self.swap_used = self.swap_used + copied
        if used > self.swap_peak:
            self.swap_peak = used
        self.swapped.append(r)

    def check_swap(self) -> list[str]:
        """Swap-space books (INV-4 across GPU and CPU): the swapped requests hold exactly the CPU
        blocks counted as used, within the swap space; every block swapped out was swapped back
        in or is still there."""
        problems: list[str] = []
        held = 0
        for r in self.swapped:
            if r.swapped_blocks <= 0 or r.blocks:
                problems.append(
                    f"swapped request {r.id} holds {r.swapped_blocks} CPU and {len(r.blocks)} "
                    "GPU blocks"
                )
            held += r.swapped_blocks
        if held != self.swap_used:
            problems.append(
                f"swapped requests hold {held} CPU blocks but {self.swap_used} are used"
            )
        space = self.limits.swap_blocks
        if self.swap_peak > max(space, 0):
            problems.append(f"swap space peaked at {self.swap_peak} blocks, over its {space}")
        if self.swap_out_blocks - self.swap_in_blocks != self.swap_used:
            problems.append(
                f"swap conservation broken: {self.swap_out_blocks} blocks out - "
                f"{self.swap_in_blocks} in != {self.swap_used} in CPU memory"
            )
        return problems
