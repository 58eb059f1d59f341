"""What a workload produces: a lazy, arrival-ordered stream of request specs (and, for recorded
conversations replayed closed loop, their later rounds: :class:`RecordedSessions`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class RequestSpec:
    """One request as the workload describes it, before it enters the cluster.

    ``prompt_tokens`` includes the shared prefix (``prefix_tokens`` of them, from ``prefix_group``;
    group -1 means no shared prefix). ``output_tokens`` is the oracle output length: only the
    instance's execution reads it, never a control-plane decision. ``max_output_tokens`` is the
    client's budget (0 = let the server fill in max_model_len − prompt).
    """

    __slots__ = (
        "id",
        "arrival_us",
        "prompt_tokens",
        "output_tokens",
        "prefix_group",
        "prefix_tokens",
        "max_output_tokens",
        "slo_class",
        "client",
        "tenant",
        "segments",
        "continued",
        "session",
    )

    def __init__(
        self,
        id: int,
        arrival_us: int,
        prompt_tokens: int,
        output_tokens: int,
        prefix_group: int = -1,
        prefix_tokens: int = 0,
        max_output_tokens: int = 0,
        slo_class: str = "standard",
        client: str = "default",
        tenant: str = "",
        segments: tuple[tuple[int, int], ...] | None = None,
    ):
        self.id = id
        self.arrival_us = arrival_us
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens
        self.max_output_tokens = max_output_tokens
        self.slo_class = slo_class
        self.client = client
        self.tenant = tenant
        # Optional explicit prompt content: ``(segment_id, length)`` runs whose lengths sum to
        # ``prompt_tokens``. Equal segment ids mean equal tokens, so prompts that share leading
        # segments share KV blocks (e.g. Mooncake hash ids). Use ids from ``trace_segment(...)``.
        self.segments = segments
        # True when a later request's prompt contains this one's prompt and answer (a session's
        # next round): the simulator then keeps its KV blocks findable after it finishes
        self.continued = False
        # The recorded session this request opens (RecordedSessions), -1 for none: the cluster
        # then sends the session's later rounds itself, each after the one before it completed
        self.session = -1

    def __repr__(self) -> str:  # noqa: D105
        return (
            f"RequestSpec(id={self.id}, arrival_us={self.arrival_us}, prompt={self.prompt_tokens}, "
            f"output={self.output_tokens}, prefix_group={self.prefix_group}, prefix={self.prefix_tokens})"
        )


TRACE_SEGMENT_BASE = 1 << 40


def trace_segment(block_id: int) -> int:
    """Segment id for a trace's content block id (disjoint from prefix-group and request ids)."""
    return -(TRACE_SEGMENT_BASE + int(block_id))


class RecordedSessions:
    """Recorded conversations replayed closed loop (a trace's ``session_mode: closed-loop``).

    The workload's request stream holds each session's first round only, its ``spec.session`` set
    to the session id (0, 1, ... in the order the first rounds arrive). The cluster sends round
    ``i`` >= 1 of session ``s`` :meth:`think_us` after round ``i - 1`` completed, as
    :meth:`spec` describes it; a round that fails ends its session. A round whose prompt holds the
    conversation so far (:meth:`new_turn` > 0) is sent as that conversation -- the previous
    round's prompt and answer, so its blocks can be prefix-cache hits -- followed by a new turn.

    ``rounds[s]`` is session ``s``'s number of rounds (sessions differ, unlike generated ones).
    Round ``i`` >= 1 of session ``s`` is entry ``start[s] + i - 1`` of the per-round lists.
    """

    def __init__(
        self,
        counts: Sequence[int],
        think_us: Sequence[int],
        new_turn: Sequence[int],
        make_specs: Callable[[], list[RequestSpec]],
        description: dict[str, Any],
    ):
        self.rounds = dict(enumerate(counts))
        self.start = [0] * len(counts)
        position = 0
        for s, count in enumerate(counts):
            self.start[s] = position
            position += count - 1
        self._think = list(think_us)
        self._turn = list(new_turn)
        self._make_specs = make_specs
        self._specs: list[RequestSpec] | None = None  # made when the first follow-up is sent
        self.description = description

    def think_us(self, session: int, index: int) -> int:
        """The think time (µs, >= 0) before round ``index`` >= 1 of ``session``."""
        return self._think[self.start[session] + index - 1]

    def new_turn(self, session: int, index: int) -> int:
        """Tokens of the new turn of round ``index`` >= 1 when its prompt holds the conversation
        so far, else -1 (the round is sent with its recorded prompt)."""
        return self._turn[self.start[session] + index - 1]

    def continues(self, session: int, index: int) -> bool:
        """Whether the round after round ``index`` is sent on top of this one's conversation."""
        return index + 1 < self.rounds[session] and self.new_turn(session, index + 1) > 0

    def spec(self, session: int, index: int) -> RequestSpec:
        """Round ``index`` >= 1 of ``session`` as recorded (its arrival time is not used)."""
        if self._specs is None:
            self._specs = self._make_specs()
        return self._specs[self.start[session] + index - 1]

    def describe(self) -> dict[str, Any]:
        return dict(self.description)
