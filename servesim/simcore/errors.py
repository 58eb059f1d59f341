"""Error types that are part of servesim's interface.

Every error a user can cause names the field (or file/line), the bad value and the fix.
"""

from __future__ import annotations

import os
import reprlib

_LONGEST_TEXT = 4096
"""Text values (paths, names) are shown whole up to this length: a path cut in the middle is no
help in an error message."""

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6
_SHORT.maxstring = 80
_SHORT.maxother = 80


def shown_value(value: object) -> str:
    """How an error message shows a bad value: numbers and text in full (text up to
    :data:`_LONGEST_TEXT` characters), containers abridged without expanding them whole (a YAML
    alias bomb is never rendered)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if len(value) <= _LONGEST_TEXT:
            return repr(value)
        return f"{value[:200]!r}... ({len(value):,} characters)"
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if (
        type(value).__module__ == "numpy"
        and hasattr(value, "item")
        and getattr(value, "ndim", 1) == 0
    ):
        return repr(value.item())  # a numpy scalar, shown as the number it is
    shown = _SHORT.repr(value)
    if len(shown) > 160:
        size = f" ({len(value):,} items)" if hasattr(value, "__len__") else ""
        shown = f"{shown[:157]}...{size}"
    return shown


class ServesimError(Exception):
    """Base class of every error servesim raises on purpose."""


class ScenarioError(ServesimError, ValueError):
    """A scenario (or one of its files) is invalid.

    ``path`` is the dotted field path (``engine.block_size``), ``value`` the offending value and
    ``fix`` what is allowed instead. ``str(err)`` is a one-line message suitable for a CLI.
    """

    def __init__(self, path: str, value: object, fix: str):
        self.path = path
        self.value = value
        self.fix = fix
        super().__init__(f"{path}: invalid value {shown_value(value)}: {fix}")


class UnknownPluginError(ScenarioError):
    """A scenario names a plugin that is not registered."""

    def __init__(self, path: str, kind: str, name: object, known: list[str]):
        self.kind = kind
        self.known = known
        super().__init__(
            path, name, f"unknown {kind} {name!r}; known: {', '.join(known) or '(none)'}"
        )


class AuditError(ServesimError):
    """A finished run broke an invariant. ``violations`` lists every finding."""

    def __init__(self, violations: list):
        self.violations = violations
        head = "; ".join(str(v) for v in violations[:5])
        more = f" (+{len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(f"audit failed with {len(violations)} violation(s): {head}{more}")
