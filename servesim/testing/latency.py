"""``check_latency_model``: the :class:`~servesim.latency.base.LatencyModel` contract."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np

from servesim.latency.base import BatchSummary, LatencyModel
from servesim.testing.probes import _is_int


def _prefill(tokens: int, context: int = 0) -> tuple[int, int, int]:
    """One prefill item computing ``tokens`` new tokens after ``context`` cached ones."""
    return (context, tokens, context + tokens)


def _batch(prefills: Sequence[tuple[int, int, int]] = (), decodes: int = 0, context_each: int = 0):
    return BatchSummary(
        sum(p[1] for p in prefills), tuple(prefills), decodes, decodes * context_each
    )


def _typical_batches() -> list[BatchSummary]:
    return [
        BatchSummary(),
        _batch([_prefill(1)]),
        _batch([_prefill(512)]),
        _batch([_prefill(2048, context=4096)]),
        _batch(decodes=1, context_each=100),
        _batch(decodes=64, context_each=1500),
        _batch([_prefill(256), _prefill(1024, context=512)], decodes=32, context_each=800),
        _batch([_prefill(8192)], decodes=256, context_each=4000),
    ]


def _sequences() -> dict[str, list[BatchSummary]]:
    """Batches ordered by growing work; step time must not decrease along each sequence."""
    prefill_sizes = [1, 2, 16, 128, 512, 2048, 8192, 32768]
    decode_counts = [1, 2, 4, 8, 32, 128, 512]
    return {
        "non-decreasing in prefill tokens": [_batch([_prefill(p)]) for p in prefill_sizes],
        "non-decreasing in prefill tokens (with decodes running)": [
            _batch([_prefill(p)], decodes=16, context_each=1000) for p in prefill_sizes
        ],
        "non-decreasing in decode requests": [
            _batch(decodes=d, context_each=1000) for d in decode_counts
        ],
        "non-decreasing in decode requests (short contexts)": [
            _batch(decodes=d, context_each=1) for d in decode_counts
        ],
        "non-decreasing in batch size": [
            _batch([_prefill(64)] * n, decodes=n, context_each=500) for n in range(0, 65, 4)
        ],
    }


def check_latency_model(model: LatencyModel) -> None:
    """Assert that ``model`` meets the :class:`~servesim.latency.base.LatencyModel` contract.

    Checked: step times are deterministic integers ≥ 1 (empty batch included) and never decrease
    when a batch gains prefill tokens, decode requests or requests; ``queueing_time_us`` returns
    an integer ≥ 0; ``output_token_time_us`` and ``post_decode_overhead_us`` are integers ≥ 0;
    ``decode_steps_us(n, ctx, k)`` is an int64 array equal to calling ``step_time_us`` step by
    step; ``describe()`` is a JSON-serialisable dict.
    """
    who = type(model).__name__

    def fail(prop: str, detail: str) -> AssertionError:
        return AssertionError(f"check_latency_model({who}): {prop}: {detail}")

    def step(batch: BatchSummary, prop: str) -> int:
        try:
            value = model.step_time_us(batch)
        except Exception as exc:  # a contract check reports, it does not crash
            raise fail(prop, f"step_time_us({batch!r}) raised {exc!r}") from exc
        if not _is_int(value):
            raise fail(
                "step_time_us returns an int",
                f"step_time_us({batch!r}) returned {value!r} ({type(value).__name__})",
            )
        if value < 1:
            raise fail("step_time_us is at least 1 µs", f"step_time_us({batch!r}) returned {value}")
        return int(value)

    # 1. integers >= 1, deterministic (same object twice and an equal copy).
    for batch in _typical_batches():
        first = step(batch, "step_time_us returns an int >= 1")
        again = step(batch, "step_time_us is deterministic")
        copy = BatchSummary(
            batch.prefill_tokens,
            tuple(batch.prefill_items),
            batch.decode_requests,
            batch.decode_context,
        )
        other = step(copy, "step_time_us is deterministic")
        if not first == again == other:
            raise fail(
                "step_time_us is deterministic",
                f"step_time_us({batch!r}) gave {first}, then {again}, then {other} for an equal copy",
            )

    # 2. monotone sequences.
    for prop, sequence in _sequences().items():
        previous_batch, previous = None, None
        for batch in sequence:
            value = step(batch, prop)
            if previous is not None and value < previous:
                raise fail(
                    prop,
                    f"step_time_us({batch!r}) = {value} < {previous} = step_time_us({previous_batch!r})",
                )
            previous_batch, previous = batch, value

    # 3. alpha overheads.
    for prompt in (1, 16, 512, 4096, 32768):
        try:
            q = model.queueing_time_us(prompt)
        except Exception as exc:
            raise fail("queueing_time_us", f"queueing_time_us({prompt}) raised {exc!r}") from exc
        if not _is_int(q) or q < 0:
            raise fail(
                "queueing_time_us returns an int >= 0", f"queueing_time_us({prompt}) returned {q!r}"
            )
        if q != model.queueing_time_us(prompt):
            raise fail("queueing_time_us is deterministic", f"queueing_time_us({prompt}) changed")
    for attribute in ("output_token_time_us", "post_decode_overhead_us"):
        overhead = getattr(model, attribute, None)
        if not _is_int(overhead) or overhead < 0:
            raise fail(f"{attribute} is an int >= 0", f"{attribute} = {overhead!r}")

    # 4. fast-forward helper equals the step-by-step path.
    # Contexts grow by n tokens per step; the long runs let context-sensitive models show drift,
    # and the last ones carry per-request contexts across common sliding windows (4096, 8192).
    cases = (
        (1, 0, 1),
        (1, 100, 5),
        (8, 8 * 500, 17),
        (32, 32 * 1000, 200),
        (256, 256 * 3000, 64),
        (3, 30, 0),
        (4, 4 * 3500, 1200),
        (2, 2 * 8000, 400),
    )
    for n, ctx, k in cases:
        _check_decode_steps(model, n, ctx, k, fail)

    # 5. describe() can go into summary.json.
    try:
        description = model.describe()
        json.dumps(description)
    except Exception as exc:
        raise fail("describe() is JSON-serialisable", repr(exc)) from exc
    if not isinstance(description, dict):
        raise fail("describe() returns a dict", f"got {type(description).__name__}")


def _check_decode_steps(
    model: LatencyModel, n: int, ctx: int, k: int, fail: Callable[[str, str], AssertionError]
) -> None:
    prop = "decode_steps_us equals step-by-step step_time_us"
    call = f"decode_steps_us({n}, {ctx}, {k})"
    try:
        got = model.decode_steps_us(n, ctx, k)
    except Exception as exc:
        raise fail(prop, f"{call} raised {exc!r}") from exc
    if not isinstance(got, np.ndarray) or got.dtype != np.int64 or got.shape != (k,):
        shape = getattr(got, "shape", None)
        dtype = getattr(got, "dtype", type(got).__name__)
        raise fail(prop, f"{call} must return an int64 array of shape ({k},), got {dtype} {shape}")
    expected = [model.step_time_us(BatchSummary(0, (), n, ctx + i * n)) for i in range(k)]
    for i, (a, b) in enumerate(zip(got.tolist(), expected, strict=True)):
        if a != b:
            raise fail(
                prop,
                f"{call}[{i}] = {a} but step_time_us(BatchSummary(decode_requests={n}, "
                f"decode_context={ctx + i * n})) = {b}",
            )
