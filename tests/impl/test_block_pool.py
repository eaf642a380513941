"""The GPU block pool without prefix caching against a model of the spec's pool: a FIFO free
queue (kept as a ring that wraps) and ref counts; a released table gives its dead blocks back
tail first. Every step recorded in the journal is undone exactly by a rollback.
With prefix caching, the evictable LRU (a log of release stamps, stale entries left by hits, rebuilt
when full) against the spec's OrderedDict over long programs, and a fault at any line of a release
that rebuilds the log or an eviction that passes stale entries."""

from collections import deque

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.impl.alloc.block_pool import MIN_LOG, BlockPool
from pagedkv.impl.alloc.journal import Journal
from pagedkv.spec import InvariantViolation, KVSpec, OutOfBlocks

from test_fault_injection import assert_fault_changes_nothing, fault_points, line_events, manager_state


def lru_entries(pool: BlockPool) -> list:
    """The evictable LRU as (block, release stamp) pairs, least recently released first."""
    blocks = pool.evictable
    return list(zip(blocks, pool.stamp[blocks].tolist()))


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
        assert pool.problems() == []   # the ring's two copies among them, wrapped or not


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
    before = (lru_entries(bm.pool), manager_state(bm))

    def add_then_fail():
        bm.add(3, [9, 9, 9, 9, 9, 9, 9])          # 4 blocks: the free one, then all three evicted
        assert bm.num_evictable_blocks() == 0
        raise Undone

    with pytest.raises(Undone):
        bm.transaction(add_then_fail)
    assert (lru_entries(bm.pool), manager_state(bm)) == before
    assert [bm.cached_prefix_tokens(prompt) for prompt in prompts] == cached
    bm.check()


# ------------------------------------------------------------------ the evictable LRU (prefix caching)

def lru_cycles(bm, releases: int) -> None:
    """Add and free prompts that share a first block (a hit: its LRU entry goes stale) until the
    pool has released at least `releases` blocks."""
    prompt = 0
    while bm.pool.releases < releases:
        prompt += 1
        bm.add(1, [1, 1, prompt % 5, prompt % 3, prompt, 0])
        bm.free(1)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(4, 12), st.lists(st.tuples(st.sampled_from(["add", "free", "undone add", "undone free"]),
                                             st.integers(0, 5),
                                             st.integers(1, 4)), min_size=1, max_size=150))
def test_the_evictable_lru_is_the_specs_over_long_programs(num_blocks, program):
    """Prompts from a small alphabet (hits revive released blocks), enough releases to rebuild the
    log several times (MIN_LOG entries), and rolled-back adds and frees."""
    bm, kv = BlockManager(num_blocks, 2, prefix_caching=True), KVSpec(num_blocks, 2, prefix_caching=True)
    live, next_id = [], iter(range(10 ** 6))
    for op, a, b in program:
        if op == "free" and live:
            seq_id = live.pop(a % len(live))
            bm.free(seq_id)
            kv.free(seq_id)
        elif op == "undone free" and live:
            before = manager_state(bm), bm.pool.releases
            with pytest.raises(ZeroDivisionError):
                bm.transaction(lambda: (bm.free(live[a % len(live)]), 1 / 0))
            assert (manager_state(bm), bm.pool.releases) == before
        elif op in ("add", "undone add"):
            seq_id, tokens = next(next_id), [a % 2, 1, a % 3, b][:b] * (1 + a % 2)
            try:
                if op == "add":
                    assert bm.add(seq_id, tokens) == kv.add(seq_id, tokens)
                    live.append(seq_id)
                else:
                    before = manager_state(bm), bm.pool.releases
                    with pytest.raises(ZeroDivisionError):
                        bm.transaction(lambda: (bm.add(seq_id, tokens), 1 / 0))
                    assert (manager_state(bm), bm.pool.releases) == before
            except OutOfBlocks:
                with pytest.raises(OutOfBlocks):
                    kv.add(seq_id, tokens)
        assert bm.pool.evictable == list(kv.evictable)
        assert (bm.pool.free_queue, bm.num_free_blocks()) == (list(kv.free_queue), kv.num_free_blocks())
        bm.check()


def test_a_long_run_rebuilds_the_log_and_keeps_it_small():
    bm = BlockManager(8, 2, prefix_caching=True)
    lru_cycles(bm, 20 * MIN_LOG)
    # 20 logs' worth released: rebuilt each time it filled, at twice its current entries and a release
    assert len(bm.pool.lru_block) <= max(MIN_LOG, 2 * (bm.num_blocks + 3))
    bm.check()


def log_about_to_rebuild():
    """A freed prompt's three blocks do not fit the log's end: releasing them rebuilds it."""
    bm = BlockManager(8, 2, prefix_caching=True)
    lru_cycles(bm, MIN_LOG - 4)
    while bm.pool.lru_tail + 3 <= len(bm.pool.lru_block):
        lru_cycles(bm, bm.pool.releases + 1)
    bm.add(2, [4, 4, 5, 5, 6, 6])
    return bm


def stale_at_the_head():
    """Hits made the LRU's first twelve entries stale: an eviction passes them (more than one read
    window) for the current ones after them."""
    bm = BlockManager(30, 2, prefix_caching=True)
    bm.add(1, LONG)
    bm.free(1)                        # LONG's twelve blocks evictable
    bm.add(2, [100, 100, 101, 101])
    bm.free(2)                        # then two more
    bm.add(3, LONG + [9])             # the twelve revived: their entries stale; one block from the queue
    return bm


LONG = list(range(24))


@pytest.mark.parametrize("setup, operation", [
    (log_about_to_rebuild, lambda bm: bm.free(2)),
    (stale_at_the_head, lambda bm: bm.add(4, list(range(200, 234)))),   # 15 from the queue, then evicts the two
])
def test_a_fault_at_any_line_of_an_lru_change_changes_nothing(setup, operation):
    assert len(setup().pool.lru_block) == MIN_LOG
    total = line_events(setup, operation)
    for at in fault_points(total):
        assert_fault_changes_nothing(setup, operation, at)
    bm = setup()
    operation(bm)
    if setup is log_about_to_rebuild:
        assert bm.pool.lru_head == 0 and bm.pool.lru_tail == bm.num_evictable_blocks()   # rebuilt
    else:
        assert bm.num_evictable_blocks() == 0 and bm.cached_prefix_tokens(LONG + [0]) == 24
        assert bm.cached_prefix_tokens([100, 100, 101, 101, 0]) == 0


@pytest.mark.parametrize("block", [-1, 8, 99])
def test_a_log_entry_outside_the_pool_is_reported_not_raised(block):
    """The check names an LRU entry with a block id outside the pool (a negative one must not be
    read as an index from the end)."""
    bm = BlockManager(8, 2, prefix_caching=True)
    bm.add(1, [1, 1, 2, 2])
    bm.free(1)
    pool = bm.pool
    pool.lru_block[pool.lru_tail], pool.lru_stamp[pool.lru_tail] = block, pool.releases + 1
    pool.lru_tail += 1
    with pytest.raises(InvariantViolation, match=f"gpu block id {block} outside the pool is free or evictable"):
        bm.check()


def test_an_eviction_past_the_lru_log_fails_and_changes_nothing():
    """A pool that counts more evictable blocks than its log holds (a corruption) makes the
    eviction that runs out of entries raise, undone, instead of searching the log forever."""
    bm = BlockManager(4, 2, prefix_caching=True)
    bm.add(1, [1, 2, 3, 4])
    bm.free(1)                                  # two evictable blocks, two free
    bm.pool.num_evictable += 1                  # counted: three
    before = (lru_entries(bm.pool), manager_state(bm))
    with pytest.raises(RuntimeError, match="fewer than the 3 evictable blocks it counts"):
        bm.add(2, [5, 6, 7, 8, 9, 9, 9, 9, 9, 9])   # 5 blocks: the 2 free, then 3 evicted
    assert (lru_entries(bm.pool), manager_state(bm)) == before
