"""Rules on the keys of a workload mapping that several parsers share: keys that must all be
given, and two groups of keys of which only one may be. Each error names the key and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from servesim.simcore.errors import ScenarioError


def require_keys(mapping: Mapping[str, Any], keys: Iterable[str], path: str, what: str) -> None:
    """Each of ``keys`` must be in ``mapping``; the first missing one is the error
    ``missing; <what>`` at ``<path>.<key>``."""
    for key in keys:
        if key not in mapping:
            raise ScenarioError(f"{path}.{key}", None, f"missing; {what}")


def either_keys(
    mapping: Mapping[str, Any],
    first: Iterable[str],
    second: Iterable[str],
    path: str,
    what: str,
) -> tuple[list[str], list[str]]:
    """The keys of ``first`` and of ``second`` that ``mapping`` gives, two ways of saying the same
    thing: giving keys of both is an error at the first given key of ``second``, ``what`` its fix."""
    given_first = [k for k in first if k in mapping]
    given_second = [k for k in second if k in mapping]
    if given_first and given_second:
        key = given_second[0]
        raise ScenarioError(f"{path}.{key}", mapping[key], what)
    return given_first, given_second
