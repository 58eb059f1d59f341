"""``summary.json``'s ``encode`` block: what the multimodal encode stage did in a run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def encode_metrics(encode: Mapping[str, Any], arrived: int) -> dict[str, Any]:
    """The run's encode books (``RunRecord.encode``) summed up. ``encode_*_ms``: from an encoder
    batch's start to its end (colocated: the encoder's part of the step), per encoded request;
    ``embedding_transfer_*_ms``: pool only, the embeddings' trip to the prefill instance."""
    log = encode["log"]
    media = np.asarray(encode["media_ids"], dtype=np.int64)
    encode_ms = (log["end_us"] - log["start_us"]) / 1000.0
    moved = log["transfer_end_us"] >= 0
    transfer_ms = (log["transfer_end_us"][moved] - log["transfer_start_us"][moved]) / 1000.0
    return {
        "mode": encode["mode"],
        "requests_with_media": int((media < arrived).sum()),
        "encoded_requests": int(len(log["request"])),
        "encoded_items": int(log["items"].sum()),
        "encoded_tokens": int(log["tokens"].sum()),
        "encode_mean_ms": _mean(encode_ms),
        "encode_p99_ms": _p99(encode_ms),
        "colocated_encoder_ms": sum(encode["encoder_us"]) / 1000.0,
        "encode_batches": int(encode["batches"]),
        "embedding_bytes_moved": int(log["bytes"][moved].sum()),
        "embedding_transfer_mean_ms": _mean(transfer_ms),
        "embedding_transfer_p99_ms": _p99(transfer_ms),
    }


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else 0.0


def _p99(values: np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else 0.0
