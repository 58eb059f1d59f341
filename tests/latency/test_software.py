"""The software cost terms (servesim.latency.software): each term against its formula, CUDA-graph
padding, the launch floor, casts, and the terms inside the roofline and the overheads wrapper."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.latency.base import BatchSummary, LatencyContext
from servesim.latency.hardware import resolve_gpu
from servesim.latency.modelindex import resolve_model
from servesim.latency.modelspec import ModelSpec
from servesim.latency.overheads import OverheadsLatencyModel
from servesim.latency.parallel import Parallelism
from servesim.latency.roofline import RooflineLatencyModel
from servesim.latency.software import VLLM_CAPTURE_SIZES, SoftwareCosts, SoftwareTerms
from servesim.simcore.errors import ScenarioError
from servesim.testing import check_latency_model

LLAMA = "llama-3.1-8b"
BLACKBOX = {"alpha": [0, 0, 0], "beta": [1000, 1, 10]}


def tiny(**overrides) -> ModelSpec:
    """A 4-layer toy model small enough that the launch floor, not the GPU, sets its decode step."""
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
    }
    config.update(overrides)
    return ModelSpec.from_hf_config(config, name="tiny")


def fp8(**overrides) -> ModelSpec:
    return tiny(quantization_config={"quant_method": "fp8"}, **overrides)


def terms(model: ModelSpec | None = None, gpu: str = "H100", tp: int = 1, **costs) -> SoftwareTerms:
    return SoftwareTerms(SoftwareCosts(**costs), model or tiny(), resolve_gpu(gpu), tp)


def decode(n: int, context_each: int = 100) -> BatchSummary:
    return BatchSummary(0, (), n, n * context_each)


def prefill(tokens: int) -> BatchSummary:
    return BatchSummary(tokens, ((0, tokens, tokens),), 0, 0)


def roofline(name: str = LLAMA, gpu: str = "H100", tp: int = 1, **params) -> RooflineLatencyModel:
    return RooflineLatencyModel.from_config(params, LatencyContext(name, gpu, tp))


# --- CUDA graphs: padding to the next captured size ----------------------------------------------


def test_vllm_capture_sizes_are_1_2_4_then_multiples_of_8_to_512():
    assert VLLM_CAPTURE_SIZES[:6] == (1, 2, 4, 8, 16, 24)
    assert VLLM_CAPTURE_SIZES[-1] == 512 and len(VLLM_CAPTURE_SIZES) == 3 + 64


@pytest.mark.parametrize(
    ("n", "size"), [(1, 1), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24), (500, 504), (512, 512)]
)
def test_a_decode_batch_is_padded_to_the_next_captured_size(n, size):
    assert terms().graph_size(decode(n)) == size


def test_prefill_mixed_oversized_and_eager_steps_run_without_a_graph():
    t = terms()
    assert t.graph_size(decode(513)) == 0  # above the largest captured size
    assert t.graph_size(prefill(16)) == 0
    assert t.graph_size(BatchSummary(8, ((0, 8, 8),), 4, 400)) == 0  # mixed
    assert terms(cuda_graphs=False).graph_size(decode(4)) == 0


def test_a_graph_step_prices_the_padded_batch_and_one_graph_launch():
    t = terms(graph_launch_us=7.0)
    seen = []

    def gpu_us(batch: BatchSummary) -> float:
        seen.append((batch.decode_requests, batch.decode_context))
        return 100.0 * batch.decode_requests

    step = t.step_us(decode(9, 50), gpu_us)
    # padded to 16 rows for the layers (no context for the padding), sampled rows stay 9
    assert seen == [(16, 450)]
    assert step == pytest.approx(1600.0 + t.added_us(9, 16) + 7.0)


# --- kernel-launch floor -----------------------------------------------------------------------


@pytest.mark.parametrize(("tp", "kernels"), [(1, 10), (2, 12)])
def test_the_launch_floor_is_kernels_times_layers_times_launch_us(tp, kernels):
    t = terms(tiny(), tp=tp, launch_us=4.0)
    assert t.kernels == kernels * 4  # 4 layers; 2 all-reduces a layer when TP > 1
    assert t.launch_floor_us == kernels * 4 * 4.0


def test_an_eager_step_of_a_tiny_model_lasts_the_launch_floor():
    t = terms(cuda_graphs=False)
    assert t.step_us(decode(4), lambda b: 10.0) == t.launch_floor_us == 10 * 4 * 5.0
    # a slow GPU step is never floored, and pays its first launch
    slow = t.step_us(decode(4), lambda b: 5000.0)
    assert slow == pytest.approx(5000.0 + t.added_us(4, 4) + 5.0)


def test_graphs_are_faster_than_eager_for_small_decode_batches():
    on = RooflineLatencyModel(tiny(), resolve_gpu("H100"), software=SoftwareCosts())
    off = RooflineLatencyModel(
        tiny(), resolve_gpu("H100"), software=SoftwareCosts(cuda_graphs=False)
    )
    for n in (1, 2, 4, 8, 64, 512):  # captured sizes: no padding
        assert on.step_time_us(decode(n)) < off.step_time_us(decode(n))
    # both pay the same prefill (eager either way)
    assert on.step_time_us(prefill(64)) == off.step_time_us(prefill(64))


@pytest.mark.parametrize("n", [1, 4, 16, 128, 512])
def test_graphs_never_lose_to_eager_at_a_captured_size_on_llama(n):
    on = roofline(software=True)
    off = roofline(software={"cuda_graphs": False})
    assert on.step_time_us(decode(n, 2000)) <= off.step_time_us(decode(n, 2000))


# --- logits and sampler -------------------------------------------------------------------------


def test_logits_and_sampler_match_the_hand_computation():
    # llama-3.1-8b: d=4096, V=128256, bf16; H100: 3.35 TB/s, BF16 peak x decode MFU from the GPU
    # table. Two rows: the lm_head GEMM is bound by reading its d·V weights.
    spec = resolve_model(LLAMA).spec
    gpu = resolve_gpu("H100")
    t = terms(spec, casts=False)
    d, V = 4096, 128256
    bw = 3.35e12
    rate = gpu.tflops_bf16 * 1e12 * gpu.mfu_decode
    logits = max(2 * 2 * d * V / rate, (d * V * 2 + 2 * V * 4) / bw)
    sampler = 2 * V * 4 * 6 / bw
    assert t.added_us(2, 2) == pytest.approx((logits + sampler) * 1e6)
    assert terms(spec, logits=False, casts=False).added_us(2, 2) == 0.0


def test_tensor_parallelism_splits_the_head_but_not_the_sampler():
    spec = resolve_model(LLAMA).spec
    one, two = terms(spec, tp=1, casts=False), terms(spec, tp=2, casts=False)
    rows = 1
    sampler = rows * 128256 * 4 * 6 / 3.35e12 * 1e6
    assert two.added_us(rows, rows) - sampler == pytest.approx(
        (one.added_us(rows, rows) - sampler) / 2
    )


# --- quantisation casts -------------------------------------------------------------------------


def test_fp8_weights_cost_no_cast_on_a_gpu_with_native_fp8():
    model = fp8()
    native = terms(model, "H100")
    assert not native.weight_cast and native.activation_quant
    without = terms(model, "A100-80")
    assert without.weight_cast and not without.activation_quant
    # the cast pass reads every weight in FP8 and writes it in BF16 (3 bytes a parameter)
    d, L, q, kv, dff = 256, 4, 256, 128, 1024
    params = L * (d * (q + 2 * kv) + q * d) + L * 3 * d * dff
    gap = without.added_us(1, 1) - terms(model, "A100-80", casts=False).added_us(1, 1)
    assert gap == pytest.approx(params * 3 / 2.039e12 * 1e6, rel=1e-3)


def test_w8a8_quantises_each_linear_input_per_token():
    model = fp8()
    per_token = 4 * (2 * 256 + (256 + 1024)) * (2 + 1)  # L·(2d + dq + dff)·(2 + 1) bytes
    on, off = terms(model, "H100"), terms(model, "H100", casts=False)
    gap = on.added_us(1, 100) - off.added_us(1, 100)
    assert gap == pytest.approx(100 * per_token / 3.35e12 * 1e6)


def test_a_bf16_model_pays_no_cast():
    for gpu in ("H100", "A100-80"):
        t = terms(tiny(), gpu)
        assert not t.weight_cast and not t.activation_quant


# --- per-request overhead -----------------------------------------------------------------------


def test_the_request_overhead_is_accept_plus_tokenising_the_prompt():
    t = terms(request_us=800.0, tokenize_us_per_token=0.5)
    assert t.request_us(2000) == 800.0 + 1000.0
    model = roofline(alpha=[100, 1, 0], software={"request_us": 800, "tokenize_us_per_token": 0.5})
    assert model.queueing_time_us(2000) == int(100 + 2000 + 1800)


# --- inside the models --------------------------------------------------------------------------


def test_the_roofline_without_software_is_unchanged():
    plain, off = roofline(), roofline(software=False)
    for batch in (decode(7, 900), prefill(300), BatchSummary(40, ((10, 40, 50),), 3, 600)):
        assert plain.step_time_us(batch) == off.step_time_us(batch)
    assert "software" not in plain.describe() and plain.software is None


def test_the_roofline_with_software_meets_the_latency_contract():
    check_latency_model(roofline(software=True))
    check_latency_model(roofline(software={"cuda_graphs": False}))
    check_latency_model(
        RooflineLatencyModel(fp8(), resolve_gpu("A100-80"), software=SoftwareCosts())
    )
    check_latency_model(
        OverheadsLatencyModel.from_config(
            {"base": "trained-physics", "software": True}, LatencyContext(LLAMA, "H100", 1)
        )
    )


@pytest.mark.parametrize("n", [3, 9, 512, 600])
def test_a_decode_window_equals_its_steps_one_by_one(n):
    for model in (
        roofline(software=True),
        OverheadsLatencyModel.from_config(
            {"base": "trained-physics", "software": True, "step": 30},
            LatencyContext(LLAMA, "H100", 1),
        ),
        OverheadsLatencyModel.from_config(
            {"base": {"model": "blackbox", **BLACKBOX}, "software": True},
            LatencyContext(LLAMA, "H100", 1),
        ),
    ):
        window = model.decode_steps_us(n, 700 * n, 5)
        steps = [model.step_time_us(BatchSummary(0, (), n, 700 * n + i * n)) for i in range(5)]
        assert window.dtype == np.int64 and window.tolist() == steps


def test_the_overheads_wrapper_adds_the_terms_to_any_base():
    ctx = LatencyContext(LLAMA, "H100", 1)
    base = {"model": "blackbox", "alpha": [0, 0, 0], "beta": [1000, 1, 10]}
    plain = OverheadsLatencyModel.from_config({"base": base}, ctx)
    soft = OverheadsLatencyModel.from_config({"base": base, "software": True}, ctx)
    t = soft.software
    assert t is not None
    # a prefill step runs eager: base + logits/sampler + one launch, above the floor
    batch = prefill(200)
    expected = max(plain.step_time_us(batch) + t.added_us(1, 200) + 5.0, t.launch_floor_us)
    assert soft.step_time_us(batch) == int(expected)
    # decode of 3 is priced by the base at the padded 4
    padded = plain.step_time_us(BatchSummary(0, (), 4, 300))
    assert soft.step_time_us(decode(3)) == int(padded + t.added_us(3, 4) + 5.0)
    assert soft.queueing_time_us(100) == plain.queueing_time_us(100) + int(1000 + 8.0)
    assert soft.describe()["software"]["cuda_graphs"] is True


# --- monotone in batch size ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 700),
    context=st.integers(0, 8000),
    graphs=st.booleans(),
    model=st.sampled_from([LLAMA, "qwen3-30b-a3b"]),
    tp=st.sampled_from([1, 2]),
    wrapped=st.booleans(),
)
def test_decode_step_times_never_decrease_when_a_request_joins(
    n, context, graphs, model, tp, wrapped
):
    m = _model(model, tp, graphs, wrapped)
    assert m.step_time_us(decode(n + 1, context)) >= m.step_time_us(decode(n, context))


_MODELS: dict = {}


def _model(name: str, tp: int, graphs: bool, wrapped: bool):
    """The roofline with software costs, or trained-physics under the overheads wrapper with them."""
    key = (name, tp, graphs, wrapped)
    if key not in _MODELS:
        software = {"cuda_graphs": graphs}
        if wrapped:
            params = {"base": "trained-physics", "software": software}
            _MODELS[key] = OverheadsLatencyModel.from_config(
                params, LatencyContext(name, "H100", tp)
            )
        else:
            _MODELS[key] = roofline(name, tp=tp, software=software)
    return _MODELS[key]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 700), graphs=st.booleans())
def test_a_tiny_model_steps_never_decrease_across_the_largest_graph(n, graphs):
    m = RooflineLatencyModel(
        tiny(), resolve_gpu("H100"), software=SoftwareCosts(cuda_graphs=graphs)
    )
    assert m.step_time_us(decode(n + 1, 30)) >= m.step_time_us(decode(n, 30))


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("yes", "latency.software"),
        ({"launch_us": -1}, "latency.software.launch_us"),
        ({"cuda_graphs": "maybe"}, "latency.software.cuda_graphs"),
        ({"capture_sizes": [1, 4, 2]}, "latency.software.capture_sizes[2]"),
        ({"capture_sizes": [0, 4]}, "latency.software.capture_sizes[0]"),
        ({"capture_sizes": 8}, "latency.software.capture_sizes"),
        ({"kernels_per_layer": 2.5}, "latency.software.kernels_per_layer"),
        ({"bogus": 1}, "latency.software.bogus"),
    ],
)
def test_bad_software_parameters_are_named(value, field):
    with pytest.raises(ScenarioError) as info:
        roofline(software=value)
    assert info.value.path == field


def test_software_is_given_once_and_for_a_plain_instance():
    ctx = LatencyContext(LLAMA, "H100", 1)
    with pytest.raises(ScenarioError, match="already prices") as info:
        OverheadsLatencyModel.from_config(
            {"base": {"model": "roofline", "software": True}, "software": True}, ctx
        )
    assert info.value.path == "latency.software"
    pipelined = LatencyContext(LLAMA, "H100", 1, parallel=Parallelism(pp=2))
    with pytest.raises(ScenarioError, match="plain tensor-parallel") as info:
        roofline(software=True).from_config({"software": True}, pipelined)
    assert info.value.path == "latency.software"


def test_empty_capture_sizes_mean_every_step_is_eager():
    t = terms(capture_sizes=())
    assert t.graph_size(decode(1)) == 0
    cfg = SoftwareCosts.from_config({"capture_sizes": []}, "latency.software")
    assert cfg is not None and cfg.capture_sizes == ()
