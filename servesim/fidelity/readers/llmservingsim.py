"""An LLMServingSim vLLM benchmark run (requests JSONL, meta.json, config.json, summary.txt)
read into a :class:`MeasuredRun`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from servesim.fidelity.readers.common import (
    MeasuredRun,
    PathArg,
    _canonical_gpu,
    _existing,
    _number,
    _read_text,
    _run_from_timestamps,
    _timed_columns,
)
from servesim.fidelity.readers.vllm_log import _log_kv_blocks
from servesim.simcore.errors import ScenarioError

JSONL_REQUIRED = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
JSONL_OPTIONAL = ("request_id", "arrival_time", "scheduled_ts")
_JSONL_TIMES = (
    ("arrival_s", "queued_ts"),
    ("scheduled_s", "scheduled_ts"),
    ("first_token_s", "first_token_ts"),
    ("last_token_s", "last_token_ts"),
)
"""Time columns of a requests JSONL record, in the order they must not decrease (arrival =
queued_ts, LLMServingSim's definition; scheduled_ts is optional)."""
_SPS = re.compile(r"sps(\d+(?:\.\d+)?)")
_SUMMARY_ROW = re.compile(
    r"^(TTFT|TPOT|Latency|ITL|E2E)\s+(Mean|Median|P\d+)\s+"
    r"([-+]?\d+(?:\.\d+)?)\s+([-+]?\d+(?:\.\d+)?)",
    re.IGNORECASE,
)


def _llmservingsim_files(path: Path) -> dict[str, Path | None]:
    """Locate requests/meta/config/summary for a run directory (or its requests file)."""
    if path.is_file():
        requests: Path | None = path
        folder = path.parent
    else:
        folder = path
        requests = next(
            (
                p
                for p in (
                    folder / "vllm_requests.jsonl",
                    folder / "requests.jsonl",
                    folder / "vllm" / "requests.jsonl",
                )
                if p.is_file()
            ),
            None,
        )
    found: dict[str, Path | None] = {
        "requests": requests,
        "meta": None,
        "config": None,
        "summary": None,
    }
    if requests is None:
        return found
    home = requests.parent
    root = home.parent if home.name == "vllm" and not (home / "config.json").is_file() else home
    prefix = "vllm_" if requests.name.startswith("vllm_") else ""
    for key, names in (
        ("meta", (home / f"{prefix}meta.json", home / "meta.json", home / "vllm_meta.json")),
        ("config", (home / "config.json", root / "config.json")),
        (
            "summary",
            (
                root / "validation_summary.txt",
                root / "validation" / "summary.txt",
                home / "summary.txt",
            ),
        ),
    ):
        found[key] = next((p for p in names if p.is_file()), None)
    found["root"] = root
    return found


def read_llmservingsim(run_dir: PathArg) -> MeasuredRun:
    """Read an LLMServingSim vLLM benchmark run (a directory, or its requests JSONL file).

    Per request (JSONL): ``input_toks``, ``output_toks``, ``queued_ts``, ``first_token_ts``,
    ``last_token_ts`` (engine clock, s) and optionally ``request_id``, ``arrival_time`` (client wall
    clock), ``scheduled_ts``. As in LLMServingSim's validation, TTFT = first_token − queued and
    E2E = last_token − queued, so arrivals are the ``queued_ts`` (one clock for all three);
    ``queued_us`` = scheduled − queued. Settings come from ``meta.json`` (vLLM engine arguments)
    and ``config.json`` (hardware, instances); the validation summary's vLLM column goes to
    ``reported`` (ms) and its simulator column to ``extra['llmservingsim_sim_ms']``.
    """
    path = _existing(run_dir)
    files = _llmservingsim_files(path)
    requests = files["requests"]
    if requests is None:
        raise ScenarioError(
            str(path),
            None,
            "no requests file: expected vllm_requests.jsonl, requests.jsonl or vllm/requests.jsonl "
            "in the run directory",
        )
    rows = _jsonl_records(requests)
    n = len(rows)
    client = np.full(n, np.nan)

    def client_time(i: int, rec: Mapping[str, Any], times: Any, output: int) -> None:
        if "arrival_time" in rec:
            client[i] = _number(rec, "arrival_time")

    columns = _timed_columns(
        rows, requests, JSONL_REQUIRED, ("input_toks", "output_toks"), _JSONL_TIMES, client_time
    )
    ids = [str(rec.get("request_id", f"line {line}")) for line, rec in rows]
    root = files.get("root") or requests.parent
    run, order, out_of_order = _run_from_timestamps(
        **columns,
        request_ids=ids,
        name=root.name,
        source=str(root),
        system="vllm",
        clock="engine",
    )
    queued, client = columns["arrival_s"][order], client[order]
    run.notes.append(
        f"per-request times from {requests.name}: arrival = queued_ts (engine clock), TTFT = "
        "first_token_ts - queued_ts, E2E = last_token_ts - queued_ts (LLMServingSim's definitions)"
    )
    if out_of_order:
        run.notes.append(f"{out_of_order} record(s) out of queued_ts order; sorted by queued_ts")
    if not np.isnan(client).any() and n:
        lag = (queued - queued[0]) - (client - client[0])
        run.extra["client_to_queue_lag_ms_median"] = float(np.median(lag) * 1e3)
        run.notes.append(
            "arrival_time (client wall clock) is not used: relative to the first request the "
            f"engine queued requests a median {np.median(lag) * 1e3:.1f} ms later than the "
            "client sent them"
        )
    if files["meta"] is not None:
        _llmservingsim_meta(run, files["meta"])
    else:
        run.notes.append("no meta.json: vLLM engine settings unknown")
    if files["config"] is not None:
        _llmservingsim_config(run, files["config"])
    else:
        run.notes.append("no config.json: hardware unknown")
    if files["summary"] is not None:
        _llmservingsim_summary(run, files["summary"])
    if run.kv_blocks is None:
        _log_kv_blocks(run, root)
        if requests.parent != root:
            _log_kv_blocks(run, requests.parent)
    if run.kv_blocks is None:
        run.notes.append(
            "KV block count not recorded (no kv_cache in meta.json, no vLLM log with '# GPU "
            "blocks' or 'GPU KV cache size'; vllm_timeseries.csv has only kv_cache_pct)"
        )
    measured = run.measured_rate()
    if measured is not None:
        run.extra["measured_rate"] = measured
    return run


def _jsonl_records(file: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    text = _read_text(file)
    for line, content in enumerate(text.splitlines(), start=1):
        if not content.strip():
            continue
        try:
            rec = json.loads(content)  # NaN/Infinity parse, then fail the field check
        except ValueError as exc:
            raise ScenarioError(
                f"{file}:{line}",
                content.strip()[:60],
                f"record {len(rows)}: not valid JSON ({exc})",
            ) from None
        if not isinstance(rec, dict):
            raise ScenarioError(
                f"{file}:{line}", rec, f"record {len(rows)}: expected a JSON object"
            )
        rows.append((line, rec))
    if not rows:
        raise ScenarioError(str(file), None, "the file has no records (one JSON object per line)")
    return rows


def _load_json(file: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(_read_text(file))
    except ValueError as exc:
        raise ScenarioError(str(file), None, f"not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ScenarioError(str(file), type(data).__name__, "expected a JSON object")
    return data


def _meta_int(value: Any, where: str, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScenarioError(where, value, f"expected an integer >= {minimum} or null")
    return value


def _llmservingsim_meta(run: MeasuredRun, file: Path) -> None:
    meta = _load_json(file)
    kwargs = meta.get("engine_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ScenarioError(f"{file}: engine_kwargs", kwargs, "expected a JSON object")
    model = kwargs.get("model") or meta.get("model")
    if model is not None:
        run.model = str(model)
    version = meta.get("vllm_version")
    if version is not None:
        run.engine_version = f"vllm {version}"
    where = f"{file}: engine_kwargs"
    run.tp = _meta_int(kwargs.get("tensor_parallel_size"), f"{where}.tensor_parallel_size")
    run.dp = _meta_int(kwargs.get("data_parallel_size"), f"{where}.data_parallel_size")
    if "pipeline_parallel_size" in kwargs:
        run.pp = _meta_int(kwargs["pipeline_parallel_size"], f"{where}.pipeline_parallel_size")
    elif kwargs:
        run.pp = 1
        run.inferred.append("pp")
        run.notes.append(
            "pp 1: the engine arguments set no pipeline_parallel_size (vLLM's default)"
        )
    ep = kwargs.get("enable_expert_parallel")
    if ep is not None:
        if not isinstance(ep, bool):
            raise ScenarioError(f"{where}.enable_expert_parallel", ep, "expected true or false")
        run.expert_parallel = ep
    run.max_num_seqs = _meta_int(kwargs.get("max_num_seqs"), f"{where}.max_num_seqs")
    run.max_num_batched_tokens = _meta_int(
        kwargs.get("max_num_batched_tokens"), f"{where}.max_num_batched_tokens"
    )
    run.block_size = _meta_int(kwargs.get("block_size"), f"{where}.block_size")
    run.kv_blocks = _meta_int(
        kwargs.get("num_gpu_blocks_override"), f"{where}.num_gpu_blocks_override"
    )
    if run.kv_blocks is not None:
        run.extra["kv_blocks_source"] = f"{file} (engine_kwargs.num_gpu_blocks_override)"
    else:
        _meta_kv_cache(run, meta, file)
    if kwargs.get("dtype") is not None:
        run.dtype = str(kwargs["dtype"])
    for key in (
        "max_model_len",
        "kv_cache_dtype",
        "seed",
        "gpu_memory_utilization",
        "enable_chunked_prefill",
        "enable_prefix_caching",
    ):
        if kwargs.get(key) is not None:
            run.extra[key] = kwargs[key]
    dataset = meta.get("dataset_path")
    if isinstance(dataset, str):
        run.extra["dataset_path"] = dataset
        m = _SPS.search(Path(dataset).name)
        if m is not None:
            run.request_rate = float(m.group(1))
            run.inferred.append("request_rate")
            run.notes.append(
                f"request_rate {m.group(1)} req/s from the dataset name {Path(dataset).name} "
                "(sps = requests per second)"
            )
    nominal = meta.get("num_requests")
    if isinstance(nominal, int) and not isinstance(nominal, bool):
        run.extra["nominal_requests"] = nominal
        if nominal != run.n:
            run.notes.append(f"meta.json says {nominal} requests but the requests file has {run.n}")
    for key in ("started_at", "finished_at"):
        if isinstance(meta.get(key), str):
            run.extra[key] = meta[key]


def _meta_kv_cache(run: MeasuredRun, meta: Mapping[str, Any], file: Path) -> None:
    """vLLM's own KV block count, as newer LLMServingSim harnesses record it: ``kv_cache``
    (``num_gpu_blocks``, ``block_size``, ``gpu_memory_utilization``) and, per engine,
    ``resolved_config.cache_config.kv_cache_size_tokens``. With data parallelism
    ``kv_cache.num_gpu_blocks`` counts every rank's blocks; the replay needs one rank's."""
    kv = meta.get("kv_cache")
    if not isinstance(kv, Mapping):
        return
    where = f"{file}: kv_cache"
    blocks = _meta_int(kv.get("num_gpu_blocks"), f"{where}.num_gpu_blocks")
    block_size = _meta_int(kv.get("block_size"), f"{where}.block_size")
    if block_size is not None:
        run.block_size = block_size
    utilisation = kv.get("gpu_memory_utilization")
    if isinstance(utilisation, (int, float)) and not isinstance(utilisation, bool):
        run.extra["gpu_memory_utilization"] = float(utilisation)
    resolved = meta.get("resolved_config")
    cache = resolved.get("cache_config") if isinstance(resolved, Mapping) else None
    per_engine = None
    if isinstance(cache, Mapping) and run.block_size:
        tokens = _meta_int(
            cache.get("kv_cache_size_tokens"),
            f"{file}: resolved_config.cache_config.kv_cache_size_tokens",
        )
        if tokens is not None:
            per_engine = tokens // run.block_size
    dp = run.dp or 1
    if per_engine is not None:
        run.kv_blocks = per_engine
        run.extra["kv_blocks_source"] = (
            f"{file} (resolved_config.cache_config.kv_cache_size_tokens {tokens} / block size "
            f"{run.block_size}, per engine)"
        )
    elif blocks is not None and dp > 1:
        run.kv_blocks = blocks // dp
        run.extra["kv_blocks_source"] = (
            f"{file} (kv_cache.num_gpu_blocks {blocks} over {dp} data-parallel ranks)"
        )
    elif blocks is not None:
        run.kv_blocks = blocks
        run.extra["kv_blocks_source"] = f"{file} (kv_cache.num_gpu_blocks)"


def _llmservingsim_config(run: MeasuredRun, file: Path) -> None:
    config = _load_json(file)
    nodes = config.get("nodes")
    if not isinstance(nodes, list):
        raise ScenarioError(f"{file}: nodes", nodes, "expected a list of nodes")
    instances: list[Mapping[str, Any]] = []
    for i, node in enumerate(nodes):
        inner = node.get("instances") if isinstance(node, Mapping) else None
        if not isinstance(inner, list) or not all(isinstance(x, Mapping) for x in inner):
            raise ScenarioError(
                f"{file}: nodes[{i}].instances", inner, "expected a list of objects"
            )
        instances.extend(inner)
    if not instances:
        raise ScenarioError(f"{file}: nodes", nodes, "no instances")
    run.num_instances = len(instances)
    hardware = {str(x.get("hardware")) for x in instances if x.get("hardware") is not None}
    if len(hardware) == 1:
        (name,) = hardware
        run.gpu = _canonical_gpu(name)
    elif hardware:
        run.notes.append(f"mixed hardware across instances: {sorted(hardware)}")
    first = instances[0]
    if run.model is None and first.get("model_name") is not None:
        run.model = str(first["model_name"])
    if run.tp is None and isinstance(first.get("tp_size"), int):
        run.tp = first["tp_size"]
    if isinstance(first.get("ep_size"), int):
        run.extra["ep_size"] = first["ep_size"]
    memory = first.get("npu_mem")
    if isinstance(memory, Mapping):
        if memory.get("mem_size") is not None:
            run.extra["gpu_memory_gb"] = memory["mem_size"]
        if memory.get("mem_util") is not None:
            run.extra.setdefault("gpu_memory_utilization", memory["mem_util"])
    roles = {x.get("pd_type") for x in instances}
    if roles - {None}:
        run.extra["pd_types"] = sorted(str(r) for r in roles)
        run.notes.append(f"instances have prefill/decode roles {sorted(str(r) for r in roles)}")


def _llmservingsim_summary(run: MeasuredRun, file: Path) -> None:
    names = {"ttft": "ttft", "tpot": "tpot", "latency": "e2e", "e2e": "e2e", "itl": "itl"}
    sim: dict[str, float] = {}
    for content in _read_text(file).splitlines():
        m = _SUMMARY_ROW.match(content.strip())
        if m is None:
            continue
        stat = m.group(2).lower()
        key = f"{names[m.group(1).lower()]}_{'p50' if stat == 'median' else stat}_ms"
        run.reported[key] = float(m.group(3))
        sim[key] = float(m.group(4))
    if sim:
        run.extra["llmservingsim_sim_ms"] = sim
        run.notes.append(
            f"reported: the vLLM column of {file.name}; extra.llmservingsim_sim_ms: "
            "LLMServingSim's own simulated figures"
        )
