"""``servesim project``: the closed-form steady state of a scenario, printed as a small table or
as JSON (``--json``). It takes the same scenario file, flags and ``--set`` overrides as
``servesim run``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from servesim.projection.project import Projection, project
from servesim.simcore.commands import Command


def _project_arguments(p: argparse.ArgumentParser) -> None:
    from servesim.cli import _add_scenario_options

    _add_scenario_options(p)
    p.add_argument("--json", action="store_true", help="print the projection as JSON")


def cmd_project(args: argparse.Namespace) -> int:
    """Print the projection of the scenario the arguments name."""
    from servesim.cli import _load

    result = project(_load(args))
    if args.json:
        print(json.dumps(_json_safe(result.to_dict()), indent=2))
    else:
        print(format_projection(result))
    return 0


add_project_parser = Command(
    "project",
    help="project a scenario's steady state in closed form (milliseconds, no simulation)",
    description=(
        "Project the steady state of a scenario without simulating it: per instance, the "
        "decode batch-size fixed point at the offered rate, TTFT with a queueing term for "
        "prefill, TPOT/ITL, throughput, KV use, the maximum sustainable rate and "
        "concurrency, and how sure the step times are. The rate is split evenly over the "
        "instances. Takes the same scenario, flags and --set overrides as `servesim run`. "
        "Not for: prefill/decode disaggregation, speculative decoding, traces, sessions "
        "(refused by name); see docs/explanation/projection.md for where it may not be "
        "trusted."
    ),
    arguments=_project_arguments,
    handler=cmd_project,
)
"""Add the ``project`` command to the CLI's subparsers; dispatch it to :func:`cmd_project`."""


def _json_safe(value: Any) -> Any:
    """Infinite numbers become null (JSON has no infinity)."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def format_projection(p: Projection) -> str:
    """The console table of a projection."""
    d = p.to_dict()
    w = d["workload"]
    first = d["groups"][0]
    lines = [
        f"{p.model} on {p.instances} x {first['gpu']} (tp {first['tp']}), latency "
        f"{first['latency']}, max_num_seqs {first['max_num_seqs']}, {first['kv_blocks']} KV blocks",
        f"workload   {d['rate_rps']:.2f} req/s (split evenly over {p.instances} instance(s)), "
        f"mean prompt {w['prompt']:.0f} tokens, mean output {w['output']:.0f} tokens",
        f"confidence {d['confidence']['level']}: {d['confidence']['detail']}",
    ]
    if d["sustainable"]:
        g = first
        lines += [
            f"state      sustainable at {d['utilization']:.0%} of the max rate",
            f"{'TTFT':<11}{_ms(d['ttft_mean_ms']):>12}  (prefill {_ms(g['prefill_ms'])}, "
            f"prefill queue {_ms(g['prefill_queue_ms'])})",
            f"{'TPOT/ITL':<11}{_ms(d['tpot_mean_ms']):>12}",
            f"{'E2E':<11}{_ms(d['e2e_mean_ms']):>12}",
            f"throughput {d['responses_per_sec']:.2f} req/s, {d['tokens_per_sec']:,.0f} output "
            f"tok/s, {d['input_tokens_per_sec']:,.0f} input tok/s",
            f"batch      {g['decode_batch']:.1f} decoding, {g['running']:.1f} running, "
            f"{d['concurrency']:.1f} in the system (cluster); KV {g['kv_utilization']:.1%} used "
            f"of {g['kv_tokens']:,} tokens",
        ]
    else:
        lines.append(
            f"state      NOT sustainable: {d['limit']}; the table shows throughput at the max rate"
        )
        lines.append(
            f"throughput {d['responses_per_sec']:.2f} req/s, {d['tokens_per_sec']:,.0f} output "
            f"tok/s at most"
        )
    lines.append(f"max rate   {_rate(d['max_rate_rps'])} (then {d['max_rate_limit']})")
    lines.append(
        f"concurrency at the max rate {first['max_concurrency'] or 0:.0f} requests per instance; "
        f"at most {first['concurrency_limit']} run at once (max_num_seqs, or KV at the mean "
        "context)"
    )
    if len(d["groups"]) > 1:
        for g in d["groups"]:
            lines.append(
                f"  group {g['group']}: {g['instances']} x {g['gpu']} tp {g['tp']} "
                f"({g['latency']}), TPOT {_ms(g['tpot_mean_ms'])}, max "
                f"{_rate(g['max_rate_rps'])} per instance ({g['max_rate_limit']})"
            )
    lines.append(f"cpu        {d['cpu_ms']:.1f} ms")
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:.2f} req/s"
