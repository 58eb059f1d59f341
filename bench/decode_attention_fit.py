"""Re-derive the trained-physics decode-attention split (docs/explanation/latency-models.md).

1. Fit vLLM's FlashAttention-3 decode kernel on H100 (aiconfigurator's generation-attention table):
   ``t = c0 + c1·B + c_kv·KV/BW + c_q·Q/BW`` with KV = B·ctx·Hkv·dh·4 bytes (K and V, bf16) and
   Q = the same with query heads; prints the coefficients and the error by query-heads-per-KV-head.
2. Cross-check the MHA per-context-token decode cost measured in vLLM step times (DistServe's
   OPT-13B A100 profile, Splitwise's BLOOM-176B runs) against BLIS's β10 and servesim's split.

Usage: python bench/decode_attention_fit.py [../shared/data]   (needs pandas and pyarrow)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data")
H100_BW = 3.35e6  # bytes/µs
A100_BW = 2.039e6
BLIS_BETA10 = 1.94710771


def kernel_fit() -> float:
    table = (
        DATA / "kernels/aiconfigurator_h100_sxm/aiconfigurator_core/systems/data/h100_sxm"
        "/attention/vllm/0.24.0/generation_attention_perf.parquet"
    )
    t = pd.read_parquet(table)
    t = t[
        (t.kv_cache_dtype == "bfloat16")
        & (t.window_size == 0)
        & (t.kernel_source == "vllm_flash_attn_fa3")
    ].copy()
    t["ctx"] = t.isl + t.step
    t = t[(t.ctx >= 255) & (t.ctx <= 16383) & (t.batch_size <= 256)]
    us = t.latency.to_numpy() * 1e3
    kv = (t.batch_size * t.ctx * t.num_key_value_heads * t.head_dim * 4).to_numpy() / H100_BW
    q = (t.batch_size * t.ctx * t.num_heads * t.head_dim * 4).to_numpy() / H100_BW
    X = np.c_[np.ones(len(t)), t.batch_size.to_numpy(), kv, q]
    w = 1.0 / us  # relative least squares
    coef, *_ = np.linalg.lstsq(X * w[:, None], us * w, rcond=None)
    err = np.abs(X @ coef / us - 1)
    print(f"FA3 decode kernel, H100, {len(t)} shapes (ctx 256-16k, batch <= 256, bf16 KV)")
    print(
        f"  t = {coef[0]:.1f} us + {coef[1]:.4f} us*B + {coef[2]:.3f}*KV/BW + {coef[3]:.4f}*Q/BW"
        f"   mean |error| {err.mean():.1%}"
    )
    group = (t.num_heads // t.num_key_value_heads).to_numpy()
    for g in sorted(set(group)):
        sel = group == g
        print(f"  group {g:>2}: {sel.sum():>4} shapes, mean |error| {err[sel].mean():.1%}")
    return float(coef[2])


def mha_checks(kv_read: float) -> None:
    split = kv_read + (BLIS_BETA10 - kv_read) / 4
    print(
        f"MHA decode cost per context token / KV read: BLIS {BLIS_BETA10:.3f}, servesim {split:.3f}"
    )
    # DistServe vLLM profile of OPT-13B on A100-80 (servesim/latency/data/distserve_opt13b_a100.yaml):
    # decode ms per Σ(context+1) token, small and large batches; KV per token 40·2·5120·2 bytes.
    kv_us = 40 * 2 * 5120 * 2 / A100_BW
    for label, ms in (
        ("small batch", 0.000592934466077393),
        ("large batch", 0.0004907727036234946),
    ):
        print(f"  DistServe OPT-13B A100 TP1 {label}: {ms * 1e3 / kv_us:.2f}")
    # Splitwise BLOOM-176B (MHA) TP8: token_time = a + b·B + c·Σctx fitted per GPU.
    runs = pd.read_csv(DATA / "kernels/splitwise_perf_model/perf_model.csv")
    runs = runs[(runs.model == "bloom-176b") & (runs.hardware.isin(["a100-80gb", "h100-80gb"]))]
    runs = runs.groupby(["hardware", "prompt_size", "batch_size", "token_size"], as_index=False)
    runs = runs.token_time.median()
    kv_per_gpu = 70 * 2 * 14336 * 2 / 8
    for hw, g in runs.groupby("hardware"):
        ctx = g.batch_size * (g.prompt_size + g.token_size / 2)
        X = np.c_[np.ones(len(g)), g.batch_size, ctx]
        c, *_ = np.linalg.lstsq(X, g.token_time, rcond=None)
        bw = H100_BW if hw.startswith("h100") else A100_BW
        print(f"  Splitwise BLOOM-176B TP8 {hw}: {c[2] * 1e3 / (kv_per_gpu / bw):.2f}")


if __name__ == "__main__":
    mha_checks(kernel_fit())
