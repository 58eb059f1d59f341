"""Error types that are part of servesim's interface.

Every error a user can cause names the field (or file/line), the bad value and the fix.
"""

from __future__ import annotations


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
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{path}: invalid value {shown}: {fix}")


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
