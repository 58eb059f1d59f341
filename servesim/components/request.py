"""A request inside the simulator: its identity, its timeline and its engine state.

Token content is described by *segments* instead of token ids: a prompt is a shared prefix segment
(one per prefix group) followed by a segment private to the request, and the output is another
private segment. Two blocks have equal content exactly when they cover the same positions of the
same segments, which is what identical random token ids would give, at no per-token cost.
"""

from __future__ import annotations

from servesim.components.kvcache import CachedBlock, ContentIds
from servesim.policies.snapshot import REQUEST_FIELDS

# Request states (INV-2): WAITING -> RUNNING -> FINISHED, RUNNING -> WAITING on preemption.
CREATED, WAITING, RUNNING, FINISHED, DROPPED = 0, 1, 2, 3, 4
STATE_NAMES = {
    CREATED: "created",
    WAITING: "queued",
    RUNNING: "running",
    FINISHED: "completed",
    DROPPED: "dropped",
}

# Why a request finished or was dropped.
FINISH_STOP, FINISH_LENGTH = "stop", "length"
DROP_PROMPT_TOO_LONG = "prompt_exceeds_max_model_len"
DROP_BUDGET_TOO_LONG = "prompt_plus_max_tokens_exceeds_max_model_len"
DROP_KV_TOO_SMALL = "prompt_exceeds_kv_capacity"
DROP_DECODE_KV_FULL = "decode_kv_full"  # PD: no room on the decode instance for the transferred KV


def prefix_segment(group: int) -> int:
    """Segment id of a shared prefix group (negative, so it never meets a request segment)."""
    return -1 - group


class Request:
    """One request. Hot object: slots, no validation (the workload validated its inputs).

    Engine bookkeeping (vLLM v1 terms): ``num_computed`` tokens have KV in the cache; the request
    knows ``prompt_tokens + num_generated`` tokens; it is *decoding* when exactly one known token is
    not yet computed. While decoding steadily, ``num_computed`` is implicit:
    ``anchor_computed + (step - anchor_step)`` at the start of engine step ``step``.
    """

    __slots__ = (
        # identity and workload: what a policy may read, then the output length and content
        *REQUEST_FIELDS,
        "oracle_output_tokens",
        "segments",
        "content",
        # LoRA / several models: the model it names ("": the scenario's) and its adapter ("": none)
        "model",
        "adapter",
        # timeline (absolute µs; -1 = not yet)
        "enqueue_us",
        "first_scheduled_us",
        "first_token_end_us",
        "last_token_end_us",
        "finish_us",
        "state",
        "finish_reason",
        "instance",
        "preemptions",
        "cached_tokens",
        "gateway_wait_us",
        "session_id",
        "round_index",
        "think_us",
        "continues",
        "pd",
        "done",
        # engine state
        "target_output",
        "length_capped",
        "num_computed",
        "num_generated",
        "num_new",
        "order",
        "anchor_step",
        "anchor_computed",
        "finish_step",
        "irregular",
        "remote_kv",
        "copy_us",
        "swapped_blocks",
        "hold_kv",
        "blocks",
        "shareable_blocks",
        "_hashes",
        "_cursor",
    )

    def __init__(
        self,
        id: int,
        arrival_us: int,
        prompt_tokens: int,
        oracle_output_tokens: int,
        max_output_tokens: int = 0,
        prefix_group: int = -1,
        prefix_tokens: int = 0,
        slo_class: str = "standard",
        client: str = "default",
        block_size: int = 16,
        content: ContentIds | None = None,
        tenant: str = "",
        priority: int = 3,
        segments: tuple[tuple[int, int], ...] | None = None,
    ):
        self.id = id
        self.arrival_us = arrival_us
        self.prompt_tokens = prompt_tokens
        self.oracle_output_tokens = oracle_output_tokens
        self.max_output_tokens = max_output_tokens
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens if prefix_group >= 0 else 0
        self.slo_class = slo_class
        self.client = client
        self.tenant = tenant
        self.priority = priority  # cluster priority of its SLO class: higher = more important
        self.block_size = block_size
        self.content = content  # the cluster's content-id table (shared by its instances)
        if segments is not None:
            self.segments = tuple(segments)
        elif self.prefix_tokens:
            self.segments = (
                (prefix_segment(prefix_group), self.prefix_tokens),
                (2 * id, prompt_tokens - self.prefix_tokens),
            )
        else:
            self.segments = ((2 * id, prompt_tokens),)
        self.enqueue_us = -1
        self.first_scheduled_us = -1
        self.first_token_end_us = -1
        self.last_token_end_us = -1
        self.finish_us = -1
        self.state = CREATED
        self.finish_reason = ""
        self.instance = -1
        self.preemptions = 0
        self.cached_tokens = -1
        self.gateway_wait_us = -1
        self.model = ""  # LoRA / several models (servesim.components.adapters)
        self.adapter = ""
        self.session_id = -1  # sessions: which conversation, which round, the think time before it
        self.round_index = 0
        self.think_us = 0
        self.continues = False  # another round will reuse this request's context
        self.pd = (
            None  # disaggregated serving: its PDRecord (see servesim.components.disaggregation)
        )
        # its completion event, which its lifecycle process waits on (set when it is sent to an
        # instance; the engine triggers it through ``finished``)
        self.done = None
        self.target_output = 0
        self.length_capped = False
        self.num_computed = 0
        self.num_generated = 0
        self.num_new = 0
        self.order = -1
        self.anchor_step = 0
        self.anchor_computed = 0
        self.finish_step = -1
        self.irregular = False
        self.remote_kv = False  # waiting with its prompt's KV received from a prefill instance
        self.copy_us = 0  # kv_transfer.blocking: µs the decode instance spends receiving its KV
        self.swapped_blocks = 0  # engine.preemption_mode swap: KV blocks it has in CPU memory
        self.hold_kv = False  # decode_full backpressure: a prefill part keeps its KV when done
        self.blocks: list[
            CachedBlock
        ] = []  # registered blocks held, a leading run of the block table
        # Leading full blocks whose content another request may hold: whole blocks of the shared
        # prefix. A preempted request makes all its full blocks shareable (with its future self).
        if segments is not None:
            # explicit content: its leading segments that are not this request's own (its own
            # prompt and output are 2*id and 2*id+1) were seen before -- a shared prefix, a trace
            # block, an earlier round of its session -- and can be prefix-cache hits
            own = (2 * id, 2 * id + 1)
            public = 0
            for segment, length in self.segments:
                if segment in own:
                    break
                public += length
            self.shareable_blocks = public // block_size
        else:
            self.shareable_blocks = self.prefix_tokens // block_size
        self._hashes: list[int] | None = None
        self._cursor: list[int] | None = None

    # ------------------------------------------------------------------ content hashing
    def block_hash(self, index: int, block_size: int, ids: ContentIds) -> int:
        """Content id of block ``index`` (0-based) of this request's token sequence (chained:
        equal ids mean equal tokens in this block and every block before it)."""
        hashes = self._hashes
        if hashes is None:
            hashes = self._hashes = []
        while len(hashes) <= index:
            j = len(hashes)
            shared_full = self.prefix_tokens // block_size
            if j < shared_full:
                hashes.append(_group_hash(ids, self.prefix_group, j, block_size))
            else:
                previous = hashes[j - 1] if j else -1
                hashes.append(ids.chain(previous, self._block_content(j, block_size)))
        return hashes[index]

    def prompt_block_ids(self) -> list[int]:
        """Ids of the leading full prompt blocks another request could share (for routers)."""
        content = self.content
        if content is None or not self.shareable_blocks:
            return []
        bs = self.block_size
        n = min(self.shareable_blocks, self.prompt_tokens // bs)
        return [self.block_hash(j, bs, content) for j in range(n)]

    def _block_content(self, index: int, block_size: int) -> tuple:
        """The (segment, from, to) runs covering block ``index``: prompt segments, then the output
        segment (2*id + 1). Blocks are asked for in increasing order, so a cursor remembers the
        first prompt segment that can still overlap (no rescan from the start: long trace prompts
        have hundreds of segments)."""
        start, end = index * block_size, (index + 1) * block_size
        segments = self.segments
        cursor = self._cursor
        if cursor is None or cursor[1] > start:
            cursor = self._cursor = [0, 0]  # [segment index, its first token's position]
        i, offset = cursor
        n = len(segments)
        while i < n and offset + segments[i][1] <= start:
            offset += segments[i][1]
            i += 1
        cursor[0], cursor[1] = i, offset
        runs = []
        while i < n and offset < end:
            segment, length = segments[i]
            lo, hi = max(start, offset), min(end, offset + length)
            if lo < hi:
                runs.append((segment, lo - offset, hi - offset))
            offset += length
            i += 1
        if offset < end:  # the block reaches into the output
            lo, hi = max(start, offset), min(end, offset + self.num_generated)
            if lo < hi:
                runs.append((2 * self.id + 1, lo - offset, hi - offset))
        return tuple(runs)

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, state={STATE_NAMES.get(self.state, self.state)}, "
            f"prompt={self.prompt_tokens}, generated={self.num_generated}/{self.target_output}, "
            f"computed={self.num_computed})"
        )


def finished(req: Request) -> None:
    """The engine's completion hook: trigger the request's own completion event (value True: its
    instance finished or dropped it). Its lifecycle process, waiting on it, takes it from there.
    (``Event.succeed(True)``, inlined: once per request, and the event is never triggered twice.)"""
    done = req.done
    done._ok = True
    done._value = True
    done.env.schedule(done)


def _group_hash(ids: ContentIds, group: int, index: int, block_size: int) -> int:
    """Ids of a prefix group's blocks are the same for every request of the group: memoised."""
    hashes = ids.groups.get(group)
    if hashes is None:
        hashes = ids.groups[group] = []
    segment = prefix_segment(group)
    while len(hashes) <= index:
        j = len(hashes)
        previous = hashes[j - 1] if j else -1
        hashes.append(ids.chain(previous, ((segment, j * block_size, (j + 1) * block_size),)))
    return hashes[index]
