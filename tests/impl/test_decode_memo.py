"""A decode step remembers what its batch append learnt (the rows all run, the slots the new tokens
went to) until a table changes. Whatever runs in between, the batch's slot mapping and tables are
what the public per-sequence queries say, and a batch holding a sequence that stopped running is
refused. A tuple batch is remembered by identity alone (it cannot change): its hits read no dump,
and a recycled row is still seen."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pagedkv.impl.alloc.block_manager as block_manager
from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidArgument, InvalidState, OutOfBlocks, UnknownSequence

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


class Two(int):
    """An int subclass whose value is 2 (a tuple may hold one: read by its value)."""


def test_a_tuple_batch_hit_reads_no_dump_and_a_list_hit_reads_one(monkeypatch):
    """A hit checks no id again (`plain_seq_ids` is the miss); a list's hit dumps it, a tuple's not."""
    dumps = []
    marshalled, plain_seq_ids = block_manager.marshalled, block_manager.plain_seq_ids
    monkeypatch.setattr(block_manager, "marshalled", lambda items: dumps.append(type(items)) or marshalled(items))
    monkeypatch.setattr(block_manager, "plain_seq_ids", lambda items: dumps.append("miss") or plain_seq_ids(items))
    bm = BlockManager(64, 2)
    for seq_id in range(3):
        bm.add(seq_id, [seq_id, 1])
    for batch in ((0, 1, Two(2)), [0, 1, 2]):
        bm.decode(batch, [5, 5, 5])   # the miss: remembered
        dumps.clear()
        for step in range(3):
            out = bm.decode(batch, [step] * 3)
            assert out.slot_mapping.tolist() == expected_slots(bm, [0, 1, 2])
            assert out.block_tables.tolist() == expected_tables(bm, [0, 1, 2])
        assert dumps == ([] if type(batch) is tuple else [list] * 3)
    assert [bm.length(s) for s in range(3)] == [10, 10, 10]


def test_a_remembered_tuple_sees_its_rows_recycled():
    """The tuple's sequence freed and a new one of its id added: a new row, found again."""
    bm = BlockManager(64, 2)
    for seq_id in range(2):
        bm.add(seq_id, [seq_id, 1])
    batch = (0, 1)
    bm.decode(batch, [5, 5])
    bm.free(1)
    with pytest.raises(UnknownSequence):
        bm.decode(batch, [6, 6])
    bm.add(2, [4])     # takes the freed row
    bm.add(1, [7, 7, 7])
    out = bm.decode(batch, [8, 8])
    assert bm.tokens(1) == [7, 7, 7, 8]
    assert out.slot_mapping.tolist() == expected_slots(bm, [0, 1])
    assert out.block_tables.tolist() == expected_tables(bm, [0, 1])


@pytest.mark.parametrize("bad", [(0, True), (0.0, 1), (0, 1, 0), (0, 1, 99)])
def test_a_tuple_batch_is_checked_before_it_is_remembered(bad):
    """A bad tuple equal to a remembered one, or after one: refused, nothing changed."""
    bm = BlockManager(16, 2)
    bm.add(0, [1])
    bm.add(1, [2])
    bm.decode((0, 1), [3, 3])
    before = [bm.tokens(0), bm.tokens(1)]
    for _ in range(2):
        with pytest.raises((InvalidArgument, UnknownSequence)):
            bm.decode(bad, [5] * len(bad))
    assert [bm.tokens(0), bm.tokens(1)] == before
