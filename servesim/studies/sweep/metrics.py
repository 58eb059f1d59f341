"""The summary metrics a sweep may tabulate: :func:`check_metric` (names checked against a real
summary) and :func:`metric_value`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from servesim.simcore.errors import ScenarioError

_PROBE: dict[str, Any] = {}


def _probe_summary() -> dict[str, Any]:
    """A summary with every optional section (SLO goodput, decisions, sessions, disaggregation),
    from a 20-request run of the default scenario: the summary fields a metric may name."""
    if not _PROBE:
        from servesim.run import simulate
        from servesim.scenario import load_scenario

        scenario = load_scenario(
            None,
            [
                "workload.requests=20",
                "workload.sessions={rounds: 2, think_time: 1s}",
                "slo={standard: {ttft: 1s}}",
                "output.trace=decisions",
                "cluster.pools={prefill: {instances: 1}, decode: {instances: 1}}",
                "policies.disaggregation=always",
            ],
        )
        _PROBE.update(simulate(scenario, check=False).summary)
    return _PROBE


def check_metric(name: Any, path: str) -> str:
    """Check that ``name`` is a numeric summary field, or a dotted path into a summary section."""
    if not isinstance(name, str) or not name or any(not p for p in name.split(".")):
        raise ScenarioError(path, name, "expected a summary field name such as ttft_p99_ms")
    if name == "fitness":
        return name  # present when the scenario gives fitness weights (None otherwise)
    probe = _probe_summary()
    parts = name.split(".")
    if parts[0] not in probe:
        import difflib

        close = difflib.get_close_matches(parts[0], list(probe), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ScenarioError(
            path,
            name,
            f"not a summary.json field{hint}; e.g. ttft_p99_ms, e2e_p50_ms, responses_per_sec, "
            "goodput.standard.slo_attainment (docs/reference/outputs.md)",
        )
    node: Any = probe
    for depth, part in enumerate(parts):
        if isinstance(node, Mapping):
            if part not in node:
                return name  # a section keyed by data (class, tenant, pool): checked per run
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit():
                raise ScenarioError(
                    path, name, f"{'.'.join(parts[:depth])} is a list; index it, e.g. .0"
                )
            if int(part) >= len(node):
                return name
            node = node[int(part)]
        else:
            raise ScenarioError(
                path, name, f"{'.'.join(parts[:depth])} is a number; it has no field {part!r}"
            )
    if isinstance(node, Mapping):
        example = next(iter(node), "count")
        raise ScenarioError(
            path, name, f"is a section, not a number; name one of its fields, e.g. {name}.{example}"
        )
    if isinstance(node, list):
        raise ScenarioError(path, name, f"is a list, not a number; index it, e.g. {name}.0")
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ScenarioError(path, name, "is not a number")
    return name


def metric_value(summary: Mapping[str, Any], name: str) -> float | int | None:
    """The value of a (dotted) summary field, or None when this run's summary has no such field."""
    node: Any = summary
    for part in name.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if isinstance(node, numbers.Integral):  # bool included: 0 or 1
        return int(node)
    return float(node) if isinstance(node, numbers.Real) else None
