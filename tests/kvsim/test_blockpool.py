"""BlockPool: seed picture, misuse errors, copy-on-write, prefix cache, LRU, and a
hypothesis state machine that checks data integrity through a shadow KV memory."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.blockpool import (
    BlockPool, PoolExhausted, UnknownSequence, external_block_keys, token_block_keys,
)
from kvsim.errors import KvsimError


def test_seed_picture_33_tokens_three_blocks_7_2_11():
    order = [7, 2, 11] + [b for b in range(16) if b not in (7, 2, 11)]
    pool = BlockPool(16, 16, initial_free_order=order)
    pool.allocate(0, 33)
    assert pool.block_table(0) == (7, 2, 11)
    infos = {b.block_id: b for b in pool.blocks()}
    assert [infos[b].filled for b in (7, 2, 11)] == [16, 16, 1]
    # 33 tokens in 3 blocks of 16 -> 48 slots, 15 empty (the seed's slack)
    assert pool.num_used_blocks * 16 - pool.num_live_tokens == 15
    pool.check_invariants()


def test_32_tokens_two_blocks_no_slack():
    pool = BlockPool(4, 16)
    pool.allocate(1, 32)
    assert len(pool.block_table(1)) == 2 and pool.num_live_tokens == 32
    pool.append_tokens(1, 1)
    assert len(pool.block_table(1)) == 3


def test_free_unknown_and_double_free_raise():
    pool = BlockPool(4, 4)
    with pytest.raises(UnknownSequence, match="not in the pool"):
        pool.free(3)
    pool.allocate(3, 5)
    pool.free(3)
    with pytest.raises(UnknownSequence):
        pool.free(3)
    with pytest.raises(UnknownSequence):
        pool.append_tokens(3, 1)
    assert pool.num_free_blocks == 4
    pool.check_invariants()


def test_duplicate_allocate_and_bad_sizes_raise():
    pool = BlockPool(4, 4)
    pool.allocate(0, 1)
    with pytest.raises(KvsimError, match="already"):
        pool.allocate(0, 1)
    with pytest.raises(KvsimError):
        pool.allocate(1, -1)
    with pytest.raises(KvsimError):
        BlockPool(0, 4)
    with pytest.raises(KvsimError):
        BlockPool(4, 0)
    with pytest.raises(KvsimError):
        BlockPool(3, 4, initial_free_order=[0, 1, 1])


def test_append_past_pool_raises_and_changes_nothing():
    pool = BlockPool(3, 4)
    pool.allocate(0, 8)  # 2 blocks
    pool.append_tokens(0, 4)  # 3rd block
    with pytest.raises(PoolExhausted, match="needs 1 free blocks"):
        pool.append_tokens(0, 1)
    assert pool.num_tokens(0) == 12 and pool.num_free_blocks == 0
    with pytest.raises(PoolExhausted):
        pool.allocate(1, 1)
    assert 1 not in pool
    pool.check_invariants()


def test_fork_shares_then_copy_on_write_records_src_dst():
    pool = BlockPool(8, 4)
    pool.allocate(0, 6)  # blocks [a(4), b(2)]
    a, b = pool.block_table(0)
    pool.fork(0, 1)
    assert pool.ref_count(a) == pool.ref_count(b) == 2
    assert pool.num_used_blocks == 2 and pool.num_table_refs == 4
    copies = pool.append_tokens(1, 1)
    assert len(copies) == 1 and copies[0][0] == b
    dst = copies[0][1]
    assert pool.block_table(1) == (a, dst) and pool.block_table(0) == (a, b)
    assert pool.ref_count(b) == 1 and pool.ref_count(dst) == 1 and pool.ref_count(a) == 2
    # the parent is now sole owner of b and appends in place
    assert pool.append_tokens(0, 1) == []
    pool.check_invariants()
    pool.free(0)
    pool.free(1)
    assert pool.num_free_blocks == 8 and pool.num_live_tokens == 0
    pool.check_invariants()


def test_fork_at_block_boundary_needs_no_copy():
    pool = BlockPool(8, 4)
    pool.allocate(0, 8)
    pool.fork(0, 1)
    assert pool.append_tokens(1, 1) == []
    assert pool.block_table(1)[:2] == pool.block_table(0)
    pool.check_invariants()


def test_prefix_cache_hits_full_blocks_and_recomputes_last_token():
    pool = BlockPool(16, 4, enable_prefix_caching=True)
    prompt = list(range(12))  # exactly 3 full blocks
    r0 = pool.allocate(0, 12, token_ids=prompt)
    assert r0.num_cached_blocks == 0
    r1 = pool.allocate(1, 12, token_ids=prompt)
    # the last token must be recomputed, so its block (the 3rd) is not a hit
    assert r1.num_cached_blocks == 2 and r1.num_cached_tokens == 8
    assert pool.block_table(1)[:2] == pool.block_table(0)[:2]
    assert pool.block_table(1)[2] != pool.block_table(0)[2]
    r2 = pool.allocate(2, 13, token_ids=prompt + [99])
    assert r2.num_cached_blocks == 3
    assert pool.prefix_query_blocks == 3 + 3 + 4 and pool.prefix_hit_blocks == 5
    # a different first block breaks the chain even if later blocks match
    r3 = pool.allocate(3, 12, token_ids=[50, 1, 2, 3] + prompt[4:])
    assert r3.num_cached_blocks == 0
    pool.check_invariants()


def test_freed_cached_blocks_stay_hittable_then_lru_evicted():
    pool = BlockPool(4, 2, enable_prefix_caching=True)
    pool.allocate(0, 5, token_ids=[1, 2, 3, 4, 5])  # 3 blocks, 2 full cached
    pool.free(0)
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2
    r = pool.allocate(1, 5, token_ids=[1, 2, 3, 4, 6])
    assert r.num_cached_blocks == 2  # pulled out of the middle of the free queue
    pool.check_invariants()
    pool.free(1)
    # Filling the pool with unrelated data evicts cached blocks least-recently freed first.
    pool.allocate(2, 8, token_ids=[9] * 8)
    assert pool.num_free_blocks == 0
    pool.free(2)
    r = pool.allocate(3, 5, token_ids=[1, 2, 3, 4, 5])
    assert r.num_cached_blocks == 0
    pool.check_invariants()


def test_lru_eviction_order_prefers_least_recently_freed():
    pool = BlockPool(5, 2, enable_prefix_caching=True)
    pool.allocate(0, 3, token_ids=[1, 1, 7])  # one full cached block + one partial
    pool.allocate(1, 3, token_ids=[2, 2, 7])
    pool.free(0)  # freed first -> least recently used
    pool.free(1)
    k0, k1 = token_block_keys([1, 1], 2), token_block_keys([2, 2], 2)
    assert pool.cached_prefix_blocks(3, k0) == pool.cached_prefix_blocks(3, k1) == 1
    # uncached partial blocks are reused first, then the oldest cached block is evicted
    pool.allocate(2, 8, token_ids=[5, 6] * 4)
    assert pool.num_free_blocks == 1
    assert pool.cached_prefix_blocks(3, k0) == 0
    assert pool.cached_prefix_blocks(3, k1) == 1
    pool.check_invariants()


def test_can_allocate_counts_hits_on_free_blocks():
    pool = BlockPool(3, 2, enable_prefix_caching=True)
    pool.allocate(0, 5, token_ids=[1, 2, 3, 4, 5])
    pool.free(0)
    keys = token_block_keys([1, 2, 3, 4, 5], 2)
    assert pool.can_allocate(5, keys)
    assert not pool.can_allocate(7)


def test_external_keys_mapping():
    ids = [10, 11, 12]  # 3 hash blocks of 512, prompt 1300 tokens (last partial)
    assert external_block_keys(ids, 512, 512, 1300) == [10, 11]
    assert external_block_keys(ids, 512, 256, 1300)[:5] == [(10, 0), (10, 1), (11, 0), (11, 1), (12, 0)]
    assert len(external_block_keys(ids, 512, 256, 1300)) == 1300 // 256
    assert external_block_keys([1, 2, 3, 4], 512, 1024, 2048) == [2, 4]
    with pytest.raises(KvsimError):
        external_block_keys(ids, 512, 300, 1300)
    with pytest.raises(KvsimError):
        external_block_keys(ids, 512, 768, 1300)


def test_token_keys_are_chained():
    a = token_block_keys([1, 2, 3, 4], 2)
    b = token_block_keys([9, 9, 3, 4], 2)
    assert len(a) == 2 and a[1] != b[1]  # same block tokens, different parent


# ----- property test: random operation sequences ----------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free against a shadow physical memory.

    Every token written is unique (or drawn from a tiny alphabet for prompts, so prefixes
    collide and hit the cache); copies reported by copy-on-write are applied to the
    shadow memory; after every step each sequence, read through its block table, must
    hold exactly the tokens it was given.
    """

    def __init__(self) -> None:
        super().__init__()
        self.B = 3
        self.pool = BlockPool(12, self.B, enable_prefix_caching=True)
        self.memory: dict[int, list] = {b: [None] * self.B for b in range(12)}
        self.expected: dict[int, list] = {}
        self.next_id = 0
        self.counter = 1000

    def _write(self, sid: int, start: int, tokens: list) -> None:
        table = self.pool.block_table(sid)
        for i, tok in enumerate(tokens, start):
            self.memory[table[i // self.B]][i % self.B] = tok

    @rule(prompt=st.lists(st.integers(0, 1), min_size=0, max_size=10))
    def allocate(self, prompt):
        sid = self.next_id
        self.next_id += 1
        try:
            res = self.pool.allocate(sid, len(prompt), token_ids=prompt)
        except PoolExhausted:
            assert sid not in self.pool
            return
        cached = res.num_cached_tokens
        # cached blocks must already hold exactly these tokens
        table = self.pool.block_table(sid)
        for i in range(cached):
            assert self.memory[table[i // self.B]][i % self.B] == prompt[i]
        self._write(sid, cached, prompt[cached:])
        self.expected[sid] = list(prompt)

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), k=st.integers(0, 5))
    def append(self, data, k):
        sid = data.draw(st.sampled_from(sorted(self.expected)))
        tokens = list(range(self.counter, self.counter + k))
        self.counter += k
        before = self.pool.num_free_blocks
        try:
            copies = self.pool.append_tokens(sid, k)
        except PoolExhausted:
            assert self.pool.num_free_blocks == before
            return
        for src, dst in copies:
            self.memory[dst] = list(self.memory[src])
        self._write(sid, len(self.expected[sid]), tokens)
        self.expected[sid].extend(tokens)

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.expected)))
        sid = self.next_id
        self.next_id += 1
        self.pool.fork(parent, sid)
        self.expected[sid] = list(self.expected[parent])

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.expected)))
        self.pool.free(sid)
        del self.expected[sid]
        with pytest.raises(UnknownSequence):
            self.pool.free(sid)

    @invariant()
    def consistent(self):
        self.pool.check_invariants()
        for sid, toks in self.expected.items():
            table = self.pool.block_table(sid)
            got = [self.memory[table[i // self.B]][i % self.B] for i in range(len(toks))]
            assert got == toks, f"sequence {sid} data corrupted"

    def teardown(self):
        for sid in list(self.expected):
            self.pool.free(sid)
        self.pool.check_invariants()
        assert self.pool.num_free_blocks == self.pool.num_blocks
        assert self.pool.num_live_tokens == 0 and self.pool.num_table_refs == 0


PoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPoolMachine = PoolMachine.TestCase
