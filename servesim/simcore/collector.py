"""Python's cyclic garbage collector, spaced out while a simulation's event loop runs.

CPython starts a collection of its youngest generation every 700 net allocations of container
objects, and every tenth of those an older one; each collection walks every object of the
generations it collects. A simulation allocates millions of short-lived containers (events and
the tuples and lists its processes pass around) and keeps a few hundred thousand alive for a
long simulated time (the work in progress and what it holds), which the collector walks again
and again while finding almost nothing to free: the simulator's objects die by reference
counting. On the largest cluster benchmark (bench scenario j) the collector took a quarter of
the run's CPU time.

:func:`collections_spaced` raises the youngest generation's threshold for the duration of a
``with`` block and restores the previous thresholds afterwards. Cycles are still collected
(young ones at the next collection, which the 50,000 net allocations bound), so a plugin that
makes cyclic garbage costs memory for a while, not for ever.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# net allocations of container objects between two collections of the youngest generation
# (CPython's default is 700); the older generations keep their default ratios
YOUNG_THRESHOLD = 50_000


@contextmanager
def collections_spaced(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Collect the youngest generation every ``young`` net allocations inside the block (never
    more often than the thresholds already set), then put the thresholds back."""
    before = gc.get_threshold()
    if before[0] > 0:
        gc.set_threshold(max(young, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
