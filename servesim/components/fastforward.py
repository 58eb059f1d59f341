"""Steady-decode fast-forward for an engine (DESIGN §4.1): many decode steps computed at once.

While an instance's batch composition cannot change, ``window`` computes the durations of its
next k steps in one go (the instance sleeps once) and ``_bulk_steps`` applies all but the last of
them when the window ends: counters, KV allocations and step-log rows, without touching any
request. How the window is cut or settled by events from outside is the instance's business
(``instance.py``).
"""

from __future__ import annotations

import heapq

import numpy as np

from servesim.components.request import RUNNING
from servesim.latency.base import check_decode_steps


class FastForward:
    """Engine mix-in: the fast-forward window (see :class:`~servesim.components.engine.Engine`)."""

    def window(self, max_steps: int, min_steps: int = 2) -> np.ndarray | None:
        """If the step just formed starts a steady-decode window, its steps' durations (cumulative).

        Conditions (DESIGN §4.1): the formed step is decode-only and nothing irregular is pending;
        the wait queue is empty or its head is blocked by what only a completion can release.
        The window ends with the first step in which a request finishes, or before the first step
        whose KV allocation would fail. Returns None when the window is a single step.
        """
        if (
            self._scheduled
            or self._stalled
            or self.irregular
            or self._preempted_now
            or self.room_for_transfers  # transfers may start when this step ends
            or not self.n_decoders
        ):
            return None
        waiting = self.waiting
        if waiting and self.kv.cpu is not None and waiting[0].shareable_blocks:
            # decode growth evicts cached blocks to the CPU tier, where the queue head may find
            # its prefix and fit: not a head only a completion can release
            return None
        s = self.step
        heap = self.finish_heap
        while heap and (heap[0][2].finish_step != heap[0][0] or heap[0][2].state != RUNNING):
            heapq.heappop(heap)
        if not heap:
            return None
        k = heap[0][0] - s + 1  # steps s .. first finish, inclusive
        if k > max_steps:
            k = max_steps
        if k < min_steps:
            return None
        # KV: steps s+1 .. s+k-1 each pop one block per decoder crossing a block boundary.
        bs = self.limits.block_size
        counts = np.fromiter((len(p) for p in self.phases), dtype=np.int64, count=bs)
        needs = counts[(s + 1 + np.arange(k - 1)) % bs]
        cumulative = np.cumsum(needs)
        self.window_needs = cumulative  # blocks taken by steps s+1.. (readers of KV use mid-window)
        fits = int(np.searchsorted(cumulative, self.kv.free_count, side="right"))
        if fits < k - 1:
            k = fits + 1
            if k < min_steps:
                return None
        D = self.n_decoders
        rest = self.latency.decode_steps_us(D, self.decode_context + D, k - 1)
        check_decode_steps(self.latency, rest, D, self.decode_context + D)
        durations = np.empty(k, dtype=np.int64)
        durations[0] = self._dt
        durations[1:] = rest
        return np.cumsum(durations)

    def _bulk_steps(self, s: int, steps: int, ends: np.ndarray) -> None:
        """Apply the first ``steps - 1`` steps of a window (none of them finishes a request)."""
        m = steps - 1
        kv = self.kv
        D = self._decode_tokens
        # blocks taken by steps s+1 .. s+m (step s+m is the last step of the window, applied
        # normally): the window's cumulative needs, computed when it was formed (the batch has
        # not changed since)
        taken = self.window_needs
        used_before = kv.total_blocks - kv.free_count  # after step s's own allocation
        kv.pop_blocks(int(taken[m - 1]))
        starts = np.empty(m, dtype=np.int64)
        starts[0] = self._start
        starts[1:] = ends[: m - 1]
        # arrivals during a window end it within its last step, so these held for every bulk step
        waiting = self._waiting_formed
        pending = waiting + len(self.running) + len(self.swapped)
        kv_used = np.empty(m, dtype=np.int64)
        kv_used[0] = used_before
        kv_used[1:] = taken[: m - 1]
        kv_used[1:] += used_before
        # columns with equal values share one array (the log copies them into its rows)
        zeros = np.zeros(m, np.int64)
        decoders = np.full(m, D, np.int64)
        self.log.extend(
            {
                "start_us": starts,
                "dt_us": ends[:m] - starts,
                "prefill_tokens": zeros,
                "decode_tokens": decoders,
                "regular_tokens": decoders,
                "burst_tokens": zeros,
                "batch_size": decoders,
                "waiting": np.full(m, waiting, np.int64),
                "kv_used": kv_used,
                "pending_after": np.full(m, pending, np.int64),
            }
        )
        self.busy_us += int(ends[m - 1]) - self._start
        self.decode_context += D * m
        self.step = s + m
