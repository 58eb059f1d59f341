"""The encode stage in runs: colocated step time, text-only runs unchanged, E-P-D end to end,
and encode conservation through the auditor (property test, and seeded faults it must catch)."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.audit import audit
from servesim.latency.encoder import EncoderSpec, EncoderTimer
from servesim.run import audit_input, simulate
from tests.multimodal.helpers import EPD_POOLS, IMAGES, run

ENCODER = {"preset": "qwen2-vl-vit"}


def _first_step_us(results) -> int:
    return int(results.record.step_logs[0].rows[1])  # row 0: (start_us, dt_us, ...)


def test_colocated_encoder_time_is_added_to_the_first_prefill_step():
    one = {"requests": 1, "rate": 1}
    media = run({"images": 2, "tokens_per_image": 576}, ENCODER, **one)
    # the same prompt length as text only: 200 + 2 x 576 tokens
    text = run(input={"type": "constant", "value": 200 + 1152}, **one)
    s = media.scenario
    timer = EncoderTimer(EncoderSpec.from_config(ENCODER), s.gpu, s.tp)
    assert _first_step_us(media) - _first_step_us(text) == timer.items_us([576, 576])
    row = media.record.encode["log"]
    assert list(row["start_us"]) == [media.requests["first_scheduled_us"][0]]


def test_an_encoder_without_media_changes_nothing():
    plain = run()
    with_encoder = run(encoder=ENCODER)
    summary = dict(with_encoder.summary)
    assert summary.pop("encode")["encoded_requests"] == 0  # the block says nothing was encoded
    assert plain.summary == summary
    assert len(with_encoder.record.encode["log"]["request"]) == 0


def test_epd_end_to_end():
    res = run(IMAGES, ENCODER, pools=EPD_POOLS)
    enc = res.record.encode
    log = enc["log"]
    assert res.summary["completed_requests"] == 40
    assert enc["mode"] == "pool" and len(log["request"]) == len(enc["media_ids"]) > 0
    # qwen3-14b: hidden 5120, bf16 embeddings
    assert set(log["bytes"]) == {1152 * 5120 * 2}
    assert enc["links"][0]["completed"] == len(log["request"])
    r = res.requests
    rows = {int(i): k for k, i in enumerate(r["id"])}
    for k, rid in enumerate(log["request"]):
        row = rows[int(rid)]
        assert log["end_us"][k] <= log["transfer_end_us"][k] <= r["enqueue_us"][row]
        assert r["enqueue_us"][row] <= r["first_scheduled_us"][row]
    # the prefill instance never ran an encoder
    assert enc["encoder_us"] == [0, 0]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    images=st.integers(0, 3),
    tokens=st.integers(16, 1200),
    fraction=st.sampled_from([0.3, 1.0]),
    rate=st.sampled_from([2, 20, 80]),
    pooled=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_encode_conservation_colocated_and_pooled(images, tokens, fraction, rate, pooled, seed):
    media = {"images": images, "tokens_per_image": tokens, "fraction": fraction}
    res = run(media, ENCODER, pools=EPD_POOLS if pooled else None, rate=rate, seed=seed)
    assert audit(audit_input(res.record)) == []
    enc = res.record.encode
    started = set(res.requests["id"][res.requests["first_scheduled_us"] >= 0].tolist())
    media_ids = set(enc["media_ids"].tolist())
    # exactly the requests with media were encoded, once each (media_ids: requests with >= 1 item)
    assert sorted(enc["log"]["request"].tolist()) == sorted(media_ids & started)


def _faulty(record, change):
    data = audit_input(record)
    data.encode = copy.deepcopy(data.encode)
    change(data.encode["log"])
    return {v.invariant for v in audit(data)}


def _duplicate_first(log):
    for name in log:
        log[name] = np.concatenate([log[name], log[name][:1]])


def _drop_first(log):
    for name in log:
        log[name] = log[name][1:]


def test_auditor_catches_seeded_encode_faults():
    colocated = run(IMAGES, ENCODER).record
    pooled = run(IMAGES, ENCODER, pools=EPD_POOLS).record
    assert _faulty(colocated, _duplicate_first) >= {"ENC-1"}
    assert _faulty(colocated, _drop_first) == {"ENC-2"}
    assert _faulty(colocated, lambda log: log["start_us"].__iadd__(1)) == {"ENC-3"}
    assert _faulty(colocated, lambda log: log["tokens"].__isub__(1)) == {"ENC-2"}
    assert _faulty(pooled, lambda log: log["end_us"].__iadd__(10**9)) == {"ENC-3"}
    assert _faulty(pooled, lambda log: log["bytes"].__iadd__(2)) == {"ENC-4"}
    assert _faulty(pooled, lambda log: log["transfer_start_us"].__setitem__(0, -1)) == {"ENC-4"}


def test_media_on_a_trace_replay_keep_its_content_blocks():
    from servesim.run import simulate
    from servesim.scenario.build import build_scenario

    raw = {
        "model": "llama-3.1-8b",
        "cluster": {"instances": 2},
        "encoder": {"item_time": "5ms"},
        "workload": {
            "trace": "mooncake-conv",
            "requests": 60,
            "multimodal": {"audio_seconds": 4, "fraction": 0.5},
        },
    }
    plain = build_scenario({**raw, "workload": {"trace": "mooncake-conv", "requests": 60}})
    res = simulate(build_scenario(raw), progress=False)
    enc = res.record.encode
    assert len(enc["log"]["request"]) == len(enc["media_ids"]) > 0
    assert set(enc["log"]["tokens"]) == {100}  # 4 s x 25 tokens/s
    # end - start: the step's encoder batch, 5 ms per clip
    assert set((enc["log"]["end_us"] - enc["log"]["start_us"]) % 5000) == {0}
    # the trace's own content blocks come first, the clip after them
    from servesim.simcore.rng import RandomStreams

    text = list(plain.workload.requests(RandomStreams(plain.seed)))
    mixed = list(res.scenario.workload.requests(RandomStreams(plain.seed)))
    for a, b in zip(text, mixed):
        assert b.segments[: len(a.segments)] == a.segments


def test_summary_encode_block_is_documented_and_adds_up():
    from pathlib import Path

    outputs = (Path(__file__).parents[2] / "docs" / "reference" / "outputs.md").read_text()
    colocated = run(IMAGES, ENCODER).summary["encode"]
    pooled = run(IMAGES, ENCODER, pools=EPD_POOLS).summary["encode"]
    assert [k for k in pooled if f"`{k}`" not in outputs] == []
    assert colocated["mode"] == "colocated" and pooled["mode"] == "pool"
    for s in (colocated, pooled):
        assert s["encoded_requests"] == s["requests_with_media"] > 0
        assert s["encoded_tokens"] == 1152 * s["encoded_requests"]
    assert colocated["colocated_encoder_ms"] > 0 and colocated["embedding_bytes_moved"] == 0
    assert pooled["embedding_bytes_moved"] == pooled["encoded_tokens"] * 5120 * 2
    assert "encode" not in run().summary


def test_prefill_pool_encoder_and_horizon_cut_runs_are_sound_and_step_exactly():
    cases = [
        # colocated on the prefill pool: the prefill instance encodes, the decode one never does
        {"pools": {"prefill": {"instances": 1}, "decode": {"instances": 1}}},
        # requests still in the encode stage at the horizon count as in transit
        {"pools": {**EPD_POOLS, "encode": {"instances": 1, "max_batch_items": 3}}},
    ]
    for case in cases:
        fast = run(IMAGES, ENCODER, rate=40, **case)
        exact_scenario = fast.scenario.replace(exact_steps=True)
        exact = simulate(exact_scenario, progress=False)
        assert fast.summary["audit"]["passed"] and exact.summary["audit"]["passed"]
        assert fast.summary["ttft_mean_ms"] == exact.summary["ttft_mean_ms"]
        assert fast.summary["encode"]["encoded_requests"] > 0
    cut = run(IMAGES, ENCODER, rate=40, pools=EPD_POOLS).scenario.replace(horizon="600ms")
    res = simulate(cut, progress=False)
    assert res.summary["audit"]["passed"]
    assert res.summary["encode"]["encoded_requests"] <= res.summary["encode"]["requests_with_media"]
