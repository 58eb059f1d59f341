"""The multimodal parts of a scenario: the ``encoder:`` section and ``cluster.pools.encode``.

Media inputs are a workload field (``workload.multimodal``, :mod:`servesim.workloads.multimodal`);
the encoder that turns them into embeddings belongs to the served model (``encoder:``, sized as in
:mod:`servesim.latency.encoder`). Without ``cluster.pools.encode`` the encoder runs on each LLM
instance (colocated); with it, on the encode instances (encode-prefill-decode disaggregation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from servesim.latency.encoder import EncoderSpec
from servesim.scenario.schema import ENCODE_POOL_FIELDS, EncodePoolConfig, read_section
from servesim.simcore.config import check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.workloads.multimodal import MultimodalWorkload


def parse_multimodal(
    data: Mapping[str, Any],
    pools: Mapping[str, Any] | None,
    workload: Any,
    model: Any,
    gpu: Any,
    resolve_gpu: Callable[..., Any],
    base_dir: str | None,
) -> tuple[EncoderSpec | None, EncodePoolConfig | None]:
    """The scenario's encoder and encode pool (None, None: a text-only scenario), checked
    against each other, the workload and the model."""
    encoder = None
    if data.get("encoder") is not None:
        encoder = EncoderSpec.from_config(data["encoder"], "encoder")
    pool = None
    if pools is not None and pools.get("encode") is not None:
        path = "cluster.pools.encode"
        section = expect_mapping(pools["encode"], path)
        check_keys(section, ENCODE_POOL_FIELDS, path)
        pool = read_section(EncodePoolConfig, section, path)
        pool_gpu = gpu
        if section.get("gpu") is not None:
            pool_gpu = resolve_gpu(section["gpu"], f"{path}.gpu", base_dir=base_dir)
        pool = attrs.evolve(pool, gpu=pool_gpu)
        if encoder is None:
            raise ScenarioError(
                path,
                dict(section),
                "an encode pool runs the multimodal encoder: describe it with encoder: "
                "(e.g. encoder: {preset: qwen2-vl-vit})",
            )
        spec = getattr(model, "spec", None)
        if spec is None or not getattr(spec, "hidden_size", 0):
            raise ScenarioError(
                "model",
                data.get("model"),
                "embeddings sent from the encode pool are sized from the model's hidden size, "
                "which is unknown for this model; name a model with a config",
            )
    if isinstance(workload, MultimodalWorkload) and encoder is None:
        raise ScenarioError(
            "encoder",
            None,
            "missing; workload.multimodal needs the encoder that turns media into embeddings, "
            "e.g. encoder: {preset: qwen2-vl-vit} (or {item_time: 20ms}, a measured time)",
        )
    return encoder, pool
