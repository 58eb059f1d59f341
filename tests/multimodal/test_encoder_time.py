"""The encoder's batch time: the analytic roofline case, a measured time, presets and errors."""

from __future__ import annotations

import types

import pytest

from servesim.latency.encoder import ENCODER_PRESETS, EncoderSpec, EncoderTimer
from servesim.simcore.errors import ScenarioError

# 100 TFLOP/s at 50% MFU = 5e7 FLOP/µs; 2 TB/s = 2e6 B/µs
GPU = types.SimpleNamespace(tflops_bf16=100.0, mfu_prefill=0.5, bandwidth_tbs=2.0)


def test_compute_bound_batch_time_by_hand():
    spec = EncoderSpec(params=1e9, layers=10, hidden=1000, merge=1)
    # linear 2 * 1e9 * 100 = 2e11, attention 4 * 10 * 1000 * 100**2 = 4e8: 2.004e11 FLOP
    # / 5e7 FLOP/µs = 4008 µs; the weights (2e9 B / 2e6 B/µs = 1000 µs) are not the bound
    assert EncoderTimer(spec, GPU).items_us([100]) == 4008
    assert EncoderTimer(spec, GPU, tp=2).items_us([100]) == 2004


def test_weight_bound_batch_and_merge():
    spec = EncoderSpec(params=1e9, layers=10, hidden=1000, merge=4)
    # one token = 4 patches: 2 * 1e9 * 4 + 4 * 10 * 1000 * 16 = 8.00064e9 FLOP = 160.0128 µs,
    # below the 1000 µs the weights take to read: the batch is weight-bound
    assert EncoderTimer(spec, GPU).items_us([1]) == 1000
    assert EncoderTimer(spec, GPU).items_us([]) == 0


def test_batch_reads_weights_once():
    spec = EncoderSpec(params=1e9, layers=1, hidden=1, merge=1)
    timer = EncoderTimer(spec, GPU)
    # 20 one-token items: 4e10 FLOP = 800 µs < 1000 µs of weights, read once for the batch
    assert timer.items_us([1] * 20) == 1000


def test_measured_time_per_item():
    spec = EncoderSpec.from_config({"item_time": "20ms"})
    assert EncoderTimer(spec, GPU).items_us([576, 576, 100]) == 60_000


@pytest.mark.parametrize("name", sorted(ENCODER_PRESETS))
def test_presets_parse_and_keep_their_size(name):
    spec = EncoderSpec.from_config({"preset": name})
    assert spec.params == ENCODER_PRESETS[name]["params"]
    assert EncoderSpec.from_config({"preset": name, "layers": 2}).layers == 2


@pytest.mark.parametrize(
    "section, field",
    [
        ({"preset": "nope"}, "encoder.preset"),
        ({"params": 1e9, "layers": 2}, "encoder.hidden"),
        ({"preset": "qwen2-vl-vit", "item_time": "5ms"}, "encoder.item_time"),
        ({"preset": "qwen2-vl-vit", "merge": 0}, "encoder.merge"),
        ({"size": 3}, "encoder"),
    ],
)
def test_bad_encoder_sections_name_the_field(section, field):
    with pytest.raises(ScenarioError) as err:
        EncoderSpec.from_config(section, "encoder")
    assert field in str(err.value)
