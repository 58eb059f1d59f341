"""Step-time models (pure functions of a batch summary) and the model/GPU specs they use.

Importing this package registers the built-in latency models under the plugin kind ``latency``.
"""

from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.latency.specs import (
    HardwareSpec,
    ModelInfo,
    ModelSpec,
    auto_kv_blocks,
    auto_max_model_len,
    kv_bytes_per_token,
    load_model_spec,
    resolve_gpu,
    resolve_model,
    weights_bytes,
)

__all__ = [
    "BatchSummary",
    "BlackboxLatencyModel",
    "HardwareSpec",
    "LatencyContext",
    "LatencyModel",
    "ModelInfo",
    "ModelSpec",
    "auto_kv_blocks",
    "auto_max_model_len",
    "kv_bytes_per_token",
    "load_model_spec",
    "resolve_gpu",
    "resolve_model",
    "weights_bytes",
]
