"""Block-table memory follows the blocks held, and no call does work proportional to other
sequences' tables (issue 12, item 4): one long sequence among many short ones."""

import time
import tracemalloc

import numpy as np

from pagedkv.impl import BlockManager

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
