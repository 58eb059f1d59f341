"""The ``servesim`` command line: run, check, list, audit.

Every shortcut flag is sugar for one scenario field (``--max-num-seqs 64`` is
``--set engine.max_num_seqs=64``); flags apply after the scenario file and before ``--set``.
Errors in the input print one line naming the field, the value and the fix (exit code 2); a run
that breaks an invariant prints the auditor's report (exit code 3).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from servesim.simcore.commands import given_options
from servesim.startup import end_of_startup, pause_gc_for_startup

NOT_MODELLED = """\
not modelled yet (see docs/explanation/what-is-modelled.md): client timeouts and cancellation;
parts of prefill/decode disaggregation; parts of parallelism (pipeline or context ranks inside
lock-stepped data-parallel MoE ranks, expert load fluctuation and balancing); LoRA adapter prefetching.
"""

# flag -> (scenario path, help, argparse type)
SHORTCUTS: dict[str, tuple[str, str, Any]] = {
    "--model": ("model", "model name (servesim list models) or path to a HF config.json", str),
    "--gpu": ("gpu", "GPU name (servesim list gpus)", str),
    "--tp": ("tp", "tensor-parallel degree of each instance", int),
    "--instances": (
        "cluster.instances",
        "number of identical instances (see also cluster.groups)",
        int,
    ),
    "--rate": ("workload.rate", "arrival rate, requests per second", str),
    "--requests": ("workload.requests", "number of requests", str),
    "--preset": (
        "workload.preset",
        "workload preset: chatbot, summarization, contentgen, multidoc",
        str,
    ),
    "--arrival": ("workload.arrival", "arrival process: poisson, constant, gamma, weibull", str),
    "--seed": ("seed", "master random seed", int),
    "--latency-model": ("latency.model", "latency model (servesim list latency)", str),
    "--max-num-seqs": ("engine.max_num_seqs", "max requests in a batch (vLLM --max-num-seqs)", int),
    "--max-num-batched-tokens": ("engine.max_num_batched_tokens", "token budget per step", int),
    "--kv-blocks": ("engine.kv_blocks", "KV cache blocks per instance, or auto", str),
    "--block-size": ("engine.block_size", "tokens per KV block", int),
    "--max-model-len": ("engine.max_model_len", "context limit in tokens, or auto", str),
    "--horizon": (
        "horizon",
        "stop at this simulated time (e.g. 10min); default: run to completion",
        str,
    ),
    "--out": ("output.dir", "results directory (written atomically)", str),
    "--fitness": (
        "fitness",
        "weighted fitness score to report, e.g. ttft_p99_ms:3,tokens_per_sec:1",
        str,
    ),
}


def _add_scenario_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scenario", nargs="?", help="scenario YAML file (default: the built-in default scenario)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any scenario field, e.g. --set engine.max_num_seqs=64 (repeatable)",
    )
    _add_plugin_option(p)
    group = p.add_argument_group("shortcuts (each sets one scenario field)")
    for flag, (path, text, kind) in SHORTCUTS.items():
        group.add_argument(
            flag,
            dest=_shortcut_dest(path),
            type=kind,
            metavar=path.rsplit(".", 1)[-1].upper(),
            help=f"{text} [{path}]",
        )
    group.add_argument(
        "--trace",
        metavar="FILE",
        help="replay a trace file or a bundled trace (servesim list traces) instead of the "
        "scenario's workload [workload.trace]",
    )
    group.add_argument(
        "--trace-format",
        choices=("auto", "servesim", "tracev2", "mooncake", "azure", "csv"),
        help="format of --trace (default: detected from the file) [workload.format]",
    )
    group.add_argument(
        "--session-mode",
        choices=("fixed", "closed-loop"),
        help="how a replayed trace's sessions arrive: every round at its recorded time (fixed, "
        "the default) or each a recorded think time after the previous round completed "
        "(closed-loop) [workload.session_mode]",
    )
    group.add_argument(
        "--exact-steps",
        action="store_true",
        help="simulate every step (no fast-forward) [exact_steps]",
    )
    group.add_argument(
        "--no-audit", action="store_true", help="skip the post-run invariant audit [audit.enabled]"
    )


def _shortcut_dest(path: str) -> str:
    """Where argparse keeps a shortcut's value: ``short_engine__max_num_seqs`` for the flag
    that sets ``engine.max_num_seqs``."""
    return "short_" + path.replace(".", "__")


def _add_plugin_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="FILE",
        help="import a local Python file that registers plugins (servesim.plugins.register) "
        "before the scenario loads; no packaging needed (repeatable)",
    )


def _load_plugins(args: argparse.Namespace) -> None:
    if getattr(args, "plugins", None):
        from servesim.plugins import load_plugin_file

        for file in args.plugins:
            load_plugin_file(file)


_NOT_WITH_TRACE = ("--rate", "--preset", "--arrival")
"""Shortcut flags that describe a synthetic stream, which a replayed trace replaces."""


def _overrides(args: argparse.Namespace) -> list[str]:
    out = []
    trace = getattr(args, "trace", None)
    if trace is not None:
        import os

        if os.path.exists(trace):  # a file named on the command line is relative to the shell
            trace = os.path.abspath(trace)
        # a trace replaces the whole workload section; later flags (--requests ...) refine it
        for flag in _NOT_WITH_TRACE:
            value = getattr(args, _shortcut_dest(SHORTCUTS[flag][0]), None)
            if value is not None:
                from servesim.simcore.errors import ScenarioError

                raise ScenarioError(
                    flag,
                    value,
                    f"cannot be combined with --trace {trace}: a trace has its own arrivals and "
                    "lengths; drop " + flag + " (to replay faster or slower, use --set "
                    "workload.rate_scale=2 or workload.time_scale=...)",
                )
        fmt = getattr(args, "trace_format", None) or "auto"
        out.append(f"workload={{trace: {json.dumps(trace)}, format: {fmt}}}")
    if getattr(args, "session_mode", None) is not None:
        out.append(f"workload.session_mode={args.session_mode}")
    given = given_options(args, ((_shortcut_dest(path), path) for path, _, _ in SHORTCUTS.values()))
    out += [f"{path}={value}" for path, value in given.items()]
    if getattr(args, "exact_steps", False):
        out.append("exact_steps=true")
    if getattr(args, "no_audit", False):
        out.append("audit.enabled=false")
    return out + list(args.overrides)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with ``command`` (``run``, ``sweep``, ...), only that command's
    parser is built and only the modules it needs are imported."""
    parser = argparse.ArgumentParser(
        prog="servesim",
        description="Discrete-event simulator of LLM inference serving (vLLM-like instances).",
        epilog=NOT_MODELLED,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="stderr log level",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    import importlib

    # Only the parser of the command being run is built, and only its module imported (some
    # import matplotlib, scipy or pandas), so `servesim run` starts fast. Help and an unknown
    # command need them all.
    unknown = command not in _CORE_PARSERS and command not in _COMMAND_MODULES
    for name, add in _CORE_PARSERS.items():
        if command is None or command == name or unknown:
            add(sub)
    for name, (module, function) in _COMMAND_MODULES.items():
        if command is None or command == name or unknown:
            getattr(importlib.import_module(module), function)(sub)
    return parser


def _add_run_parser(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="simulate a scenario and print its summary",
        description="Simulate a scenario, audit the run, print a summary and write results.",
        epilog=NOT_MODELLED,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_scenario_options(run)
    run.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    run.add_argument("--no-write", action="store_true", help="do not write a results directory")
    run.add_argument(
        "--force",
        action="store_true",
        help="replace results/<name> even when it holds another scenario's results",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it appears on a terminal once a run has taken 2 s)",
    )


def _add_check_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="validate a scenario without running it; print the resolved values"
    )
    _add_scenario_options(check)


def _add_list_parser(sub: Any) -> None:
    lst = sub.add_parser("list", help="list registered plugins, bundled models and GPUs")
    lst.add_argument(
        "what",
        nargs="?",
        choices=["plugins", "models", "gpus", "latency", "traces", "all"],
        default="all",
    )
    lst.add_argument("--json", action="store_true", help="print JSON (models: the full catalogue)")
    _add_plugin_option(lst)


def _add_audit_parser(sub: Any) -> None:
    audit = sub.add_parser(
        "audit", help="re-check the invariants of a saved run (a results directory)"
    )
    audit.add_argument("results_dir")


_CORE_PARSERS = {
    "run": _add_run_parser,
    "check": _add_check_parser,
    "list": _add_list_parser,
    "audit": _add_audit_parser,
}
"""The commands this module runs itself, in the order ``--help`` lists them: name -> the
function that adds its parser."""
_COMMAND_MODULES = {
    "convert": ("servesim.workloads.traces.cli", "add_convert_parser"),
    "memory": ("servesim.memory", "add_memory_parser"),
    "validate": ("servesim.fidelity.validate", "add_validate_parser"),
    "calibrate": ("servesim.fidelity.calibrate", "add_calibrate_parser"),
    "plot": ("servesim.analysis.plots.cli", "add_plot_parser"),
    "report": ("servesim.analysis.report", "add_report_parser"),
    "sweep": ("servesim.studies.sweep.cli", "add_sweep_parser"),
    "plan": ("servesim.studies.plan.cli", "add_plan_parser"),
    "project": ("servesim.projection.cli", "add_project_parser"),
    "observe": ("servesim.observe.cli", "add_observe_parser"),
}
"""Commands whose parser (and code) live in their own module: name -> (module, add function)."""


def _command_of(argv: list[str]) -> str | None:
    """The sub-command named in ``argv`` (the first word that is not an option or the value
    of ``--log-level``), or None."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    from servesim.simcore.errors import AuditError, ServesimError
    from servesim.simcore.log import configure

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command != "run":
        end_of_startup()  # a run ends it once its cluster is built
    configure(args.log_level)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        _load_plugins(args)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "check":
            return _cmd_check(args)
        if args.command == "list":
            from servesim.listing import list_command

            return list_command(args)
        if args.command == "audit":
            return _cmd_audit(args)
        if getattr(args, "handler", None) is not None:  # memory, validate, plot, sweep, ...
            return args.handler(args)
    except AuditError as exc:
        print("error: the run broke an invariant:", file=sys.stderr)
        for v in exc.violations:
            print(f"  {v}", file=sys.stderr)
        return 3
    except ServesimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def _load(args: argparse.Namespace):
    from servesim.scenario import load_scenario

    return load_scenario(args.scenario, _overrides(args))


def _cmd_run(args: argparse.Namespace) -> int:
    from servesim.audit import audit
    from servesim.components.cluster import Cluster
    from servesim.run import Results, _progress, audit_input

    scenario = _load(args)
    target = scenario.output.dir or str(Path("results") / scenario.name)
    if not args.no_write and not scenario.output.dir and not args.force:
        _refuse_to_overwrite_another_scenario(Path(target), scenario)
    started = time.perf_counter()
    cluster = Cluster(scenario, _progress(scenario, False if args.no_progress else None))
    end_of_startup()
    record = cluster.run()
    violations = audit(audit_input(record)) if scenario.audit.enabled else None
    results = Results(scenario, record, violations)
    wall = time.perf_counter() - started
    # Print first: if the results cannot be written, what was computed is still shown.
    if args.json:
        from servesim.analysis.writing import dumps_summary

        sys.stdout.write(dumps_summary(results.summary))
    else:
        print(format_summary(results.summary, wall))
    if not args.no_write:
        out_dir = results.write(target)
        if not args.json:
            print(f"results: {out_dir}")
    if record.interrupted:
        print(
            f"interrupted at simulated time {record.end_us / 1e6:.3f} s: "
            f"{results.summary['completed_requests']} requests had completed"
            + ("" if args.no_write else "; the partial results above were written"),
            file=sys.stderr,
        )
        return 130
    if violations:
        print("error: the run broke an invariant:", file=sys.stderr)
        for v in violations:
            print(f"  {v}", file=sys.stderr)
        return 3
    return 0


def _refuse_to_overwrite_another_scenario(target: Path, scenario: Any) -> None:
    """The default results directory (``results/<name>``) is replaced only by the scenario that
    wrote it: a different scenario that happens to share the name (every unnamed one is
    ``scenario``) is refused before it runs, naming the path and the ways out."""
    from servesim.simcore.errors import ScenarioError

    written = target / "scenario.yaml"
    try:
        previous = written.read_text(encoding="utf-8")
    except OSError:
        return  # nothing there (or not a results directory: the writer says so)
    if previous != scenario.to_yaml():
        raise ScenarioError(
            "output.dir",
            str(target),
            f"holds the results of another scenario ({written}); give this run its own "
            "directory (--out DIR, or name: in the scenario), or pass --force to replace them",
        )


def format_summary(s: dict[str, Any], wall_s: float | None = None) -> str:
    """The short console table of a run."""
    sc = s.get("scenario", {})
    lines = []
    if sc:
        e = sc["engine"]
        rung = s.get("confidence", {}).get("level")
        lines.append(
            f"{sc['model']} on {sc['instances']} x {sc['gpu']} (tp {sc['tp']}), latency {sc['latency'].get('model')}"
            + (f" ({rung})" if rung else "")
            + ", "
            f"max_num_seqs {e['max_num_seqs']}, token budget {e['max_num_batched_tokens']}, "
            f"{e['kv_blocks']} KV blocks of {e['block_size']}"
        )
    refused = ""
    if (
        s.get("rejected_requests")
        or s.get("shed_requests")
        or s.get("expired_requests")
        or s.get("gateway_queued")
    ):
        refused = (
            f", rejected {s['rejected_requests']}, shed {s['shed_requests']}, "
            f"expired {s['expired_requests']}, in gateway {s['gateway_queued']}"
        )
    lines.append(
        f"requests   {s['completed_requests']} completed of {s['injected_requests']} "
        f"(queued {s['still_queued']}, running {s['still_running']}, dropped {s['dropped_unservable']}{refused}) "
        f"in {s['sim_duration_s']:.1f} s simulated"
    )
    if s.get("run_verdict"):
        lines.append(f"verdict    {s['run_verdict']}: {s['run_verdict_reason']}")
    if s.get("fitness") is not None:
        lines.append(f"fitness    {s['fitness']:.4f}")
    elif s.get("fitness_error"):
        lines.append(f"fitness    not scored: {s['fitness_error']}")
    lines.append(
        f"throughput {s['responses_per_sec']:.2f} req/s, {s['tokens_per_sec']:.0f} output tok/s, "
        f"{s['input_tokens_per_sec']:.0f} input tok/s"
    )
    lines.append(f"{'latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for key, label in (
        ("ttft", "TTFT"),
        ("itl", "ITL"),
        ("tpot", "TPOT"),
        ("e2e", "E2E"),
        ("scheduling_delay", "sched delay"),
    ):
        lines.append(
            f"{label:<14}{s[key + '_mean_ms']:>10.1f}{s[key + '_p50_ms']:>10.1f}"
            f"{s[key + '_p90_ms']:>10.1f}{s[key + '_p99_ms']:>10.1f}"
        )
    lines.append(
        f"kv cache   utilisation mean {s['kv_utilization_mean']:.1%} peak {s['kv_utilization_peak']:.1%}, "
        f"prefix hit rate {s['cache_hit_rate']:.1%}, preemptions {s['preemption_count']}"
    )
    # offload tiers below the GPU (engine.kv_tiers or kv_cpu_blocks): what each one reloaded
    for name, tier in s.get("kv_tier_hits", {}).items():
        lines.append(
            f"kv tier    {name}: {tier['hits']} hits, {tier['reloaded_blocks']} blocks reloaded "
            f"({tier['reloaded_bytes'] / 1e9:.2f} GB, {tier['reload_ms']:.1f} ms), "
            f"{tier['evicted_blocks']} evicted"
        )
    from servesim.analysis.lora import lora_lines  # LoRA / several models: model, adapter lines

    lines.extend(lora_lines(s))
    goodput = s.get("goodput")
    if goodput:
        good = sum(c["good"] for c in goodput.values())
        count = sum(c["count"] for c in goodput.values())
        lines.append(
            f"slo        attainment {s['slo_attainment']:.1%} ({good} of {count} requests met "
            f"every target), goodput {s['goodput_rps']:.2f} req/s"
        )
        for name, c in goodput.items():
            dims = ", ".join(
                f"{dim.removesuffix('_ms')} {share:.1%}"
                for dim, share in c["slo_attainment_by_dim"].items()
            )
            lines.append(
                f"  {name:<9}{c['good']} of {c['count']} good ({c['slo_attainment']:.1%}; met: "
                f"{dims}); ttft p99 {c['ttft_p99_ms']:.1f} ms, tpot mean {c['tpot_mean_ms']:.1f} ms, "
                f"e2e p99 {c['e2e_p99_ms']:.1f} ms"
            )
    pd = s.get("pd")
    if pd is not None:
        pools = ", ".join(
            f"{role} {len(p['instances'])} busy {p['busy_fraction']:.0%}"
            for role, p in pd["pools"].items()
        )
        lines.append(
            f"pd         {pd['split_requests']} split, {pd['local_requests']} local "
            f"({pd['decider']}); pools: {pools}"
        )
        lines.append(
            f"transfers  {pd['transfers_completed']} done, {pd['kv_bytes_moved'] / 1e9:.2f} GB; "
            f"duration p50 {pd['transfer_p50_ms']:.1f} p99 {pd['transfer_p99_ms']:.1f} ms "
            f"(sharing the link added p99 {pd['transfer_queueing_p99_ms']:.1f} ms); "
            f"peak {pd['peak_concurrent_transfers']} at once"
            + (
                f"; {pd['dropped_at_decode_kv']} refused (decode KV full)"
                if pd["dropped_at_decode_kv"]
                else ""
            )
        )
    audit = s.get("audit", {})
    verdict = (
        "skipped" if not audit.get("checked") else ("passed" if audit.get("passed") else "FAILED")
    )
    speed = ""
    if wall_s:
        speed = f"; {s['steps']} steps in {wall_s:.2f} s wall ({s['injected_requests'] / wall_s:,.0f} requests/s)"
    lines.append(f"audit      {verdict}{speed}")
    return "\n".join(lines)


def _cmd_check(args: argparse.Namespace) -> int:
    scenario = _load(args)
    e = scenario.engine
    print(f"scenario {scenario.name!r} is valid")
    model = scenario.model
    origin = f"; {model.origin}" if model.origin.startswith("HF cache") else ""
    print(f"  model {model.name} ({model.config_path or 'no architecture config'}{origin})")
    for item in model.unmodelled:
        print(f"  warning: {item.message()}")
    print(f"  gpu {scenario.gpu.name} x tp {scenario.tp}, {scenario.instances} instance(s)")
    print(
        f"  kv_blocks {e.kv_blocks} ({e.kv_blocks_source}), max_model_len {e.max_model_len} ({e.max_model_len_source})"
    )
    print(
        f"  latency {scenario.latency.name}, routing {scenario.routing.name}, scheduler {scenario.scheduler.name}"
    )
    print(f"  workload {json.dumps(scenario.workload.describe(), default=str)}")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from servesim.analysis.saved import audit_saved_run

    violations, summary = audit_saved_run(args.results_dir)
    if violations:
        print(f"{args.results_dir}: {len(violations)} invariant violation(s)")
        for v in violations:
            print(f"  {v}")
        return 3
    print(
        f"{args.results_dir}: all invariants hold "
        f"({summary.get('injected_requests', '?')} requests, {summary.get('steps', '?')} steps checked)"
    )
    return 0


def run_main() -> None:
    """Console-script entry: exit quietly when stdout is closed early (``servesim list | head``)."""
    import os

    # Before numpy is imported: OpenBLAS starts a thread per core at import (~0.02 s of a 0.3 s
    # run), which the fits' small matrix products do not need and a sweep's workers would each
    # repeat. Here, not in ``import servesim``, which must not change a user program's threads.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    pause_gc_for_startup()
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
