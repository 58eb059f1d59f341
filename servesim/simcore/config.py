"""Validation primitives for configuration sections: checked once, at load time.

Every helper takes the dotted ``path`` of the field it reads, so an error always names the field,
the bad value and what is allowed (:class:`ScenarioError`). Sizes and durations accept units::

    parse_duration_us("50ms") == 50_000     parse_duration_us(2) == 2_000_000  (bare = seconds)
    parse_bytes("25GB") == 25e9             parse_rate_bytes("25GB/s") == 25e9 (bytes per second)

Nothing here knows what is being simulated; the scenario classes live with the code they configure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml

from servesim.simcore.errors import ScenarioError

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"

_DURATION_UNITS_US = {
    "us": 1,
    "µs": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
}

_BYTE_UNITS = {
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects a key given twice in one mapping (PyYAML keeps the last)."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"field {key!r} is given twice (first at line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def load_yaml(text: str):
    """Parse YAML safely, rejecting duplicate keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def load_bundled_yaml(text: str) -> Any:
    """Parse a YAML data file shipped with servesim, with libyaml's C parser when PyYAML was
    built with it (the pure-Python parser takes ~0.1 s over the bundled tables, more than a
    small run). Only for our own files: a user's file goes through :func:`load_yaml`, whose
    duplicate-key check and error messages are the pure-Python parser's."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def expect_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(
            path, value, f"expected a mapping (key: value), got {type(value).__name__}"
        )
    for key in value:
        if not isinstance(key, str):
            raise ScenarioError(f"{path}.{key}", key, "keys must be strings")
    return value


def check_keys(value: Mapping[str, Any], allowed: Iterable[str], path: str) -> None:
    """Reject unknown keys, suggesting the closest known one."""
    allowed = list(allowed)
    for key in value:
        if key not in allowed:
            hint = _closest(key, allowed)
            suggestion = f" (did you mean {hint!r}?)" if hint else ""
            where = f"{path}.{key}" if path else key
            raise ScenarioError(
                where,
                value[key],
                f"unknown field{suggestion}; allowed fields: {', '.join(allowed)}",
            )


def _closest(word: str, options: list[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return match[0] if match else None


MAX_TIME_US = 2**62
"""The simulated clock's end: every time and duration is an integer number of µs below this."""


def as_bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ScenarioError(path, value, "expected true or false")


def as_int(value: Any, path: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (floats with no fractional part are accepted, e.g. ``1e5``)."""
    if isinstance(value, bool):
        raise ScenarioError(path, value, "expected an integer, not a boolean")
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise ScenarioError(path, value, "expected an integer") from None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ScenarioError(path, value, "expected a whole number")
        value = int(value)
    if not isinstance(value, int):
        raise ScenarioError(path, value, "expected an integer")
    _check_range(value, path, minimum, maximum)
    return value


def as_float(
    value: Any,
    path: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
) -> float:
    """A finite float (NaN and infinities are rejected)."""
    if isinstance(value, bool):
        raise ScenarioError(path, value, "expected a number, not a boolean")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ScenarioError(path, value, "expected a number") from None
    if not isinstance(value, (int, float)):
        raise ScenarioError(path, value, "expected a number")
    value = float(value)
    if not math.isfinite(value):
        raise ScenarioError(path, value, "expected a finite number (not NaN or infinity)")
    if exclusive_minimum is not None and value <= exclusive_minimum:
        raise ScenarioError(path, value, f"must be greater than {number_text(exclusive_minimum)}")
    _check_range(value, path, minimum, maximum)
    return value


def number_text(value: float) -> str:
    """A number as an error message shows it: in full (``9223372036854775807``, ``0.8``,
    ``1e-300``), never rounded to a few digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _check_range(value: float, path: str, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise ScenarioError(path, value, f"must be at least {number_text(minimum)}")
    if maximum is not None and value > maximum:
        raise ScenarioError(path, value, f"must be at most {number_text(maximum)}")


def as_str(value: Any, path: str, *, choices: Iterable[str] | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise ScenarioError(path, value, "expected a non-empty string")
    if choices is not None:
        options = list(choices)
        if value not in options:
            raise ScenarioError(path, value, f"must be one of: {', '.join(options)}")
    return value


def parse_duration_us(value: Any, path: str, *, bare_unit: str = "s", minimum: int = 0) -> int:
    """A duration in integer microseconds. Bare numbers are in ``bare_unit`` (seconds by default)."""
    if isinstance(value, str):
        text = value.strip()
        m = re.fullmatch(_NUMBER + r"\s*([a-zµ]+)?", text)
        if not m:
            raise ScenarioError(
                path, value, "expected a duration such as 50ms, 2s, 1.5h or a number"
            )
        number, unit = float(m.group(1)), (m.group(2) or bare_unit)
        if unit not in _DURATION_UNITS_US:
            raise ScenarioError(
                path,
                value,
                f"unknown time unit {unit!r}; use one of {', '.join(_DURATION_UNITS_US)}",
            )
    else:
        number = as_float(value, path)
        unit = bare_unit
    us = number * _DURATION_UNITS_US[unit]
    if not math.isfinite(us):
        raise ScenarioError(path, value, "expected a finite duration")
    if abs(us) >= MAX_TIME_US:
        raise ScenarioError(
            path,
            value,
            f"longer than the simulated clock runs ({MAX_TIME_US} µs, about 146,000 years)",
        )
    result = int(round(us))
    if result < minimum:
        raise ScenarioError(path, value, f"must be at least {minimum} µs")
    return result


def parse_bytes(value: Any, path: str, *, bare_unit: str = "b") -> float:
    """A size in bytes: ``25GB``, ``16GiB``, or a bare number in ``bare_unit``."""
    if isinstance(value, str):
        m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]+)?", value.strip())
        if not m:
            raise ScenarioError(path, value, "expected a size such as 512MB, 16GiB or a number")
        number, unit = float(m.group(1)), (m.group(2) or bare_unit).lower()
    else:
        number, unit = as_float(value, path), bare_unit
    if unit not in _BYTE_UNITS:
        raise ScenarioError(
            path, value, f"unknown size unit {unit!r}; use one of {', '.join(_BYTE_UNITS)}"
        )
    result = number * _BYTE_UNITS[unit]
    if not math.isfinite(result) or result < 0:
        raise ScenarioError(path, value, "expected a finite, non-negative size")
    return result


def parse_rate_bytes(value: Any, path: str) -> float:
    """A bandwidth in bytes per second: ``25GB/s``, ``100Gbps`` (bits), or a number of bytes/s."""
    if isinstance(value, str):
        text = value.strip()
        m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]+)bps", text)
        if m:
            return parse_bytes(f"{m.group(1)}{m.group(2)}b", path) / 8
        if text.lower().endswith("/s"):
            return parse_bytes(text[:-2], path)
    return parse_bytes(value, path)


def set_path(tree: dict[str, Any], dotted: str, raw_value: str) -> None:
    """Apply one ``--set a.b.c=value`` override to a nested dict (values parsed as YAML scalars)."""
    if not dotted or any(not part for part in dotted.split(".")):
        raise ScenarioError(
            "--set", dotted, "expected a dotted field path such as engine.max_num_seqs"
        )
    try:
        value = yaml.safe_load(raw_value) if raw_value != "" else ""
    except yaml.YAMLError as exc:
        raise ScenarioError(
            dotted, raw_value, f"not a valid YAML value ({exc.__class__.__name__})"
        ) from None
    node: Any = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif isinstance(child, str):
            # `workload.arrival: gamma` then `--set workload.arrival.cv=2`: the name becomes a field
            child = node[part] = {"name": child}
        elif not isinstance(child, dict):
            where = dotted[: dotted.index(part) + len(part)]
            raise ScenarioError(
                where,
                child,
                f"expected a mapping, so {dotted} cannot be set inside it; fix the scenario file",
            )
        node = child
    node[parts[-1]] = value


def parse_set_option(option: str) -> tuple[str, str]:
    if "=" not in option:
        raise ScenarioError(
            "--set", option, "expected FIELD=VALUE, e.g. --set engine.max_num_seqs=64"
        )
    key, _, value = option.partition("=")
    return key.strip(), value.strip()


def plain_data(value: Any, leaf: Callable[[Any], Any] | None = None) -> Any:
    """A plain-data copy of a YAML-like value: every mapping a ``dict`` with string keys, every
    list or tuple a ``list``, scalars as they are (or as ``leaf`` maps them, e.g. numpy numbers
    to Python ones); ready for ``json.dumps`` or ``yaml.safe_dump``."""
    if isinstance(value, Mapping):
        return {str(k): plain_data(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v, leaf) for v in value]
    return value if leaf is None else leaf(value)
