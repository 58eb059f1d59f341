"""Batch formation, one rule per test (vLLM v1 ``Scheduler.schedule``; spec §2.2, §2.4, App. A).

Most tests drive one Engine by hand (tests/conftest.py ``EngineHarness``): submit requests, run a
step, look at which requests computed how many tokens. The step time is the blackbox
``β0 + β1·prefill_tokens + β2·decode_requests`` with β = (1000, 1, 10) unless a test says otherwise.

The last test checks the optimised Engine step by step against ``ReferenceEngine``, a plain
re-statement of the same rules (one object per physical KV block, an explicit LRU free list), on
random workloads: same tokens per request, admissions, preemptions, prefix hits, completions,
batch summaries (hence step times), free blocks and evictions after every step.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np
import pytest
from conftest import EngineHarness, run_scenario, scenario_dict
from hypothesis import HealthCheck, given, settings
from strategies import engine_workloads

from servesim.components.request import (
    DROP_BUDGET_TOO_LONG,
    DROP_KV_TOO_SMALL,
    DROP_PROMPT_TOO_LONG,
    DROPPED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISHED,
    WAITING,
)
from servesim.latency.base import BatchSummary
from servesim.latency.blackbox import BlackboxLatencyModel

# ---------------------------------------------------------------------- phase 1 before phase 2


def test_running_requests_are_scheduled_before_waiting_ones():
    h = EngineHarness(max_num_batched_tokens=10, block_size=4, total_blocks=64)
    long = h.submit(25, 3)
    assert h.step().tokens == {long.id: 10}
    short = h.submit(4, 2)  # waiting while `long` still has 15 prompt tokens to prefill
    step = h.step()
    assert step.tokens == {long.id: 10}  # the running chunk takes the whole budget
    assert h.waiting_ids() == [short.id]
    step = h.step()
    assert step.tokens == {long.id: 5, short.id: 4}  # the waiting request gets what is left
    assert step.admitted == [short.id]


def test_decoding_requests_take_their_token_before_a_waiting_prompt_is_chunked():
    h = EngineHarness(max_num_batched_tokens=4, block_size=4, total_blocks=64)
    first = h.submit(4, 5)
    h.step()
    second = h.submit(8, 1)
    step = h.step()
    assert step.tokens == {first.id: 1, second.id: 3}


# ---------------------------------------------------------------------- limits


def test_max_num_seqs_caps_the_running_batch():
    h = EngineHarness(max_num_seqs=2, block_size=4, total_blocks=64)
    a, b, c = (h.submit(4, 3) for _ in range(3))
    steps = h.run()
    assert steps[0].admitted == [a.id, b.id]
    assert h.requests[c.id].first_scheduled_us == steps[2].end  # the step where a and b finished
    assert steps[2].finished == [a.id, b.id]
    assert steps[3].admitted == [c.id]
    assert all(s.row["batch_size"] <= 2 for s in steps)


def test_the_token_budget_caps_the_tokens_of_a_step_and_the_last_admission_is_chunked():
    h = EngineHarness(max_num_batched_tokens=16, block_size=4, total_blocks=64)
    a, b, c = (h.submit(6, 2) for _ in range(3))
    step = h.step()
    assert step.tokens == {a.id: 6, b.id: 6, c.id: 4}
    assert step.row["prefill_tokens"] == 16
    step = h.step()
    assert step.tokens == {a.id: 1, b.id: 1, c.id: 2}
    assert step.row["prefill_tokens"] == 2 and step.row["decode_tokens"] == 2


def test_without_chunked_prefill_a_prompt_larger_than_the_budget_left_waits():
    h = EngineHarness(
        max_num_batched_tokens=16, block_size=4, total_blocks=64, enable_chunked_prefill=False
    )
    a, b, c = (h.submit(6, 2) for _ in range(3))
    step = h.step()
    assert step.tokens == {a.id: 6, b.id: 6}
    assert h.waiting_ids() == [c.id]


def test_a_long_prompt_is_prefilled_in_chunks_over_several_steps():
    h = EngineHarness(max_num_batched_tokens=16, block_size=4, total_blocks=64)
    r = h.submit(50, 2)
    steps = h.run()
    assert [s.tokens.get(r.id, 0) for s in steps] == [16, 16, 16, 2, 1]
    assert [s.row["prefill_tokens"] for s in steps] == [16, 16, 16, 2, 0]
    # the first token comes out of the step that computes the last prompt token, not before
    assert r.first_token_end_us == steps[3].end
    assert r.num_generated == 2 and r.state == FINISHED


def test_long_prefill_token_threshold_caps_every_chunk_but_not_the_budget_of_others():
    h = EngineHarness(
        max_num_batched_tokens=64, block_size=4, total_blocks=64, long_prefill_token_threshold=8
    )
    long = h.submit(20, 2)
    short = h.submit(5, 3)
    steps = h.run()
    assert [s.tokens.get(long.id, 0) for s in steps[:4]] == [8, 8, 4, 1]
    assert steps[0].tokens[short.id] == 5  # a prompt under the threshold is not split
    assert steps[0].row["prefill_tokens"] == 13


# ---------------------------------------------------------------------- phase 2: the wait queue


def test_a_head_that_does_not_fit_blocks_the_queue():
    h = EngineHarness(block_size=4, total_blocks=10)
    big = h.submit(24, 50)  # 6 blocks, then a 7th for its first decode token
    h.step()
    head = h.submit(20, 2)  # 5 blocks: does not fit in the 4 free
    small = h.submit(4, 2)  # 1 block: would fit, but is behind the head
    step = h.step()
    assert h.kv.free_count >= 1
    assert step.admitted == []
    assert h.waiting_ids() == [head.id, small.id]
    assert step.tokens == {big.id: 1}


def test_no_request_is_admitted_in_a_step_that_preempted():
    # Two decoders fill a 4-block cache; when the first needs a fifth block the second (last
    # admitted) is preempted. Its re-admission chunk (threshold: 4 tokens = 1 block) fits in the
    # block left free, yet it waits for the next step: phase 2 is skipped after a preemption.
    h = EngineHarness(
        block_size=4,
        total_blocks=4,
        long_prefill_token_threshold=4,
        enable_prefix_caching=False,
    )
    first, second = h.submit(4, 30), h.submit(4, 30)
    steps = [h.step() for _ in range(6)]
    assert [s.preempted for s in steps] == [[], [], [], [], [], [second.id]]
    preempting = steps[-1]
    assert preempting.admitted == [] and preempting.tokens == {first.id: 1}
    assert h.waiting_ids() == [second.id]
    assert h.kv.free_count >= 1  # room for the 4-token chunk, unused this step
    assert h.step().admitted == [second.id]


# ---------------------------------------------------------------------- enqueue guards


@pytest.mark.parametrize(
    ("prompt", "max_output_tokens", "reason"),
    [
        (32, 0, DROP_PROMPT_TOO_LONG),  # prompt >= max_model_len
        (40, 0, DROP_PROMPT_TOO_LONG),
        (20, 13, DROP_BUDGET_TOO_LONG),  # prompt + max_output_tokens > max_model_len
        (31, 2, DROP_BUDGET_TOO_LONG),
    ],
)
def test_enqueue_guards_drop_requests_that_cannot_fit_the_context(
    prompt, max_output_tokens, reason
):
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    r = h.submit(prompt, 1, max_output_tokens=max_output_tokens)
    assert r.state == DROPPED and r.finish_reason == reason
    assert h.finished == [r] and h.engine.dropped == 1
    assert not h.engine.has_work()
    assert h.engine.total_input_tokens == 0


@pytest.mark.parametrize(("prompt", "max_output_tokens"), [(31, 0), (31, 1), (20, 12)])
def test_enqueue_guards_accept_requests_at_the_context_limit(prompt, max_output_tokens):
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    r = h.submit(prompt, 1, max_output_tokens=max_output_tokens)
    assert r.state == WAITING
    h.run()
    assert r.state == FINISHED


def test_a_prompt_needing_more_blocks_than_the_cache_is_dropped():
    h = EngineHarness(block_size=4, total_blocks=4, max_model_len=100)
    too_big = h.submit(17, 1)
    fits = h.submit(16, 1)
    assert too_big.state == DROPPED and too_big.finish_reason == DROP_KV_TOO_SMALL
    assert fits.state == WAITING


def test_enqueue_guards_never_read_the_oracle_output_length():
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    r = h.submit(10, 10**6)  # the oracle is far beyond the context, the budget is server-filled
    assert r.state == WAITING


def test_max_output_tokens_zero_is_filled_to_the_context_and_caps_a_longer_oracle():
    h = EngineHarness(block_size=4, total_blocks=64, max_model_len=32)
    capped = h.submit(10, 100, max_output_tokens=0)
    short = h.submit(10, 5, max_output_tokens=0)
    h.run()
    assert capped.num_generated == 32 - 10 and capped.finish_reason == FINISH_LENGTH
    assert short.num_generated == 5 and short.finish_reason == FINISH_STOP


def test_length_capped_requests_are_counted_in_the_summary():
    data = scenario_dict(
        requests=12,
        input=20,
        output={"type": "uniform", "min": 1, "max": 30},
        max_output_tokens=0,
        kv_blocks=64,
        block_size=4,
        max_model_len=40,
    )
    results = run_scenario(data)
    req = results.requests
    capped = req["oracle_output_tokens"] > 40 - 20
    assert capped.any() and (~capped).any()
    np.testing.assert_array_equal(req["output_tokens"], np.minimum(req["oracle_output_tokens"], 20))
    assert results.summary["length_capped_requests"] == int(capped.sum())
    labels = results.record.requests.labels("finish_reason")
    assert {labels[c] for c in req["finish_reason"][capped]} == {"length"}


# ---------------------------------------------------------------------- token accounting


@pytest.mark.parametrize("outputs", [1, 2, 5])
def test_output_tokens_count_the_token_produced_by_the_prefill(outputs):
    h = EngineHarness(block_size=4, total_blocks=64)
    r = h.submit(10, outputs)
    steps = h.run()
    assert len(steps) == 1 + (outputs - 1)  # one prefill step, then N-1 decode steps
    assert sum(s.row["decode_tokens"] for s in steps) == outputs - 1
    assert r.first_token_end_us == steps[0].end
    assert r.num_generated == outputs and r.finish_us == steps[-1].end
    # the final token's KV is never allocated: prompt + N - 1 tokens were computed
    assert r.num_computed == 10 + outputs - 1


def test_a_fully_cached_prompt_still_computes_its_last_block():
    h = EngineHarness(block_size=4, total_blocks=64)
    warm = h.submit(16, 1, prefix_group=0, prefix_tokens=16)
    h.run()
    same = h.submit(16, 1, prefix_group=0, prefix_tokens=16)  # every block of it is cached
    step = h.step()
    assert step.hits == {same.id: 12}  # at most (prompt - 1) // block_size blocks hit
    assert step.tokens == {same.id: 4}
    assert same.cached_tokens == 12 and warm.cached_tokens == 0


def test_a_prompt_one_token_past_a_cached_prefix_computes_one_token():
    h = EngineHarness(block_size=4, total_blocks=64)
    h.submit(16, 1, prefix_group=0, prefix_tokens=16)
    h.run()
    longer = h.submit(17, 1, prefix_group=0, prefix_tokens=16)
    step = h.step()
    assert step.hits == {longer.id: 16} and step.tokens == {longer.id: 1}
    assert step.row["prefill_tokens"] == 1


# ---------------------------------------------------------------------- same-instant rule (SimPy)


@pytest.mark.parametrize("exact_steps", [True, False])
def test_an_arrival_at_a_step_boundary_joins_the_batch_formed_at_that_instant(
    exact_steps, small_windows
):
    # Constant arrivals every 2 ms, steps of exactly 1 ms: request 0 arrives at 2 ms and runs
    # steps [2,3) [3,4) [4,5) ms; request 1 arrives at 4 ms, exactly when a step ends.
    data = scenario_dict(
        requests=2,
        rate=500,
        arrival="constant",
        input=8,
        output=3,
        beta=(1000, 0, 0),
        exact_steps=exact_steps,
    )
    req = run_scenario(data).requests
    np.testing.assert_array_equal(req["arrival_us"], [2000, 4000])
    np.testing.assert_array_equal(req["first_scheduled_us"], [2000, 4000])
    np.testing.assert_array_equal(req["first_token_us"], [3000, 5000])


@pytest.mark.parametrize("exact_steps", [True, False])
def test_an_arrival_during_a_step_waits_for_the_next_step_boundary(exact_steps, small_windows):
    # Steps of 1.5 ms from 2 ms: boundaries at 3.5, 5, 6.5 ms; request 1 arrives at 4 ms.
    data = scenario_dict(
        requests=2,
        rate=500,
        arrival="constant",
        input=8,
        output=4,
        beta=(1500, 0, 0),
        exact_steps=exact_steps,
    )
    req = run_scenario(data).requests
    np.testing.assert_array_equal(req["first_scheduled_us"], [2000, 5000])


# ---------------------------------------------------------------------- a reference scheduler


class RefRequest:
    """A request as the reference scheduler sees it: explicit tokens and physical blocks."""

    def __init__(self, rid: int, spec: dict, limits: dict):
        bs = limits["block_size"]
        self.id = rid
        self.prompt = spec["prompt"]
        self.group = spec["group"]
        self.prefix = spec["prefix"] if spec["group"] >= 0 else 0
        budget = spec["max_output_tokens"] or limits["max_model_len"] - self.prompt
        self.target = min(spec["output"], budget)
        self.reason = FINISH_STOP if spec["output"] <= budget else FINISH_LENGTH
        self.generated = 0
        self.computed = 0
        self.table: list[int] = []  # physical block ids, in token order
        self.registered = 0  # leading blocks of the table that carry their content key
        # full blocks another request (or this one, after a preemption) may hold the content of
        self.shareable = self.prefix // bs if limits["enable_prefix_caching"] else 0
        self.decoding = False
        self.first_scheduled = -1
        self.cached_at_first_admission = -1
        self.first_token_end = -1
        self.finish = -1
        self.preemptions = 0

    @property
    def known(self) -> int:
        return self.prompt + self.generated

    def key(self, j: int, bs: int) -> tuple:
        """Content of block j: the group's shared prefix, or this request's own tokens."""
        if j < self.prefix // bs:
            return ("group", self.group, j)
        return ("request", self.id, j)


class ReferenceEngine:
    """vLLM v1 batch formation written out plainly (spec §2.4–2.6, vLLM recompute semantics).

    One list entry per physical block (reference count, content key) and an explicit LRU free
    list of block ids; every rule is a line or two. Slow and obvious, so that the optimised
    Engine (aggregate decoders, anonymous block runs, finish heaps) can be checked against it.
    """

    def __init__(self, limits: dict, beta: tuple[float, float, float]):
        self.limits = limits
        self.bs = limits["block_size"]
        total = limits["total_blocks"]
        self.refs = [0] * total
        self.content: list[tuple | None] = [None] * total
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(total))
        self.registry: dict[tuple, int] = {}
        self.waiting: deque[RefRequest] = deque()
        self.running: list[RefRequest] = []
        self.beta = beta
        self.evictions = 0
        self.summaries: list[tuple] = []

    # -- enqueue guards (spec §2.2)
    def submit(self, r: RefRequest, spec: dict) -> bool:
        lim = self.limits
        if r.prompt >= lim["max_model_len"]:
            return False
        if (
            spec["max_output_tokens"]
            and r.prompt + spec["max_output_tokens"] > lim["max_model_len"]
        ):
            return False
        if -(-r.prompt // self.bs) > lim["total_blocks"]:
            return False
        self.waiting.append(r)
        return True

    # -- blocks
    def _pop(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)  # LRU head
            if self.content[b] is not None:  # lazy eviction happens only now
                del self.registry[self.content[b]]
                self.content[b] = None
                self.evictions += 1
            self.refs[b] = 1
            out.append(b)
        return out

    def _hold(self, r: RefRequest, tokens: int) -> None:
        r.table += self._pop(-(-tokens // self.bs) - len(r.table))

    def _register(self, r: RefRequest, full_blocks: int) -> None:
        for j in range(r.registered, min(full_blocks, r.shareable)):
            key = r.key(j, self.bs)
            if key in self.registry:  # someone holds this content already: ours stays private
                r.shareable = j
                return
            self.registry[key] = r.table[j]
            self.content[r.table[j]] = key
            r.registered = j + 1

    def _release(self, r: RefRequest) -> None:
        for b in reversed(r.table):  # last block first: the prefix is evicted last
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free[b] = None
        r.table = []
        r.registered = 0

    def _preempt(self, r: RefRequest) -> None:
        self.running.remove(r)
        full = min(r.computed // self.bs, r.known // self.bs)
        if self.limits["enable_prefix_caching"] and full > r.shareable:
            r.shareable = full  # its own blocks stay matchable by its re-admission
            self._register(r, full)
        self._release(r)
        r.computed = 0
        r.decoding = False
        r.preemptions += 1
        self.waiting.appendleft(r)

    # -- one step
    def form(self, now: int) -> tuple[dict[int, int], list[int], list[int], dict[int, int], int]:
        lim, bs = self.limits, self.bs
        threshold = lim["long_prefill_token_threshold"]
        budget = lim["max_num_batched_tokens"]
        scheduled: dict[int, tuple[RefRequest, int]] = {}
        preempted: list[int] = []
        # phase 1: running requests in admission order; fcfs victims come from the end
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            if r.decoding:
                n = 1
            else:
                n = r.known - r.computed
                if 0 < threshold < n:
                    n = threshold
                n = min(n, budget)
            gave_up = False
            while -(-(r.computed + n) // bs) - len(r.table) > len(self.free):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.id)
                if victim is r:
                    gave_up = True
                    break
            if gave_up:
                break
            self._hold(r, r.computed + n)
            if not r.decoding:
                self._register(r, (r.computed + n) // bs)
            scheduled[r.id] = (r, n)
            budget -= n
            i += 1
        # phase 2: the wait queue, head first, only if nobody was preempted
        admitted, hits = [], {}
        while (
            not preempted
            and self.waiting
            and budget > 0
            and len(self.running) < lim["max_num_seqs"]
        ):
            r = self.waiting[0]
            found = []
            for j in range(min(r.shareable, (r.known - 1) // bs)):
                b = self.registry.get(r.key(j, bs))
                if b is None:
                    break
                found.append(b)
            cached = len(found) * bs
            n = r.known - cached
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                if not lim["enable_chunked_prefill"]:
                    break
                n = budget
            revived = sum(1 for b in found if self.refs[b] == 0)
            if -(-(cached + n) // bs) - len(found) + revived > len(self.free):
                break  # head-of-line blocking
            for b in found:
                if self.refs[b] == 0:
                    del self.free[b]
                self.refs[b] += 1
            self.waiting.popleft()
            r.table, r.registered, r.computed = list(found), len(found), cached
            self._hold(r, cached + n)
            self._register(r, (cached + n) // bs)
            if r.first_scheduled < 0:
                r.first_scheduled = now
                r.cached_at_first_admission = cached
            self.running.append(r)
            scheduled[r.id] = (r, n)
            budget -= n
            admitted.append(r.id)
            hits[r.id] = cached
        # step time (blackbox) from the batch summary
        prefill = [(r.computed, n, r.known) for r, n in scheduled.values() if not r.decoding]
        decoders = [r for r, _ in scheduled.values() if r.decoding]
        summary = (
            sum(n for _, n, _ in prefill),
            sorted(prefill),
            len(decoders),
            sum(r.computed for r in decoders),
        )
        self.summaries.append(summary)
        b0, b1, b2 = self.beta
        dt = max(1, int(b0 + b1 * summary[0] + b2 * summary[2]))
        self._scheduled = scheduled
        return {rid: n for rid, (_, n) in scheduled.items()}, admitted, preempted, hits, dt

    def end(self, end: int) -> list[int]:
        finished = []
        for r, n in self._scheduled.values():
            r.computed += n
            if r.computed < r.known:
                continue  # a prefill chunk
            r.generated += 1  # the token after the last computed one
            if r.generated == 1:
                r.first_token_end = end
            if r.generated < r.target:
                r.decoding = True
                continue
            self.running.remove(r)  # the final token's KV is never allocated
            self._release(r)
            r.finish = end
            finished.append(r.id)
        return finished


class RecordingBlackbox(BlackboxLatencyModel):
    """The blackbox model, keeping every batch summary it was asked to price."""

    def __init__(self, beta):
        super().__init__((0, 0, 0), beta)
        self.summaries: list[tuple] = []

    def step_time_us(self, batch: BatchSummary) -> int:
        self.summaries.append(
            (
                batch.prefill_tokens,
                sorted(batch.prefill_items),
                batch.decode_requests,
                batch.decode_context,
            )
        )
        return super().step_time_us(batch)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_workloads())
def test_the_engine_schedules_exactly_like_the_reference_scheduler(workload):
    limits, specs = workload
    beta = (1000, 1.5, 7)
    latency = RecordingBlackbox(beta)
    h = EngineHarness(latency=latency, **limits)
    ref = ReferenceEngine(limits, beta)
    refs: dict[int, RefRequest] = {}
    pending = deque(enumerate(specs))
    while pending or h.engine.has_work():
        if not h.engine.has_work() and pending[0][1]["arrival"] > h.now:
            h.now = pending[0][1]["arrival"]  # idle until the next arrival
        while pending and pending[0][1]["arrival"] <= h.now:  # same-instant arrivals join
            rid, spec = pending.popleft()
            req = h.submit(
                spec["prompt"],
                spec["output"],
                max_output_tokens=spec["max_output_tokens"],
                prefix_group=spec["group"],
                prefix_tokens=spec["prefix"],
            )
            assert req.id == rid
            refs[rid] = RefRequest(rid, spec, limits)
            assert ref.submit(refs[rid], spec) == (req.state == WAITING)
        if not h.engine.has_work():
            continue
        now = h.now
        tokens, admitted, preempted, hits, dt = ref.form(now)
        step = h.step()
        where = f"step at {now} µs"
        assert latency.summaries[-1] == ref.summaries[-1], where
        assert step.dt == dt, where
        assert step.admitted == admitted and step.hits == hits, where
        assert sorted(step.preempted) == sorted(preempted), where
        assert step.tokens == {rid: n for rid, n in tokens.items() if n > 0}, where
        assert sorted(step.finished) == sorted(ref.end(step.end)), where
        assert h.kv.free_count == len(ref.free), where
        assert h.kv.evictions == ref.evictions, where
        assert h.waiting_ids() == [r.id for r in ref.waiting], where
        assert h.check_kv() == [], where
    for rid, r in refs.items():
        req = h.requests[rid]
        if req.state == DROPPED:
            continue
        assert (req.first_scheduled_us, req.first_token_end_us, req.finish_us) == (
            r.first_scheduled,
            r.first_token_end,
            r.finish,
        ), rid
        assert (req.num_generated, req.preemptions, req.cached_tokens, req.finish_reason) == (
            r.generated,
            r.preemptions,
            r.cached_at_first_admission,
            r.reason,
        ), rid
    assert h.kv.used_blocks == 0
