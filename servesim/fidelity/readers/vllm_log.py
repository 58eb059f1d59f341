"""vLLM server logs next to a measured run: the KV-cache size vLLM reported at start-up."""

from __future__ import annotations

import re
from pathlib import Path

from servesim.fidelity.readers.common import MeasuredRun

_LOG_V0_BLOCKS = re.compile(r"#\s*GPU blocks:\s*([\d,]+)")
_LOG_V1_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")


def _log_kv_blocks(run: MeasuredRun, folder: Path, stem: str | None = None) -> None:
    """vLLM's block count from a server log next to the run: ``# GPU blocks: N`` (v0) or
    ``GPU KV cache size: N tokens`` (v1, divided by the block size). Each engine (data-parallel
    rank) logs its own; the smallest is kept."""
    if run.kv_blocks is not None or not folder.is_dir():
        return
    names = [f"{stem}.log"] if stem else []
    logs = [folder / n for n in names if (folder / n).is_file()]
    logs += sorted(p for p in folder.glob("*.log") if p not in logs)
    for log in logs:
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        v0 = [int(x.replace(",", "")) for x in _LOG_V0_BLOCKS.findall(text)]
        v1 = [int(x.replace(",", "")) for x in _LOG_V1_TOKENS.findall(text)]
        if v0:
            run.kv_blocks = min(v0)
            run.extra["kv_blocks_source"] = f"{log} ('# GPU blocks: {run.kv_blocks}', vLLM v0)"
        elif v1:
            block = run.block_size or 16
            run.kv_blocks = min(v1) // block
            run.extra["kv_blocks_source"] = (
                f"{log} ('GPU KV cache size: {min(v1):,} tokens' / block size {block}"
                + ("" if run.block_size else ", vLLM's default")
                + ")"
            )
            if run.block_size is None:
                run.block_size = block
                run.inferred.append("block_size")
        else:
            continue
        if len(set(v0 or v1)) > 1:
            run.notes.append(
                f"{log.name} logs several KV sizes {sorted(set(v0 or v1))}; kept the smallest"
            )
        return
