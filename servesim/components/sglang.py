"""SGLang's scheduler (``engine.profile: sglang``): prefill batches first, admission by a token
reservation, a radix-tree prefix cache, retraction when decoding runs out of memory.

Sources, sgl-project/sglang, ``python/sglang/srt/`` (v0.4-v0.5; current main where they differ):
``managers/scheduler.py`` (``get_next_batch_to_run``, ``get_new_batch_prefill``,
``update_running_batch``), ``managers/schedule_policy.py`` (``SchedulePolicy``, ``PrefillAdder``),
``managers/schedule_batch.py`` (``retract_decode``, ``check_decode_mem``), ``environ.py`` (the
new-token-ratio constants) and ``server_args.py`` (defaults). One step, as SGLang forms it:

1. **A prefill batch, if one can be formed** (SGLang does not mix prefill and decode by default,
   ``enable_mixed_chunk`` is off): the request being chunked continues first, then the wait
   queue in policy order (``fcfs``, the default since v0.5, or ``lpm``: longest cached prefix
   first, with requests that share a prefix with an earlier waiting one held back; plain FCFS
   above 128 waiting requests). A request is admitted while its prompt's uncached tokens plus
   its expected output (``max_new_tokens``, clipped at 4096) fit in the free and evictable
   tokens minus what the running requests are expected to still need (their remaining
   ``max_new_tokens`` times ``new_token_ratio``). A prompt longer than what is left of the
   chunk budget (``chunked_prefill_size``) is cut there and continues next step; the whole
   batch stays within ``max_prefill_tokens``. Every running decoder waits during such a step.
   A failed admission marks the batch full: no admission is tried again until a request
   finishes or is retracted.
2. **Otherwise a decode step** of every running request. If the free and evictable tokens
   cannot hold one more token per request, requests are *retracted* (fewest output tokens
   first, then longest prompt) until what is free covers 20 decode steps of the rest; a
   retracted request frees its private tokens, keeps its cached prompt in the tree (unlocked)
   and goes to the back of the queue, to be prefilled again with its output so far.
   ``new_token_ratio`` then becomes the remaining requests' decoded share (+20 steps each) of
   their ``max_new_tokens``; without a retraction it decays by a fixed step per decode step
   from ``0.7 * schedule_conservativeness`` to 14 % of that, over 600 steps, and is reset when
   the instance has been idle.

Not modelled: overlap scheduling, ``enable_mixed_chunk``, pages larger than one token, the
hierarchical (CPU) cache, priority scheduling and the ``dfs-weight``/``lof``/``random`` policies,
the out-of-memory error SGLang raises when a chunk cannot be allocated (here the chunk shrinks
to what is free, and a request that cannot continue at all is retracted).
"""

from __future__ import annotations

import heapq

from servesim.components.engine import Engine
from servesim.components.radix import RadixCache, RadixNode, token_runs
from servesim.components.request import RUNNING, Request

INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
LPM_QUEUE_LIMIT = 128  # above this many waiting requests, lpm sorts nothing (plain FCFS)
IN_BATCH_PREFIX_THRESHOLD = 32  # IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD
POLICIES = ("fcfs", "lpm")
MAX_PREFILL_TOKENS = 16384  # server_args.max_prefill_tokens


def default_chunked_prefill_size(gpu_memory_gib: float) -> int:
    """``server_args.chunked_prefill_size`` when not given: by the GPU's memory (v0.5)."""
    if gpu_memory_gib < 35:  # A10, L40, 4090
        return 2048
    if gpu_memory_gib < 160:  # H100, H200, A100, H20
        return 8192
    return 16384  # B200, MI300


def default_max_running_requests(kv_tokens: int, context_len: int) -> int:
    """``max_running_requests`` when not given: half the token pool, capped by the request pool
    (``model_runner``: between 2048 and 4096 slots, 512 per context length of KV)."""
    pool = min(max(int(kv_tokens / context_len * 512), 2048), 4096)
    return max(1, min(kv_tokens // 2, pool))


class SGLangEngine(Engine):
    """An instance scheduled as SGLang schedules it (see the module docstring)."""

    def __init__(
        self,
        limits,
        latency,
        *,
        policy: str = "fcfs",
        conservativeness: float = 1.0,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        **options,
    ):
        if limits.block_size != 1:
            raise ValueError("the SGLang profile models page_size 1 (block_size 1)")
        super().__init__(limits, latency, **options)
        self.kv = RadixCache(limits.total_blocks)
        self.caching = limits.enable_prefix_caching
        self.policy = policy
        self.max_prefill_tokens = max_prefill_tokens
        init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.init_ratio = init
        self.min_ratio = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = init
        self.batch_full = False  # an admission failed: none is tried until a request leaves
        self.chunked: Request | None = None  # the request whose prompt is being chunked
        self.retractions = 0

    # ------------------------------------------------------------------ arrivals
    def add_request(self, req: Request, now: int) -> bool:
        if not self.has_work():  # SGLang resets the ratio in an idle scheduler loop
            self.new_token_ratio = self.init_ratio
        return super().add_request(req, now)

    def max_new_tokens(self, r: Request) -> int:
        """SGLang's ``max_new_tokens`` for ``r``: the client's budget, at most what the context
        leaves (``max_req_len - input - 1``); the whole context without a budget."""
        cap = self.limits.max_model_len - r.prompt_tokens - 1
        budget = r.max_output_tokens
        return cap if budget <= 0 or budget > cap else budget

    def _generated(self, r: Request) -> int:
        """Output tokens ``r`` has at the start of the step being formed."""
        if r.finish_step >= 0:
            return r.anchor_computed + (self.step - r.anchor_step) - r.prompt_tokens + 1
        return r.num_generated

    # ------------------------------------------------------------------ batch formation
    def form_batch(self, now: int) -> int:
        self._open_step(now)
        self._in_flight = True
        self._preempted_now = False
        self._decode_tokens = 0
        if self._prefill_batch(now):
            stalled = self._stalled
            for r in self.running:
                if r.finish_step >= 0:
                    stalled.append(r)  # no decoding in a prefill batch
        elif self.n_decoders:
            self._decode_batch()
        self._waiting_formed = len(self.waiting)
        return self._finish_forming()

    def _prefill_batch(self, now: int) -> bool:
        """SGLang's ``get_new_batch_prefill``: schedule the chunked request's next chunk, then
        admit waiting requests; returns whether anything was scheduled."""
        chunked = self.chunked
        if chunked is None and (self.batch_full or not self.waiting):
            return False
        budget = _Budget(self, chunked)
        if chunked is not None:
            self._continue_chunk(chunked, budget)
        self._admit_queue(budget, now)
        return bool(self._scheduled)

    def _continue_chunk(self, r: Request, budget: _Budget) -> None:
        """``PrefillAdder.add_chunked_req``: the next piece of a chunked prompt."""
        left = r.prompt_tokens + r.num_generated - r.num_computed
        n = left if budget.chunk is None or left <= budget.chunk else budget.chunk
        if n > self.kv.free_count:
            n = self.kv.free_count  # (SGLang would fail with an out-of-memory error here)
        if n == 0:
            self._retract(r, self.running.index(r))
            return
        expected = 0  # its expected output is reserved with its last chunk
        if n == left:
            expected = min(self.max_new_tokens(r) - r.num_generated, CLIP_MAX_NEW_TOKENS)
            self.chunked = None
        self.kv.pop_blocks(n)
        self._scheduled.append((r, n))
        budget.spend(n, expected)
        budget.admitted += 1  # it is in the batch (SGLang's can_run_list) like an admission

    def _admit_queue(self, budget: _Budget, now: int) -> None:
        """``get_new_batch_prefill``'s loop over the wait queue, in policy order: admit heads
        while ``PrefillAdder.add_one_req`` says they fit."""
        waiting = self.waiting
        if not waiting:
            return
        if self.policy == "lpm" and self.caching and 1 < len(waiting) <= LPM_QUEUE_LIMIT:
            self._sort_longest_prefix()
        max_seqs = self.limits.max_num_seqs
        while waiting:
            if len(self.running) >= max_seqs:
                self.batch_full = True
                return
            verdict = self._add_one(waiting[0], budget, now)
            if verdict == _ADDED:
                waiting.popleft()
                verdict = budget.state()
            if verdict == _NO_TOKEN:
                self.batch_full = True
                return
            if verdict == _OTHER:
                return

    def _match(self, r: Request) -> tuple[RadixNode | None, int]:
        """The tree's longest match of ``r``'s known tokens, leaving one to compute (SGLang
        recomputes the last token for its logits)."""
        if not self.caching:
            return None, 0
        known = r.prompt_tokens + r.num_generated
        return self.kv.match(token_runs(r, known), known - 1)

    def _add_one(self, r: Request, budget: _Budget, now: int) -> int:
        """``PrefillAdder.add_one_req`` (page size 1): admit ``r`` whole, or its first chunk."""
        kv = self.kv
        node, prefix = self._match(r)
        extend = r.prompt_tokens + r.num_generated - prefix
        expected = min(self.max_new_tokens(r) - r.num_generated, CLIP_MAX_NEW_TOKENS)
        if extend + expected >= budget.total():
            return _NO_TOKEN
        if extend >= budget.input and budget.admitted:
            return _OTHER
        if node is not None:
            kv.lock(node)  # its cached prefix is no longer evictable: check again
            if extend + expected >= budget.total():
                kv.unlock(node)
                return _NO_TOKEN
        n = extend
        if budget.chunk is not None and extend > budget.chunk:
            if budget.chunk <= 0:
                if node is not None:
                    kv.unlock(node)
                return _OTHER
            n = budget.chunk  # a chunk of it now, the rest in the next steps
            expected = 0
            self.chunked = r
        kv.hit_blocks += prefix
        kv.pop_blocks(n)
        r.blocks = node if node is not None else []
        r.num_computed = prefix
        self._start_running(r, prefix, now)
        self._scheduled.append((r, n))
        budget.spend(n, expected)
        budget.admitted += 1
        return _ADDED

    def _sort_longest_prefix(self) -> None:
        """``SchedulePolicy`` with ``lpm``: longest cached prefix first (a stable sort). A request
        with little cached (at most 32 tokens) that shares more than that with an earlier
        waiting request goes last: admitting the first one caches the prefix for it."""
        waiting = self.waiting
        scratch = RadixCache(1 << 62)  # SGLang's waiting_queue_radix_tree
        keys = {}
        for r in waiting:
            known = r.prompt_tokens + r.num_generated
            runs = token_runs(r, known)
            _, prefix = self.kv.match(runs, known - 1)
            key = -prefix
            if prefix <= IN_BATCH_PREFIX_THRESHOLD:
                _, shared = scratch.match(runs, known)
                if shared >= IN_BATCH_PREFIX_THRESHOLD:
                    key = 1  # after every other
                else:
                    scratch.insert(runs, known)
            keys[id(r)] = key
        ordered = sorted(waiting, key=lambda r: keys[id(r)])
        waiting.clear()
        waiting.extend(ordered)

    def _decode_batch(self) -> None:
        """``update_running_batch``: one token for every running request, after retracting some
        if memory cannot hold them; the new-token ratio moves."""
        kv = self.kv
        if kv.free_count < self.n_decoders:
            self._retract_decode()
        else:
            ratio = self.new_token_ratio - self.ratio_decay
            self.new_token_ratio = ratio if ratio > self.min_ratio else self.min_ratio
        kv.pop_blocks(self.n_decoders)
        self._decode_tokens = self.n_decoders

    def _retract_decode(self) -> None:
        """``ScheduleBatch.retract_decode``: retract decoders, fewest output tokens first, then
        longest prompt, until what is free covers RETRACT_DECODE_STEPS tokens of every other."""
        kv = self.kv
        decoders = [r for r in self.running if r.finish_step >= 0]
        decoders.sort(key=lambda r: (self._generated(r), -r.prompt_tokens), reverse=True)
        first = True
        while first or kv.free < RETRACT_DECODE_STEPS * len(decoders):
            if len(decoders) == 1:
                break
            first = False
            victim = decoders.pop()
            self._retract(victim, self.running.index(victim))
            residual = RETRACT_DECODE_STEPS * len(decoders) - kv.free
            if residual > 0:
                kv.evict(residual)
        self._preempted_now = True
        decoded = sum(self._generated(r) for r in decoders)
        wanted = sum(self.max_new_tokens(r) for r in decoders)
        ratio = (decoded + RETRACT_DECODE_STEPS * len(decoders)) / wanted if wanted else 1.0
        self.new_token_ratio = ratio if ratio < 1.0 else 1.0

    def _retract(self, r: Request, index: int) -> None:
        """Retraction is vLLM's preemption by recompute (``Engine._preempt``: its own tokens are
        freed, its path in the tree unlocked -- its cached prompt stays, evictable -- and it
        keeps its output, to recompute it), except that it goes to the back of the queue."""
        self._preempt(r, index, 0)
        self.waiting.popleft()  # where _preempt put it
        self.waiting.append(r)
        if r is self.chunked:
            self.chunked = None
        self.retractions += 1
        self.batch_full = False

    # ------------------------------------------------------------------ step end
    def _end_prefills(self, s, end, finishing) -> int:
        """After a prefill batch, its requests' computed tokens enter the tree, held by them
        (``cache_unfinished_req``): a later request can reuse a prompt still being served."""
        tokens = super()._end_prefills(s, end, finishing)
        if self.caching:
            for r, _ in self._scheduled:
                self._cache(r, r.num_computed, keep=True)
        return tokens

    def _cache(self, r: Request, computed: int, keep: bool) -> None:
        """Insert ``r``'s first ``computed`` tokens into the tree; free its slots of those that
        were cached already; hold the new path (``keep``) or let it go."""
        kv = self.kv
        held = r.blocks
        node, existing = kv.insert(token_runs(r, computed), computed)
        kv.free_slots(existing - len(held))
        kv.lock(node)
        if isinstance(held, RadixNode):
            kv.unlock(held)
        r.blocks = node
        if not keep:
            kv.release(0, node)
            r.blocks = []

    def _register_full(self, r: Request, full_blocks: int) -> None:
        """The tree takes whole token sequences (see ``_cache``), not vLLM's full blocks."""

    def _finish(self, r: Request, end: int, computed: int, allocated: int = -1) -> None:
        """A finished request's tokens stay cached (``cache_finished_req``); room may be free."""
        if self.caching:
            self._cache(r, computed, keep=True)
        super()._finish(r, end, computed, allocated)
        self.batch_full = False

    # ------------------------------------------------------------------ fast-forward
    def window(self, max_steps: int, min_steps: int = 2):
        """Decode windows as vLLM's, when no admission can be tried in them."""
        if self.chunked is not None or (self.waiting and not self.batch_full):
            return None
        self._settle_top()
        return super().window(max_steps, min_steps)

    def end_step(self, end: int, steps: int = 1, ends=None) -> None:
        if steps > 1:  # the window's decode steps after its first each decay the ratio
            ratio = self.new_token_ratio
            for _ in range(steps - 1):
                ratio -= self.ratio_decay
                if ratio <= self.min_ratio:
                    ratio = self.min_ratio
                    break
            self.new_token_ratio = ratio
        if not self._stalled:
            self._settle_heap(self.step + steps - 1)
            super().end_step(end, steps, ends)
            return
        # a prefill batch: every decoder waited; the engine's own way re-files each of them in
        # the decoder lists, which costs the batch size per decoder (SGLang runs thousands)
        self._wait_all()
        self._settle_heap(self.step)
        waited, self.irregular = self.irregular, []
        super().end_step(end, steps, ends)
        self.irregular = waited

    def _wait_all(self) -> None:
        """Every decoder of the step got no token: its progress and finish step move one step
        later, as ``Engine.end_step`` re-anchors a stalled decoder; it is irregular until its
        next token. Its entry in the finish heap is brought up to date by ``_settle_heap``."""
        start = self._start
        irregular = self.irregular
        for r in self._stalled:
            r.anchor_step += 1
            r.finish_step += 1
            if not r.irregular:
                r.irregular = True
                r.last_token_end_us = start
                irregular.append(r)
        self._stalled.clear()

    def _settle_heap(self, upto: int) -> None:
        """Bring the finish heap's entries for steps up to ``upto`` up to date: the entry of a
        decoder that has waited since moves to its new finish step, the entry of a request no
        longer decoding goes. ``Engine.end_step`` then finishes exactly the right requests."""
        heap = self.finish_heap
        valid = []
        while heap and heap[0][0] <= upto:
            f, order, r = heapq.heappop(heap)
            if r.state == RUNNING and r.finish_step == f:
                valid.append((f, order, r))
            elif r.state == RUNNING and r.finish_step > f:
                heapq.heappush(heap, (r.finish_step, order, r))
        for item in valid:
            heapq.heappush(heap, item)

    def _settle_top(self) -> None:
        """Bring the finish heap's first entry up to date (``Engine.window`` reads it, and drops
        it when out of date)."""
        heap = self.finish_heap
        while heap:
            f, order, r = heap[0]
            if r.state == RUNNING and r.finish_step == f:
                return
            if r.state == RUNNING and r.finish_step > f:
                heapq.heapreplace(heap, (r.finish_step, order, r))
            else:
                heapq.heappop(heap)


_ADDED, _NO_TOKEN, _OTHER = 0, 1, 2  # PrefillAdder's verdicts (CONTINUE is _ADDED then state)


class _Budget:
    """What one prefill batch may still take (``PrefillAdder``'s remaining-token counters)."""

    __slots__ = ("kv", "offset", "allocated", "input", "chunk", "admitted")

    def __init__(self, engine: SGLangEngine, chunked: Request | None):
        self.kv = engine.kv
        # the running requests' remaining max_new_tokens (engine.max_new_tokens, less what
        # they generated), each clipped, times the ratio: inlined, it runs over the whole batch
        step = engine.step
        cap = engine.limits.max_model_len - 1
        clip = CLIP_MAX_NEW_TOKENS
        expected = 0
        for r in engine.running:
            if r is chunked:
                continue
            prompt = r.prompt_tokens
            budget = r.max_output_tokens
            if budget <= 0 or budget > cap - prompt:
                budget = cap - prompt
            if r.finish_step >= 0:
                budget -= r.anchor_computed + step - r.anchor_step - prompt + 1
            else:
                budget -= r.num_generated
            expected += budget if budget < clip else clip
        self.offset = expected * engine.new_token_ratio  # tokens promised, then this batch's
        self.allocated = 0  # tokens this batch took from the pool (SGLang allocates them later)
        self.input = engine.max_prefill_tokens
        limits = engine.limits
        self.chunk = limits.max_num_batched_tokens if limits.enable_chunked_prefill else None
        self.admitted = 0

    def total(self) -> float:
        """``rem_total_tokens``: free and evictable tokens not promised to anyone, counted
        as SGLang counts them before it allocates the batch."""
        return self.kv.free_count + self.allocated - self.offset

    def spend(self, tokens: int, expected_output: int) -> None:
        """``_update_prefill_budget``: a prefill of ``tokens`` that may then decode
        ``expected_output`` more."""
        self.offset += tokens + expected_output
        self.allocated += tokens
        self.input -= tokens
        if self.chunk is not None:
            self.chunk -= tokens

    def state(self) -> int:
        """``budget_state``: go on, stop for lack of tokens (the batch is full), or stop."""
        if self.total() <= 0 or self.kv.free_count <= 0:  # (cur_rem_tokens: free_count here)
            return _NO_TOKEN
        if self.input <= 0 or (self.chunk is not None and self.chunk <= 0):
            return _OTHER
        return _ADDED


def sglang_engine(config, limits, latency, **options) -> SGLangEngine:
    """The engine of an instance whose ``engine`` section says ``profile: sglang``."""
    return SGLangEngine(
        limits,
        latency,
        policy=config.schedule_policy,
        conservativeness=config.schedule_conservativeness,
        max_prefill_tokens=config.max_prefill_tokens,
        **options,
    )
