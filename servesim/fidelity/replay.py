"""Replay a measured run through the simulator and compare the two, metric by metric.

:func:`replay_scenario` builds the scenario that reproduces a :class:`MeasuredRun`: its exact
arrivals and token counts (a trace), its model and GPU, its engine limits where the run recorded
them, and its topology (one colocated instance, or a prefill and a decode instance for a
disaggregated DistServe run). :func:`compare` puts the simulated and measured statistics side by
side with their relative errors. Settings a run does not record are assumptions, listed in the
returned ``assumed`` notes so that every report says what it guessed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from servesim.fidelity.readers.common import MeasuredRun, summarize
from servesim.fidelity.recorded_link import with_recorded_link
from servesim.simcore.errors import ScenarioError

# vLLM's defaults of early 2024 (the version DistServe measured): used where a run is silent.
VLLM_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "block_size": 16}
# KV transfers inside one DistServe node go over NVLink; the runs do not record a rate.
DISTSERVE_TRANSFER = {"bandwidth": "150GB/s", "base_latency": 0}
# DistServe's --swap-space (GiB of CPU memory per GPU worker), its default and the value of its
# evaluation scripts
DISTSERVE_SWAP_GIB = 16
# DistServe's decoding scheduler accepts a migration only while the prompts in its waiting queue
# hold less than this fraction of its GPU blocks (waiting_block_prop_threshold, its default)
DISTSERVE_DECODE_QUEUE = 0.05

STATS = ("mean", "p50", "p90", "p99")


def replay_scenario(
    run: MeasuredRun, trace_file: str | Path, *, overrides: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The scenario dict that replays ``run`` (its trace already written to ``trace_file``), and
    the list of settings it had to assume."""
    assumed: list[str] = []
    block = run.block_size or VLLM_DEFAULTS["block_size"]
    if run.block_size is None:
        assumed.append(f"block_size {block} (vLLM default)")
    limits = {}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        value = getattr(run, key)
        if value is None:
            value = VLLM_DEFAULTS[key]
            assumed.append(f"{key} {value} (vLLM default of the time)")
        limits[key] = value
    model, note = _model_name(run.model)
    if note:
        assumed.append(note)
    data: dict[str, Any] = {
        "name": f"replay-{run.name}",
        "seed": 1,
        "model": model,
        "gpu": run.gpu or "A100-80",
        "workload": {"trace": str(trace_file), "format": "csv"},
        "engine": {**limits, "block_size": block},
    }
    if run.gpu is None:
        assumed.append("gpu A100-80")
    for field in ("model", "gpu"):
        if field in run.inferred and getattr(run, field) is not None:
            assumed.append(f"{field} {getattr(run, field)} (inferred by the reader; see notes)")
    overrides = dict(overrides or {})
    utilisation = (run.extra or {}).get("gpu_memory_utilization")
    if isinstance(utilisation, (int, float)) and 0 < utilisation <= 1:
        data["engine"]["gpu_memory_utilization"] = float(utilisation)
    distserve = model == "opt-13b"  # DistServe's fitted step times exist for OPT-13B on A100-80
    exp = Path(str(run.source)).suffix == ".exp"
    if run.disaggregated:
        extra = run.extra or {}
        placement = (
            f"c{run.prefill_tp or 1}{run.prefill_pp or 1}d{run.decode_tp or 1}{run.decode_pp or 1}"
        )
        assumed.append(
            f"placement {placement} (prefill TP{run.prefill_tp or 1}/PP{run.prefill_pp or 1}, "
            f"decode TP{run.decode_tp or 1}/PP{run.decode_pp or 1}), from "
            f"{extra.get('placement_source', 'the run')}"
        )
        pools = {}
        missing = []
        for role in ("prefill", "decode"):
            tp = getattr(run, f"{role}_tp") or 1
            pp = getattr(run, f"{role}_pp") or 1
            pool: dict[str, Any] = {"instances": 1, "tp": tp}
            if pp > 1:
                # pipeline parallelism: each step is a pipeline round of up to pp micro-batches
                # over stages of L/pp layers, activations handed over on the node's NVLink
                pool["engine"] = {"pp": pp}
                assumed.append(
                    f"{role} PP{pp} modelled as {pp} pipeline stages (engine.pp: a step is one "
                    f"round of up to {pp} micro-batches, activations over NVLink); its KV "
                    f"capacity is the PP{pp} one"
                )
            if distserve:
                pool["latency"] = {"model": "distserve-profile", "engine": "distserve"}
            flag = overrides.pop(f"cluster.pools.{role}.engine.kv_blocks", None)
            given_by = f"--kv-blocks-{role}"
            if flag is None:
                flag, given_by = overrides.get("engine.kv_blocks"), "--kv-blocks"
            capacity = extra.get(f"{role}_kv_capacity_tokens")
            if flag is not None:
                pool["engine"] = {**pool.get("engine", {}), "kv_blocks": flag}
                assumed.append(f"KV capacity ({role}): {flag} blocks, given by {given_by}")
            elif capacity:
                pool["engine"] = {**pool.get("engine", {}), "kv_blocks": int(capacity) // block}
                assumed.append(
                    f"KV capacity ({role}): {int(capacity) // block} blocks ({capacity} tokens / "
                    f"block {block}), from {extra.get('kv_capacity_table', 'max_num_tokens.csv')} "
                    "(simdistserve's memory model, not measured)"
                )
            elif exp:
                missing.append(role)
            pools[role] = pool
        if missing:
            searched = (run.extra or {}).get("kv_capacity_table_missing") or []
            raise ScenarioError(
                "profile_data/max_num_tokens.csv",
                run.name,
                f"KV capacity of the {' and '.join(missing)} instance unknown: simdistserve's "
                "capacity table is "
                + (
                    f"missing (looked for {', '.join(searched)})"
                    if searched
                    else "without a row for this model and TP/PP"
                )  # fmt: skip
                + "; put it next to the run, or give "
                + " and ".join(f"--kv-blocks-{role} N" for role in missing)
                + " (or --kv-blocks N for both)",
            )
        overrides.pop("engine.kv_blocks", None)
        data["tp"] = pools["decode"]["tp"]
        if "kv_blocks" in pools["decode"].get("engine", {}):  # the scenario's own engine is
            data["engine"]["kv_blocks"] = pools["decode"]["engine"]["kv_blocks"]  # decode's
        data["cluster"] = {"pools": pools, "kv_transfer": dict(DISTSERVE_TRANSFER)}
        data["policies"] = {"disaggregation": "always"}
        assumed.append(
            f"KV transfer {DISTSERVE_TRANSFER['bandwidth']} per GPU, no setup latency (NVLink)"
        )
        if exp:
            # DistServe's decode engine migrates KV in its step loop and awaits it
            data["cluster"]["kv_transfer"]["blocking"] = True
            assumed.append(
                "the decode instance stalls while it receives each KV cache "
                "(kv_transfer.blocking: DistServe's decode engine migrates between its steps)"
            )
            # DistServe's context engine keeps a finished prompt's KV until the decode engine
            # has migrated it, and admits a prompt only when its blocks fit beside those: a full
            # decode instance pushes the backlog in front of prefill
            data["cluster"]["kv_transfer"]["decode_full"] = "backpressure"
            # its decode engine accepts a migration only while its waiting queue holds < 5% of
            # its blocks (DecodingStageSchedConfig.waiting_block_prop_threshold)
            data["cluster"]["kv_transfer"]["decode_queue_limit"] = DISTSERVE_DECODE_QUEUE
            assumed.append(
                "a prompt's KV stays on the prefill instance until the decode instance takes it "
                "(kv_transfer.decode_full: backpressure, as DistServe's context engine), which it "
                f"does while the prompts it accepted and does not run yet hold under "
                f"{DISTSERVE_DECODE_QUEUE:.0%} of its blocks (decode_queue_limit, DistServe's "
                "default)"
            )
            # DistServe's decode scheduler swaps the last request of the batch out to CPU when
            # its blocks run out and swaps it back in before admitting migrated requests; its
            # swap space is per worker, and a PP stage's blocks are 1/PP of the model's
            pp = run.decode_pp or 1
            decode = pools["decode"]
            decode["engine"] = {
                **decode.get("engine", {}),
                "preemption_mode": "swap",
                "swap_space": DISTSERVE_SWAP_GIB * pp,
            }
            assumed.append(
                f"the decode instance preempts by swapping to {DISTSERVE_SWAP_GIB} GiB of CPU "
                f"memory per GPU{f' (x{pp} blocks: PP{pp} workers hold 1/{pp} of a block)' if pp > 1 else ''}"
                ", copied over PCIe at engine.kv_cpu_bandwidth (25 GB/s), serialised with the "
                "step (DistServe's decode engine)"
            )
        if distserve:
            data["latency"] = {"model": "distserve-profile", "engine": "distserve"}
        if exp:
            assumed.append(
                "scheduler: DistServe's engines (prefill instance batches whole prompts, decode "
                "instance decodes; no chunked prefill)"
            )
    else:
        data["tp"] = run.tp or 1
        dp = run.dp or 1
        if (run.num_instances or 1) > 1 and dp == run.num_instances:
            # vLLM data parallelism: one engine of dp ranks (engine.dp), each rank an instance
            # behind vLLM's own DP load balancer; an MoE model's ranks share their experts and
            # step in lock-step, with expert parallelism when vLLM ran it
            data["engine"]["dp"] = dp
            ep = dp * (run.tp or 1) if run.expert_parallel else 1
            if ep > 1:
                data["engine"]["ep"] = ep
            data["policies"] = {"routing": {"name": "weighted", "scorers": {"vllm-dp": 1}}}
            assumed.append(
                f"{dp} data-parallel ranks (engine.dp: {dp}) routed by the vllm-dp scorer"
                + (
                    f", expert parallel over the {ep} GPUs (engine.ep: {ep}; dispatch and "
                    "combine on the interconnect by vLLM's default all-gather/reduce-scatter, "
                    "ranks in lock-step)"
                    if ep > 1
                    else ""
                )
            )
        elif (run.num_instances or 1) > 1:
            data["cluster"] = {"instances": int(run.num_instances)}
            data["policies"] = {"routing": {"name": "weighted", "scorers": {"vllm-dp": 1}}}
            assumed.append(f"{run.num_instances} instances routed by the vllm-dp scorer")
        if distserve:
            data["latency"] = {"model": "distserve-profile", "engine": "vllm"}
        if exp:
            # DistServe measured vLLM of early 2024: v0's scheduler, without chunked prefill
            data["engine"]["prefill_first"] = True
            assumed.append(
                "scheduler: vLLM v0 scheduler (engine.prefill_first: prefill-only and decode-only "
                "steps, no chunked prefill), as vLLM ran by default in early 2024"
            )
            # v0 swaps only sequence groups of several sequences (beam search, n > 1); the
            # benchmark's single-sequence requests are preempted by recompute
            data["engine"]["preemption_mode"] = "recompute"
            assumed.append(
                "preemption by recompute (vLLM v0's default for single-sequence requests)"
            )
        else:
            assumed.append(
                "scheduler: vLLM v1 (chunked prefill within max_num_batched_tokens, decodes "
                "first, prefix caching)"
            )
        capacity = run.kv_capacity_tokens
        flag = overrides.get("engine.kv_blocks")
        if flag is not None:
            assumed.append(f"KV capacity: {flag} blocks, given by --kv-blocks")
        elif run.kv_blocks:
            data["engine"]["kv_blocks"] = int(run.kv_blocks)
            source = (run.extra or {}).get("kv_blocks_source", run.source)
            assumed.append(f"KV capacity: {int(run.kv_blocks)} blocks, from {source}")
        elif capacity:
            data["engine"]["kv_blocks"] = int(capacity) // block
            assumed.append(
                f"KV capacity: {int(capacity) // block} blocks ({capacity} tokens / block "
                f"{block}), from {(run.extra or {}).get('kv_capacity_table', run.source)}"
                " (simdistserve's memory model, not measured)"
            )
        elif exp:
            searched = (run.extra or {}).get("kv_capacity_table_missing") or []
            raise ScenarioError(
                "profile_data/max_num_tokens.csv",
                run.name,
                "KV capacity unknown: simdistserve's capacity table is "
                + (
                    f"missing (looked for {', '.join(searched)})"
                    if searched
                    else "without a row for this model and TP/PP"
                )  # fmt: skip
                + " and no vLLM log next to the run gives '# GPU blocks'; put the table next "
                "to the run, or give --kv-blocks N",
            )
        # else: engine.kv_blocks auto, reported by load_replay with the computed count
    for key, value in (overrides or {}).items():
        _set(data, key, value)
    return data, assumed


LATENCY_PREFERENCE = ("blackbox", "trained-physics", "roofline")


def load_replay(
    run: MeasuredRun,
    trace_file: str | Path,
    *,
    overrides: Mapping[str, Any] | None = None,
    latency: str | None = None,
    overheads: tuple[float, float] | str | Path | None = None,
) -> tuple[Any, list[str]]:
    """The loaded :class:`~servesim.scenario.Scenario` that replays ``run``, and the assumptions.

    ``latency`` names the latency model; when neither it nor the replay (DistServe's own fits)
    nor ``overrides`` chooses one, the first of blackbox (fitted coefficients for the model, GPU
    and TP), trained-physics and roofline that accepts the run's model and GPU is used.
    ``overheads`` = (first-token µs, per-step µs), or the path of an overheads file written by
    ``servesim calibrate --latency overheads``, wraps every latency section in the
    :class:`~servesim.latency.overheads.OverheadsLatencyModel`.
    """
    from servesim.scenario import load_scenario

    data, assumed = replay_scenario(run, trace_file, overrides=overrides)
    if latency is not None:
        data["latency"] = {"model": latency}
        chosen = f"latency model {latency}, given by --latency-model"
    elif (
        "latency" in data
        and (overrides or {}).get("latency") is None
        and not any(k.startswith("latency") for k in (overrides or {}))
    ):
        chosen = (
            f"latency model {data['latency']['model']}: DistServe's own fitted step times for "
            f"{run.model or 'OPT-13B'} on A100-80GB"
        )
    elif "latency" in data:
        chosen = "latency model as set by --set latency..."
    else:
        chosen = ""
    candidates: list[str | None] = [None] if "latency" in data else list(LATENCY_PREFERENCE)
    tried: list[str] = []
    for name in candidates:
        if name is not None:
            data["latency"] = {"model": name}
        frontend = _without_frontend(run, data)
        link = with_recorded_link(run, data)
        try:
            scenario = load_scenario(_with_overheads(data, overheads))
            break
        except ScenarioError as exc:
            if name is None or not exc.path.startswith("latency"):
                raise  # not the candidate latency model's refusal: the run's own error
            tried.append(f"{name}: {exc.fix}")
    else:
        raise ScenarioError(
            "latency", run.model, "no latency model accepts this model and GPU: " + "; ".join(tried)
        )
    if not chosen:
        chosen = (
            f"latency model {data['latency']['model']}: the first of "
            f"{', '.join(LATENCY_PREFERENCE)} that accepts {scenario.model.name} on "
            f"{scenario.gpu.name}"
        )
        if tried:
            chosen += " (not available: " + "; ".join(t.split(":")[0] for t in tried) + ")"
    assumed.append(chosen)
    if frontend:
        assumed.append(frontend)
    if link:
        assumed.append(link)
    if overheads is None:
        assumed.append("serving overheads: none (no --overheads; step times only)")
    elif isinstance(overheads, (str, Path)):
        assumed.append(f"serving overheads from {overheads}")
    else:
        assumed.append(
            f"serving overheads: first token {overheads[0]:g} us, per step {overheads[1]:g} us"
        )
    for spec in _auto_capacity(scenario):
        assumed.append(spec)
    return scenario, assumed


def _without_frontend(run: MeasuredRun, data: dict[str, Any]) -> str:
    """Drop trained-physics' front-end overheads from the replay of a run timed on the engine's
    clock; returns the note that says so ('' when nothing was dropped).

    Its α are what a server spends outside the engine: α0 before the request reaches the
    engine's queue (HTTP, tokenising), α2 per token and α1 at the end (detokenising, streaming).
    BLIS fitted them on times taken at the client. A run timed from the engine's queue
    (``clock: engine``, e.g. vLLM v1's ``queued_ts`` to ``last_token_ts``) has none of them inside
    its TTFT or E2E, so adding them to its arrivals would count the front end twice. A latency
    section that gives its own ``alpha`` is taken as given."""
    section = data.get("latency")
    if run.clock != "engine" or not isinstance(section, dict):
        return ""
    if section.get("model") != "trained-physics" or "alpha" in section:
        return ""
    from servesim.latency.trained import default_coefficients

    a0, a1, a2 = default_coefficients()[0]
    section["alpha"] = [0, 0, 0]
    return (
        f"trained-physics front-end overheads off (alpha 0, 0, 0 instead of {a0 / 1000:.1f} ms "
        f"before the queue, {a1 / 1000:.2f} ms at the end, {a2:.0f} us per token): the run's times "
        "are the engine's (from its queue to its token outputs), which the front end is outside of"
    )


def _auto_capacity(scenario: Any) -> list[str]:
    """One 'KV capacity computed by servesim memory model' line per distinct instance kind whose
    engine.kv_blocks was auto."""
    lines: list[str] = []
    for inst in scenario.instance_specs:
        engine = inst.engine
        if not str(engine.kv_blocks_source).startswith("auto"):
            continue
        role = "" if inst.role in ("mixed", "none") else f" ({inst.role})"
        line = (
            f"KV capacity{role} computed by servesim memory model: {engine.kv_blocks} blocks "
            f"({engine.kv_blocks_source}; no block count recorded by the run)"
        )
        if line not in lines:
            lines.append(line)
    return lines


def _with_overheads(data: dict[str, Any], overheads: Any) -> dict[str, Any]:
    """``data`` with every latency section (the scenario's and each pool's) wrapped in the
    ``overheads`` model; ``data`` itself when there are no overheads."""
    if overheads is None:
        return data
    if isinstance(overheads, (str, Path)):
        values: dict[str, Any] = {"file": str(overheads)}
    else:
        first, step = (max(0, int(round(x))) for x in overheads)
        values = {"first_token": first, "step": step}

    def wrap(section: Any) -> dict[str, Any]:
        return {"model": "overheads", "base": section, **values}

    out = {**data, "latency": wrap(data["latency"])}
    pools = data.get("cluster", {}).get("pools")
    if pools:
        out["cluster"] = {
            **data["cluster"],
            "pools": {
                role: {**pool, "latency": wrap(pool["latency"])} if "latency" in pool else pool
                for role, pool in pools.items()
            },
        }
    return out


def simulate_run(
    run: MeasuredRun,
    *,
    overrides: Mapping[str, Any] | None = None,
    latency: str | None = None,
    overheads: tuple[float, float] | str | Path | None = None,
) -> tuple[Any, list[str]]:
    """Replay ``run`` (see :func:`load_replay`); returns (the simulation's Results, the
    assumptions made)."""
    from servesim.run import simulate

    with tempfile.TemporaryDirectory(prefix="servesim-replay-") as tmp:
        trace = run.write_trace_csv(Path(tmp) / f"{run.name}.csv")
        scenario, assumed = load_replay(
            run, trace, overrides=overrides, latency=latency, overheads=overheads
        )
        results = simulate(scenario)
    return results, assumed


def simulated_metrics(results: Any) -> dict[str, dict[str, float | int | None]]:
    """Per-request TTFT, TPOT and E2E of a replay (completed requests), summarised like the
    measured ones."""
    r = results.requests
    done = r["status"] == 0
    arrival = r["arrival_us"][done]
    out_tokens = r["output_tokens"][done]
    ttft = (r["first_token_us"][done] - arrival) / 1000.0
    e2e = (r["completion_us"][done] - arrival) / 1000.0
    tpot = np.where(
        out_tokens > 1, r["itl_sum_us"][done] / np.maximum(out_tokens - 1, 1) / 1000.0, -1.0
    )
    return {"ttft_ms": summarize(ttft), "tpot_ms": summarize(tpot), "e2e_ms": summarize(e2e)}


def compare(
    measured: Mapping[str, Mapping],
    simulated: Mapping[str, Mapping],
    metrics: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms"),
) -> dict[str, Any]:
    """``{metric: {stat: {measured, simulated, error}}}``; error = simulated / measured − 1."""
    out: dict[str, Any] = {}
    for metric in metrics:
        rows = {}
        for stat in STATS:
            m = measured.get(metric, {}).get(stat)
            s = simulated.get(metric, {}).get(stat)
            error = (s / m - 1.0) if (m and s is not None) else None
            rows[stat] = {"measured": m, "simulated": s, "error": error}
        out[metric] = rows
    return out


def _model_name(model: str | None) -> tuple[str, str]:
    """A bundled model name for the run's model, and a note when it had to be approximated."""
    from servesim.latency.modelindex import resolve_model

    if model is None:
        return "opt-13b", "model opt-13b (the run does not name one)"
    name = model.split("/")[-1].lower()
    candidates = [model, name]
    for suffix in ("-instruct-2507", "-2507", "-instruct"):
        if name.endswith(suffix):
            candidates.append(name[: -len(suffix)])
    for i, candidate in enumerate(candidates):
        try:
            found = resolve_model(candidate).name
        except ScenarioError:
            continue
        note = "" if i < 2 else f"model {found}: the bundled config with {model}'s architecture"
        return found, note
    return name, ""


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
