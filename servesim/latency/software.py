"""Software costs a step's FLOPs and bytes do not show: the serving stack around the kernels.

The roofline prices the decoder layers' GEMMs, attention and weight reads. A real server also
pays, per request and per step, for work those formulas leave out. Each term below is physics
(a count times a unit cost, or bytes over the GPU's bandwidth), with a documented default, not a
constant fitted to a run:

* **Per-request server overhead** (added to the queueing delay, never to a GPU step): accepting
  and admitting the request, ``request_us``, plus tokenising its prompt, ``tokenize_us_per_token``
  per prompt token.
* **Logits** (the ``lm_head`` GEMM): one row per request in the step (vLLM v1 computes a row for
  every scheduled request), ``2·d·V`` FLOPs a row at the GPU's BF16 peak × its decode MFU, reading
  the ``d·V`` head weights at the compute precision (vLLM does not quantise ``lm_head``) and
  writing fp32 logits; tensor parallelism splits the vocabulary. Its own small roofline.
* **Sampler**: per row, ``sampler_passes`` memory passes over the row's fp32 logits (``4V`` bytes)
  on one GPU: temperature (read + write), softmax (read + write), the exponential-race draw vLLM
  samples with (read the probabilities, write the noise): 6. Top-k/top-p sorts are not counted.
* **Kernel-launch floor**: with CUDA graphs off (eager), the CPU launches
  ``kernels_per_layer × L`` kernels (+2 all-reduces a layer when TP > 1); a step cannot end before
  the last launch, and the first launch is never hidden::

      eager_us = max(gpu_us + launch_us, kernels × L × launch_us)

* **CUDA graphs** (on by default, as in vLLM): a decode-only step whose batch fits a captured size
  replays one graph, padded to the next captured size ``B``, as vLLM does (the padding rows run
  the GEMMs; they have no KV context)::

      graph_us = gpu_us(batch padded to B) + graph_launch_us

  Prefill and mixed steps, and decode batches above the largest captured size, run eager.
* **Quantisation casts**: FP8 weights (1 byte, 2-byte compute dtype) on a GPU without native FP8
  (``tflops_fp8: 0``) pay a cast pass over the weights the step reads (read FP8, write BF16:
  ``1 + 2`` bytes a parameter, experts as the step's tokens touch them, uniform routing); on a GPU
  with native FP8 they run W8A8 and pay the per-token activation quantisation of each linear
  layer's input (read BF16, write FP8), ``L·(2d + (dq + dff)/TP)`` values a token.

Logits, sampler, casts and activation quantisation are serial kernels, so they add to the step;
the launch floor and the graph launch then apply to the sum. Padding a decode batch to its graph
size and the floor keep step times monotone in batch size when ``graph_launch_us <= launch_us``
(the defaults): the first eager step past the largest graph costs at least the graph's step.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from servesim.latency.base import BatchSummary
from servesim.latency.hardware import HardwareSpec
from servesim.latency.modelspec import ModelSpec
from servesim.latency.moe_routing import ExpertRouting
from servesim.simcore.config import as_bool, as_float, as_int, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError

VLLM_CAPTURE_SIZES = (1, 2, 4, *range(8, 513, 8))
"""vLLM's default CUDA-graph capture sizes: 1, 2, 4, then every multiple of 8 up to 512 (vLLM v1's
``cuda_graph_sizes: [512]``, expanded by its ``CompilationConfig``)."""
LOGIT_BYTES = 4.0
"""vLLM computes the logits and samples in fp32."""
COLLECTIVES_PER_LAYER = 2
"""Tensor-parallel all-reduces a decoder layer launches (attention output, MLP output)."""


@attrs.frozen
class SoftwareCosts:
    """The parameters of the software terms, with their sources (``latency.software``)."""

    cuda_graphs: bool = True
    """vLLM's default (``enforce_eager: false``)."""
    capture_sizes: tuple[int, ...] = VLLM_CAPTURE_SIZES
    """Decode batch sizes with a captured graph, increasing."""
    launch_us: float = 5.0
    """CPU cost of one kernel launch, µs: 4–6 µs through the CUDA driver and runtime (NVIDIA's
    "Getting Started with CUDA Graphs" blog; pegainfer's launch-overhead measurements)."""
    graph_launch_us: float = 5.0
    """Replaying one captured graph, µs: near-constant for straight-line graphs since CUDA 12.6
    (NVIDIA, "Constant Time Launch for Straight-Line CUDA Graphs"), of the order of one launch."""
    kernels_per_layer: int = 10
    """Kernels of one decoder layer in vLLM's Llama forward: 2 norms, QKV GEMM, RoPE, KV-cache
    write, attention, O GEMM, gate-up GEMM, activation, down GEMM."""
    request_us: float = 1000.0
    """Accepting and admitting a request, µs: an HTTP request through a Python ASGI server, its
    validation and the hop to the engine process. An order-of-magnitude estimate (vLLM PR 21139
    saw 12–15 ms of preprocessing under a 96-request load, queueing included); calibrate it."""
    tokenize_us_per_token: float = 0.08
    """Tokenising, µs a prompt token: Hugging Face ``tokenizers`` state under 20 s a GB of text
    on a server CPU, about 4 bytes a token (a multi-core lower bound)."""
    logits: bool = True
    """Price the ``lm_head`` GEMM and the sampler."""
    sampler_passes: float = 6.0
    """fp32 passes over each row's logits (see the module docstring)."""
    casts: bool = True
    """Price FP8 weight casts (no native FP8) or W8A8 activation quantisation (native FP8)."""

    _KEYS = (
        "cuda_graphs",
        "capture_sizes",
        "launch_us",
        "graph_launch_us",
        "kernels_per_layer",
        "request_us",
        "tokenize_us_per_token",
        "logits",
        "sampler_passes",
        "casts",
    )

    @classmethod
    def from_config(cls, value: Any, path: str) -> SoftwareCosts | None:
        """``software: true`` (the defaults), ``false``/absent (None: off) or a mapping of the
        parameters to change; errors name ``path.key``."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, str):
            raise ScenarioError(
                path, value, "expected true, false or a mapping such as {cuda_graphs: false}"
            )
        section = expect_mapping(value, path)
        check_keys(section, cls._KEYS, path)
        values: dict[str, Any] = {}
        for key in ("cuda_graphs", "logits", "casts"):
            if key in section:
                values[key] = as_bool(section[key], f"{path}.{key}")
        for key in (
            "launch_us",
            "graph_launch_us",
            "request_us",
            "tokenize_us_per_token",
            "sampler_passes",
        ):
            if key in section:
                values[key] = as_float(section[key], f"{path}.{key}", minimum=0)
        if "kernels_per_layer" in section:
            values["kernels_per_layer"] = as_int(
                section["kernels_per_layer"], f"{path}.kernels_per_layer", minimum=0
            )
        if "capture_sizes" in section:
            values["capture_sizes"] = parse_capture_sizes(
                section["capture_sizes"], f"{path}.capture_sizes"
            )
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        sizes = self.capture_sizes
        return {
            "cuda_graphs": self.cuda_graphs,
            "capture_sizes": "vllm-default" if sizes == VLLM_CAPTURE_SIZES else list(sizes),
            "launch_us": self.launch_us,
            "graph_launch_us": self.graph_launch_us,
            "kernels_per_layer": self.kernels_per_layer,
            "request_us": self.request_us,
            "tokenize_us_per_token": self.tokenize_us_per_token,
            "logits": self.logits,
            "sampler_passes": self.sampler_passes,
            "casts": self.casts,
        }


def parse_capture_sizes(value: Any, path: str) -> tuple[int, ...]:
    """A strictly increasing list of batch sizes >= 1 (``[]``: no graphs captured)."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ScenarioError(path, value, "expected a list of batch sizes, e.g. [1, 2, 4, 8, 16]")
    sizes = tuple(as_int(v, f"{path}[{i}]", minimum=1) for i, v in enumerate(value))
    for i in range(1, len(sizes)):
        if sizes[i] <= sizes[i - 1]:
            raise ScenarioError(
                f"{path}[{i}]", sizes[i], f"sizes must increase; {sizes[i - 1]} comes before it"
            )
    return sizes


def check_plain_layout(ctx: Any, path: str, value: Any) -> None:
    """Software costs are priced for one tensor-parallel instance: a lock-stepped, pipelined or
    expert-parallel layout would need them per rank and stage, which is not modelled."""
    parallel = ctx.parallel
    if parallel is not None and not parallel.plain:
        raise ScenarioError(
            path,
            value,
            "software costs are priced for a plain tensor-parallel instance; remove "
            "engine.dp/ep/pp/cp or the software costs",
        )


class SoftwareTerms:
    """:class:`SoftwareCosts` bound to a model, a GPU and a tensor-parallel degree."""

    def __init__(self, costs: SoftwareCosts, model: ModelSpec, hardware: HardwareSpec, tp: int):
        self.costs = costs
        d = float(model.hidden_size)
        L = float(model.num_layers)
        V = float(model.vocab_size)
        bpp = float(model.bytes_per_param)
        self._bandwidth = hardware.bandwidth_tbs * 1e12
        self._tp = float(tp)
        collectives = COLLECTIVES_PER_LAYER if tp > 1 else 0
        self.kernels = (costs.kernels_per_layer + collectives) * model.num_layers
        self.launch_floor_us = self.kernels * costs.launch_us
        self._sizes = costs.capture_sizes if costs.cuda_graphs else ()
        self._largest = self._sizes[-1] if self._sizes else 0

        priced = costs.logits and V > 0
        self._logits_rate = hardware.tflops_bf16 * 1e12 * hardware.mfu_decode
        self._logits_flops_row = 2.0 * d * V / tp if priced else 0.0
        self._logits_weight_bytes = d * V * bpp / tp if priced else 0.0
        self._logits_bytes_row = V * LOGIT_BYTES / tp if priced else 0.0
        self._sampler_bytes_row = V * LOGIT_BYTES * costs.sampler_passes if priced else 0.0

        fp8_weights = model.weight_bytes_per_param == 1.0 and bpp > 1.0
        native = hardware.tflops_fp8 > 0
        self.weight_cast = costs.casts and fp8_weights and not native
        self.activation_quant = costs.casts and fp8_weights and native
        self._cast_bytes_param = (1.0 + bpp) / tp  # read FP8, write the compute dtype
        n_moe, n_dense = model.moe_layer_split
        matrices = float(model.mlp_matrices)
        q, kv = float(model.q_dim), float(model.kv_dim)
        self._static_params = L * (d * (q + 2.0 * kv) + q * d) + n_dense * matrices * d * float(
            model.dense_layer_intermediate_size
        )
        moe = model.is_moe and n_moe > 0
        dff_moe = float(model.expert_intermediate_size)
        self._expert_params = n_moe * matrices * d * dff_moe if moe else 0.0
        self._routing = ExpertRouting(model.num_experts, model.num_experts_per_tok) if moe else None
        # Linear-layer inputs quantised per token: QKV and gate-up read the full d on every rank,
        # O and down their TP shard (MoE: the k experts' intermediate width).
        dff = (
            dff_moe * model.num_experts_per_tok
            if moe
            else float(model.dense_layer_intermediate_size)
        )
        self._quant_bytes_token = L * (2.0 * d + (q + dff) / tp) * (bpp + 1.0)

    # ---- per request ---------------------------------------------------------------------------

    def request_us(self, prompt_tokens: int) -> float:
        """Server time before the request can queue: accept/admit plus tokenising the prompt."""
        return self.costs.request_us + self.costs.tokenize_us_per_token * prompt_tokens

    # ---- per step ------------------------------------------------------------------------------

    def graph_size(self, batch: BatchSummary) -> int:
        """The captured batch size a decode-only step is padded to; 0 = the step runs eager."""
        n = batch.decode_requests
        if batch.prefill_items or n == 0 or n > self._largest:
            return 0
        return self._sizes[bisect.bisect_left(self._sizes, n)]

    def added_us(self, rows: int, tokens: int) -> float:
        """Serial kernels the layers' roofline leaves out: logits, sampler, weight casts and
        activation quantisation, for ``rows`` sampled rows and ``tokens`` new tokens."""
        bandwidth = self._bandwidth
        logits = max(
            rows * self._logits_flops_row / self._logits_rate,
            (self._logits_weight_bytes + rows * self._logits_bytes_row) / bandwidth,
        )
        seconds = logits + rows * self._sampler_bytes_row / bandwidth
        if self.weight_cast:
            seconds += self._weight_params(tokens) * self._cast_bytes_param / bandwidth
        if self.activation_quant:
            seconds += tokens * self._quant_bytes_token / bandwidth
        return seconds * 1e6

    def _weight_params(self, tokens: int) -> float:
        if self._routing is None:
            return self._static_params
        return self._static_params + self._expert_params * self._routing.touched(tokens)

    def step_us(self, batch: BatchSummary, gpu_us: Callable[[BatchSummary], float]) -> float:
        """The step's duration (float µs) from ``gpu_us``, the layers' time of a batch."""
        rows = batch.batch_size
        size = self.graph_size(batch)
        if size:
            padded = BatchSummary(0, (), size, batch.decode_context)
            return gpu_us(padded) + self.added_us(rows, size) + self.costs.graph_launch_us
        tokens = batch.prefill_tokens + batch.decode_requests
        eager = gpu_us(batch) + self.added_us(rows, tokens) + self.costs.launch_us
        return max(eager, self.launch_floor_us)

    def decode_steps_us(
        self, n: int, contexts: np.ndarray, gpu_us: Callable[[int, np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """:meth:`step_us` of decode-only steps of ``n`` requests (float µs), the same float
        operations; ``gpu_us(size, contexts)`` prices the layers of a batch of ``size``."""
        size = self.graph_size(BatchSummary(0, (), n, 0))
        if size:
            return gpu_us(size, contexts) + self.added_us(n, size) + self.costs.graph_launch_us
        eager = gpu_us(n, contexts) + self.added_us(n, n) + self.costs.launch_us
        return np.maximum(eager, self.launch_floor_us)

    def describe(self) -> dict[str, Any]:
        return {
            **self.costs.describe(),
            "kernels_per_step": self.kernels,
            "weight_cast": self.weight_cast,
            "activation_quant": self.activation_quant,
        }
