"""The paged KV block manager: accounting, prefix sharing, LRU eviction, conservation.

The first part exercises :class:`~servesim.components.kvcache.KVCache` directly; the middle part
checks prefix sharing through the engine (two requests of a prefix group hold the same blocks);
the last part is a hypothesis state machine that mirrors the free list with a plain Python model
and recounts every block (``KVCache.check``) after every operation.
"""

from __future__ import annotations

from collections import deque

import pytest
from conftest import EngineHarness, run_scenario, scenario_dict
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from strategies import block_hashes

from servesim.components.kvcache import KVCache


def owned(kv: KVCache, n: int) -> None:
    """Take ``n`` blocks off the free list (what an allocation does)."""
    assert n <= kv.free_count
    kv.pop_blocks(n)


# ---------------------------------------------------------------------- accounting


def test_a_new_cache_is_all_free():
    kv = KVCache(10, 4)
    assert (kv.free_count, kv.used_blocks) == (10, 0)
    assert kv.check([]) == []


def test_allocation_and_release_balance_the_books():
    kv = KVCache(10, 4)
    owned(kv, 3)
    owned(kv, 4)
    assert (kv.free_count, kv.used_blocks, kv.miss_blocks) == (3, 7, 7)
    assert kv.check([(3, []), (4, [])]) == []
    kv.release(3, [])
    assert (kv.free_count, kv.used_blocks) == (6, 4)
    assert kv.check([(4, [])]) == []
    kv.release(4, [])
    assert kv.free_count == 10 and kv.check([]) == []


def test_the_recount_notices_a_block_nobody_owns():
    kv = KVCache(10, 4)
    owned(kv, 3)
    problems = kv.check([(2, [])])
    assert any("conservation" in p for p in problems)


@pytest.mark.parametrize(("blocks", "size"), [(0, 4), (4, 0)])
def test_a_cache_needs_blocks_of_at_least_one_token(blocks, size):
    with pytest.raises(ValueError):
        KVCache(blocks, size)


# ---------------------------------------------------------------------- registration and sharing


def test_a_registered_block_is_found_by_its_hash_and_shared_by_reference():
    kv = KVCache(4, 4)
    owned(kv, 1)
    block = kv.register(0xA)
    assert kv.lookup(0xA) is block and block.ref == 1
    kv.claim([block])  # a second request hits it
    assert block.ref == 2 and kv.hit_blocks == 1
    assert kv.used_blocks == 1  # shared: one physical block
    assert kv.check([(0, [block]), (0, [block])]) == []
    kv.release(0, [block])
    assert block.ref == 1 and kv.used_blocks == 1
    kv.release(0, [block])
    assert block.ref == 0 and kv.used_blocks == 0 and kv.check([]) == []


def test_registering_content_that_is_already_cached_keeps_the_duplicate_anonymous():
    kv = KVCache(4, 4)
    owned(kv, 2)
    first = kv.register(0xA)
    assert kv.register(0xA) is None
    assert kv.lookup(0xA) is first
    assert kv.check([(0, [first]), (1, [])]) == []


def test_two_requests_of_a_prefix_group_share_the_prefix_blocks():
    h = EngineHarness(block_size=4, total_blocks=32)
    a = h.submit(14, 5, prefix_group=0, prefix_tokens=12)
    h.step()
    b = h.submit(14, 5, prefix_group=0, prefix_tokens=12)
    step = h.step()
    assert step.hits == {b.id: 12} and step.tokens[b.id] == 2
    assert len(a.blocks) == 3 and all(x is y for x, y in zip(a.blocks, b.blocks, strict=True))
    assert [blk.ref for blk in a.blocks] == [2, 2, 2]
    # a: 4 blocks (14 prompt tokens + 1 decode token); b: 3 shared + 1 private
    assert h.kv.used_blocks == 4 + 1
    assert h.check_kv() == []
    h.run()
    assert h.kv.used_blocks == 0 and h.check_kv() == []
    assert h.kv.hit_blocks == 3


@pytest.mark.parametrize(("group", "other_group"), [(0, 1), (0, 2), (1, 2), (2, 3), (5, 9)])
def test_requests_of_different_prefix_groups_share_nothing(group, other_group):
    h = EngineHarness(block_size=4, total_blocks=32)
    a = h.submit(14, 5, prefix_group=group, prefix_tokens=12)
    h.step()
    other = h.submit(14, 5, prefix_group=other_group, prefix_tokens=12)
    step = h.step()
    assert step.hits == {other.id: 0}
    assert not {id(blk) for blk in other.blocks} & {id(blk) for blk in a.blocks}
    assert h.kv.used_blocks == 4 + 4


def test_a_workload_with_two_prefix_groups_hits_only_within_a_group():
    data = scenario_dict(
        requests=40,
        rate=50,
        input=4,
        output=2,
        prefix={"tokens": 32, "groups": 2},
        kv_blocks=256,
        block_size=4,
    )
    req = run_scenario(data).requests
    # The cache never evicts here, so exactly the first request of each group misses.
    assert (req["cached_tokens"] == 0).sum() == 2
    assert set(req["cached_tokens"]) == {0, 32}  # the whole 32-token prefix


def test_without_prefix_caching_nothing_is_shared():
    h = EngineHarness(block_size=4, total_blocks=32, enable_prefix_caching=False)
    a = h.submit(14, 5, prefix_group=0, prefix_tokens=12)
    h.step()
    b = h.submit(14, 5, prefix_group=0, prefix_tokens=12)
    step = h.step()
    assert step.hits == {b.id: 0} and not a.blocks and not b.blocks
    assert h.kv.used_blocks == 8


# ---------------------------------------------------------------------- LRU free list


def held(kv: KVCache, hashes) -> list:
    """Blocks owned by one request, registered under ``hashes`` in block-table order."""
    owned(kv, len(hashes))
    return [kv.register(h) for h in hashes]


def test_released_blocks_are_evicted_last_block_first():
    kv = KVCache(3, 4)
    blocks = held(kv, [10, 11, 12])
    kv.release(0, blocks)  # free list, head first: 12, 11, 10
    assert all(kv.is_cached(h) for h in (10, 11, 12))
    owned(kv, 1)
    assert not kv.is_cached(12) and kv.is_cached(11) and kv.is_cached(10)
    owned(kv, 1)
    assert not kv.is_cached(11) and kv.is_cached(10)
    assert kv.evictions == 2


def test_a_requests_anonymous_tail_blocks_are_reused_before_its_registered_prefix():
    kv = KVCache(4, 4)
    blocks = held(kv, [10, 11])
    owned(kv, 2)  # two more blocks of the same request, not shareable
    kv.release(2, blocks)
    owned(kv, 2)
    assert kv.is_cached(10) and kv.is_cached(11) and kv.evictions == 0
    owned(kv, 1)
    assert not kv.is_cached(11) and kv.is_cached(10)


def test_the_least_recently_released_request_is_evicted_first():
    kv = KVCache(4, 4)
    older = held(kv, [10, 11])
    newer = held(kv, [20, 21])
    kv.release(0, older)
    kv.release(0, newer)
    owned(kv, 2)
    assert not kv.is_cached(10) and not kv.is_cached(11)
    assert kv.is_cached(20) and kv.is_cached(21)


def test_requests_finishing_in_the_same_step_are_released_in_batch_order():
    """vLLM frees finished requests in scheduling order (running requests in batch order, then
    this step's admissions), and so does BLIS (completions pass over the batch); the free list
    is an LRU, so that order decides whose cached blocks are evicted first."""
    h = EngineHarness(block_size=4, total_blocks=4, max_num_seqs=4)
    h.submit(8, 2, prefix_group=0, prefix_tokens=8)  # a: 2 prefix blocks, then a 3rd to decode
    h.step()
    h.submit(4, 1)  # b: admitted next to a's decode step; both finish in that step
    assert h.step().finished == [0, 1]
    # batch order: a's blocks (last first: anonymous, prefix 1, prefix 0) then b's block
    h.submit(8, 1)  # c takes two blocks off the head: a's anonymous one and prefix block 1
    h.step()
    late = h.submit(9, 1, prefix_group=0, prefix_tokens=8)
    assert h.step().hits == {late.id: 4}  # only prefix block 0 is still cached


def test_a_free_cached_block_still_hits_until_it_is_popped():
    kv = KVCache(3, 4)
    (block,) = held(kv, [10])
    kv.release(0, [block])
    assert kv.lookup(10) is block and block.ref == 0 and kv.free_count == 3
    kv.claim([block])  # lazy eviction: a later request revives it
    assert block.ref == 1 and kv.free_count == 2 and kv.hit_blocks == 1
    assert kv.check([(0, [block])]) == []
    kv.release(0, [block])
    owned(kv, 3)  # now everything is reused: the content is gone
    assert kv.lookup(10) is None


def test_a_finished_requests_prefix_hits_until_other_requests_reuse_its_blocks():
    h = EngineHarness(block_size=4, total_blocks=8)
    h.submit(13, 1, prefix_group=0, prefix_tokens=12)
    h.run()  # 4 blocks back on the free list, 3 of them still registered
    assert h.kv.used_blocks == 0
    again = h.submit(13, 1, prefix_group=0, prefix_tokens=12)
    assert h.step().hits == {again.id: 12}
    h.run()
    h.submit(31, 1)  # takes every block: the prefix is evicted
    h.run()
    late = h.submit(13, 1, prefix_group=0, prefix_tokens=12)
    assert h.step().hits == {late.id: 0}


def test_the_step_log_counts_the_blocks_each_step_used():
    """``kv_used`` is documented as the blocks in use after the step's allocation; a request
    that finishes in the step held its blocks for the whole step (BLIS samples usage during
    Execute, before completions release anything), so utilisation must include them."""
    h = EngineHarness(block_size=4, total_blocks=8)
    h.submit(10, 1)  # 3 blocks for one prefill step that also finishes the request
    step = h.step()
    assert step.finished == [0]
    assert step.row["kv_used"] == 3


def test_kv_utilisation_of_a_lone_request_counts_its_blocks():
    data = scenario_dict(requests=1, input=10, output=1, kv_blocks=8, block_size=4)
    results = run_scenario(data)
    assert results.summary["kv_utilization_peak"] == 3 / 8


# ---------------------------------------------------------------------- conservation, randomly


class Holder:
    """What one request owns: anonymous blocks and registered blocks (a leading run)."""

    def __init__(self, anonymous: int = 0, registered: list | None = None):
        self.anonymous = anonymous
        self.registered = registered or []


class KVCacheMachine(RuleBasedStateMachine):
    """Random allocate / register / hit / grow / release sequences against a model free list.

    The model keeps the free list as a deque of ``None`` (an anonymous block) and hashes
    (a registered free block), head first, and predicts which content each pop evicts.
    """

    TOTAL, BLOCK_SIZE = 12, 4

    def __init__(self):
        super().__init__()
        self.kv = KVCache(self.TOTAL, self.BLOCK_SIZE)
        self.holders: list[Holder] = []
        self.free: deque = deque([None] * self.TOTAL)
        self.cached: dict[int, object] = {}  # model registry: hash -> block
        self.evicted = 0

    def _pop(self, n: int) -> None:
        self.kv.pop_blocks(n)
        for _ in range(n):
            item = self.free.popleft()
            if item is not None:
                del self.cached[item]
                self.evicted += 1

    @rule(n=st.integers(1, 4))
    def allocate(self, n):
        if n <= len(self.free):
            self._pop(n)
            self.holders.append(Holder(anonymous=n))

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), n=st.integers(1, 3))
    def grow(self, data, n):
        holder = data.draw(st.sampled_from(self.holders))
        if n <= len(self.free):
            self._pop(n)
            holder.anonymous += n

    @precondition(lambda self: any(h.anonymous for h in self.holders))
    @rule(data=st.data(), block_hash=block_hashes)
    def register(self, data, block_hash):
        holder = data.draw(st.sampled_from([h for h in self.holders if h.anonymous]))
        block = self.kv.register(block_hash)
        if block_hash in self.cached:
            assert block is None
            return
        assert block is not None and block.ref == 1
        self.cached[block_hash] = block
        holder.anonymous -= 1
        holder.registered.append(block)

    @precondition(lambda self: self.cached)
    @rule(data=st.data())
    def hit(self, data):
        """A new request finds some cached blocks (in use or free) and claims them."""
        hashes = data.draw(st.lists(st.sampled_from(sorted(self.cached)), min_size=1, unique=True))
        blocks = [self.kv.lookup(h) for h in hashes]
        assert all(b is self.cached[h] for b, h in zip(blocks, hashes))
        revived = [h for h, b in zip(hashes, blocks) if b.ref == 0]
        if len(revived) > len(self.free):
            return
        self.kv.claim(blocks)
        for h in revived:
            self.free.remove(h)
        self.holders.append(Holder(registered=blocks))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        refs_before = {id(b): b.ref for b in holder.registered}
        self.kv.release(holder.anonymous, holder.registered)
        self.free.extend([None] * holder.anonymous)
        for block in reversed(holder.registered):
            refs_before[id(block)] -= 1
            if refs_before[id(block)] == 0:
                self.free.append(block.hash)

    @invariant()
    def the_books_balance(self):
        owners = [(h.anonymous, h.registered) for h in self.holders]
        assert self.kv.check(owners) == []
        assert self.kv.free_count == len(self.free)
        assert self.kv.used_blocks + self.kv.free_count == self.TOTAL

    @invariant()
    def cached_content_matches_the_model_free_list(self):
        for block_hash in range(12):
            assert self.kv.is_cached(block_hash) == (block_hash in self.cached)
        assert self.kv.evictions == self.evicted


KVCacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_kv_cache_conservation_and_lru_under_random_operations = KVCacheMachine.TestCase
