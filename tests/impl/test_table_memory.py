"""Block-table memory follows the blocks held, and no call does work proportional to other
sequences' tables (issue 12, item 4): one long sequence among many short ones."""

import time
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.impl.alloc.journal import Journal
from pagedkv.impl.alloc.rows import RowTables
from pagedkv.spec import PagedKVError

LONG, SHORT, SHORT_LEN = 200_000, 256, 16


def peak_bytes(fn) -> int:
    """Peak memory traced while `fn` runs (numpy reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def pool_with_short_ones() -> BlockManager:
    bm = BlockManager(LONG + SHORT * (3 * SHORT_LEN) + 64, 1, max_seqs=SHORT + 1)
    for seq_id in range(1, SHORT + 1):
        bm.add(seq_id, [seq_id] * SHORT_LEN)
    return bm


def test_a_long_prompt_costs_tables_in_proportion_to_its_own_blocks():
    """Before: one row per sequence at the longest table's width, 256 x 200k int32 (195 MiB)."""
    bm = pool_with_short_ones()
    prompt = list(range(LONG))
    prompt_bytes = 8 * LONG            # the prompt itself as int64, which `add` must hold anyway
    peak = peak_bytes(lambda: bm.add(0, prompt))
    assert peak < 12 * prompt_bytes, f"add of a {LONG}-token prompt peaked at {peak / 2 ** 20:.1f} MiB"
    held = sum(len(bm.block_table(s)) for s in bm.seq_ids())
    assert bm.rows.arena.nbytes <= 4 * 4 * held    # int32 ids, segments at most 2x, arena at most 2x
    bm.check()


def test_appends_do_not_copy_other_sequences_tables():
    """Before: the next append re-allocated every row to twice the long table's width."""
    bm = pool_with_short_ones()
    bm.add(0, list(range(LONG)))
    short_ids = list(range(1, SHORT + 1))
    tokens = np.arange(SHORT)
    bm.append_batch(short_ids, tokens)          # warm the batch memo
    for _ in range(SHORT_LEN + 1):              # the short tables outgrow their segments
        peak = peak_bytes(lambda: bm.append_batch(short_ids, tokens))
        assert peak < 4 * LONG, f"a decode step of the short ones traced {peak} bytes"
    start = time.perf_counter()
    for _ in range(SHORT_LEN):
        bm.append(0, 1)
    assert time.perf_counter() - start < 0.5
    bm.check()


def test_freeing_the_long_one_gives_its_table_memory_back():
    bm = pool_with_short_ones()
    small = bm.rows.arena.nbytes
    bm.add(0, list(range(LONG)))
    bm.append(1, 1)                             # a short table moves past the long one
    assert bm.rows.arena.nbytes >= 4 * LONG
    bm.free(0)
    assert bm.rows.arena.nbytes <= 2 * small + 4 * 4 * SHORT * (SHORT_LEN + 1)
    assert bm.block_tables(list(range(1, SHORT + 1))).shape == (SHORT, SHORT_LEN + 1)
    bm.check()


# ------------------------------------------------------------------ the gathered tables of a repeated batch

def expected_tables(bm, ids) -> list:
    tables = [bm.block_table(s) for s in ids]
    width = max(map(len, tables), default=0)
    return [t + [-1] * (width - len(t)) for t in tables]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "fork", "free", "add", "swap", "undone"]),
                          st.integers(0, 4), st.integers(0, 30)), max_size=30))
def test_tables_of_a_repeated_batch_follow_every_change(program):
    """`block_tables` reuses the last call's tables for the same rows, re-gathering the rows that
    changed: after every call, and after a transaction that changed tables and was undone, the
    tables equal each sequence's own."""
    bm = BlockManager(64, 2, num_cpu_blocks=16, max_seqs=2, max_blocks_per_seq=1)
    for seq_id in range(5):
        bm.add(seq_id, [seq_id] * (seq_id + 1))
    next_id = 5
    for op, pick, n in program:
        running = bm.running()
        if running:
            assert bm.block_tables(running).tolist() == expected_tables(bm, running)
        target = running[pick % len(running)] if running else None
        try:
            if op == "add" or target is None:
                bm.add(next_id, [7] * (n + 1))
                next_id += 1
            elif op == "append":
                bm.append_batch(running, [n] * len(running))
            elif op == "fork":
                bm.fork(target, next_id)
                next_id += 1
            elif op == "free":
                bm.free(target)
            elif op == "swap":
                bm.swap_out(target)
                bm.swap_in(target)
            else:
                def grow_then_fail():
                    bm.append_batch(running, [n] * len(running))
                    bm.block_tables(running)        # gathered inside, then undone
                    raise RuntimeError("undone")
                with pytest.raises(RuntimeError):
                    bm.transaction(grow_then_fail)
        except PagedKVError:
            pass
    running = bm.running()
    assert bm.block_tables(running).tolist() == expected_tables(bm, running)
    bm.check()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.data())
def test_table_bytes_count_every_array_the_tables_own(lengths, data):
    """`rows.nbytes` (what bench/table_memory.py reports) is the host memory of every numpy array
    the row tables hold, whatever rows were added, grown and freed before."""
    bm = BlockManager(sum(lengths) + 64, 2, max_seqs=2)
    for seq_id, length in enumerate(lengths):
        bm.add(seq_id, [seq_id] * length)
    for seq_id in data.draw(st.sets(st.sampled_from(range(len(lengths))))):
        bm.free(seq_id)
    owned = [value for value in vars(bm.rows).values() if isinstance(value, np.ndarray)]
    assert bm.rows.nbytes == sum(array.nbytes for array in owned)


# ------------------------------------------------------------------ the segment placed last

@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 90), min_size=1, max_size=6), st.lists(st.integers(1, 300), min_size=1, max_size=40))
def test_admitting_and_freeing_one_after_another_never_compacts(kept, churn):
    """A sequence freed right after its admission gives its segment back to the used end: in an
    arena sized for all of them from the start (as an engine sizes it), the arena stays the same
    object, its used end returns where it was, and nothing is left past it."""
    bm = BlockManager(sum(kept) + max(churn) + 8, 1, max_seqs=len(kept) + 1, max_blocks_per_seq=max(kept + churn))
    for seq_id, length in enumerate(kept):
        bm.add(seq_id, [seq_id] * length)
    arena, used = bm.rows.arena, bm.rows.used
    for length in churn:
        bm.add(99, [7] * length)
        bm.free(99)
        assert bm.rows.arena is arena and bm.rows.used == used
        assert not np.count_nonzero(arena[used:] != -1)
    bm.check()


def test_a_segment_not_placed_last_stays_garbage_until_the_last_one_goes():
    bm = BlockManager(64, 1, max_seqs=4, max_blocks_per_seq=1)
    bm.add(1, [1] * 5)   # a segment of 8
    bm.add(2, [2] * 3)   # a segment of 4, placed last
    assert bm.rows.used == 12
    bm.free(1)
    assert bm.rows.used == 12 and bm.block_table(2) == list(bm.rows.arena[8:11])
    bm.free(2)
    assert bm.rows.used == 8   # back to where 2's segment began; 1's garbage waits for a compaction
    assert not np.count_nonzero(bm.rows.arena[8:] != -1)
    bm.check()


def test_row_tables_hand_out_their_tables_on_the_device_they_were_built_for():
    """Off the host the batch tables move to the manager's device ("meta" stands in for CUDA here:
    a device that is not the CPU, without one)."""
    rows = RowTables(2, 2, torch.device("meta"), Journal())
    assert rows.device_tables(np.array([], dtype=np.int64)).device.type == "meta"
