"""``servesim observe``: its argument parser, the request stream and the command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from servesim.simcore.commands import Command, given_options
from servesim.simcore.errors import ScenarioError

API_KEY_VARIABLES = ("SERVESIM_API_KEY", "OPENAI_API_KEY")
"""Environment variables read (in this order) for the API key when --api-key is not given."""

EXTRA_HINT = "pip install 'servesim[observe]'"


def _observe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", metavar="SPEC.yaml",
                   help="scenario file whose workload (and seed) to send")  # fmt: skip
    p.add_argument("--url", required=True, help="server address, e.g. http://localhost:8000")
    p.add_argument("--model", required=True, help="model name as the server knows it")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    load = p.add_argument_group("the request stream (as in servesim run)")
    load.add_argument("--rate", help="open loop: arrival rate, requests per second")
    load.add_argument("--max-concurrency", type=int, metavar="N",
                      help="requests in flight at most; alone: a closed loop of N users")  # fmt: skip
    load.add_argument("--trace", metavar="FILE", help="open loop: replay a trace's arrivals")
    load.add_argument("--trace-format", default="auto", help="format of --trace (default: detect)")
    load.add_argument("--requests", help="number of requests")
    load.add_argument("--preset", help="workload preset: chatbot, summarization, ...")
    load.add_argument("--arrival", help="arrival process: poisson, constant, gamma, weibull")
    load.add_argument("--seed", type=int, help="master random seed (arrivals, sizes, prompts)")
    load.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="FIELD=VALUE", help="any scenario field, as in servesim run")  # fmt: skip
    run = p.add_argument_group("the run")
    run.add_argument("--warmup", type=int, default=0, metavar="N",
                     help="send N requests first, not recorded (default 0)")  # fmt: skip
    run.add_argument("--duration", type=float, metavar="S",
                     help="stop sending new requests S seconds after the start")  # fmt: skip
    run.add_argument("--timeout", type=float, default=600.0, metavar="S",
                     help="give up on a request after S seconds (default 600)")  # fmt: skip
    run.add_argument(
        "--api-key", help=f"bearer token (default: ${' or $'.join(API_KEY_VARIABLES)})"
    )
    run.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    run.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                     help="do not send ignore_eos (for servers that refuse it; outputs may then "
                     "end before their target length)")  # fmt: skip
    run.add_argument("--no-usage", dest="usage", action="store_false",
                     help="do not ask for stream_options.include_usage (token counts are then "
                     "the requested prompt and one per chunk)")  # fmt: skip
    prompts = p.add_argument_group("prompt sizes")
    prompts.add_argument("--tokenizer", metavar="PATH|none",
                         help="tokenizer.json (or folder) to size prompts exactly; default: the "
                         "model's own when on disk, else the words-per-token ratio")  # fmt: skip
    prompts.add_argument("--words-per-token", type=float, default=1.0, metavar="R",
                         help="words per token without a tokenizer (default 1.0)")  # fmt: skip
    prompts.add_argument("--calibrate-ratio", action="store_true",
                         help="measure the server's tokens per built prompt first (4 short "
                         "requests) and correct prompt sizes")  # fmt: skip
    server = p.add_argument_group("what is known of the server (written to measured.csv)")
    server.add_argument("--system", default="observed", help="name of the serving system")
    server.add_argument("--gpu", help="GPU name as servesim knows it (servesim list gpus)")
    server.add_argument("--tp", type=int, help="tensor-parallel degree")
    server.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="another setting, e.g. max_num_seqs=256 (repeatable)")  # fmt: skip


def _require_httpx() -> str:
    try:
        import httpx
    except ImportError:
        raise ScenarioError(
            "observe",
            "httpx",
            f"servesim observe needs the httpx package, which is not installed: {EXTRA_HINT}",
        ) from None
    return httpx.__version__


_STREAM_OPTIONS = (
    ("rate", "workload.rate"),
    ("requests", "workload.requests"),
    ("preset", "workload.preset"),
    ("arrival", "workload.arrival"),
    ("seed", "seed"),
)
"""Options that set one field of the scenario whose requests are sent: (option's dest, field)."""


def request_stream(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any], bool]:
    """The requests ``servesim run`` would simulate for these flags, the workload description,
    and whether the run is a closed loop."""
    from servesim.scenario import load_scenario
    from servesim.simcore.rng import RandomStreams

    closed = args.max_concurrency is not None and not (args.rate or args.trace or args.spec)
    if args.rate is None and args.trace is None and args.spec is None and not closed:
        raise ScenarioError(
            "observe",
            None,
            "say how to offer the load: --rate R, --max-concurrency N, --trace FILE or a SPEC.yaml",
        )
    overrides: list[str] = []
    if args.trace is not None:
        if args.rate is not None or args.preset is not None or args.arrival is not None:
            raise ScenarioError(
                "--trace",
                args.trace,
                "a trace has its own arrivals and sizes: drop --rate, --preset and --arrival",
            )
        trace = os.path.abspath(args.trace) if os.path.exists(args.trace) else args.trace
        overrides.append(f"workload={{trace: {json.dumps(trace)}, format: {args.trace_format}}}")
    given = given_options(args, _STREAM_OPTIONS)
    overrides += [f"{field}={value}" for field, value in given.items()]
    scenario = load_scenario(args.spec, overrides + list(args.overrides))
    specs = list(scenario.workload.requests(RandomStreams(scenario.seed)))
    if not specs:
        raise ScenarioError("workload", None, "the workload has no requests to send")
    described = {"seed": scenario.seed, **scenario.workload.describe()}
    return specs, described, closed


def _settings_lines(args: argparse.Namespace, out: Path, mode: str) -> dict[str, Any]:
    """The ``# key: value`` lines of measured.csv (settings validate reads, then provenance)."""
    lines: dict[str, Any] = {
        "name": out.name or "observed",
        "system": args.system,
        "model": args.model,
        "gpu": args.gpu,
        "tp": args.tp,
    }
    if args.rate is not None and mode == "open loop":
        try:
            lines["request_rate"] = float(args.rate)
        except ValueError:
            pass  # a rate with a unit: validate measures the rate from the arrivals anyway
    for item in args.setting:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError("--setting", item, "expected KEY=VALUE, e.g. max_num_seqs=256")
        lines[key.strip()] = value.strip()
    lines["source"] = "servesim observe"
    lines["url"] = args.url
    lines["mode"] = mode
    return lines


#: Options passed to :class:`ObserveSettings` as they are, under the same name.
_OPTIONS_AS_SETTINGS = ("url", "model", "chat", "ignore_eos", "usage", "max_concurrency", "warmup")


def cmd_observe(args: argparse.Namespace) -> int:
    """Run ``servesim observe``; exit 0, or 130 when interrupted (what finished is written)."""
    httpx_version = _require_httpx()
    from servesim.observe.load import Observer, ObserveSettings
    from servesim.observe.prompts import PromptBuilder, load_tokenizer
    from servesim.observe.writers import format_summary, started_at, versions, write_observation

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ScenarioError("--out", args.out, "is a file; give a directory")
    specs, workload, closed = request_stream(args)
    api_key = args.api_key
    if api_key is None:
        api_key = next((os.environ[v] for v in API_KEY_VARIABLES if os.environ.get(v)), None)
    settings = ObserveSettings(
        **{name: getattr(args, name) for name in _OPTIONS_AS_SETTINGS},
        api_key=api_key,
        closed_loop=closed,
        duration_s=args.duration,
        timeout_s=args.timeout,
        calibrate=args.calibrate_ratio,
    )
    settings.check()
    builder = PromptBuilder(
        tokenizer=load_tokenizer(args.tokenizer, args.model),
        words_per_token=args.words_per_token,
        seed=workload["seed"],
    )
    mode = "closed loop" if closed else "open loop"
    print(
        f"observe {args.url} ({args.model}): {len(specs)} requests, {mode}"
        + (f", at most {args.max_concurrency} in flight" if args.max_concurrency else "")
        + f"; prompts sized by {builder.method}",
        file=sys.stderr,
    )
    import asyncio

    observer = Observer(settings, builder)
    observation = asyncio.run(observer.run(specs))
    meta = {
        "url": args.url,
        "endpoint": observer.url,
        "model": args.model,
        "started_at": started_at(observation.wall_start),
        "mode": mode,
        "settings": {
            "chat": args.chat,
            "api_key": "given" if api_key else "none",
            "ignore_eos": args.ignore_eos,
            "usage": args.usage,
            "max_concurrency": args.max_concurrency,
            "warmup": args.warmup,
            "duration_s": args.duration,
            "timeout_s": args.timeout,
        },
        "workload": workload,
        "prompts": {
            "method": observation.builder.method if observation.builder else None,
            "calibration": observation.calibration,
        },  # fmt: skip
        "versions": versions({"httpx": httpx_version}),
        "served_models": observation.served_models,
        "notes": observation.notes,
    }
    for note in observation.notes:
        print(f"note: {note}", file=sys.stderr)
    files = write_observation(
        out, observation, model=args.model, meta=meta, settings=_settings_lines(args, out, mode)
    )
    from servesim.observe.writers import summary

    if observation.builder is not None:
        print(f"prompts    sized by {observation.builder.method}")
    print(format_summary(summary(observation)))
    print("wrote " + ", ".join(str(f) for f in files))
    if observation.stopped_by == "interrupted":
        print(
            "interrupted: the requests that had finished were written; those cut short are "
            "recorded as incomplete in trace.csv",
            file=sys.stderr,
        )
        return 130
    return 0


add_observe_parser = Command(
    "observe",
    help="measure a real OpenAI-compatible server with the requests a simulation would see",
    description=(
        "Send a workload to an OpenAI-compatible server (vLLM, SGLang, TGI) and time every "
        "streamed token. The requests are the ones `servesim run` would simulate for the same "
        "flags or SPEC.yaml (same arrivals, sizes and prefix groups). Open loop with --rate, "
        "--trace or a SPEC.yaml (--max-concurrency then caps requests in flight); closed loop "
        "with --max-concurrency alone. Writes DIR/trace.csv (+ trace.yaml, BLIS TraceV2), "
        "DIR/measured.csv (read by servesim validate and calibrate), DIR/chunks.jsonl and "
        f"DIR/meta.json. Needs the observe extra: {EXTRA_HINT}."
    ),
    arguments=_observe_arguments,
    handler=cmd_observe,
)
"""Add the ``observe`` command to the CLI's subparsers."""
