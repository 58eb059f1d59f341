"""The ``servesim convert`` command: a trace into another format, or an inference-perf benchmark
config into a servesim workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from servesim.simcore.errors import ScenarioError


def add_convert_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` command to the CLI's subparsers; dispatch it to :func:`cmd_convert`."""
    p = subparsers.add_parser(
        "convert",
        help="convert a trace between formats (servesim, tracev2, ...), or an inference-perf "
        "config into a servesim workload",
    )
    p.add_argument(
        "source", help="trace file (or bundled trace name) to read, or `inference-perf` (--spec)"
    )
    p.add_argument(
        "destination",
        nargs="?",
        help="file to write (.gz compresses); inference-perf: a scenario YAML (default: stdout)",
    )
    p.add_argument(
        "--from", dest="src_format", default="auto", help="source format (default: detect)"
    )
    p.add_argument(
        "--to", dest="dst_format", default="auto", help="destination format: servesim or tracev2"
    )
    p.add_argument(
        "--lossy",
        action="store_true",
        help="allow dropping what the destination format cannot hold (content segments, budgets)",
    )
    p.add_argument(
        "--spec",
        metavar="FILE",
        help="with source `inference-perf`: the inference-perf config YAML to convert (load "
        "stages, arrivals, length distributions, shared prefixes)",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", help="the file to write (instead of DESTINATION)"
    )
    p.set_defaults(handler=cmd_convert)
    return p


def cmd_convert(args: argparse.Namespace) -> int:
    destination = args.destination
    if args.output is not None:
        if destination is not None:
            raise ScenarioError("--output", args.output, "give the destination once, not twice")
        destination = args.output
    if args.source == "inference-perf" or args.spec is not None:
        return _inference_perf(args.source, args.spec, destination)
    if destination is None:
        raise ScenarioError("destination", None, "missing; give the file to write")
    from servesim.workloads.traces import convert

    written = convert(
        args.source, destination, args.src_format, args.dst_format, strict=not args.lossy
    )
    print(f"wrote {destination}" + (f" ({written})" if written else ""))
    return 0


def _inference_perf(source: str, spec: str | None, destination: str | None) -> int:
    from servesim.simcore.files import write_atomic
    from servesim.workloads.inferenceperf import (
        convert_inference_perf,
        read_inference_perf,
        scenario_text,
    )

    if source != "inference-perf" or spec is None:
        raise ScenarioError(
            "--spec", spec, "use `servesim convert inference-perf --spec CONFIG.yaml [-o OUT]`"
        )
    sections, notes = convert_inference_perf(read_inference_perf(spec))
    text = scenario_text(sections, notes, Path(spec).name)
    if destination is None:
        sys.stdout.write(text)
        return 0
    write_atomic(destination, text)
    print(f"wrote {destination} ({len(notes)} note(s) in its header)")
    return 0
