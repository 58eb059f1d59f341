"""Writing files so that a reader never sees half of one.

:func:`write_atomic` is the one way servesim writes a result file (reports, figures, fits,
plans, sweep tables): the bytes go to a temporary sibling that replaces the target in one
rename, so an interrupted write leaves the previous file whole, and the new file gets the
permissions a plain ``open`` would give it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes | Callable[[BinaryIO], object]) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling and a rename.

    ``data`` is text (written as UTF-8, newlines as given), bytes, or a function that writes
    into the open binary file (``fig.savefig``, ``np.savez``). The parent directory must exist.
    Whatever goes wrong, no temporary file is left behind and the exception propagates.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
