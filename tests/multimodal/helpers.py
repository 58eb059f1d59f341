"""Small multimodal scenarios shared by the encode-stage tests."""

from __future__ import annotations

import copy
from typing import Any

from servesim.run import simulate
from servesim.scenario.build import build_scenario

BASE: dict[str, Any] = {
    "name": "mm",
    "seed": 3,
    "model": "qwen3-14b",
    "gpu": "H100",
    "cluster": {"instances": 2},
    "workload": {
        "rate": 8,
        "requests": 40,
        "input": {"type": "constant", "value": 200},
        "output": {"type": "constant", "value": 30},
    },
}

IMAGES = {"images": 2, "tokens_per_image": 576, "fraction": 0.5}
EPD_POOLS = {"encode": {"instances": 1}, "prefill": {"instances": 1}, "decode": {"instances": 1}}


def scenario(
    media: dict | None = None,
    encoder: dict | None = None,
    pools: dict | None = None,
    seed: int = 3,
    **workload: Any,
):
    """The base scenario with media, an encoder, pools, a seed and workload fields."""
    raw = copy.deepcopy(BASE)
    raw["seed"] = seed
    raw["workload"].update(workload)
    if media is not None:
        raw["workload"]["multimodal"] = media
    if encoder is not None:
        raw["encoder"] = encoder
    if pools is not None:
        raw["cluster"] = {"pools": pools}
    return build_scenario(raw)


def run(*args: Any, **kwargs: Any):
    return simulate(scenario(*args, **kwargs), progress=False)
