"""A progress bar for long runs: requests finished, simulated time, ETA (tqdm).

It appears only when stderr is a terminal and only once a run has lasted ``delay_s`` wall seconds
(2 s by default), so short runs, pipes, CI logs and notebooks executed as scripts stay clean. The
cluster reports every ``every`` finished requests (an integer compare per request otherwise), and
the bar never touches the simulation's events: a run is the same with or without it.
"""

from __future__ import annotations

import sys
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
        self._bar = None
        self._done = 0
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_requests,
                unit="req",
                delay=delay_s,
                file=self.stream,
                dynamic_ncols=True,
                desc="simulating",
            )

    def update(self, done: int, sim_us: int) -> None:
        bar = self._bar
        if bar is None:
            return
        bar.update(done - self._done)
        self._done = done
        bar.set_postfix_str(f"sim {sim_us / 1e6:,.1f} s", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
