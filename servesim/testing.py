"""Checks a plugin author runs on their own code: does it honour servesim's contracts?

Like scikit-learn's ``check_estimator`` or Gymnasium's ``check_env``::

    from servesim.testing import check_latency_model

    def test_my_model_meets_the_contract():
        check_latency_model(MyLatencyModel(...))

Each check raises ``AssertionError`` naming the property that failed and the inputs that broke it.
servesim runs the same checks on every built-in: ``check_latency_model`` for latency models,
``check_router`` for routing policies and ``check_scorer`` for the weighted router's scorers.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import numpy as np

from servesim.latency.base import BatchSummary, LatencyModel
from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES, InstanceSnapshot

__all__ = ["check_latency_model", "check_router", "check_scorer", "ProbeRequest", "OracleReadError"]


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


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


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


# ------------------------------------------------------------------ control-plane policies


class OracleReadError(AssertionError):
    """A policy read a request's output length, which no control-plane decision may see (INV-9)."""


class ProbeRequest:
    """A request as a control-plane policy may see it (``servesim.policies.snapshot``), whose
    output-length fields raise :class:`OracleReadError` when read. Use it to unit-test a policy::

        r = ProbeRequest(0, prompt_tokens=512, block_ids=[11, 12], slo_class="critical")
    """

    __slots__ = (
        "id",
        "arrival_us",
        "prompt_tokens",
        "max_output_tokens",
        "prefix_group",
        "prefix_tokens",
        "slo_class",
        "client",
        "tenant",
        "priority",
        "block_size",
        "_block_ids",
    )

    def __init__(
        self,
        id: int,
        arrival_us: int = 0,
        prompt_tokens: int = 256,
        *,
        block_ids: Sequence[int] = (),
        prefix_group: int = -1,
        slo_class: str = "standard",
        priority: int | None = None,
        tenant: str = "",
        block_size: int = 16,
        max_output_tokens: int = 0,
        client: str = "default",
    ):
        self.id = id
        self.arrival_us = arrival_us
        self.prompt_tokens = prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.prefix_group = prefix_group
        self.prefix_tokens = len(block_ids) * block_size
        self.slo_class = slo_class
        self.client = client
        self.tenant = tenant
        self.priority = DEFAULT_SLO_PRIORITIES.get(slo_class, 3) if priority is None else priority
        self.block_size = block_size
        self._block_ids = list(block_ids)

    def prompt_block_ids(self) -> list[int]:
        return list(self._block_ids)

    # The engine's private knowledge: a policy reading any of these breaks INV-9.
    @property
    def oracle_output_tokens(self) -> int:
        raise OracleReadError("a policy read request.oracle_output_tokens (the output length)")

    @property
    def target_output(self) -> int:
        raise OracleReadError(
            "a policy read request.target_output (derived from the output length)"
        )

    @property
    def finish_step(self) -> int:
        raise OracleReadError("a policy read request.finish_step (derived from the output length)")

    def __repr__(self) -> str:
        return (
            f"ProbeRequest(id={self.id}, prompt_tokens={self.prompt_tokens}, "
            f"block_ids={self._block_ids}, slo_class={self.slo_class!r})"
        )


def _leading_match(cache: frozenset[int]) -> Callable[[Sequence[int]], int]:
    def cached(block_ids: Sequence[int]) -> int:
        n = 0
        for block in block_ids:
            if block not in cache:
                break
            n += 1
        return n

    return cached


def _snapshot_fields(s: InstanceSnapshot) -> tuple:
    return (
        s.index,
        s.queue_depth,
        s.batch_size,
        s.kv_utilization,
        s.free_kv_blocks,
        s.total_kv_blocks,
        s.in_flight,
        s.preemptions,
    )


def _policy_cases(
    seed: int, num_instances: int, decisions: int
) -> list[tuple[ProbeRequest, list[InstanceSnapshot]]]:
    """Random decisions over ``num_instances`` instances: mostly every instance, sometimes a
    subset (so positions differ from indices); small load values (plenty of ties); a few prefix
    groups whose leading blocks the instances' caches hold in part."""
    rng = np.random.default_rng(seed)
    groups = [[1000 * g + j for j in range(int(rng.integers(1, 12)))] for g in range(4)]
    classes = sorted(DEFAULT_SLO_PRIORITIES)
    cases = []
    for d in range(decisions):
        if num_instances > 1 and rng.random() < 0.3:
            size = int(rng.integers(1, num_instances))
            indices = sorted(rng.choice(num_instances, size=size, replace=False).tolist())
        else:
            indices = list(range(num_instances))
        snapshots = []
        for i in indices:
            total = 1000
            kv = float(rng.choice([0.0, 0.25, 0.5, 0.9, 1.0]))
            cache = frozenset(
                b
                for g in groups
                for b in g[: int(rng.integers(0, len(g) + 1))]
                if rng.random() < 0.5
            )
            snapshots.append(
                InstanceSnapshot(
                    i,
                    queue_depth=int(rng.integers(0, 4)),
                    batch_size=int(rng.integers(0, 4)),
                    kv_utilization=kv,
                    free_kv_blocks=int(total * (1 - kv)),
                    total_kv_blocks=total,
                    in_flight=int(rng.integers(0, 3)),
                    preemptions=int(rng.integers(0, 2)),
                    cached_prefix=_leading_match(cache),
                )
            )
        prompt = int(rng.integers(1, 400))
        group = int(rng.integers(-1, len(groups)))
        block_ids = groups[group][: prompt // 16] if group >= 0 else []
        slo = classes[int(rng.integers(len(classes)))]
        request = ProbeRequest(
            d,
            arrival_us=1000 * d,
            prompt_tokens=prompt,
            block_ids=block_ids,
            prefix_group=group,
            slo_class=slo,
            tenant=f"t{int(rng.integers(3))}",
        )
        cases.append((request, snapshots))
    return cases


def check_router(router_factory: Callable[[], Any], seed: int = 0) -> None:
    """Assert that the routers ``router_factory()`` builds meet the routing contract.

    Checked, over random decision sequences (all instances or a subset of them): ``route``
    returns the ``index`` of one of the snapshots it was given, as an int; it never reads a
    request's output length (the requests are :class:`ProbeRequest`); it does not modify the
    snapshots; and two routers built by the factory and bound with equally seeded generators
    make identical decisions (all randomness comes from the ``rng`` given to ``bind``). The
    router process's call order is followed: ``bind(n, rng)`` once, then ``route`` and
    ``observe(request, chosen)`` per request.
    """
    who = "check_router"

    def fail(prop: str, detail: str) -> AssertionError:
        return AssertionError(f"{who}({name}): {prop}: {detail}")

    def run(router: Any, num_instances: int, cases: list) -> list[int]:
        router.bind(num_instances, np.random.default_rng(seed))
        observe = getattr(router, "observe", None)
        decisions = []
        for request, snapshots in cases:
            before = [_snapshot_fields(s) for s in snapshots]
            try:
                chosen = router.route(request, snapshots)
            except OracleReadError as exc:
                raise fail(
                    "route() never reads a request's output length (INV-9)", str(exc)
                ) from exc
            except Exception as exc:  # a contract check reports, it does not crash
                raise fail(
                    "route() works on valid snapshots",
                    f"route({request!r}, {snapshots!r}) raised {exc!r}",
                ) from exc
            if not _is_int(chosen):
                raise fail(
                    "route() returns an int",
                    f"route({request!r}, ...) returned {chosen!r} ({type(chosen).__name__})",
                )
            present = [s.index for s in snapshots]
            if chosen not in present:
                raise fail(
                    "route() returns the index of a given snapshot",
                    f"returned {chosen} for candidates {present} (of {num_instances} instances)",
                )
            if [_snapshot_fields(s) for s in snapshots] != before:
                raise fail("route() leaves the snapshots unchanged", f"at request {request!r}")
            if observe is not None:
                try:
                    observe(request, int(chosen))
                except OracleReadError as exc:
                    raise fail(
                        "observe() never reads a request's output length (INV-9)", str(exc)
                    ) from exc
            decisions.append(int(chosen))
        return decisions

    first = router_factory()
    name = type(first).__name__
    for num_instances in (1, 2, 5):
        cases = _policy_cases(seed + num_instances, num_instances, 150)
        one = run(first if num_instances == 1 else router_factory(), num_instances, cases)
        two = run(router_factory(), num_instances, cases)
        if one != two:
            at = next(i for i, (a, b) in enumerate(zip(one, two)) if a != b)
            raise fail(
                "decisions are deterministic for a given rng seed",
                f"two routers bound with default_rng({seed}) chose {one[at]} and {two[at]} at "
                f"decision {at} ({num_instances} instances)",
            )


def check_scorer(scorer: Any, seed: int = 0) -> None:
    """Assert that ``scorer`` meets the scorer contract of the weighted router.

    Checked, over random decision sequences: ``score`` returns one finite number in [0, 1] per
    snapshot; it never reads a request's output length (:class:`ProbeRequest`) nor modifies the
    snapshots; ``observe(request, chosen_index)`` accepts each decision; and, when the scorer
    can be deep-copied, a copy fed the same decisions gives the same scores (determinism).
    """
    name = type(scorer).__name__

    def fail(prop: str, detail: str) -> AssertionError:
        return AssertionError(f"check_scorer({name}): {prop}: {detail}")

    try:
        twin = copy.deepcopy(scorer)
    except Exception:  # not copyable: skip the determinism comparison
        twin = None

    def run(target: Any, cases: list) -> list[list[float]]:
        rng = np.random.default_rng(seed)
        out = []
        for request, snapshots in cases:
            before = [_snapshot_fields(s) for s in snapshots]
            try:
                scores = list(target.score(request, snapshots))
            except OracleReadError as exc:
                raise fail(
                    "score() never reads a request's output length (INV-9)", str(exc)
                ) from exc
            except Exception as exc:
                raise fail(
                    "score() works on valid snapshots",
                    f"score({request!r}, {snapshots!r}) raised {exc!r}",
                ) from exc
            if len(scores) != len(snapshots):
                raise fail(
                    "score() returns one score per snapshot",
                    f"{len(scores)} scores for {len(snapshots)} snapshots",
                )
            for value, s in zip(scores, snapshots):
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
                if not ok or not math.isfinite(value) or not 0.0 <= value <= 1.0:
                    raise fail(
                        "scores are finite numbers in [0, 1]",
                        f"score({request!r}, ...) gave {value!r} for {s!r}",
                    )
            if [_snapshot_fields(s) for s in snapshots] != before:
                raise fail("score() leaves the snapshots unchanged", f"at request {request!r}")
            chosen = snapshots[int(rng.integers(len(snapshots)))].index
            try:
                target.observe(request, chosen)
            except OracleReadError as exc:
                raise fail(
                    "observe() never reads a request's output length (INV-9)", str(exc)
                ) from exc
            out.append([float(v) for v in scores])
        return out

    for num_instances in (1, 2, 5):
        cases = _policy_cases(seed + num_instances, num_instances, 150)
        first = run(scorer, cases)
        if twin is not None:
            second = run(twin, cases)
            if first != second:
                at = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
                raise fail(
                    "scores are deterministic",
                    f"a copy fed the same decisions scored {second[at]} instead of {first[at]} "
                    f"at decision {at} ({num_instances} instances)",
                )
            twin = copy.deepcopy(scorer) if num_instances < 5 else None
