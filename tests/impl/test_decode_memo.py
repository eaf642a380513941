"""A decode step remembers what its batch append learnt (the rows all run, the slots the new tokens
went to) until a table changes. Whatever runs in between, the batch's slot mapping and tables are
what the public per-sequence queries say, and a batch holding a sequence that stopped running is
refused."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidState, OutOfBlocks

B = 2


def expected_slots(bm: BlockManager, seq_ids: list) -> list:
    """The slot of each sequence's last token, from its block table and length."""
    return [bm.block_table(s)[(bm.length(s) - 1) // B] * B + (bm.length(s) - 1) % B for s in seq_ids]


def expected_tables(bm: BlockManager, seq_ids: list) -> list:
    width = max(len(bm.block_table(s)) for s in seq_ids)
    return [bm.block_table(s) + [-1] * (width - len(bm.block_table(s))) for s in seq_ids]


between = st.sampled_from(["nothing", "tables", "preempt", "resume", "free_other", "fork", "add", "append_one"])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(between, st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=25),
       st.booleans())
def test_batch_slots_and_tables_follow_every_change(events, caching):
    bm = BlockManager(64, B, num_cpu_blocks=16, prefix_caching=caching)
    batch = [0, 1, 2, 3]
    for seq_id in batch:
        bm.add(seq_id, [seq_id % 2, 1, 2])
    fresh_ids = iter(range(100, 200))
    for event, victim, token in events:
        running = bm.running()
        if all(s in running for s in batch):
            try:
                bm.append_batch(batch, [token] * len(batch))
            except OutOfBlocks:
                return
        seq_id = batch[victim]
        try:
            if event == "tables" and all(s in running for s in batch):
                bm.block_tables(batch)
            elif event == "preempt" and bm.status(seq_id) == "running":
                bm.preempt(seq_id, "swap" if token % 2 else "recompute")
            elif event == "resume" and bm.status(seq_id) != "running":
                bm.resume(seq_id)
            elif event == "free_other" and bm.seq_ids()[-1] not in batch:
                bm.free(bm.seq_ids()[-1])
            elif event == "fork" and bm.status(seq_id) == "running":
                bm.fork(seq_id, next(fresh_ids))
            elif event == "add":
                bm.add(next(fresh_ids), [token, 1])
            elif event == "append_one" and bm.status(seq_id) == "running":
                bm.append(seq_id, token)
        except OutOfBlocks:
            pass
        if all(bm.status(s) == "running" for s in batch):
            assert bm.slot_mapping(batch).tolist() == expected_slots(bm, batch)
            assert bm.block_tables(batch).tolist() == expected_tables(bm, batch)
        else:
            with pytest.raises(InvalidState):
                bm.slot_mapping(batch)
            with pytest.raises(InvalidState):
                bm.append_batch(batch, [token] * len(batch))
        bm.check()


def test_a_handed_out_slot_mapping_is_the_callers_own():
    bm = BlockManager(16, B)
    batch = [1, 2]
    for seq_id in batch:
        bm.add(seq_id, [seq_id, 5])
    bm.append_batch(batch, [7, 7])
    first = bm.slot_mapping(batch)
    first[:] = -5
    assert bm.slot_mapping(batch).tolist() == expected_slots(bm, batch)
    assert np.all(bm.slot_mapping(batch).numpy() >= 0)


def test_handed_out_tables_are_the_callers_own():
    """Tables handed out are copies: writing into them changes nothing the manager answers next,
    and the manager's later steps (patched into its own tables) leave them as they were."""
    bm = BlockManager(32, B)
    batch = [1, 2]
    for seq_id in batch:
        bm.add(seq_id, [seq_id, 5])
    for step in range(4):
        bm.append_batch(batch, [step, step])
        before = expected_tables(bm, batch)
        handed = bm.block_tables(batch)
        assert handed.tolist() == before
        again = bm.block_tables(batch)        # the remembered tables, copied
        again[:] = -7
        assert bm.block_tables(batch).tolist() == before
        bm.append_batch(batch, [9, 9])       # a new block for each: patched into the manager's own
        assert handed.tolist() == before
        assert bm.block_tables(batch).tolist() == expected_tables(bm, batch)
