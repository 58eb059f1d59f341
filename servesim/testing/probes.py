"""What the policy checks feed a policy: requests that refuse to reveal their output length
(INV-9), and random instance snapshots with plenty of ties."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import numpy as np

from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES, REQUEST_FIELDS, InstanceSnapshot


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class OracleReadError(AssertionError):
    """A policy read a request's output length, which no control-plane decision may see (INV-9)."""


class ProbeRequest:
    """A request as a control-plane policy may see it (``servesim.policies.snapshot``), whose
    output-length fields raise :class:`OracleReadError` when read. Use it to unit-test a policy::

        r = ProbeRequest(0, prompt_tokens=512, block_ids=[11, 12], slo_class="critical")
    """

    __slots__ = (*REQUEST_FIELDS, "_block_ids")

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


def _failer(check: str, target: Any) -> Callable[[str, str], AssertionError]:
    name = getattr(target, "__name__", None) or type(target).__name__

    def fail(prop: str, detail: str) -> AssertionError:
        return AssertionError(f"{check}({name}): {prop}: {detail}")

    return fail
