"""The GPU block pool without prefix caching against a model of the spec's pool: a FIFO free
queue (kept as a ring that wraps) and ref counts; a released table gives its dead blocks back
tail first. Every step recorded in the journal is undone exactly by a rollback."""

from collections import deque

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.impl.alloc.block_pool import BlockPool
from pagedkv.impl.alloc.journal import Journal
from pagedkv.spec import OutOfBlocks

from test_fault_injection import manager_state


def pool_state(pool: BlockPool) -> tuple:
    return pool.free_queue, pool.ref_count.tolist(), pool.num_free()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 9), st.lists(st.tuples(st.sampled_from(["take", "share", "release", "undone"]),
                                             st.integers(0, 9), st.integers(0, 9)), max_size=40))
@example(4, [("take", 2, 0), ("release", 0, 0), ("take", 4, 0), ("release", 0, 0)])   # a release that wraps
def test_the_pool_takes_and_releases_like_a_fifo_of_ref_counts(num_blocks, program):
    journal = Journal()
    pool = BlockPool(num_blocks, journal)
    free, refs, tables = deque(range(num_blocks)), [0] * num_blocks, []
    for op, a, b in program:
        if op == "take" and a <= len(free):
            blocks = pool.take(a)
            expected = [free.popleft() for _ in range(a)]
            assert blocks.dtype == np.int64 and blocks.tolist() == expected
            for block in expected:
                refs[block] = 1
            tables.append(expected)
        elif op == "share" and tables:   # another holder of a table (a fork)
            table = tables[a % len(tables)]
            pool.share(np.array(table, dtype=np.int64))
            for block in table:
                refs[block] += 1
            tables.append(list(table))
        elif op == "release" and tables:
            table = tables.pop(a % len(tables))
            pool.release(np.array(table, dtype=np.int32))   # as the table arena holds it
            for block in reversed(table):
                refs[block] -= 1
                if refs[block] == 0:
                    free.append(block)
        elif op == "undone":   # any of the steps, then a rollback: nothing changed
            before = pool_state(pool)
            released = sorted({a % len(tables), b % len(tables)}) if tables else []
            pool.release(np.array(tables[released[0]], dtype=np.int32)) if released else None
            if a <= pool.num_free():
                taken = pool.take(a)   # may take blocks that release freed, and wrap the ring
                if b % 3 == 0:         # given back: into ring slots that the take emptied
                    pool.release(taken.astype(np.int32))
            for i in released[1:]:
                pool.release(np.array(tables[i], dtype=np.int32))
            journal.rollback()
            assert pool_state(pool) == before
        journal.undo.clear()   # each step commits
        assert pool_state(pool) == (list(free), refs, len(free))


# ------------------------------------------------------------------ blocks written inside a transaction

class Undone(Exception):
    """Raised at the end of a transaction's body, so that it is rolled back."""


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.integers(3, 12), st.booleans(),
       st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=7), min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from(["free", "add", "append"]), st.integers(0, 9),
                          st.lists(st.integers(0, 9), min_size=1, max_size=9)), min_size=1, max_size=6))
def test_a_rollback_gives_blocks_freed_in_the_transaction_their_tokens_back(num_blocks, caching, prompts, body):
    """Freeing a sequence and admitting others that take its blocks and overwrite them, then
    failing: everything is as before, every sequence reads back its own tokens."""
    bm = BlockManager(num_blocks, 2, prefix_caching=caching)
    for seq_id, tokens in enumerate(prompts):
        if bm.num_free_blocks() >= -(-len(tokens) // 2):
            bm.add(seq_id, tokens)
    before = manager_state(bm)

    def run():
        for step, (op, a, tokens) in enumerate(body):
            ids = bm.seq_ids()
            try:
                if op == "free" and ids:
                    bm.free(ids[a % len(ids)])
                elif op == "add":
                    bm.add(100 + step, tokens)
                elif op == "append" and bm.running():
                    bm.append(bm.running()[a % len(bm.running())], tokens[0])
            except OutOfBlocks:
                pass   # a refused call changes nothing; the transaction goes on
        raise Undone

    with pytest.raises(Undone):
        bm.transaction(run)
    assert manager_state(bm) == before
    bm.check()



def test_a_rollback_of_an_add_that_evicted_every_cached_block_restores_them_all():
    """An add that takes the free blocks and then evicts every evictable one, undone: the cached
    blocks are evictable again, in their release order, and still serve their prefix."""
    bm = BlockManager(4, 2, prefix_caching=True)
    bm.add(1, [1, 2, 3, 4])
    bm.add(2, [5, 6])
    bm.free(2)
    bm.free(1)                                  # released after 2: 1's blocks are evicted last
    assert bm.num_evictable_blocks() == 3 and bm.num_free_blocks() == 4
    prompts = ([1, 2, 3, 4, 0], [5, 6, 0])
    cached = [bm.cached_prefix_tokens(prompt) for prompt in prompts]
    assert cached == [4, 2]
    before = (list(bm.pool.evictable.items()), manager_state(bm))

    def add_then_fail():
        bm.add(3, [9, 9, 9, 9, 9, 9, 9])          # 4 blocks: the free one, then all three evicted
        assert bm.num_evictable_blocks() == 0
        raise Undone

    with pytest.raises(Undone):
        bm.transaction(add_then_fail)
    assert (list(bm.pool.evictable.items()), manager_state(bm)) == before
    assert [bm.cached_prefix_tokens(prompt) for prompt in prompts] == cached
    bm.check()
