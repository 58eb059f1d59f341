"""``servesim list``: what a scenario can name (plugins by kind, bundled models, GPUs, traces)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from servesim.latency.hardware import bundled_gpus
from servesim.latency.modelindex import bundled_models
from servesim.simcore.registry import describe


def list_command(args: argparse.Namespace) -> int:
    """Print the registered plugins, bundled models, GPUs and traces (``args.what``), as a
    table or as JSON (``args.json``)."""
    what = args.what
    if args.json:
        out: dict[str, Any] = {}
        if what in ("plugins", "all", "latency"):
            out.update(
                (kind, names)
                for kind, names in describe().items()
                if what != "latency" or kind == "latency"
            )
        if what in ("models", "all"):
            from servesim.latency.catalog import model_catalog

            out["models"] = [entry.to_json() for entry in model_catalog()]
        if what in ("gpus", "all"):
            out["gpus"] = bundled_gpus()
        if what in ("traces", "all"):
            from servesim.workloads.traces import bundled_traces

            out["traces"] = sorted(bundled_traces())
        print(json.dumps(out, indent=2))
        return 0
    if what in ("plugins", "all", "latency"):
        for kind, names in describe().items():
            if what == "latency" and kind != "latency":
                continue
            print(f"{kind:<15} {', '.join(names) if names else '(none)'}")
    if what == "models":
        from servesim.latency.catalog import format_model_catalog, model_catalog

        print(format_model_catalog(model_catalog()))
    elif what == "all":
        print(f"{'models':<15} {', '.join(bundled_models())} (details: servesim list models)")
    if what in ("gpus", "all"):
        print(f"{'gpus':<15} {', '.join(bundled_gpus())}")
    if what in ("traces", "all"):
        from servesim.workloads.traces import bundled_traces

        print(f"{'traces':<15} {', '.join(sorted(bundled_traces()))}")
    return 0
