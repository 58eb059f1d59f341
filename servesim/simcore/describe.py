"""A JSON-ready description of an object, built from a list of its attributes.

Several parts (a link, an interconnect, an arrival process, a run's verdict) report their
parameters as a flat dict for summary.json. Listing the reported names once, as a tuple, keeps
the key order stated in one place and each name written once; a ``(key, attribute)`` pair reports
an attribute under a different key.
"""

from __future__ import annotations

from typing import Any

Field = str | tuple[str, str]


def describe_fields(obj: object, fields: tuple[Field, ...]) -> dict[str, Any]:
    """``{key: obj.attribute}`` for each field, in order; a bare name is both key and attribute."""
    out: dict[str, Any] = {}
    for field in fields:
        key, attribute = (field, field) if isinstance(field, str) else field
        out[key] = getattr(obj, attribute)
    return out


__all__ = ["Field", "describe_fields"]
