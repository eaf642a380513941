"""The decode step after a decode step of the same batch takes a short path (`_append_again`:
next slot or a new block per row, the remembered tables patched in place). Driven through any
mix of changes in between, a manager called with the same batch list (the short path wherever it
applies) and one called with a fresh copy each time (the full plan every step) stay identical in
everything a caller can see, and both pass their invariant check.

`decode` (the step in one call) answers as `append_batch`, `block_tables` and `slot_mapping` called
in turn on a twin manager, refusals, rollbacks and faults included."""

from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidArgument, InvalidState, OutOfBlocks, UnknownSequence

from test_fault_injection import FaultInjector, Planted, manager_state

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


# ------------------------------------------------------------------ decode: one call for the step

def three_calls(bm: BlockManager, batch, tokens):
    """The step as three calls, answered as `decode_call` answers."""
    try:
        copies = bm.append_batch(batch, tokens)
    except (OutOfBlocks, InvalidState, InvalidArgument, UnknownSequence) as error:
        return (type(error).__name__, str(error))
    tables, slots = bm.block_tables(batch), bm.slot_mapping(batch)
    return ("ok", copies, tables.dtype, tables.tolist(), slots.dtype, slots.tolist())


def decode_call(bm: BlockManager, batch, tokens):
    try:
        out = bm.decode(batch, tokens)
    except (OutOfBlocks, InvalidState, InvalidArgument, UnknownSequence) as error:
        return (type(error).__name__, str(error))
    return ("ok", out.copies, out.block_tables.dtype, out.block_tables.tolist(), out.slot_mapping.dtype,
            out.slot_mapping.tolist())


def twin_state(bm: BlockManager) -> dict:
    """`manager_state` less where the table segments lie in the arena: a rollback forgets the
    decode memo, and the full plan moves fewer tables than the short path would."""
    state = manager_state(bm)
    del state["arena"]
    return state


def hostile(batch, tokens, kind: int):
    """The step's arguments, one of them bad (kind 1..5), or as they are (0)."""
    if kind == 1:
        return batch, tokens[:-1]                                 # a token short
    if kind == 2:
        return batch, tokens[:-1] + [-1]                          # a negative token
    if kind == 3:
        return type(batch)([*batch[:-1], True]), tokens           # a bool id
    if kind == 4:
        return type(batch)([*batch[:-1], batch[0]]), tokens       # an id twice
    if kind == 5:
        return type(batch)([*batch[:-1], 999]), tokens            # an unknown id
    return batch, tokens


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 6), between, st.integers(0, 3), st.integers(0, 9), st.integers(0, 12),
                          st.integers(0, 120)), min_size=1, max_size=25),
       st.booleans(), st.integers(14, 48), st.integers(1, 4), st.sampled_from(["list", "tuple", "fresh list"]))
def test_decode_answers_as_the_three_calls(events, caching, num_blocks, B, batch_kind):
    """Few blocks, so steps run out (OutOfBlocks, nothing appended) and evict; one draw in six a
    bad argument (refused by both alike, nothing changed); some events plant a fault at a line of
    each `decode` (nothing changed, then the call answers as undisturbed)."""
    one, three = (BlockManager(num_blocks, B, num_cpu_blocks=16, prefix_caching=caching) for _ in range(2))
    batch = [0, 1, 2, 3]
    for bm in (one, three):
        for seq_id in batch:
            bm.add(seq_id, [seq_id % 2, 1, 2, 3][:1 + seq_id])
    batch = tuple(batch) if batch_kind == "tuple" else batch
    new_ids = iter(range(100, 200))
    for decode_steps, event, victim, token, kind, fault_at in events:
        for step in range(decode_steps):
            ids = list(batch) if batch_kind == "fresh list" else batch
            tokens = [(token + step + i) % 5 for i in range(len(batch))]
            ids, tokens = hostile(ids, tokens, kind if kind <= 5 and step == 0 else 0)
            before = manager_state(one)
            try:
                with FaultInjector(1 + fault_at + step if kind == 6 else None):
                    answer = decode_call(one, ids, tokens)
            except Planted:
                assert manager_state(one) == before
                one.check()
                answer = decode_call(one, ids, tokens)   # then it answers as undisturbed
            assert answer == three_calls(three, ids, tokens)
            if answer[0] != "ok":
                assert manager_state(one) == before
        seq_id, new_id = batch[victim], next(new_ids)
        for bm in (one, three):
            running = bm.status(seq_id) == "running"
            if event == "tables":
                call(bm, "block_tables", batch)
            elif event == "preempt" and running:
                call(bm, "preempt", seq_id, "swap" if token % 2 else "recompute")
            elif event in ("resume", "nothing"):   # every batch member that stopped running
                for member in batch:
                    if bm.status(member) != "running":
                        call(bm, "resume", member)
            elif event == "fork":   # two of the batch: the next step copies both tails (if partial)
                for member, child in ((seq_id, new_id), (batch[victim - 1], new_id + 100)):
                    if bm.status(member) == "running":
                        call(bm, "fork", member, child)
            elif event == "add_shared":
                call(bm, "add", new_id, bm.tokens(seq_id)[:4] + [token] if running else [token])
            elif event == "append_one" and running:
                call(bm, "append", seq_id, token)
            elif event == "free" and bm.seq_ids()[-1] not in batch:
                call(bm, "free", bm.seq_ids()[-1])
        assert twin_state(one) == twin_state(three)
        one.check()
        three.check()
