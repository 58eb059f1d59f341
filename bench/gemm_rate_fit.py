"""Re-derive two trained-physics constants from kernel tables (docs/explanation/latency-models.md).

1. PREFILL_FLOOR: the time of vLLM's bf16 GEMMs per FLOP, in units of the datasheet peak's, by
   number of rows (tokens): on H100 (aiconfigurator's GEMM table, vLLM 0.24, shapes with n and k
   between 1k and 32k/16k) and on RTX PRO 6000 (LLMServingSim's one-layer profile of
   Llama-3.1-8B, vLLM 0.19: its qkv, o, gate_up and down projections).
2. The RTX PRO 6000 decode-attention kernel: ``t = c0 + c1·B + c_kv·KV/BW`` on the same profile's
   decode-only shapes (context >= 256), to compare with the H100's KERNEL_KV_READ = 1.107.

Usage: python bench/gemm_rate_fit.py [../shared/data]   (needs pandas and pyarrow)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data")
H100_TFLOPS, RTX_TFLOPS, RTX_BW = 989.5, 500.0, 1.792e6  # datasheet bf16 dense; bytes/µs
RTX_PROFILE = (
    DATA / "measured/llmservingsim_vllm/profiles/profiler/perf/RTXPRO6000/meta-llama/Llama-3.1-8B"
    "/bf16/tp1"
)
LLAMA_GEMMS = {  # layer: (k, n) of Llama-3.1-8B at tp 1
    "qkv_proj": (4096, 6144),
    "o_proj": (4096, 4096),
    "gate_up_proj": (4096, 28672),
    "down_proj": (14336, 4096),
}
ROWS = (128, 256, 512, 1024, 2048, 4096)


def h100_gemm_ratio() -> dict[int, float]:
    table = (
        DATA / "kernels/aiconfigurator_h100_sxm/aiconfigurator_core/systems/data/h100_sxm/gemm"
        "/vllm/0.24.0/gemm_perf.parquet"
    )
    t = pd.read_parquet(table)
    t = t[(t.gemm_dtype == "bfloat16") & t.n.between(1024, 32768) & t.k.between(1024, 16384)]
    out = {}
    for m in ROWS:
        s = t[t.m == m]
        flops_us = (2.0 * s.m * s.n * s.k / (H100_TFLOPS * 1e6)).sum()
        out[m] = float((s.latency * 1e3).sum() / flops_us)
    return out


def rtx_gemm_ratio() -> dict[int, float]:
    dense = pd.read_csv(RTX_PROFILE / "dense.csv")
    out = {}
    for m in ROWS:
        rows = dense[(dense.tokens == m) & dense.layer.isin(list(LLAMA_GEMMS))]
        if len(rows) < len(LLAMA_GEMMS):
            continue
        flops = sum(2.0 * m * k * n for k, n in LLAMA_GEMMS.values())
        out[m] = float(rows.time_us.sum() / (flops / (RTX_TFLOPS * 1e6)))
    return out


def rtx_decode_attention() -> tuple[np.ndarray, float]:
    a = pd.read_csv(RTX_PROFILE / "attention.csv")
    a = a[(a.prefill_chunk == 0) & (a.n_decode > 0) & (a.kv_decode >= 256)]
    batch = a.n_decode.to_numpy(float)
    kv = batch * a.kv_decode.to_numpy(float) * 8 * 128 * 4 / RTX_BW  # 8 KV heads, K and V, bf16
    t = a.time_us.to_numpy(float)
    x = np.c_[np.ones_like(batch), batch, kv]
    w = 1.0 / t  # relative least squares
    coef, *_ = np.linalg.lstsq(x * w[:, None], t * w, rcond=None)
    return coef, float(np.mean(np.abs(x @ coef / t - 1.0)))


def main() -> None:
    h100, rtx = h100_gemm_ratio(), rtx_gemm_ratio()
    print("bf16 GEMM time / time at the datasheet peak, by rows (tokens):")
    print("  rows   H100   RTX PRO 6000")
    for m in ROWS:
        print(f"  {m:5d}  {h100[m]:5.3f}  {rtx.get(m, float('nan')):5.3f}")
    coef, err = rtx_decode_attention()
    print(
        f"RTX PRO 6000 decode attention: t = {coef[0]:.1f} us + {coef[1]:.3f} us*B + "
        f"{coef[2]:.3f}*KV/BW (mean error {err:.1%})"
    )


if __name__ == "__main__":
    main()
