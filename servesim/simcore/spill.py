"""Rows moved out of memory during a long run: a scratch directory, integer column files, and
row buckets keyed by an integer.

A run that records millions of rows would otherwise hold them all in memory until it ends. The
recorders move full blocks of rows here and read them back one column (or one slice of a column)
at a time, so what stays in memory is one block, whatever the length of the run. Everything is
64-bit integers, stored raw (native byte order): what is written is read back bit for bit.

The directory is scratch, not a result: it is created under the system temporary directory
(``TMPDIR``) and removed when its owner is garbage-collected or the process exits (or, after a
process was killed outright, by the next process that spills).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np

INT64_BYTES = 8


PREFIX = "servesim-spill-"


class SpillDir:
    """A private scratch directory, removed with its last user (or at interpreter exit).

    Its name carries the creating process's id: a process killed outright cannot remove its own,
    so each new one first removes those whose process is gone (:func:`remove_orphans`)."""

    def __init__(self) -> None:
        remove_orphans()
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.path), True)
        self._names = 0

    def new_name(self, stem: str) -> str:
        """A file stem no other user of this directory has been given."""
        self._names += 1
        return f"{stem}-{self._names}"

    def remove(self) -> None:
        """Delete the directory now (idempotent)."""
        self._remove()


def remove_orphans(root: str | Path | None = None) -> list[Path]:
    """Delete the scratch directories under ``root`` (the temporary directory) left by processes
    that no longer run; the ones removed."""
    removed = []
    for leftover in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        try:
            pid = int(leftover.name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or process_alive(pid):
            continue
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (ours or another user's): what decides whether a
    scratch directory named after it is an orphan."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _append(path: Path, values: np.ndarray) -> None:
    with open(path, "ab") as fh:
        fh.write(np.ascontiguousarray(values, dtype=np.int64).tobytes())


def _read(path: Path, start: int, count: int) -> np.ndarray:
    if count <= 0:
        return np.zeros(0, np.int64)
    with open(path, "rb") as fh:
        return np.fromfile(fh, dtype=np.int64, count=count, offset=start * INT64_BYTES)


class ColumnFiles:
    """Named int64 columns, each in its own file, appended a block of rows at a time.

    Reading one column never touches the others, so a reader holds one column (or a slice of
    one) in memory, not the rows.
    """

    def __init__(self, spill: SpillDir, stem: str, columns: tuple[str, ...]) -> None:
        self.spill = spill  # keeps the directory alive as long as the columns are readable
        self.columns = columns
        name = spill.new_name(stem)
        self._paths = [spill.path / f"{name}.{i}.i64" for i in range(len(columns))]
        self.length = 0

    def append(self, block: np.ndarray) -> None:
        """Append ``block`` (rows × columns, in :attr:`columns` order)."""
        for j, path in enumerate(self._paths):
            _append(path, block[:, j])
        self.length += len(block)

    def read(self, column: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of one column (all of it by default)."""
        stop = self.length if stop is None else min(stop, self.length)
        return _read(self._paths[self.columns.index(column)], start, stop - start)


class KeyedRows:
    """Rows of ``width`` int64 values sorted into buckets by ``key_column // bucket_span``.

    Appending writes each bucket's share of a block to that bucket's file; :meth:`drain` hands the
    buckets back in key order. A caller that needs the rows sorted by the key column sorts one
    bucket at a time (at most ``bucket_span`` rows when keys are unique): an on-disk bucket sort.
    """

    def __init__(self, spill: SpillDir, stem: str, width: int, key_column: int, bucket_span: int):
        self.spill = spill
        self.width = width
        self.key_column = key_column
        self.bucket_span = bucket_span
        self._stem = spill.new_name(stem)
        self._buckets: set[int] = set()
        self.length = 0

    def _path(self, bucket: int) -> Path:
        return self.spill.path / f"{self._stem}.{bucket}.rows"

    def append(self, block: np.ndarray) -> None:
        """Append ``block`` (rows × width int64)."""
        buckets = block[:, self.key_column] // self.bucket_span
        order = np.argsort(buckets, kind="stable")
        block, buckets = block[order], buckets[order]
        cuts = np.flatnonzero(np.diff(buckets)) + 1
        for part in np.split(np.arange(len(block)), cuts):
            if not len(part):
                continue
            bucket = int(buckets[part[0]])
            _append(self._path(bucket), block[part[0] : part[-1] + 1].reshape(-1))
            self._buckets.add(bucket)
        self.length += len(block)

    def drain(self) -> Iterator[np.ndarray]:
        """Each bucket's rows (rows × width), in ascending key order; the files are removed."""
        for bucket in sorted(self._buckets):
            path = self._path(bucket)
            rows = np.fromfile(path, dtype=np.int64).reshape(-1, self.width)
            path.unlink()
            yield rows
        self._buckets.clear()
        self.length = 0
