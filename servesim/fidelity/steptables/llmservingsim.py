"""LLMServingSim per-layer profiles composed into the steps of a :class:`~servesim.fidelity.steptables.table.StepTable`."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import yaml

from servesim.fidelity.readers.common import PathArg
from servesim.fidelity.steptables.table import StepTable, _composed_tp, _table_from_rows
from servesim.simcore.csvcells import BadCell, cell_number
from servesim.simcore.errors import ScenarioError

_LLAMA_DENSE = ("qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn", "down_proj")


def read_llmservingsim_profile(
    path: PathArg,
    *,
    tp: int | None = None,
    num_layers: int | None = None,
    max_context: int | None = None,
) -> StepTable:
    """Compose step times from an LLMServingSim per-layer profile (``perf/<hw>/<model>/<variant>``).

    A step of ``pc`` new prefill tokens (one request, ``kv_prefill`` tokens already cached) and
    ``nd`` decode requests (``kv_decode`` tokens of context each) takes, as LLMServingSim's trace
    generator composes it for the llama layer sequence::

        embedding(T) + L·(2·layernorm(T) + qkv_proj(T) + rotary_emb(T) + attention(row)
                          + o_proj(T) + gate_up_proj(T) + act_fn(T) + down_proj(T))
        + final_layernorm(T) + lm_head(S) + sampler(S)

    with ``T = pc + nd`` tokens and ``S = nd + [pc > 0]`` sequences, one step per row of
    ``attention.csv``; the dense and per-sequence times are interpolated linearly between profiled
    token counts, and rows beyond the profiled range are left out (no extrapolation). ``L`` is the
    model's layer count (from the bundled config of ``meta.yaml``'s model unless given).
    ``max_context`` keeps only rows whose per-request context (``kv_prefill + prefill_chunk``,
    ``kv_decode``) is at most that many tokens: the profiled grid runs to 16k tokens per decode
    request, far beyond what a KV cache holds for 256 requests.

    Only ``tp=1``: the profiles hold no all-reduce (LLMServingSim adds it from its network
    simulator), so a TP>1 step composed from them would be missing its communication. The
    composed times are kernel times only: host-side scheduling and launch gaps are not in them.
    """
    root = Path(path)
    if root.is_file():
        root = root.parent
    if root.name.startswith("tp") and (root.parent / "meta.yaml").is_file():
        tp = tp if tp is not None else _tp_of(root.name)
        root = root.parent
    meta_file = root / "meta.yaml"
    if not meta_file.is_file():
        raise ScenarioError(
            str(root),
            None,
            "not an LLMServingSim profile: expected meta.yaml and tp<N>/ (dense.csv, "
            "attention.csv, per_sequence.csv) in perf/<hardware>/<model>/<variant>/",
        )
    try:
        meta = yaml.safe_load(meta_file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(str(meta_file), None, f"cannot read meta.yaml ({exc})") from None
    arch = str(meta.get("architecture", ""))
    if arch != "llama":
        raise ScenarioError(
            f"{meta_file}: architecture",
            arch,
            "only the llama layer sequence is known to the composer; another architecture's "
            "layers (q/k norms, MoE) would be summed wrongly",
        )
    tp = _composed_tp(
        tp,
        "LLMServingSim profiles hold no TP all-reduce (its network simulator adds it), so a "
        "step composed from a tp>1 profile would leave the communication out; use tp 1",
    )
    folder = root / f"tp{tp}"
    model = str(meta.get("model", root.parent.name))
    if num_layers is None:
        from servesim.latency.modelindex import resolve_model

        try:
            spec = resolve_model(model.split("/")[-1].lower(), "model").require_spec(
                "model", "composing LLMServingSim layers"
            )
        except ScenarioError:
            try:
                spec = resolve_model(model.split("/")[-1].lower() + "-instruct", "model").spec
            except ScenarioError:
                raise ScenarioError(
                    "--layers",
                    None,
                    f"no bundled config for {model}; give its number of layers",
                ) from None
        num_layers = int(spec.num_layers)
    dense = _layer_table(folder / "dense.csv", "tokens")
    per_seq = _layer_table(folder / "per_sequence.csv", "sequences")
    needed = {
        "dense.csv": [*_LLAMA_DENSE, "layernorm", "embedding", "final_layernorm"],
        "per_sequence.csv": ["lm_head", "sampler"],
    }
    for name, layers in needed.items():
        table = dense if name == "dense.csv" else per_seq
        absent = [layer for layer in layers if layer not in table]
        if absent:
            raise ScenarioError(
                str(folder / name), None, f"missing layer(s) {', '.join(absent)} (llama sequence)"
            )
    attention = _read_attention(folder / "attention.csv")
    max_tokens = min(float(dense[layer][0][-1]) for layer in needed["dense.csv"])
    max_seqs = min(float(per_seq[layer][0][-1]) for layer in needed["per_sequence.csv"])
    pc, kvp, nd, kvd, t_attn = attention
    tokens = (pc + nd).astype(np.float64)
    seqs = (nd + (pc > 0)).astype(np.float64)
    keep = (tokens >= 1) & (tokens <= max_tokens) & (seqs >= 1) & (seqs <= max_seqs)
    out_of_range = int(np.count_nonzero(~keep))
    if max_context is not None:
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
            raise ScenarioError("--max-context", max_context, "expected a whole number >= 1")
        keep &= (kvd <= max_context) & (kvp + pc <= max_context)

    def d(layer: str) -> np.ndarray:
        keys, values = dense[layer]
        return np.interp(tokens[keep], keys, values)

    def s(layer: str) -> np.ndarray:
        keys, values = per_seq[layer]
        return np.interp(seqs[keep], keys, values)

    per_layer = 2 * d("layernorm") + t_attn[keep]
    for layer in _LLAMA_DENSE:
        per_layer = per_layer + d(layer)
    step = (
        d("embedding") + num_layers * per_layer + d("final_layernorm") + s("lm_head") + s("sampler")
    )
    rows = []
    for i, (p, kp, n, kd, t) in enumerate(
        zip(pc[keep].tolist(), kvp[keep].tolist(), nd[keep].tolist(), kvd[keep].tolist(), step)
    ):
        kind = "mixed" if p and n else ("prefill" if p else "decode")
        rows.append(
            {
                "kind": kind,
                "prefill_tokens": p,
                "decode_requests": n,
                "decode_context": n * kd,
                "prefill_items": ((kp, p, kp + p),) if p else (),
                "time_us": float(t),
                "group": i,
                "tp": tp,
            }
        )
    if not rows:
        raise ScenarioError(str(folder), None, "no attention row within the profiled token range")
    hardware = str(meta.get("hardware", root.parent.parent.name))
    table = _table_from_rows(
        rows, source=str(root), fmt="llmservingsim-profile", model=model, hardware=hardware
    )
    table.notes.append(
        f"steps composed from per-layer kernel times of {num_layers} layers (LLMServingSim's llama "
        "sequence); host scheduling and launch gaps are not in them"
    )
    if out_of_range:
        table.notes.append(
            f"{out_of_range} attention rows beyond the profiled {int(max_tokens)} tokens / "
            f"{int(max_seqs)} sequences left out"
        )
    if max_context is not None:
        table.notes.append(f"only rows with at most {max_context} tokens of context per request")
    return table


def _tp_of(name: str) -> int:
    try:
        return int(name[2:])
    except ValueError:
        raise ScenarioError(name, name, "expected a tp<N> folder") from None


def _layer_table(file: Path, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if not file.is_file():
        raise ScenarioError(str(file), None, "no such file (LLMServingSim profile)")
    out: dict[str, list[tuple[float, float]]] = {}
    with file.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for column in ("layer", key, "time_us"):
            if column not in (reader.fieldnames or []):
                raise ScenarioError(f"{file}:1", reader.fieldnames, f"missing column {column}")
        for line, rec in enumerate(reader, start=2):
            try:
                x = cell_number((rec[key] or "").strip(), key)
                t = cell_number((rec["time_us"] or "").strip(), "time_us")
            except BadCell as bad:
                raise ScenarioError(
                    f"{file}:{line}", bad.value, f"column {bad.column}: {bad.what}"
                ) from None
            out.setdefault(rec["layer"], []).append((x, t))
    table = {}
    for layer, pairs in out.items():
        pairs.sort()
        keys = np.asarray([p[0] for p in pairs])
        values = np.asarray([p[1] for p in pairs])
        table[layer] = (keys, values)
    return table


def _read_attention(file: Path) -> tuple[np.ndarray, ...]:
    if not file.is_file():
        raise ScenarioError(str(file), None, "no such file (LLMServingSim profile)")
    columns = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
    try:
        data = np.genfromtxt(file, delimiter=",", names=True, dtype=None, encoding="utf-8")
    except ValueError as exc:
        raise ScenarioError(str(file), None, f"malformed CSV ({exc})") from None
    names = data.dtype.names or ()
    missing = [c for c in columns if c not in names]
    if missing:
        raise ScenarioError(f"{file}:1", list(names), f"missing column(s) {', '.join(missing)}")
    out = tuple(np.atleast_1d(data[c]).astype(np.float64) for c in columns)
    pc, kvp, nd, kvd, t = out
    return pc.astype(np.int64), kvp.astype(np.int64), nd.astype(np.int64), kvd.astype(np.int64), t
