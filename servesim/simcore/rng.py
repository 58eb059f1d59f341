"""Named, independent random streams derived from one master seed.

Each consumer asks for its own stream by name (``workload/chat``, ``router``, ``lengths/chat``).
Streams come from numpy's SeedSequence keyed by a stable digest of the name, so adding a consumer
never shifts another consumer's draws, and the same (seed, name) always gives the same stream.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _name_key(name: str) -> list[int]:
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


class RandomStreams:
    """Factory of independent ``numpy.random.Generator`` streams, one per name."""

    def __init__(self, seed: int):
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = seed
        self._streams: dict[str, np.random.Generator] = {}

    def stream(self, name: str) -> np.random.Generator:
        """The generator for ``name`` (created on first use, then cached)."""
        gen = self._streams.get(name)
        if gen is None:
            seq = np.random.SeedSequence(entropy=self.seed, spawn_key=_name_key(name))
            gen = np.random.Generator(np.random.PCG64(seq))
            self._streams[name] = gen
        return gen

    def fresh(self, name: str) -> np.random.Generator:
        """A new generator for ``name`` starting from the beginning of its stream."""
        seq = np.random.SeedSequence(entropy=self.seed, spawn_key=_name_key(name))
        return np.random.Generator(np.random.PCG64(seq))
