"""The name tables shipped in ``servesim/latency/data`` (GPUs, models): read once per process,
and parsed once per version of the file.

A table maps canonical names to entries; a scenario may name an entry by any of its keys (the
name, aliases, HuggingFace ids) in any case, so each table comes with a lowercase lookup.

Parsing YAML costs more than a small run needs (PyYAML's constructor is Python even over
libyaml's parser: ~1 ms per 1,000 values), so a parsed file is also kept on disk in
``marshal`` form, as Python keeps compiled modules, in ``$SERVESIM_CACHE_DIR`` (default
``$XDG_CACHE_HOME/servesim``, else ``~/.cache/servesim``; an empty ``SERVESIM_CACHE_DIR`` turns
it off). A cache file is named after a hash of the file's bytes, so an edited file is parsed
again; a cache that cannot be read or written is passed over, never an error.
"""

from __future__ import annotations

import hashlib
import marshal
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from servesim.latency.modelspec import _DATA_DIR
from servesim.simcore.config import load_bundled_yaml

T = TypeVar("T")

CACHE_ENV = "SERVESIM_CACHE_DIR"


def bundled_section(file: str, section: str) -> Mapping[str, Any]:
    """The ``section`` mapping of ``data/<file>`` (see :func:`load_bundled`).

    The callers cache what they build from it (``functools.lru_cache``): a process reads each
    file at most once."""
    return load_bundled(_DATA_DIR / file)[section]


def load_bundled(path: Path) -> Any:
    """A YAML file shipped with servesim, parsed, or read back from the on-disk cache of its
    last parse (the module docstring says where). The caller caches the result in memory."""
    raw = path.read_bytes()
    cached = cache_file(path, raw)
    if cached is not None:
        try:
            return marshal.loads(cached.read_bytes())
        except (OSError, EOFError, ValueError, TypeError):
            pass  # not cached yet, or unreadable: parse
    data = load_bundled_yaml(raw.decode("utf-8"))
    if cached is not None:
        _store(cached, data)
    return data


def cache_file(path: Path, raw: bytes) -> Path | None:
    """Where the parse of ``raw`` (the bytes of ``path``) is cached; None when caching is off."""
    root = os.environ.get(CACHE_ENV)
    if root is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "servesim")
    if not root:
        return None
    digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
    return Path(root) / f"{path.stem}-{digest}.marshal"


def _store(cached: Path, data: Any) -> None:
    """Write ``data`` to ``cached`` atomically (a temporary name, then a rename), or not at all:
    a value marshal cannot hold, a read-only or full disk leave the cache as it was."""
    try:
        blob = marshal.dumps(data)
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
        partial.write_bytes(blob)
        os.replace(partial, cached)
    except (OSError, ValueError):
        return


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
