"""BlockManager: every bad-input path raises the spec's typed error and changes nothing; hash
collisions never give a wrong hit; batched forms equal one-at-a-time; tensors; metrics."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from managers import mixed_manager
from pagedkv.impl import BlockManager
from pagedkv.spec import (DuplicateSequence, InvalidArgument, InvalidState, KVSpec, OutOfBlocks,
                          UnknownSequence)


def state(bm: BlockManager) -> dict:
    """Everything observable, plus the pending copies and metrics."""
    return {
        "seqs": {s: (bm.length(s), bm.tokens(s), bm.status(s), bm.cached_tokens(s), bm.block_table(s),
                     bm.cpu_block_table(s)) for s in bm.seq_ids()},
        "counts": (bm.num_free_blocks(), bm.num_evictable_blocks(), bm.num_free_cpu_blocks()),
        "refcounts": [bm.refcount(b) for b in range(bm.num_blocks)],
        "pending": bm.copies.pending(),
        "metrics": bm.metrics(),
    }


@pytest.fixture
def bm():
    bm = mixed_manager()
    bm.check()
    return bm


BAD_CALLS = [
    ("add", ("a", [1]), InvalidArgument),
    ("add", (True, [1]), InvalidArgument),
    ("add", (9, []), InvalidArgument),
    ("add", (9, "ab"), InvalidArgument),
    ("add", (9, None), InvalidArgument),
    ("add", (9, [1, -1]), InvalidArgument),
    ("add", (9, [1, True]), InvalidArgument),
    ("add", (9, [1, 2.0]), InvalidArgument),
    ("add", (9, [2 ** 64]), InvalidArgument),
    ("add", (1, [1]), DuplicateSequence),
    ("add", (9, list(range(20))), OutOfBlocks),
    ("append", (1, -1), InvalidArgument),
    ("append", (1, 1.5), InvalidArgument),
    ("append", (1, None), InvalidArgument),
    ("append", (99, 1), UnknownSequence),
    ("append", ("x", 1), InvalidArgument),
    ("append", (3, 1), InvalidState),
    ("append", (4, 1), InvalidState),
    ("fork", (99, 9), UnknownSequence),
    ("fork", (1, 2), DuplicateSequence),
    ("fork", (3, 9), InvalidState),
    ("fork", (1, "c"), InvalidArgument),
    ("free", (99,), UnknownSequence),
    ("free", (1.0,), InvalidArgument),
    ("preempt", (1, "swapp"), InvalidArgument),
    ("preempt", (1, None), InvalidArgument),
    ("preempt", (99, "swap"), UnknownSequence),
    ("preempt", (3, "recompute"), InvalidState),
    ("preempt", (4, "swap"), InvalidState),
    ("preempt", (1, "swap"), OutOfBlocks),   # 2 blocks, 1 CPU block free
    ("resume", (1,), InvalidState),
    ("resume", (99,), UnknownSequence),
    ("swap_in", (3,), InvalidState),
    ("swap_out", (3,), InvalidState),
    ("refcount", (-1,), InvalidArgument),
    ("refcount", (8,), InvalidArgument),
    ("refcount", (1.0,), InvalidArgument),
    ("refcount", (True,), InvalidArgument),
    ("block_table", (99,), UnknownSequence),
    ("tokens", ("1",), InvalidArgument),
    ("step", ([1],), InvalidArgument),
    ("step", ({1: -1},), InvalidArgument),
    ("step", ({99: 1},), UnknownSequence),
    ("step", ({1: 1, 3: 1},), InvalidState),
    ("append_batch", ([1, 1], [1, 2]), InvalidArgument),
    ("append_batch", ([1, 2], [1]), InvalidArgument),
    ("append_batch", ([1, 99], [1, 2]), UnknownSequence),
    ("append_batch", ([1, "2"], [1, 2]), InvalidArgument),
    ("append_batch", ([1, 2], [1, -2]), InvalidArgument),
    ("append_batch", ([1, 2], np.array([1.0, 2.0])), InvalidArgument),
    ("append_batch", ([1, 2], np.array([1, 2 ** 64 - 1], dtype=np.uint64)), InvalidArgument),
    ("append_batch", ([1, 3], [1, 2]), InvalidState),
    ("append_batch", (1, [1]), InvalidArgument),
    ("block_tables", ([1, 99],), UnknownSequence),
    ("slot_mapping", ([1], [4]), InvalidArgument),
    ("slot_mapping", ([3],), InvalidState),
]


@pytest.mark.parametrize("operation, args, error", BAD_CALLS,
                         ids=[f"{op}{args!r}"[:60] for op, args, _ in BAD_CALLS])
def test_bad_call_raises_typed_error_and_changes_nothing(bm, operation, args, error):
    before = state(bm)
    with pytest.raises(error):
        getattr(bm, operation)(*args)
    assert state(bm) == before
    bm.check()


def test_batch_out_of_blocks_changes_nothing():
    bm = BlockManager(3, 2)
    bm.add(1, [1, 2])
    bm.add(2, [3, 4])
    bm.add(3, [5, 6])
    before = state(bm)
    with pytest.raises(OutOfBlocks) as info:
        bm.append_batch([1, 2, 3], [7, 8, 9])
    assert (info.value.needed, info.value.available) == (3, 0)
    assert state(bm) == before


@pytest.mark.parametrize("kwargs", [{"num_blocks": 0, "block_size": 1}, {"num_blocks": 2, "block_size": 0},
                                    {"num_blocks": 2, "block_size": 1, "num_cpu_blocks": -1},
                                    {"num_blocks": 2, "block_size": 1, "max_blocks_per_seq": 0},
                                    {"num_blocks": 2, "block_size": 1, "max_seqs": 0},
                                    {"num_blocks": True, "block_size": 1}])
def test_bad_construction(kwargs):
    with pytest.raises(InvalidArgument):
        BlockManager(**kwargs)


# ------------------------------------------------------------------ prefix cache exactness

def test_equal_blocks_after_different_prefixes_never_hit():
    """The index is keyed by the whole prefix: a block's tokens alone never make a hit."""
    bm = BlockManager(16, 2, prefix_caching=True)
    bm.add(1, [1, 2, 3, 4, 5])                 # (1, 2) then (3, 4) after (1, 2)
    assert bm.add(2, [9, 9, 3, 4, 5]) == 0     # (3, 4) after (9, 9): another content
    assert bm.add(3, [1, 2, 3, 4, 6]) == 4     # the same prefix hits both blocks
    assert bm.block_table(3)[:2] == bm.block_table(1)[:2]
    for seq_id, tokens in [(2, [9, 9, 3, 4, 5]), (3, [1, 2, 3, 4, 6])]:
        assert bm.tokens(seq_id) == tokens
    bm.check()


def test_token_ids_past_any_hash_width_are_told_apart():
    """t and t + 2**61 - 1 collide under Python's tuple hash; as content they differ (issue 12.6)."""
    big = 2 ** 61 - 1
    for subject in (KVSpec(8, 1, prefix_caching=True), BlockManager(8, 1, prefix_caching=True)):
        subject.add(1, [5, 0])
        subject.add(2, [5 + big, 0])
        subject.free(1)
        assert subject.add(3, [5, 0]) == 1 and subject.add(4, [5 + big, 0]) == 1
        assert subject.block_table(4)[0] == subject.block_table(2)[0]


def test_same_content_in_a_different_block_still_hits_like_the_spec():
    """Block 1 of seq 2 was written after a copy of (1, 2) that is not the indexed one; content
    equality is by value, so a prompt through the indexed (1, 2) still hits it."""
    for subject in (KVSpec(8, 2, prefix_caching=True), BlockManager(8, 2, prefix_caching=True)):
        subject.add(1, [1, 2, 3])
        subject.add(2, [1, 2])                 # at most (2-1)//2 = 0 hits: a second (1, 2)
        subject.append(2, 3)
        subject.append(2, 4)                   # (3, 4) indexed, written after the unindexed copy
        assert subject.add(3, [1, 2, 3, 4, 5]) == 4
        assert subject.block_table(3)[:2] == [subject.block_table(1)[0], subject.block_table(2)[1]]


def test_cached_prefix_is_served_and_counted():
    bm = BlockManager(16, 4, prefix_caching=True)
    bm.add(1, list(range(13)))
    bm.free(1)
    assert bm.cached_prefix_tokens(list(range(12)) + [99]) == 12
    assert bm.add(2, list(range(12)) + [99]) == 12
    assert bm.metrics()["prefix_hit_rate"] == pytest.approx(12 / 26)
    bm.check()


# ------------------------------------------------------------------ batched forms

def fork_family(num_blocks=40, block_size=3, prefix_caching=True):
    bm = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching, max_seqs=1, max_blocks_per_seq=1)
    bm.add(1, [1, 2, 3, 4])
    bm.fork(1, 2)
    bm.fork(1, 3)
    bm.add(4, [1, 2, 3, 4, 5, 6])
    bm.add(5, [9])
    return bm


def test_append_batch_equals_one_at_a_time():
    batched, single = fork_family(), fork_family()
    rng = np.random.default_rng(0)
    for _ in range(12):
        order = rng.permutation([1, 2, 3, 4, 5]).tolist()
        tokens = rng.integers(0, 5, size=5)
        copies = batched.append_batch(order, tokens)
        assert copies == [c for s, t in zip(order, tokens.tolist()) for c in single.append(s, t)]
        assert state(batched)["seqs"] == state(single)["seqs"]
        assert state(batched)["refcounts"] == state(single)["refcounts"]
    batched.check()


def test_append_batch_with_evictions_keeps_one_at_a_time_index_order():
    """Evictions mid-batch must not let an earlier sequence's full block be indexed out of order."""
    def build():
        bm = BlockManager(6, 2, prefix_caching=True)
        bm.add(1, [1, 2, 3, 4])
        bm.free(1)                             # (1,2), (3,4) evictable and indexed
        bm.add(2, [1, 2, 3])                   # hits (1,2); writes 3
        bm.add(3, [5])
        bm.add(4, [6, 7])
        return bm
    batched, single = build(), build()
    batched.append_batch([2, 4, 3], [4, 8, 5])
    for s, t in zip([2, 4, 3], [4, 8, 5]):
        single.append(s, t)
    assert state(batched) == state(single)


def test_block_tables_slot_mapping_and_seq_lens():
    bm = fork_family()
    ids = [4, 1, 5]
    tables = bm.block_tables(ids)
    assert tables.dtype == torch.int32 and tables.shape == (3, 2)
    assert tables.tolist() == [bm.block_table(4), bm.block_table(1), bm.block_table(5) + [-1]]
    assert bm.seq_lens(ids).tolist() == [6, 4, 1] and bm.seq_lens(ids).dtype == torch.int32
    slots = bm.slot_mapping(ids)
    assert slots.dtype == torch.int64
    B = bm.block_size
    assert slots.tolist() == [bm.block_table(s)[(n - 1) // B] * B + (n - 1) % B for s, n in zip(ids, [6, 4, 1])]
    prefill = bm.slot_mapping(ids, [2, 0, 1]).tolist()
    assert prefill == [bm.block_table(4)[1] * B + 1, bm.block_table(4)[1] * B + 2, bm.block_table(5)[0] * B]


def test_copies_are_queued_as_tensors_and_drained():
    bm = BlockManager(8, 2, num_cpu_blocks=4)
    bm.add(1, [1])
    bm.fork(1, 2)
    cow = bm.append(2, 5)
    out = bm.swap_out(1)
    back = bm.swap_in(1)
    copies = bm.take_copies()
    assert [(kind, pairs.tolist()) for kind, pairs in copies.phases] == [
        ("cow", [list(c) for c in cow]), ("swap_out", [list(c) for c in out]), ("swap_in", [list(c) for c in back])]
    assert all(pairs.dtype == torch.int64 for _, pairs in copies.phases)
    assert copies.cow.tolist() == [list(c) for c in cow]
    assert bm.take_copies().phases == () and len(bm.take_copies()) == 0


def test_metrics_count_what_happened():
    bm = BlockManager(4, 2, num_cpu_blocks=2, prefix_caching=True)
    bm.add(1, [1, 2, 3])
    bm.fork(1, 2)
    bm.append(2, 4)                            # copy-on-write
    bm.preempt(1, "swap")
    bm.preempt(2, "recompute")
    bm.add(3, [7, 7, 7, 7, 7, 7, 7])           # needs all 4: evicts cached (3, 4) and (1, 2)
    m = bm.metrics()
    assert (m["copies"], m["preempt_swap"], m["preempt_recompute"], m["evictions"]) == (1, 1, 1, 2)
    assert (m["active_blocks"], m["free_blocks"], m["evictable_blocks"], m["usage"]) == (4, 0, 0, 1.0)


def test_tables_grow_beyond_preallocation():
    bm = BlockManager(64, 1, max_seqs=1, max_blocks_per_seq=1)
    for seq_id in range(5):
        bm.add(seq_id, list(range(seq_id + 3)))
    assert [bm.length(s) for s in range(5)] == [3, 4, 5, 6, 7]
    assert bm.block_tables(list(range(5))).shape == (5, 7)
    bm.check()


def test_free_everything_returns_the_pools():
    bm = fork_family()
    bm.append_batch([1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    for seq_id in bm.seq_ids():
        bm.free(seq_id)
    assert bm.num_free_blocks() == bm.num_blocks
    assert all(bm.refcount(b) == 0 for b in range(bm.num_blocks))
    bm.check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_equal_the_cpu_ones():
    on_gpu, on_cpu = (BlockManager(32, 4, num_cpu_blocks=8, device=d, max_seqs=2, max_blocks_per_seq=1)
                      for d in ("cuda", "cpu"))
    for bm in (on_gpu, on_cpu):
        bm.add(1, list(range(10)))
        bm.fork(1, 2)
        bm.append_batch([2, 1], [7, 8])
        bm.swap_out(2)
        bm.swap_in(2)
        bm.add(3, [5] * 9)
    ids = [3, 1, 2]
    for query in ("block_tables", "seq_lens", "slot_mapping"):
        gpu, cpu = getattr(on_gpu, query)(ids), getattr(on_cpu, query)(ids)
        assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu), query
    gpu_copies, cpu_copies = on_gpu.take_copies(), on_cpu.take_copies()
    assert [kind for kind, _ in gpu_copies.phases] == [kind for kind, _ in cpu_copies.phases]
    for (_, gpu), (_, cpu) in zip(gpu_copies.phases, cpu_copies.phases):
        assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=9), min_size=1, max_size=5),
       st.sampled_from([np.int64, np.int32, np.uint8]))
def test_prompts_as_integer_arrays_act_as_lists(prompts, dtype):
    """An engine's token ids as a numpy array (or tensor) are the same prompt as the list."""
    as_list, as_array = (BlockManager(12, 2, prefix_caching=True) for _ in range(2))
    for seq_id, prompt in enumerate(prompts):
        for bm, given_prompt in ((as_list, prompt), (as_array, np.array(prompt, dtype=dtype))):
            try:
                bm.add(seq_id, given_prompt)
            except OutOfBlocks:
                pass
        assert state(as_list) == state(as_array)
    assert as_list.cached_prefix_tokens(prompts[0]) == as_array.cached_prefix_tokens(torch.tensor(prompts[0]))


def test_a_rolled_back_addition_is_not_remembered_by_the_batch_memo():
    # The batch memo keeps the rows of the last list object; a transaction that added 2, read the
    # batch [0, 1, 2] and then failed is undone, so the same list names an unknown sequence again.
    bm = BlockManager(8, 2)
    bm.add(0, [1])
    bm.add(1, [2])
    ids = [0, 1, 2]

    def add_read_and_fail():
        bm.add(2, [3])
        bm.block_tables(ids)
        raise RuntimeError("fails after reading the batch")

    with pytest.raises(RuntimeError):
        bm.transaction(add_read_and_fail)
    with pytest.raises(UnknownSequence):
        bm.block_tables(ids)


def test_a_freed_row_is_left_as_a_fresh_one_and_a_rolled_back_take_leaves_it_so():
    # `take` records the row it hands out as holding FREE_FIELDS (nothing read), so every free row
    # must hold them: a fresh row, one `free` recycled (length, admission stamp and table reset),
    # and one a rolled-back `add` gave back.
    from pagedkv.impl.alloc.rows import FREE_FIELDS, _row_arrays
    bm = BlockManager(16, 2, max_seqs=2)

    def fields(row):
        return tuple(array[row].item() for array in _row_arrays(bm.rows))

    bm.add(0, [1, 2, 3])
    bm.add(1, [4, 5, 6, 7, 8])
    row = bm.row_of[1]
    assert fields(row) != FREE_FIELDS
    bm.free(1)
    assert fields(row) == FREE_FIELDS and bm.rows.seq[row] is None

    def add_and_fail():
        bm.add(2, [9, 9, 9])
        assert bm.row_of[2] == row
        raise RuntimeError("undo the add")

    with pytest.raises(RuntimeError):
        bm.transaction(add_and_fail)
    assert fields(row) == FREE_FIELDS and bm.rows.free_rows[-1] == row
    bm.check()
    bm.add(2, [9, 9, 9])   # the row serves again
    assert bm.row_of[2] == row and bm.tokens(2) == [9, 9, 9]
