"""The decode step after a decode step of the same batch takes a short path (`_append_again`:
next slot or a new block per row, the remembered tables patched in place). Driven through any
mix of changes in between, a manager called with the same batch list (the short path wherever it
applies) and one called with a fresh copy each time (the full plan every step) stay identical in
everything a caller can see, and both pass their invariant check."""

from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidState, OutOfBlocks

B = 2


def observable(bm: BlockManager, batch: list) -> dict:
    ids = bm.seq_ids()
    state = {
        "seqs": [(s, bm.status(s), bm.length(s), bm.tokens(s), bm.block_table(s), bm.cpu_block_table(s))
                 for s in ids],
        "ref_count": bm.pool.ref_count.tolist(), "free_queue": bm.pool.free_queue,
        "evictable": list(bm.pool.evictable), "block_tokens": bm.block_tokens.tolist(),
        "pending": bm.copies.pending(), "metrics": bm.metrics(),
    }
    if bm.cache is not None:
        state["contents"] = bm.cache.contents()
    if all(bm.status(s) == "running" for s in batch):
        state["slots"] = bm.slot_mapping(batch).tolist()
        state["tables"] = bm.block_tables(batch).tolist()
    return state


def counting_short_paths(bm: BlockManager) -> list:
    """Count the manager's short-path appends (an instance attribute shadows the method)."""
    taken, short_path = [], bm._append_again

    def counted(*args):
        taken.append(1)
        return short_path(*args)
    bm._append_again = counted
    return taken


def call(bm: BlockManager, method: str, *args):
    try:
        answer = getattr(bm, method)(*args)
        return ("ok", answer.tolist() if hasattr(answer, "tolist") else answer)
    except (OutOfBlocks, InvalidState) as error:
        return (type(error).__name__, str(error))


between = st.sampled_from(["nothing", "tables", "preempt", "resume", "fork", "add_shared", "append_one", "free"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 9), between, st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=30),
       st.booleans(), st.integers(24, 64), st.integers(1, 5))
def test_the_short_path_answers_as_the_full_plan(events, caching, num_blocks, B):
    """Block sizes 1 to 5 and runs of up to 9 steps: every row starts a new block within a run,
    each in its own phase (the prompts' lengths 1 to 4 leave every offset in a block)."""
    same, fresh = (BlockManager(num_blocks, B, num_cpu_blocks=16, prefix_caching=caching) for _ in range(2))
    batch = [0, 1, 2, 3]
    for bm in (same, fresh):
        for seq_id in batch:
            bm.add(seq_id, [seq_id % 2, 1, 2, 3][:1 + seq_id])
    new_ids = iter(range(100, 200))
    for decode_steps, event, victim, token in events:
        for step in range(decode_steps):
            tokens = [(token + step + i) % 5 for i in range(len(batch))]
            assert call(same, "append_batch", batch, tokens) == call(fresh, "append_batch", list(batch), tokens)
            if step % 2:   # the engine reads the tables between steps: patched in place on the short path
                assert call(same, "block_tables", batch) == call(fresh, "block_tables", list(batch))
        seq_id, new_id = batch[victim], next(new_ids)
        for bm in (same, fresh):
            running = bm.status(seq_id) == "running"
            if event == "tables":
                call(bm, "block_tables", batch)
            elif event == "preempt" and running:
                call(bm, "preempt", seq_id, "swap" if token % 2 else "recompute")
            elif event == "resume" and not running:
                call(bm, "resume", seq_id)
            elif event == "fork" and running:       # the batch member's partial tail is shared now
                call(bm, "fork", seq_id, new_id)
            elif event == "add_shared":             # may hit the batch's filled (indexed) blocks
                call(bm, "add", new_id, bm.tokens(seq_id)[:4] + [token] if running else [token])
            elif event == "append_one" and running:
                call(bm, "append", seq_id, token)
            elif event == "free" and bm.seq_ids()[-1] not in batch:
                call(bm, "free", bm.seq_ids()[-1])
        assert observable(same, batch) == observable(fresh, batch)
        same.check()
        fresh.check()


def test_a_steady_decode_takes_the_short_path_and_matches_the_full_plan():
    same, fresh = (BlockManager(200, B, prefix_caching=True) for _ in range(2))
    batch = [0, 1, 2]
    for bm in (same, fresh):
        for seq_id in batch:
            bm.add(seq_id, list(range(seq_id + 3)))
    taken = counting_short_paths(same)
    for step in range(12):
        tokens = [step, 2 * step, 3]
        assert same.append_batch(batch, tokens) == fresh.append_batch(list(batch), tokens) == []
        assert same.block_tables(batch).tolist() == fresh.block_tables(list(batch)).tolist()
        assert same.slot_mapping(batch).tolist() == fresh.slot_mapping(list(batch)).tolist()
    assert len(taken) == 11   # every step after the first
    assert observable(same, batch) == observable(fresh, batch)
    same.check()


def test_a_table_that_moves_on_the_short_path_takes_the_batchs_full_tables_along():
    """Tables of four blocks fill their segments of four: the short path's first row that needs a
    fifth block moves every full table of the batch to a segment of eight (each of them needs one
    within the next block's worth of steps), so the run moves tables once per doubling."""
    bm = BlockManager(64, 4, max_seqs=4, max_blocks_per_seq=4)
    batch = [0, 1, 2, 3]
    for seq_id, length in zip(batch, [16, 15, 14, 13]):   # four blocks each, the last ones 4/4 .. 1/4 full
        bm.add(seq_id, list(range(length)))
    rows = [bm.row_of[s] for s in batch]
    assert bm.rows.capacity[rows].tolist() == bm.rows.num_held[rows].tolist() == [4, 4, 4, 4]
    bm.append_batch(batch, [1] * 4)                        # the full plan: only sequence 0 needs a block
    assert bm.rows.capacity[rows].tolist() == [8, 4, 4, 4]
    bm.append_batch(batch, [2] * 4)                        # sequence 1 needs its fifth: all move
    assert bm.rows.capacity[rows].tolist() == [8, 8, 8, 8]
    assert [len(bm.block_table(s)) for s in batch] == [5, 5, 4, 4]
    assert [bm.tokens(s)[-2:] for s in batch] == [[1, 2]] * 4
    bm.check()


def test_a_steady_run_sorts_its_phases_once_and_gathers_its_tables_once(monkeypatch):
    """Block size 1: every step gives every row a block, so the batch's tables grow a column a
    step. Gathered once, they are patched in place (widened by the new column) and copied whole
    by each `block_tables`, never gathered again; the run's phases are sorted once."""
    from pagedkv.impl.alloc.rows import DecodeRun, RowTables
    gathers, sorts = [], []
    gather, phases = RowTables.gather, DecodeRun.phases
    monkeypatch.setattr(RowTables, "gather", lambda self, *args: gathers.append(1) or gather(self, *args))
    monkeypatch.setattr(DecodeRun, "phases", lambda self, *args: sorts.append(1) or phases(self, *args))
    bm = BlockManager(400, 1)
    batch = [0, 1, 2]
    for seq_id in batch:
        bm.add(seq_id, [seq_id, 1])
    for step in range(30):
        bm.append_batch(batch, [step] * 3)
        tables = bm.block_tables(batch)
        assert tables.tolist() == [bm.block_table(s) for s in batch]
        assert tables.is_contiguous()
    assert len(gathers) == 1
    assert len(sorts) == 1
