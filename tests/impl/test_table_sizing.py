"""How BlockManager sizes its row tables (docs/design.md, "Sizing"): `max_seqs` and
`max_blocks_per_seq` only size the initial row arrays and arena; rows double once every one is live,
and a compaction makes the arena twice the slots of the live tables' segments, never smaller than
it started."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.impl import BlockManager


def row_arrays(bm) -> tuple:
    return bm.rows.seq_len, bm.rows.num_held, bm.rows.row_status


def test_the_default_rows_hold_256_live_sequences_and_the_257th_grows_them():
    bm = BlockManager(300, 1)
    arrays, nbytes = row_arrays(bm), bm.rows.nbytes
    for seq in range(256):
        bm.add(seq, [seq])
    assert all(now is then for now, then in zip(row_arrays(bm), arrays)) and bm.rows.nbytes == nbytes
    bm.add(256, [0])
    assert all(len(now) > len(then) for now, then in zip(row_arrays(bm), arrays))
    assert bm.block_tables(list(range(257))).tolist() == [[seq] for seq in range(257)]


def live_slots(bm) -> int:
    """Slots of the segments live tables occupy (a free row has none)."""
    return int(np.sum(bm.rows.capacity))


OPS = st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 40)), st.tuples(st.just("append"), st.integers(0, 30)),
                         st.tuples(st.just("free"), st.integers(0, 30))), max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), OPS)
def test_a_compaction_leaves_the_arena_twice_the_live_segments(max_seqs, max_blocks, program):
    """Whenever an admission outgrows the arena or a free leaves most of it unused, the new arena is
    at most twice the live segments' slots, or the size it started with (no table reads here: a
    read's compaction also keeps room for the read's width)."""
    bm = BlockManager(4096, 1, max_seqs=max_seqs, max_blocks_per_seq=max_blocks)
    start, live, fresh = len(bm.rows.arena), [], 0
    for op, arg in program:
        arena = bm.rows.arena
        if op == "add":
            bm.add(fresh, list(range(arg)))
            live.append(fresh)
            fresh += 1
        elif op == "append" and live:
            bm.append(live[arg % len(live)], 0)
        elif op == "free" and live:
            bm.free(live.pop(arg % len(live)))
        if bm.rows.arena is not arena and op in ("add", "free"):
            assert len(bm.rows.arena) <= max(start, 2 * live_slots(bm)), (op, len(bm.rows.arena), live_slots(bm))
    bm.check()
