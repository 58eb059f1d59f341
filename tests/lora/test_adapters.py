"""LoRA adapters on one engine: loads charged in the step, LRU slots, vLLM v1's max_loras rule."""

from __future__ import annotations

from servesim.components.adapters import attach_lora
from servesim.components.engine import Engine, EngineLimits
from servesim.components.request import RUNNING, WAITING, Request
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.scenario.lora import LoRAConfig
from tests.components.test_cpu_tier import run_alone  # enqueue, step until it finishes

MB = 1_000_000


def config(max_loras: int = 2, max_cpu: int = 2, sizes: dict | None = None) -> LoRAConfig:
    """Adapters of 50 MB; no kernel time (flops and slot bytes 0), so only loads show."""
    sizes = sizes or {"a": 50 * MB, "b": 50 * MB, "c": 50 * MB}
    return LoRAConfig(
        max_loras=max_loras,
        max_cpu_loras=max_cpu,
        adapters={name: 16 for name in sizes},
        pcie_bytes_s=25e9,
        disk_bytes_s=2e9,
        load_latency_us=1000,
        adapter_bytes=sizes,
        shard_bytes=sizes,
    )


def engine(lora: LoRAConfig | None) -> Engine:
    limits = EngineLimits(
        max_num_seqs=8, max_num_batched_tokens=256, block_size=4, total_blocks=200
    )
    e = Engine(limits, BlackboxLatencyModel(alpha=(0, 0, 0), beta=(1000.0, 1.0, 10.0)))
    if lora is not None:
        attach_lora(e, lora, gpu=_NoGPU())
    return e


class _NoGPU:
    tflops_bf16 = 1000.0
    bandwidth_tbs = 3.35


def request(rid: int, adapter: str, now: int = 0, output: int = 3) -> Request:
    r = Request(rid, now, 16, output, block_size=4)
    r.adapter = adapter
    return r


def test_an_adapter_load_is_paid_by_the_step_that_first_needs_it():
    """A 50 MB adapter not yet in CPU memory: read from disk at 2 GB/s (50e6 / 2e9 s = 25,000
    µs), copied over PCIe at 25 GB/s (50e6 / 25e9 s = 2,000 µs), plus the 1,000 µs floor:
    28,000 µs more in its first step than the same step without adapters. A second request with
    the same adapter finds it in its GPU slot: no load."""
    _, plain = run_alone(engine(None), request(0, ""), 0)
    e = engine(config())
    t, first = run_alone(e, request(0, "a"), 0)
    assert first[0] - plain[0] == 28_000
    assert first[1:] == plain[1:]
    _, again = run_alone(e, request(1, "a", t), t)
    assert again == plain
    assert e._lora.log == [(0, "a", 28_000, 1)]
    # the step log holds the charged step (what the auditor's INV-LORA-3 reads)
    assert e.log.as_arrays()["dt_us"][0] == plain[0] + 28_000


def test_an_adapter_in_cpu_memory_costs_only_the_copy():
    """max_cpu_loras 3 keeps a, evicted from its GPU slot, in CPU memory: reloading it costs
    2,000 + 1,000 µs, no disk read."""
    e = engine(config(max_loras=1, max_cpu=3))
    t = 0
    for rid, name in enumerate(("a", "b", "a")):
        t, _ = run_alone(e, request(rid, name, t), t)
    assert [cost for _, _, cost, _ in e._lora.log] == [28_000, 28_000, 3_000]
    assert e._lora.evictions == 2 and e._lora.disk_loads == 2


def test_the_least_recently_used_slot_is_given_up():
    """Two slots: a, b loaded; b used again; c then evicts a (the least recently used)."""
    e = engine(config(max_loras=2, max_cpu=3))
    t = 0
    for rid, name in enumerate(("a", "b", "b", "c")):
        t, _ = run_alone(e, request(rid, name, t), t)
    assert list(e._lora.gpu) == ["b", "c"]
    t, _ = run_alone(e, request(9, "b", t), t)  # resident: no load
    t, _ = run_alone(e, request(10, "a", t), t)  # evicts c, now the least recently used
    assert list(e._lora.gpu) == ["b", "a"]
    assert [name for _, name, _, _ in e._lora.log] == ["a", "b", "c", "a"]


def test_max_loras_skips_a_third_adapter_and_admits_the_requests_behind_it():
    """vLLM v1: with two slots, a batch holding a and b skips the request for c (it keeps its
    place at the head of the queue) and still admits a later request for a."""
    e = engine(config(max_loras=2, max_cpu=3))
    reqs = [
        request(0, "a", output=20),
        request(1, "b", output=20),
        request(2, "c"),
        request(3, "a"),
    ]
    for r in reqs:
        e.add_request(r, 0)
    e.form_batch(0)
    assert [r.state for r in reqs] == [RUNNING, RUNNING, WAITING, RUNNING]
    assert list(e.waiting) == [reqs[2]]
    assert e._lora.batch_adapters() == 2
    assert set(e._lora.gpu) == {"a", "b"}


def test_adapter_sizes_follow_the_model_and_vllms_tensor_parallel_shards():
    """llama-3.1-8b: 32 layers, hidden 4096, 32 heads and 8 KV heads of 128. Attention modules at
    rank 16 in bf16: per layer q (4096 + 4096), k (4096 + 1024), v (4096 + 1024), o (4096 + 4096)
    = 26,624 per unit of rank, so 32 x 26,624 x 16 x 2 = 27,262,976 bytes. At tp 2 each GPU
    keeps A whole and half of B for q, k, v (column-parallel), half of A and all of B for o
    (row-parallel): 32 x (6,144 + 4,608 + 4,608 + 6,144) x 16 x 2 = 22,020,096 bytes."""
    from servesim.latency.modelindex import resolve_model
    from servesim.scenario.lora import parse_lora

    model = resolve_model("llama-3.1-8b", "model")
    one = parse_lora({"adapters": ["a"]}, "engine.lora", model, tp=1)
    two = parse_lora({"adapters": ["a"]}, "engine.lora", model, tp=2)
    assert one.adapter_bytes == {"a": 27_262_976} == one.shard_bytes
    assert two.adapter_bytes == {"a": 27_262_976} and two.shard_bytes == {"a": 22_020_096}
    # flops per token: 2 x rank x width
    assert one.flops_per_token == 2 * 16 * 32 * 26_624


def test_the_gpu_slots_take_their_memory_from_an_auto_kv_cache():
    """Four slots of 27,262,976 bytes = 109,051,904 bytes; a KV block of llama-3.1-8b (16 tokens
    x 32 layers x 2 x 8 heads x 128 x 2 bytes) is 2,097,152 bytes: 52 blocks fewer."""
    from servesim.scenario import load_scenario

    base = {"model": "llama-3.1-8b", "workload": {"preset": "chatbot", "rate": 1, "requests": 1}}
    plain = load_scenario(base).engine.kv_blocks
    lora = {**base, "engine": {"lora": {"max_loras": 4, "adapters": ["a"]}}}
    assert load_scenario(lora).engine.kv_blocks == plain - 52
    lora["engine"]["kv_blocks"] = 1000  # given: kept as given
    assert load_scenario(lora).engine.kv_blocks == 1000
