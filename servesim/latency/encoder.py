"""The time a multimodal encoder (a vision transformer, an audio encoder) takes for a batch of
media items, from its size and the GPU's roofline numbers, or from a measured time per item.

An encoder turns one media item (an image, an audio clip) into ``t`` embedding tokens that join
the prompt. A vision transformer sees ``merge`` patches per output token (Qwen2-VL merges 2x2
patches into one token, LLaVA's CLIP ViT keeps one token per patch), so it runs over
``n = t * merge`` positions per item. Per item, in FLOPs:

* the linear layers: ``2 * params * n`` (one multiply-add per weight per position);
* the attention scores and their weighted sum: ``4 * layers * hidden * n**2`` (full attention
  within the item; no attention across items).

A batch reads the weights once: ``params * dtype_bytes`` bytes. The batch's time is the larger of
its FLOPs at the GPU's prefill MFU and its weight bytes at the GPU's memory bandwidth, both split
over the instance's ``tp`` GPUs (vLLM shards the vision tower's linear layers like the language
model's). Activations, the patch embedding and the projector's own FLOPs (a few percent of the
tower) are left out.

Presets (sizes from the models' Hugging Face ``config.json``; parameter counts are the published
sizes of the towers):

* ``qwen2-vl-vit``: Qwen2-VL-7B-Instruct ``vision_config``: depth 32, embed_dim 1280,
  spatial_merge_size 2 (4 patches per token); about 675 M parameters with its merger.
* ``llava-clip-vit-l``: llava-1.5-7b-hf ``vision_config`` (CLIP ViT-L/14 at 336 px): 24 layers,
  hidden 1024, 576 tokens per image, one per patch; about 304 M parameters.
* ``whisper-large-v3-encoder``: Qwen2-Audio-7B ``audio_config`` (Whisper-large-v3's encoder):
  32 layers, d_model 1280; 50 frames per second pooled 2x to 25 tokens per second; about
  635 M parameters.

A measured alternative, ``item_time``, charges a fixed time per item with no batching gain: use
it when a profile of the encoder on the target GPU is at hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from servesim.simcore.config import (
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    parse_duration_us,
)
from servesim.simcore.errors import ScenarioError

ENCODER_PRESETS: dict[str, dict[str, float]] = {
    "qwen2-vl-vit": {"params": 675e6, "layers": 32, "hidden": 1280, "merge": 4},
    "llava-clip-vit-l": {"params": 304e6, "layers": 24, "hidden": 1024, "merge": 1},
    "whisper-large-v3-encoder": {"params": 635e6, "layers": 32, "hidden": 1280, "merge": 2},
}
"""Encoder sizes by name (module docstring: where each number comes from)."""

ENCODER_FIELDS = ("preset", "params", "layers", "hidden", "merge", "dtype_bytes", "item_time")


@attrs.frozen
class EncoderSpec:
    """A multimodal encoder's size (or its measured time per item): see the module docstring."""

    name: str = "custom"
    params: float = 0.0
    layers: int = 0
    hidden: int = 0
    merge: int = 1
    dtype_bytes: int = 2
    item_us: int = 0  # > 0: measured µs per item, the size fields unused

    @classmethod
    def from_config(cls, value: Any, path: str = "encoder") -> EncoderSpec:
        """``encoder: {preset: qwen2-vl-vit}``, ``{params, layers, hidden, merge, dtype_bytes}``
        (a preset's fields may be overridden one by one), or ``{item_time: 20ms}``."""
        section = expect_mapping(value, path)
        check_keys(section, ENCODER_FIELDS, path)
        if section.get("item_time") is not None:
            sized = [k for k in ("preset", "params", "layers", "hidden") if k in section]
            if sized:
                raise ScenarioError(
                    f"{path}.item_time",
                    section["item_time"],
                    f"a measured time per item replaces the encoder's size; remove "
                    f"{', '.join(sized)} or item_time",
                )
            item_us = parse_duration_us(section["item_time"], f"{path}.item_time", minimum=1)
            return cls(name="measured", item_us=item_us)
        base: dict[str, float] = {}
        name = "custom"
        if section.get("preset") is not None:
            name = as_str(section["preset"], f"{path}.preset", choices=tuple(ENCODER_PRESETS))
            base = dict(ENCODER_PRESETS[name])
        for key in ("params", "layers", "hidden"):
            if section.get(key) is None and key not in base:
                raise ScenarioError(
                    f"{path}.{key}",
                    None,
                    f"missing; give the encoder's {key}, or a preset "
                    f"({', '.join(ENCODER_PRESETS)}), or a measured item_time",
                )
        params = section.get("params", base.get("params"))
        return cls(
            name=name,
            params=as_float(params, f"{path}.params", exclusive_minimum=0.0),
            layers=as_int(section.get("layers", base.get("layers")), f"{path}.layers", minimum=1),
            hidden=as_int(section.get("hidden", base.get("hidden")), f"{path}.hidden", minimum=1),
            merge=as_int(section.get("merge", base.get("merge", 1)), f"{path}.merge", minimum=1),
            dtype_bytes=as_int(
                section.get("dtype_bytes", 2), f"{path}.dtype_bytes", minimum=1, maximum=8
            ),
        )

    def item_flops(self, tokens: int) -> float:
        """FLOPs to encode one item into ``tokens`` embedding tokens."""
        n = tokens * self.merge
        return 2.0 * self.params * n + 4.0 * self.layers * self.hidden * n * n

    def describe(self) -> dict[str, Any]:
        if self.item_us:
            return {"name": self.name, "item_time_us": self.item_us}
        return {
            "name": self.name,
            "params": self.params,
            "layers": self.layers,
            "hidden": self.hidden,
            "merge": self.merge,
            "dtype_bytes": self.dtype_bytes,
        }


class EncoderTimer:
    """Batch times of one encoder on one instance's GPUs (``gpu``: a HardwareSpec)."""

    __slots__ = ("spec", "_flops_per_us", "_bytes_per_us", "_weight_bytes")

    def __init__(self, spec: EncoderSpec, gpu: Any, tp: int = 1):
        self.spec = spec
        self._flops_per_us = gpu.tflops_bf16 * 1e6 * gpu.mfu_prefill * tp
        self._bytes_per_us = gpu.bandwidth_tbs * 1e6 * tp
        self._weight_bytes = spec.params * spec.dtype_bytes

    def flops(self, items: Sequence[int]) -> float:
        """FLOPs of a batch of items (their embedding token counts)."""
        spec = self.spec
        return sum(spec.item_flops(t) for t in items)

    def batch_us(self, count: int, flops: float) -> int:
        """µs for a batch of ``count`` items needing ``flops`` (0 for an empty batch; whole µs,
        rounded up, at least 1 otherwise)."""
        if count <= 0:
            return 0
        if self.spec.item_us:
            return count * self.spec.item_us
        compute = flops / self._flops_per_us
        weights = self._weight_bytes / self._bytes_per_us
        return max(1, math.ceil(max(compute, weights)))

    def items_us(self, items: Sequence[int]) -> int:
        """µs to encode ``items`` (embedding token counts) in one batch."""
        return self.batch_us(len(items), self.flops(items))


def encoder_from_scenario(data: Mapping[str, Any]) -> EncoderSpec | None:
    """The scenario's ``encoder:`` section, parsed (None when absent)."""
    if data.get("encoder") is None:
        return None
    return EncoderSpec.from_config(data["encoder"], "encoder")
