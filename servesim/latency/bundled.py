"""The name tables shipped in ``servesim/latency/data`` (GPUs, models): read once per process.

A table maps canonical names to entries; a scenario may name an entry by any of its keys (the
name, aliases, HuggingFace ids) in any case, so each table comes with a lowercase lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from servesim.latency.modelspec import _DATA_DIR
from servesim.simcore.config import load_bundled_yaml

T = TypeVar("T")


def bundled_section(file: str, section: str) -> Mapping[str, Any]:
    """The ``section`` mapping of ``data/<file>``, parsed with the C parser when there is one.

    The callers cache what they build from it (``functools.lru_cache``): a process parses each
    file at most once."""
    return load_bundled_yaml((_DATA_DIR / file).read_text(encoding="utf-8"))[section]


def name_lookup(
    entries: Mapping[str, T], other_keys: Callable[[T], Iterable[str | None]], file: str
) -> dict[str, str]:
    """Lowercase key -> canonical name, for every entry's name and its ``other_keys`` (None and
    empty keys skipped). A key naming two entries is a mistake in the bundled ``file``: the
    lookup would silently pick one, so it is refused."""
    lookup: dict[str, str] = {}
    for name, entry in entries.items():
        for key in (name, *other_keys(entry)):
            if key:
                previous = lookup.setdefault(key.lower(), name)
                if previous != name:
                    raise ValueError(f"{file}: {key!r} names both {previous} and {name}")
    return lookup
