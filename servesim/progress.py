"""A progress bar for long runs: requests finished, simulated time, ETA (tqdm).

It appears only when stderr is a terminal and only once a run has lasted ``delay_s`` wall seconds
(2 s by default), so short runs, pipes, CI logs and notebooks executed as scripts stay clean. The
cluster reports every ``every`` finished requests (an integer compare per request otherwise), and
the bar never touches the simulation's events: a run is the same with or without it.

tqdm itself is imported, and the bar (with its monitor thread) made, at the first report after
the delay: a short run in a terminal, the most common interactive one, pays for neither (tqdm's
import alone costs ~9 ms, a few percent of such a run).
"""

from __future__ import annotations

import sys
import time
from typing import Any


class RunProgress:
    """Call :meth:`update` with the requests finished so far and the simulated time."""

    def __init__(
        self,
        total_requests: int | None,
        *,
        delay_s: float = 2.0,
        every: int = 500,
        stream: Any = None,
        force: bool = False,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = force or bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every
        self.total = total_requests
        self._started = time.time()  # tqdm's own clock (time.time): the bar's elapsed time
        self._show_at = time.monotonic() + delay_s
        self._bar = None
        self._done = 0

    def update(self, done: int, sim_us: int) -> None:
        bar = self._bar
        if bar is None:
            if not self.enabled or time.monotonic() < self._show_at:
                return
            bar = self._bar = self._open(done)
        else:
            bar.update(done - self._done)
        self._done = done
        bar.set_postfix_str(f"sim {sim_us / 1e6:,.1f} s", refresh=False)

    def _open(self, done: int) -> Any:
        """The bar, shown from now on, starting at ``done`` requests; its elapsed time counts from
        the run's start, not from the bar's."""
        from tqdm import tqdm

        bar = tqdm(
            total=self.total,
            initial=done,
            unit="req",
            file=self.stream,
            dynamic_ncols=True,
            desc="simulating",
        )
        bar.start_t = self._started
        return bar

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
