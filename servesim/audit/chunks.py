"""Reading the auditor's input a slice of rows at a time, and looking instants up in every
server's step boundaries at once.

A long run's request table and step logs live on disk (the run record spills them); a check that
read whole columns would hold several of them at once, which at ten million requests is gigabytes.
The checks that cross many columns read them here in slices of :data:`CHUNK_ROWS` rows instead, so
what they hold is one slice, whatever the length of the run. A mapping that knows how to slice
itself (the run record's lazy columns) is asked for its ``chunks``; a plain dict of arrays (a
saved run, a test's copy) is sliced in memory, which costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

CHUNK_ROWS = 1 << 18
"""Rows per slice: about 2 MB per int64 column, so a check holding ten columns and their
temporaries stays within a few tens of MB. Read at each call, so a test can make it tiny."""


def chunks(
    table: Mapping[str, np.ndarray], names: Sequence[str]
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(index of the slice's first row, the named columns over that slice), in row order."""
    size = CHUNK_ROWS
    sliced = getattr(table, "chunks", None)
    if sliced is not None:
        offset = 0
        for chunk in sliced(tuple(names), size):
            yield offset, chunk
            offset += len(chunk[names[0]])
        return
    length = len(table[names[0]])
    for start in range(0, length, size):
        yield start, {name: table[name][start : start + size] for name in names}


def column_max(table: Mapping[str, np.ndarray], name: str, default: int) -> int:
    """The largest value of one column (``default`` when it is empty), a slice at a time."""
    top = default
    for _, chunk in chunks(table, (name,)):
        if len(chunk[name]):
            top = max(top, int(chunk[name].max()))
    return top


def rows(table: Mapping[str, np.ndarray], name: str = "start_us") -> int:
    """How many rows a table has (its ``rows`` if it says, else the length of one column)."""
    known = getattr(table, "rows", None)
    return int(known) if known is not None else len(table[name])


class ServerInstants:
    """Every server's instants, sorted, in one ascending array keyed ``server * span + time``, so
    one search answers a batch of (server, instant) questions without a loop over servers.

    It holds 8 bytes per instant (16 with ``values``), filled a slice at a time:
    ``slices(server)`` yields that server's instants (``sizes[server]`` of them in all) and the
    values that go with them (or None), typically read a slice of a step log at a time.
    ``top``: no instant is larger."""

    def __init__(
        self,
        sizes: Sequence[int],
        slices: Callable[[int], Iterator[tuple[np.ndarray, np.ndarray | None]]],
        top: int,
    ) -> None:
        self.span = max(int(top), 0) + 2
        self.keys = np.empty(sum(sizes), dtype=np.int64)
        self.values: np.ndarray | None = None
        at = 0
        for server, size in enumerate(sizes):
            end = at
            for instants, values in slices(server):
                n = len(instants)
                np.add(instants, server * self.span, out=self.keys[end : end + n])
                if values is not None:
                    if self.values is None:
                        self.values = np.empty(len(self.keys), dtype=np.int64)
                    self.values[end : end + n] = values
                end += n
            assert end - at == size, (server, size, end - at)
            self._sort(at, end)
            at = end

    def _sort(self, start: int, stop: int) -> None:
        """Order one server's range by instant (a log out of order only: a clock violation)."""
        keys = self.keys[start:stop]
        if len(keys) < 2 or (keys[1:] >= keys[:-1]).all():
            return
        order = np.argsort(keys, kind="stable")
        keys[:] = keys[order]
        if self.values is not None:
            self.values[start:stop] = self.values[start:stop][order]

    def _query(self, servers: np.ndarray, instants: np.ndarray) -> np.ndarray:
        # an instant past every key stays within its own server's range of keys
        return servers * self.span + np.clip(instants, -1, self.span - 1)

    def contains(self, servers: np.ndarray, instants: np.ndarray) -> np.ndarray:
        """Whether each (server, instant) is one of that server's instants."""
        if not len(self.keys):
            return np.zeros(len(instants), dtype=bool)
        query = self._query(servers, instants)
        at = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return (self.keys[at] == query) & (instants >= 0) & (instants < self.span - 1)

    def at_or_before(
        self, servers: np.ndarray, instants: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each (server, instant ≥ 0): whether that server has an instant at or before it, the
        index of the last such (valid where found), and whether it is the instant itself."""
        if not len(self.keys):
            none = np.zeros(len(instants), dtype=bool)
            return none, np.zeros(len(instants), dtype=np.int64), none
        query = self._query(servers, instants)
        at = np.searchsorted(self.keys, query, side="right") - 1
        safe = np.maximum(at, 0)
        found = (at >= 0) & (self.keys[safe] >= servers * self.span)
        return found, safe, found & (self.keys[safe] == servers * self.span + instants)
