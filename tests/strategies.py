"""Shared hypothesis strategies: small, valid, fast scenarios that still reach the hard corners.

Every scenario has one instance (sometimes two or three behind round-robin routing), explicit
blackbox coefficients, an explicit (usually small) KV cache and at most a few dozen requests, so
one run takes tens of milliseconds. The draws are biased towards the places where a simulator
goes wrong: KV caches small enough to force preemption,
shared prefix groups, chunked prefill (small token budgets), ``long_prefill_token_threshold``,
tiny ``max_num_seqs``, prompts near ``max_model_len`` (enqueue guards) and server-filled
``max_output_tokens: 0`` budgets (length-capped requests); now and then a CPU KV tier or
speculative decoding.
"""

from __future__ import annotations

from typing import Any

from conftest import scenario_dict
from hypothesis import strategies as st

BLOCK_SIZES = (1, 2, 4, 8, 16)


@st.composite
def latency_coefficients(draw) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """(alpha, beta) for the blackbox model; fractional values exercise the truncation to µs."""
    alpha = (
        draw(st.sampled_from([0, 0, 150, 777.5])),
        draw(st.sampled_from([0, 0, 0.5, 2])),
        draw(st.sampled_from([0, 0, 40, 333.3])),
    )
    beta = (
        draw(st.integers(50, 3000)),
        draw(st.sampled_from([0, 0.25, 1, 3.5])),
        draw(st.sampled_from([0, 5, 17.5, 60])),
    )
    return alpha, beta


FRACTIONS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)


@st.composite
def length_distribution(draw, high: int) -> Any:
    """A token-length distribution section with values in [1, high], spread over the range.

    Bounds are drawn as fractions of ``high`` (rather than raw integers, which hypothesis pulls
    towards 1), so long prompts and outputs are as common as short ones.
    """

    def at(fraction: float) -> int:
        return max(1, round(fraction * high))

    a = at(draw(st.sampled_from(FRACTIONS)))
    if draw(st.booleans()):
        return a
    b = at(draw(st.sampled_from(FRACTIONS)))
    return {"type": "uniform", "min": min(a, b), "max": max(a, b)}


@st.composite
def scenarios(
    draw,
    *,
    max_requests: int = 60,
    horizon: bool = False,
    kv_every_step: bool = False,
) -> dict[str, Any]:
    """A small random scenario dict (see the module docstring).

    Half the draws are *under pressure*: many concurrent requests with long prompts and outputs
    on a cache that holds one or two of them, which is what makes preemption common.
    """
    pressure = draw(st.booleans())
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    max_model_len = draw(st.integers(max(2, block_size), 320))
    # The cache holds one to four maximum-length requests.
    factor = draw(st.sampled_from([1, 1.5] if pressure else [1, 1.5, 2, 4]))
    kv_blocks = max(1, int(-(-max_model_len // block_size) * factor))
    chunked = draw(st.sampled_from([True, True, True, False]))
    if not chunked:
        budget = draw(st.integers(max_model_len, 2 * max_model_len))
    elif pressure:
        budget = draw(st.integers(16, max(16, 4 * max_model_len)))
    else:
        budget = draw(st.one_of(st.integers(1, 16), st.integers(16, max(16, 4 * max_model_len))))
    threshold = draw(st.one_of(st.just(0), st.integers(1, max_model_len)))
    max_num_seqs = draw(
        st.integers(4, 32) if pressure else st.one_of(st.integers(1, 3), st.integers(4, 32))
    )

    prefix = None
    prefix_tokens = 0
    if max_model_len > 4 and draw(st.booleans()):
        prefix_tokens = draw(st.integers(1, max_model_len // 2))
        prefix = {"tokens": prefix_tokens, "groups": draw(st.integers(1, 3))}
    # Prompts and outputs scale with the context limit; a few prompts exceed it (the enqueue
    # guards drop them), most fit.
    room = max(1, max_model_len - prefix_tokens)
    if pressure:
        input_high = max(1, room // 2)
        output_high = max(1, room // 2)
        max_output_tokens = draw(st.sampled_from(["oracle", 0]))
        rate = draw(st.sampled_from([1000.0, 5000.0]))
        requests = draw(st.integers(min(8, max_requests), max_requests))
    else:
        input_high = draw(st.sampled_from([max(1, room // 4), max(1, room // 2), room + 2]))
        output_high = draw(
            st.sampled_from([1, 4, max(1, max_model_len // 4), max(1, max_model_len // 2)])
        )
        max_output_tokens = draw(st.sampled_from(["oracle", "oracle", 0, 8, 64]))
        rate = draw(st.sampled_from([20.0, 200.0, 1000.0, 5000.0]))
        requests = draw(st.integers(1, max_requests))
    inputs = length_distribution(input_high)
    outputs = length_distribution(output_high)

    extra: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:  # a CPU tier: evicted prefix blocks come back by copy
        extra["kv_cpu_blocks"] = max(1, int(kv_blocks * draw(st.sampled_from([0.5, 2]))))
        extra["kv_cpu_latency"] = draw(st.sampled_from([0, 100]))
    if draw(st.integers(0, 4)) == 0:  # speculative decoding: several tokens per decode step
        extra["speculative"] = {
            "draft_tokens": draw(st.integers(1, 4)),
            "acceptance_rate": draw(st.sampled_from([0.3, 0.7, 0.95])),
        }

    if "speculative" not in extra and draw(st.integers(0, 3)) == 0:
        # preemption by swapping (vLLM v0, DistServe); a small swap space fills and falls back
        # to recompute (the default model's block of 4 tokens is 640 KiB)
        extra["preemption_mode"] = "swap"
        extra["swap_space"] = draw(st.sampled_from(["1MiB", "8MiB", 4]))
    if not chunked and "speculative" not in extra and draw(st.booleans()):
        extra["prefill_first"] = True  # vLLM v0: prefill-only steps first, whole prompts
        threshold = 0
    alpha, beta = draw(latency_coefficients())
    arrival = draw(
        st.sampled_from(["poisson", "poisson", "constant", {"process": "gamma", "cv": 3}])
    )
    horizon_value = None
    if horizon:
        # mostly while requests are still arriving, sometimes early or long after
        arrivals_us = requests / rate * 1e6
        fraction = draw(st.sampled_from([0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 4.0]))
        horizon_value = f"{max(1, int(fraction * arrivals_us)) + draw(st.integers(0, 999))}us"
    return scenario_dict(
        requests=requests,
        rate=rate,
        input=draw(inputs),
        output=draw(outputs),
        arrival=arrival,
        prefix=prefix,
        max_output_tokens=max_output_tokens,
        kv_blocks=kv_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.sampled_from([True, True, True, False])),
        alpha=alpha,
        beta=beta,
        horizon=horizon_value,
        kv_every_step=kv_every_step,
        seed=draw(st.integers(0, 2**32 - 1)),
        instances=draw(st.sampled_from([1, 1, 1, 1, 2, 3])),
        **extra,
    )


# ---------------------------------------------------------------------- disaggregated clusters


@st.composite
def pd_scenarios(draw, *, mixed_only: bool = False) -> dict[str, Any]:
    """A random engine scenario laid out as prefill, decode and mixed pools of random sizes,
    with a random decider, per-pool KV capacities, link topology, sharing rule, bandwidth,
    base latency and decode-full rule. ``mixed_only``: always at least one mixed pool instance
    beside a decode or prefill pool (mixed instances both reserve KV for incoming transfers and
    start transfers from their own prefills, at step boundaries of each other)."""
    data = draw(scenarios(max_requests=40, horizon=draw(st.booleans()), kv_every_step=True))
    data.pop("cluster", None)
    data["engine"].pop("speculative", None)  # speculation and PD are not combined here
    data["engine"].pop("prefill_first", None)  # nor is vLLM v0's scheduler
    mixed = draw(st.integers(1 if mixed_only else 0, 2))
    prefill = draw(st.integers(0 if mixed else 1, 2))
    decode = draw(st.integers(0 if mixed else 1, 2))
    pools: dict[str, Any] = {}
    for role, count in (("prefill", prefill), ("decode", decode), ("mixed", mixed)):
        if count:
            pools[role] = {"instances": count}
    if "decode" in pools and draw(st.booleans()):
        # a smaller decode cache (at least one maximum-length prompt): KV-full drops at start
        engine = data["engine"]
        blocks = -(-engine["max_model_len"] // engine["block_size"])
        pools["decode"]["engine"] = {"kv_blocks": max(blocks, engine["kv_blocks"] // 2)}
    deciders = ["always", "always", "never", "prefix-threshold", "direct-to-decode"]
    decider: Any = draw(st.sampled_from(deciders))
    if decider in ("prefix-threshold", "direct-to-decode"):
        decider = {"decider": decider, "threshold": draw(st.integers(0, 64))}
    data["policies"] = {
        "disaggregation": decider,
        "routing": draw(st.sampled_from(["round-robin", "random", "least-loaded"])),
    }
    data["cluster"] = {
        "pools": pools,
        "cache_signal_delay": draw(st.sampled_from([0, "1ms"])),
        "kv_transfer": {
            "bandwidth": draw(st.sampled_from(["1MB/s", "20MB/s", "1GB/s", "100GB/s"])),
            "base_latency": draw(st.sampled_from([0, "10us", "1ms"])),
            "topology": draw(st.sampled_from(["shared", "pair", "prefill-nic", "decode-nic"])),
            "sharing": draw(
                st.sampled_from(["processor-sharing", "processor-sharing", "at-start"])
            ),
            "decode_full": draw(st.sampled_from(["wait", "wait", "backpressure", "drop"])),
            "blocking": draw(st.booleans()),
            "decode_queue_limit": draw(st.sampled_from([0, 0, 0.05, 0.5])),
        },
    }
    return data


# ---------------------------------------------------------------------- KV cache operations

# A small pool of content hashes, so registrations collide and lookups hit.
block_hashes = st.integers(0, 11)


# ---------------------------------------------------------------------- engine-level workloads


@st.composite
def engine_workloads(draw, max_requests: int = 24) -> tuple[dict[str, Any], list[dict[str, int]]]:
    """(EngineLimits keyword arguments, requests) for driving one Engine by hand.

    Each request is ``{arrival, prompt, output, max_output_tokens, group, prefix}`` with integer
    arrival times in µs; steps take about a millisecond, so arrivals overlap running batches.
    """
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(max(2, block_size), 160))
    factor = draw(st.sampled_from([1, 1, 1.5, 2, 4]))  # caches of one to four longest requests
    total_blocks = max(1, int(-(-max_model_len // block_size) * factor))
    chunked = draw(st.sampled_from([True, True, True, False]))
    budget = (
        draw(st.integers(1, 2 * max_model_len))
        if chunked
        else draw(st.integers(max_model_len, 2 * max_model_len))
    )
    limits = {
        "max_num_seqs": draw(st.integers(1, 8)),
        "max_num_batched_tokens": budget,
        "block_size": block_size,
        "total_blocks": total_blocks,
        "max_model_len": max_model_len,
        "long_prefill_token_threshold": draw(st.one_of(st.just(0), st.integers(1, max_model_len))),
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": draw(st.sampled_from([True, True, True, False])),
    }
    prefix = draw(st.sampled_from([0, 0, max_model_len // 4, max_model_len // 2]))
    groups = draw(st.integers(1, 3))
    requests = []
    t = 0
    for _ in range(draw(st.integers(1, max_requests))):
        t += draw(st.sampled_from([0, 0, 100, 700, 1500, 5000]))
        grouped = prefix > 0 and draw(st.booleans())
        own = draw(st.integers(1, max(1, max_model_len // 2)))
        requests.append(
            {
                "arrival": t,
                "prompt": (prefix if grouped else 0) + own,
                "output": draw(st.integers(1, max(1, max_model_len // 2))),
                "max_output_tokens": draw(st.sampled_from([0, 0, 4, max_model_len])),
                "group": draw(st.integers(0, groups - 1)) if grouped else -1,
                "prefix": prefix if grouped else 0,
            }
        )
    return limits, requests
