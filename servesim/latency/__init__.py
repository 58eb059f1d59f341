"""Step-time models (pure functions of a batch summary) and the model/GPU specs they use.

Importing this package registers the built-in latency models under the plugin kind ``latency``:
``blackbox``, ``roofline``, ``trained-physics``, ``distserve-profile`` and the ``interference``
wrapper.
"""

from servesim.latency.anchored import AnchoredLatency
from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.latency.hardware import HardwareSpec, load_gpu_spec, resolve_gpu
from servesim.latency.interference import InterferenceLatencyModel
from servesim.latency.kvcapacity import (
    auto_kv_blocks,
    auto_max_model_len,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    minimum_gpus,
    weight_params,
    weights_bytes,
)
from servesim.latency.modelindex import ModelInfo, resolve_model
from servesim.latency.modelspec import ModelSpec, load_model_spec
from servesim.latency.overheads import OverheadsLatencyModel
from servesim.latency.profiled import DistServeProfileLatencyModel
from servesim.latency.roofline import RooflineLatencyModel
from servesim.latency.tensor_parallel import check_tensor_parallel
from servesim.latency.trained import TrainedPhysicsLatencyModel

__all__ = [
    "AnchoredLatency",
    "BatchSummary",
    "BlackboxLatencyModel",
    "DistServeProfileLatencyModel",
    "HardwareSpec",
    "InterferenceLatencyModel",
    "LatencyContext",
    "LatencyModel",
    "ModelInfo",
    "ModelSpec",
    "OverheadsLatencyModel",
    "RooflineLatencyModel",
    "TrainedPhysicsLatencyModel",
    "auto_kv_blocks",
    "auto_max_model_len",
    "check_tensor_parallel",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "load_gpu_spec",
    "load_model_spec",
    "minimum_gpus",
    "resolve_gpu",
    "resolve_model",
    "weight_params",
    "weights_bytes",
]
