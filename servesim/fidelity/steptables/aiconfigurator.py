"""Compose engine step times from NVIDIA AIConfigurator's per-kernel database (for calibrate).

AIConfigurator (Apache-2.0) measures single kernels on a GPU: GEMMs over a grid of ``(m, n, k)``,
context (prefill) attention over ``(batch, input length)`` and generation (decode) attention over
``(batch, cached tokens)``, per head layout. :func:`read_aiconfigurator` prices a dense decoder
step of a servesim model from them, layer by layer, for a grid of prefill-only and decode-only
steps, and returns a :class:`~servesim.fidelity.steptables.table.StepTable` the step fits accept::

    step = L · (qkv(T) + o(T) + gate_up(T) + down(T) + attention) + lm_head(S)

with ``T`` the tokens of the step, ``S`` its sequences, ``L`` the model's layers, GEMM shapes at
the model's sizes (``qkv``: n = (heads + 2·kv_heads)·head_dim, k = hidden; ``o``: n = hidden,
k = heads·head_dim; ``gate_up``: n = 2·intermediate, k = hidden; ``down``: n = hidden,
k = intermediate; ``lm_head``: n = vocab, k = hidden). A GEMM between grid points is interpolated
linearly in m, n and k (an ``n`` beyond the grid, as a large vocabulary, is priced as several
GEMMs of the largest ``n``); attention is interpolated linearly over batch and length, and steps
outside the measured range are left out. Only TP 1 dense models in bf16: the database's
all-reduce and MoE tables are not composed, and norms, activations, rotary embedding, sampling
and host gaps are not in any table (the fits' β0 absorbs their constant part).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servesim.fidelity.steptables.table import StepTable, _composed_tp, _table_from_rows
from servesim.simcore.errors import ScenarioError

PREFILL_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (128, 512, 2048, 8192)
MS_TO_US = 1000.0


def _database(path: Path) -> Path:
    """The ``systems/data/<gpu>`` folder at or under ``path`` (one GPU)."""
    if (path / "gemm").is_dir():
        return path
    found = sorted(p.parent for p in path.glob("**/gemm") if p.is_dir())
    if len(found) == 1:
        return found[0]
    raise ScenarioError(
        str(path),
        None,
        "expected AIConfigurator's database folder for one GPU (systems/data/<gpu>, holding "
        f"gemm/ and attention/); found {len(found)}",
    )


def _parquet(folder: Path, name: str) -> dict[str, np.ndarray]:
    files = sorted(folder.glob(f"*/*/{name}.parquet"))
    if not files:
        raise ScenarioError(
            str(folder), None, f"no {name}.parquet under {folder}/<framework>/<version>/"
        )
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ScenarioError(
            str(files[0]),
            "pyarrow",
            "reading AIConfigurator's parquet tables needs pyarrow: pip install servesim[parquet]",
        ) from None
    table = pq.read_table(files[-1])  # the newest version folder, by name
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


class _Gemm:
    """bf16 GEMM latency (µs) at any (m, n, k) inside the measured grid."""

    def __init__(self, rows: dict[str, np.ndarray]):
        keep = rows["gemm_dtype"] == "bfloat16"
        m, n, k = (rows[c][keep].astype(np.int64) for c in ("m", "n", "k"))
        lat = rows["latency"][keep].astype(np.float64) * MS_TO_US
        self.ns = np.unique(n)
        self.ks = np.unique(k)
        self.curves: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        order = np.lexsort((m, k, n))
        m, n, k, lat = m[order], n[order], k[order], lat[order]
        bounds = np.flatnonzero(np.diff(n) | np.diff(k)) + 1
        for part in np.split(np.arange(m.size), bounds):
            if part.size:
                self.curves[(int(n[part[0]]), int(k[part[0]]))] = (m[part], lat[part])
        self.max_m = int(min(c[0][-1] for c in self.curves.values()))

    def _bracket(self, grid: np.ndarray, x: float) -> tuple[int, int, float]:
        i = int(np.searchsorted(grid, x))
        if i < grid.size and grid[i] == x:
            return int(grid[i]), int(grid[i]), 0.0
        if i == 0 or i == grid.size:
            raise ValueError(x)
        lo, hi = int(grid[i - 1]), int(grid[i])
        return lo, hi, (x - lo) / (hi - lo)

    def __call__(self, m: float, n: int, k: int) -> float:
        top = int(self.ns[-1])
        if n > top:  # a wide GEMM (a vocabulary projection) as several of the widest measured
            full, rest = divmod(n, top)
            return full * self(m, top, k) + (self(m, rest, k) if rest else 0.0)
        n0, n1, wn = self._bracket(self.ns, n)
        k0, k1, wk = self._bracket(self.ks, k)
        total = 0.0
        for nn, fn in ((n0, 1 - wn), (n1, wn)):
            for kk, fk in ((k0, 1 - wk), (k1, wk)):
                if fn * fk == 0.0:
                    continue
                ms, lat = self.curves[(nn, kk)]
                total += fn * fk * float(np.interp(m, ms, lat))
        return total


class _Attention:
    """Attention latency (µs) over (batch, length) for one head layout, bf16, no window."""

    def __init__(
        self, rows: dict[str, np.ndarray], heads: int, kv_heads: int, head_dim: int, length: str
    ):
        keep = (
            (rows["num_heads"] == heads)
            & (rows["num_key_value_heads"] == kv_heads)
            & (rows["head_dim"] == head_dim)
            & (rows["attn_dtype"] == "bfloat16")
            & (rows["kv_cache_dtype"] == "bfloat16")
            & (rows["window_size"] == 0)
            & (rows["beam_width"] == 1)
        )
        if not keep.any():
            raise LookupError((heads, kv_heads, head_dim))
        b = rows["batch_size"][keep].astype(np.float64)
        x = rows[length][keep].astype(np.float64)
        lat = rows["latency"][keep].astype(np.float64) * MS_TO_US
        self.bs = np.unique(b)
        self.xs = np.unique(x)
        grid = np.full((self.bs.size, self.xs.size), np.nan)
        grid[np.searchsorted(self.bs, b), np.searchsorted(self.xs, x)] = lat
        self.grid = grid

    def __call__(self, batch: float, length: float) -> float:
        """NaN outside the measured grid (or where a corner was not measured)."""
        if not (self.bs[0] <= batch <= self.bs[-1] and self.xs[0] <= length <= self.xs[-1]):
            return float("nan")
        i = min(int(np.searchsorted(self.bs, batch, side="right")) - 1, self.bs.size - 2)
        j = min(int(np.searchsorted(self.xs, length, side="right")) - 1, self.xs.size - 2)
        i, j = max(i, 0), max(j, 0)
        if self.bs.size == 1 or self.xs.size == 1:
            return float("nan")
        wb = (batch - self.bs[i]) / (self.bs[i + 1] - self.bs[i])
        wx = (length - self.xs[j]) / (self.xs[j + 1] - self.xs[j])
        g = self.grid
        return float(
            (1 - wb) * (1 - wx) * g[i, j]
            + wb * (1 - wx) * g[i + 1, j]
            + (1 - wb) * wx * g[i, j + 1]
            + wb * wx * g[i + 1, j + 1]
        )


def _compose(
    gemm: _Gemm,
    context: _Attention,
    generation: _Attention,
    spec: Any,
    max_context: int | None,
    prefill_lengths: Sequence[int],
    decode_batches: Sequence[int],
    decode_contexts: Sequence[int],
    dense: Callable[[int], float],
) -> tuple[list[dict[str, Any]], int]:
    """The composed rows (prefill grid, then decode grid) and how many fell outside the data."""
    hidden, layers = spec.hidden_size, spec.num_layers
    rows: list[dict[str, Any]] = []
    skipped = 0
    for length in prefill_lengths:
        attention = context(1, length)
        if length > gemm.max_m or np.isnan(attention):
            skipped += 1
            continue
        if max_context is not None and length > max_context:
            continue
        t = layers * (dense(length) + attention) + gemm(1, spec.vocab_size, hidden)
        rows.append(
            {"kind": "prefill", "prefill_tokens": length, "decode_requests": 0,
             "decode_context": 0, "prefill_items": ((0, length, length),), "time_us": t,
             "group": len(rows), "tp": 1}
        )  # fmt: skip
    for batch in decode_batches:
        for ctx in decode_contexts:
            if max_context is not None and ctx > max_context:
                continue
            attention = generation(batch, ctx)
            if batch > gemm.max_m or np.isnan(attention):
                skipped += 1
                continue
            t = layers * (dense(batch) + attention) + gemm(batch, spec.vocab_size, hidden)
            rows.append(
                {"kind": "decode", "prefill_tokens": 0, "decode_requests": batch,
                 "decode_context": batch * ctx, "prefill_items": (), "time_us": t,
                 "group": len(rows), "tp": 1}
            )  # fmt: skip
    return rows, skipped


def read_aiconfigurator(
    path: str | Path,
    *,
    llm: str | None,
    tp: int | None = None,
    max_context: int | None = None,
    prefill_lengths: Sequence[int] = PREFILL_LENGTHS,
    decode_batches: Sequence[int] = DECODE_BATCHES,
    decode_contexts: Sequence[int] = DECODE_CONTEXTS,
) -> StepTable:
    """Step times of servesim model ``llm`` composed from the AIConfigurator database at ``path``
    (module docstring): one prefill-only step per prompt length (batch 1) and one decode-only
    step per (batch, context) pair, as a StepTable."""
    from servesim.latency.modelindex import resolve_model

    root = Path(path)
    if llm is None:
        raise ScenarioError(
            "--llm",
            None,
            "name the servesim model whose layer shapes price the kernels, "
            "e.g. --llm llama-3.1-8b (servesim list models)",
        )
    spec = resolve_model(llm, "--llm").require_spec("--llm", "composing AIConfigurator kernels")
    if spec.num_experts or spec.kv_lora_rank:
        raise ScenarioError(
            "--llm",
            llm,
            "only dense models with standard attention are composed (the MoE and "
            "MLA tables are not); choose a dense model",
        )
    tp = _composed_tp(
        tp,
        "AIConfigurator steps are composed at TP 1 only (its all-reduce tables "
        "are not composed, so a TP step would leave the communication out)",
    )
    if max_context is not None and (isinstance(max_context, bool) or max_context < 1):
        raise ScenarioError("--max-context", max_context, "expected a whole number >= 1")
    db = _database(root)
    gemm = _Gemm(_parquet(db / "gemm", "gemm_perf"))
    heads, kv_heads, head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    try:
        context = _Attention(
            _parquet(db / "attention", "context_attention_perf"), heads, kv_heads, head_dim, "isl"
        )
        generation = _Attention(
            _parquet(db / "attention", "generation_attention_perf"),
            heads,
            kv_heads,
            head_dim,
            "step",
        )
    except LookupError:
        raise ScenarioError(
            "--llm",
            llm,
            f"the database has no attention measured for {heads} heads, {kv_heads} "
            f"KV heads of dimension {head_dim}; choose a model with a measured layout",
        ) from None
    hidden, inter = spec.hidden_size, spec.intermediate_size
    layers = spec.num_layers

    def dense(tokens: int) -> float:
        return (
            gemm(tokens, (heads + 2 * kv_heads) * head_dim, hidden)
            + gemm(tokens, hidden, heads * head_dim)
            + gemm(tokens, 2 * inter, hidden)
            + gemm(tokens, hidden, inter)
        )

    try:
        rows, skipped = _compose(
            gemm, context, generation, spec, max_context, prefill_lengths, decode_batches,
            decode_contexts, dense,
        )  # fmt: skip
    except ValueError as exc:  # a GEMM dimension outside the measured grid
        raise ScenarioError(
            "--llm",
            llm,
            f"a layer dimension ({exc.args[0]}) lies outside the database's GEMM "
            f"grid ({int(gemm.ns[0])}..{int(gemm.ns[-1])}); choose a model inside it",
        ) from None
    if not rows:
        raise ScenarioError(str(db), None, "no step of the grid falls inside the measured ranges")
    table = _table_from_rows(
        rows, source=str(db), fmt="aiconfigurator", model=spec.name, hardware=db.name
    )
    table.notes.append(
        f"steps composed from AIConfigurator kernel times (bf16 GEMMs and attention, {layers} "
        "layers, TP 1); norms, activations, rotary, sampling and host gaps are not in them"
    )
    if skipped:
        table.notes.append(f"{skipped} grid steps outside the measured ranges left out")
    return table
