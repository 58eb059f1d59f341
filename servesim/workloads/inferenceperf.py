"""Import an inference-perf benchmark config as a servesim workload.

inference-perf (kubernetes-sigs/inference-perf) describes a benchmark in one YAML file: a ``load``
section (how requests are sent: ``constant`` or ``poisson`` arrivals in rate stages, or a
``concurrent`` closed loop) and a ``data`` section (what they contain: ``random``/``synthetic``
length distributions, or ``shared_prefix`` groups of system prompts and questions).
:func:`convert_inference_perf` turns such a config into the ``seed`` and ``workload`` sections of
a servesim scenario, so the benchmark a team already runs against its servers can be simulated:

======================================  ==============================================================
inference-perf                          servesim
======================================  ==============================================================
``load.type: constant | poisson``       ``arrival: constant | poisson``
``load.stages: [{rate, duration}]``     ``stages: [{duration, rate}]`` (segments), with a rate-0 gap
                                        of ``load.interval`` seconds between two stages
``load.type: concurrent``               closed loop: ``sessions.users`` = ``concurrency_level``,
                                        ``requests`` = ``num_requests`` (one stage)
``load.base_seed``                      ``seed``
``data.input_distribution`` …           ``input`` / ``output`` length distributions: ``normal`` →
                                        ``gaussian``, ``lognormal``, ``uniform``, ``fixed`` →
                                        ``constant`` (its ``mean``); ``min``/``max`` kept
``data.shared_prefix``                  ``prefix: {tokens: system_prompt_len, groups: num_groups}``,
                                        ``input`` = ``question_len``, ``output`` = ``output_len``
======================================  ==============================================================

Everything that has no servesim counterpart is refused with the field named (dataset-backed data
types such as ``shareGPT``, whose lengths live in a dataset servesim does not read; ``sweep``,
which probes a live server; trace replays, which ``servesim run --trace`` replays directly;
``skew_normal`` and ``poisson`` length distributions) or, where dropping it keeps the load the
same, listed in the notes (the API type, the server, the tokenizer, the report settings;
``request_timeout`` until timeouts are modelled); ``lora_traffic_split`` becomes the requests'
adapter mix (``workload.adapters``).
``shared_prefix`` draws each request's group at random, where inference-perf cycles through the
``num_groups × num_prompts_per_group`` prompts; the group sizes agree in expectation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesim.simcore.config import as_float, as_int, as_str, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.workloads.keys import require_keys

#: Sections of an inference-perf config that change what the simulated load is.
LOAD_SECTIONS = ("load", "data")
#: Sections that only say how to reach, measure or report on a server; dropped with a note.
DROPPED_SECTIONS = (
    "api",
    "server",
    "tokenizer",
    "metrics",
    "report",
    "storage",
    "circuit_breakers",
    "multi_lora",
)
_LOAD_FIELDS = (
    "type",
    "interval",
    "stages",
    "sweep",
    "num_workers",
    "worker_max_concurrency",
    "worker_max_tcp_connections",
    "trace",
    "circuit_breakers",
    "request_timeout",
    "request_retries",
    "request_retry_backoff_sec",
    "stage_teardown_grace_seconds",
    "lora_traffic_split",
    "base_seed",
)
_CLIENT_SIDE = (
    "num_workers",
    "worker_max_concurrency",
    "worker_max_tcp_connections",
    "circuit_breakers",
    "request_retries",
    "request_retry_backoff_sec",
    "stage_teardown_grace_seconds",
)
_DATASETS = (
    "shareGPT",
    "cnn_dailymail",
    "infinity_instruct",
    "billsum_conversations",
    "otel_trace_replay",
    "conversation_replay",
    "sharegpt4video",
)
_DISTRIBUTION_FIELDS = ("min", "max", "mean", "std_dev", "total_count", "type", "variance", "skew")
_SHARED_PREFIX_FIELDS = (
    "num_groups",
    "num_unique_system_prompts",
    "num_prompts_per_group",
    "num_users_per_system_prompt",
    "system_prompt_len",
    "question_len",
    "output_len",
    "seed",
    "question_distribution",
    "output_distribution",
    "enable_multi_turn_chat",
    "multimodal",
)


def convert_inference_perf(config: Any, path: str = "inference-perf") -> tuple[dict, list[str]]:
    """(``{"seed": ..., "workload": ...}`` scenario sections, notes on what was approximated or
    dropped) for an inference-perf config mapping. Errors name the inference-perf field."""
    cfg = expect_mapping(config, path)
    check_keys(cfg, (*LOAD_SECTIONS, *DROPPED_SECTIONS), path)
    notes = [
        f"{path}.{name}: not part of the load; dropped" for name in DROPPED_SECTIONS if name in cfg
    ]
    model = expect_mapping(cfg.get("server"), f"{path}.server").get("model_name")
    if model:
        notes.append(f"{path}.server.model_name: {model}; set the scenario's model to match")
    load = expect_mapping(cfg.get("load"), f"{path}.load")
    check_keys(load, _LOAD_FIELDS, f"{path}.load")
    workload = _data(expect_mapping(cfg.get("data"), f"{path}.data"), f"{path}.data", notes)
    workload.update(_load(load, f"{path}.load", notes))
    if load.get("lora_traffic_split") is not None:  # LoRA adapters: the requests' adapter mix
        workload["adapters"] = _lora_split(load["lora_traffic_split"], f"{path}.load", notes)
    sections: dict[str, Any] = {}
    if load.get("base_seed") is not None:
        sections["seed"] = as_int(load["base_seed"], f"{path}.load.base_seed", minimum=0)
    else:
        notes.append(f"{path}.load.base_seed: not given (inference-perf uses the clock); seed 42")
        sections["seed"] = 42
    sections["workload"] = workload
    return sections, notes


def _lora_split(value: Any, path: str, notes: list[str]) -> dict[str, float]:
    """``lora_traffic_split: [{name, split}, ...]`` (splits summing to 1) as
    ``workload.adapters: {name: split}``; the adapters must be in ``engine.lora.adapters``."""
    where = f"{path}.lora_traffic_split"
    if not isinstance(value, list) or not value:
        raise ScenarioError(where, value, "expected a list of {name: ADAPTER, split: SHARE}")
    split: dict[str, float] = {}
    for i, entry in enumerate(value):
        e = expect_mapping(entry, f"{where}[{i}]")
        check_keys(e, ("name", "split"), f"{where}[{i}]")
        name = as_str(e.get("name"), f"{where}[{i}].name")
        split[name] = as_float(e.get("split"), f"{where}[{i}].split", exclusive_minimum=0.0)
    if abs(sum(split.values()) - 1.0) > 1e-6:
        raise ScenarioError(where, value, "the splits must add up to 1 (as inference-perf checks)")
    notes.append(f"{where}: workload.adapters; add engine.lora with adapters: [{', '.join(split)}]")
    return split


def _load(load: Mapping[str, Any], path: str, notes: list[str]) -> dict[str, Any]:
    kind = as_str(
        load.get("type", "constant"),
        f"{path}.type",
        choices=("constant", "poisson", "concurrent", "trace_replay", "trace_session_replay"),
    )
    if kind.startswith("trace"):
        raise ScenarioError(
            f"{path}.type",
            kind,
            "a trace replay: replay the trace itself with `servesim run --trace FILE` "
            "(see docs/howto/replay-a-trace.md)",
        )
    if load.get("sweep") is not None:
        raise ScenarioError(
            f"{path}.sweep",
            dict(load["sweep"]),
            "a sweep probes a live server for its saturation rate; give explicit stages, or "
            "use `servesim sweep` over workload.rate",
        )
    for name in _CLIENT_SIDE:
        if name in load:
            notes.append(f"{path}.{name}: a load-generator setting; dropped")
    if load.get("request_timeout") is not None:
        notes.append(f"{path}.request_timeout: client timeouts are not modelled; dropped")
    stages = load.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ScenarioError(f"{path}.stages", stages, "expected a non-empty list of stages")
    if kind == "concurrent":
        return _concurrent(stages, path)
    interval = as_float(load.get("interval", 1.0), f"{path}.interval", minimum=0.0)
    segments: list[dict[str, Any]] = []
    for i, stage in enumerate(stages):
        sp = f"{path}.stages[{i}]"
        st = expect_mapping(stage, sp)
        check_keys(st, ("rate", "duration"), sp)
        require_keys(st, ("rate", "duration"), sp, f"a {kind} stage needs it")
        rate = as_float(st["rate"], f"{sp}.rate", exclusive_minimum=0.0)
        duration = as_float(st["duration"], f"{sp}.duration", exclusive_minimum=0.0)
        if i and interval > 0:
            segments.append({"duration": f"{interval:g}s", "rate": 0})
        segments.append({"duration": f"{duration:g}s", "rate": rate})
    if interval > 0 and len(stages) > 1:
        notes.append(f"{path}.interval: {interval:g} s idle between stages (rate-0 segments)")
    return {"arrival": kind, "stages": segments}


def _concurrent(stages: list, path: str) -> dict[str, Any]:
    if len(stages) > 1:
        raise ScenarioError(
            f"{path}.stages",
            f"{len(stages)} stages",
            "a concurrent load converts one stage at a time (one closed loop of users); "
            "convert each stage as its own config",
        )
    sp = f"{path}.stages[0]"
    st = expect_mapping(stages[0], sp)
    check_keys(st, ("num_requests", "concurrency_level", "rate", "duration"), sp)
    require_keys(st, ("num_requests", "concurrency_level"), sp, "a concurrent stage needs it")
    return {
        "requests": as_int(st["num_requests"], f"{sp}.num_requests", minimum=1),
        "sessions": {
            "users": as_int(st["concurrency_level"], f"{sp}.concurrency_level", minimum=1),
            "think_time": "0s",
        },
    }


def _data(data: Mapping[str, Any], path: str, notes: list[str]) -> dict[str, Any]:
    kind = as_str(data.get("type", "mock"), f"{path}.type")
    if kind in _DATASETS:
        raise ScenarioError(
            f"{path}.type",
            kind,
            "its lengths come from a dataset servesim does not read; use data.type random "
            "(with input_distribution/output_distribution) or shared_prefix, or measure the "
            "dataset's lengths and give them as a servesim empirical length distribution",
        )
    if kind in ("random", "synthetic"):
        check_keys(
            data, ("type", "input_distribution", "output_distribution", "path", "trace"), path
        )
        return {
            side: _distribution(data.get(f"{side}_distribution"), f"{path}.{side}_distribution")
            for side in ("input", "output")
        }
    if kind == "shared_prefix":
        return _shared_prefix(data.get("shared_prefix"), f"{path}.shared_prefix", notes)
    raise ScenarioError(
        f"{path}.type",
        kind,
        "expected random, synthetic or shared_prefix (mock sends fixed test prompts of no "
        "stated length)",
    )


def _shared_prefix(value: Any, path: str, notes: list[str]) -> dict[str, Any]:
    sp = expect_mapping(value, path)
    if not sp:
        raise ScenarioError(path, value, "missing; data.type shared_prefix needs this section")
    check_keys(sp, _SHARED_PREFIX_FIELDS, path)
    for unsupported in ("enable_multi_turn_chat", "multimodal"):
        if sp.get(unsupported):
            raise ScenarioError(
                f"{path}.{unsupported}",
                sp[unsupported],
                "not converted: servesim's sessions draw each turn independently; "
                "set it to false, or write servesim sessions by hand",
            )
    groups = 10
    for alias in ("num_groups", "num_unique_system_prompts"):
        if alias in sp:
            groups = as_int(sp[alias], f"{path}.{alias}", minimum=1)
    system = sp.get("system_prompt_len", 100)
    if isinstance(system, Mapping):
        tokens = round(_distribution(system, f"{path}.system_prompt_len").get("mean", 0))
        notes.append(f"{path}.system_prompt_len: a distribution; every group gets its mean")
    else:
        tokens = as_int(system, f"{path}.system_prompt_len", minimum=0)
    notes.append(
        f"{path}: groups drawn at random per request (inference-perf cycles through "
        "num_groups × num_prompts_per_group prompts; the same group sizes in expectation)"
    )
    out: dict[str, Any] = {"prefix": {"tokens": tokens, "groups": groups}}
    for side, legacy in (
        ("question_len", "question_distribution"),
        ("output_len", "output_distribution"),
    ):
        key = "input" if side == "question_len" else "output"
        if sp.get(legacy) is not None:
            if side in sp and isinstance(sp[side], Mapping):
                raise ScenarioError(
                    f"{path}.{legacy}", sp[legacy], f"give either {side} or {legacy}, not both"
                )
            out[key] = _distribution(sp[legacy], f"{path}.{legacy}")
        else:
            value = sp.get(side, 50)
            out[key] = (
                _distribution(value, f"{path}.{side}")
                if isinstance(value, Mapping)
                else {"type": "constant", "value": as_int(value, f"{path}.{side}", minimum=1)}
            )
    return out


def _distribution(value: Any, path: str) -> dict[str, Any]:
    """A servesim length distribution for an inference-perf ``Distribution`` mapping (its
    defaults: min 10, max 1024, mean 512, std_dev 200, type normal)."""
    d = expect_mapping(value, path)
    check_keys(d, _DISTRIBUTION_FIELDS, path)
    kind = as_str(d.get("type", "normal"), f"{path}.type")
    lo = as_int(d.get("min", 10), f"{path}.min", minimum=1)
    hi = as_int(d.get("max", 1024), f"{path}.max", minimum=1)
    if lo > hi:
        raise ScenarioError(f"{path}.min", lo, f"must not exceed max ({hi})")
    mean = as_float(d.get("mean", 512), f"{path}.mean", exclusive_minimum=0.0)
    if d.get("variance") is not None:
        std = as_float(d["variance"], f"{path}.variance", minimum=0.0) ** 0.5
    else:
        std = as_float(d.get("std_dev", 200), f"{path}.std_dev", minimum=0.0)
    if kind == "normal":
        return {"type": "gaussian", "mean": mean, "std_dev": std, "min": lo, "max": hi}
    if kind == "lognormal":
        return {"type": "lognormal", "mean": mean, "std_dev": std, "min": lo, "max": hi}
    if kind == "uniform":
        return {"type": "uniform", "min": lo, "max": hi}
    if kind == "fixed":
        return {"type": "constant", "value": round(mean)}
    raise ScenarioError(
        f"{path}.type",
        kind,
        "servesim has no such length distribution; use normal, lognormal, uniform or fixed "
        "(skew_normal and poisson are not converted)",
    )


def scenario_text(sections: Mapping[str, Any], notes: list[str], source: str) -> str:
    """The converted sections as a scenario YAML file, the notes as its header comments."""
    import yaml

    lines = [f"# Converted from the inference-perf config {source} by `servesim convert`."]
    lines += [f"# note: {n}" for n in notes]
    lines.append("# Add model, gpu, cluster and engine sections to make it a full scenario.")
    body = yaml.safe_dump(dict(sections), sort_keys=False, default_flow_style=None, width=100)
    return "\n".join(lines) + "\n" + body


def read_inference_perf(file: str) -> Any:
    """The parsed YAML of an inference-perf config file; I/O and syntax problems as one-line
    errors naming ``--spec``."""
    import yaml

    from servesim.simcore.config import load_yaml

    try:
        return load_yaml(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError("--spec", file, f"cannot read it ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ScenarioError("--spec", file, f"not valid YAML{where}; fix the file") from None
