"""What a workload produces: a lazy, arrival-ordered stream of request specs."""

from __future__ import annotations


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

    def __repr__(self) -> str:  # noqa: D105
        return (
            f"RequestSpec(id={self.id}, arrival_us={self.arrival_us}, prompt={self.prompt_tokens}, "
            f"output={self.output_tokens}, prefix_group={self.prefix_group}, prefix={self.prefix_tokens})"
        )


TRACE_SEGMENT_BASE = 1 << 40


def trace_segment(block_id: int) -> int:
    """Segment id for a trace's content block id (disjoint from prefix-group and request ids)."""
    return -(TRACE_SEGMENT_BASE + int(block_id))
