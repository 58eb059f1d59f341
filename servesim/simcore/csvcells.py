"""One CSV cell read as a number, with an error that names the column and says what is allowed.

Generic: nothing here knows what a column means. A reader passes a cell's text and its column name
and turns a :class:`BadCell` into its own error naming the file and line. Used by the measured-run
and step-table readers of :mod:`servesim.fidelity` and the workload trace readers.
"""

from __future__ import annotations

import math


class BadCell(ValueError):
    """A malformed cell: ``column`` names it, ``value`` is its text, ``what`` says what is allowed."""

    def __init__(self, column: str, value: str, what: str):
        super().__init__(what)
        self.column, self.value, self.what = column, value, what


def cell_finite(text: str, column: str, *, not_finite: str = "expected a finite number") -> float:
    """A finite number ("2.5", "1e3"); ``not_finite`` is the error's text for NaN or infinity."""
    try:
        value = float(text)
    except ValueError:
        raise BadCell(column, text, "expected a number") from None
    if not math.isfinite(value):
        raise BadCell(column, text, not_finite)
    return value


def cell_number(
    text: str, column: str, *, minimum: float = 0.0, strict: bool = False, hint: str = ""
) -> float:
    """A finite number >= ``minimum`` (> ``minimum`` when ``strict``); "2.5", "1e3" are accepted.
    ``hint`` (the fix, e.g. "leave the cell empty when unknown") is added to a below-minimum error.
    """
    value = cell_finite(text, column, not_finite="expected a finite number (not NaN or infinity)")
    if value < minimum or (strict and value == minimum):
        what = f"must be {'>' if strict else '>='} {minimum:g}"
        raise BadCell(column, text, f"{what} ({hint})" if hint else what)
    return value


def cell_whole(text: str, column: str, *, minimum: int = 0) -> int:
    """A whole number >= ``minimum`` ("12", "12.0" and "1e3" are accepted)."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise BadCell(column, text, "expected a whole number") from None
        if not math.isfinite(number) or number != int(number):
            raise BadCell(column, text, "expected a whole number") from None
        value = int(number)
    if value < minimum:
        if value < 0:
            raise BadCell(column, text, "must not be negative")
        raise BadCell(column, text, f"must be at least {minimum}")
    return value


__all__ = ["BadCell", "cell_finite", "cell_number", "cell_whole"]
