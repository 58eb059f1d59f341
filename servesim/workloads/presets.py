"""Named workload presets: BLIS's four canned request mixes (spec §6.1 item 2, ``defaults.yaml``).

Each preset supplies Gaussian input and output length configs (mean ± std_dev, clamped to [min,
max]); a scenario picks one with ``workload: {preset: chatbot, rate: 10, requests: 1000}`` and may
override ``input`` or ``output``. BLIS pairs presets with constant arrivals; servesim's default
arrival process is Poisson, so write ``arrival: constant`` for a like-for-like comparison.
"""

from __future__ import annotations

from typing import Any


def _gaussian(mean: int, std_dev: int, lo: int, hi: int) -> dict[str, Any]:
    return {"type": "gaussian", "mean": mean, "std_dev": std_dev, "min": lo, "max": hi}


PRESETS: dict[str, dict[str, Any]] = {
    "chatbot": {
        "description": "interactive chat: short prompts, short replies",
        "input": _gaussian(256, 100, 2, 800),
        "output": _gaussian(256, 100, 1, 1024),
    },
    "summarization": {
        "description": "long documents in, short summaries out (prefill heavy)",
        "input": _gaussian(4096, 500, 100, 8192),
        "output": _gaussian(512, 150, 10, 2048),
    },
    "contentgen": {
        "description": "content generation: medium prompts, equally long outputs",
        "input": _gaussian(1024, 150, 10, 2048),
        "output": _gaussian(1024, 200, 10, 2048),
    },
    "multidoc": {
        "description": "multi-document QA: very long prompts, medium answers",
        "input": _gaussian(10240, 1200, 500, 20480),
        "output": _gaussian(1536, 300, 50, 4096),
    },
}
"""Preset name -> ``{"description": str, "input": length config, "output": length config}``."""


def preset_names() -> list[str]:
    """The preset names, sorted."""
    return sorted(PRESETS)
