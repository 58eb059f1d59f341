"""vLLM v0's default scheduler (``engine.prefill_first``): prefill-only steps first.

A step that admits whole prompts from the wait queue prefills only them (every running decoder
waits); otherwise the step decodes and admits nothing. Admissions keep ``watermark_blocks`` free
(see ``Engine._admit``).
"""

from __future__ import annotations


class PrefillFirst:
    """Engine mix-in: the prefill-only half of vLLM v0's scheduling."""

    def _prefill_only(self, now: int) -> bool:
        """vLLM v0's default scheduler (``engine.prefill_first``), first half: admit whole
        prompts from the wait queue, head first. If any was admitted, this step prefills only
        them and every running decoder waits (no token this step); returns True. Otherwise the
        step decodes only (phase 1) and admits nothing. Prompts are never chunked (the loader
        requires it), so no request is mid-prefill when a step is formed."""
        self._admit_waiting(self.limits.max_num_batched_tokens, False, now)
        if not self._scheduled:
            return False
        self._preempted_now = False
        self._in_flight = True
        self._decode_tokens = 0
        stalled = self._stalled
        for r in self.running:
            if r.finish_step >= 0:
                stalled.append(r)
        return True
