"""The spec's deterministic choices and the seed's worked examples, as concrete regression cases."""

import pytest
from hypothesis import given, strategies as st

from pagedkv.spec import KV, KVSpec, OutOfBlocks, blocks_needed, slot_of
from pagedkv.spec.lab import block_arithmetic


# ------------------------------------------------------------------ the seeds' worked examples

def test_seed_address_of_token_6():
    # Seed 002: B = 4, block table [P5, P1, P7]; token 6 is in logical block 1 -> P1, offset 2.
    assert slot_of([5, 1, 7], 6, 4) == 1 * 4 + 2


@pytest.mark.parametrize("block_size, totals", [
    (16, {"blocks": 8, "slots": 128, "useful": 112, "tail_waste": 16}),   # seed 002 lab, B = 16
    (4, {"blocks": 29, "slots": 116, "useful": 112, "tail_waste": 4}),    # seed 002 lab, B = 4
])
def test_seed_lab_totals(block_size, totals):
    assert block_arithmetic((17, 32, 63), block_size)[1] == totals


def test_seed_cow_takes_one_free_block_before_the_write():
    # Seed 002: B = 4, A and B share a tail holding 3 tokens; A writes 1001: a new block is taken
    # and the valid KV copied, A's mapping switched, then the write lands in the copy.
    kv = KVSpec(8, 4)
    kv.add(1, [10, 11, 12])
    kv.fork(1, 2)
    shared_tail = kv.block_table(1)[-1]
    free_before = kv.num_free_blocks()
    copies = kv.append(1, 1001)
    assert kv.num_free_blocks() == free_before - 1
    assert copies == [(shared_tail, kv.block_table(1)[-1])]
    assert kv.block_table(2) == [shared_tail] and kv.refcount(shared_tail) == 1
    assert [slot.token for slot in kv.read(1)] == [10, 11, 12, 1001]
    assert [slot.token for slot in kv.read(2)] == [10, 11, 12]


def test_seed_full_tail_takes_new_block_without_copy():
    # Seed 002: when the tail is full the next token takes a fresh block; the full prefix is not copied.
    kv = KVSpec(8, 4)
    kv.add(1, [1, 2, 3, 4])
    kv.fork(1, 2)
    assert kv.append(1, 5) == [] and kv.append(2, 6) == []
    assert kv.block_table(1)[0] == kv.block_table(2)[0] and kv.refcount(kv.block_table(1)[0]) == 2


# ------------------------------------------------------------------ deterministic choices

def test_free_queue_is_fifo_and_release_is_tail_first():
    kv = KVSpec(6, 2)
    kv.add(1, [1, 2, 3, 4, 5])    # blocks 0, 1, 2
    kv.add(2, [7])                # block 3
    kv.free(1)                    # released tail first: 2, 1, 0 join after 4, 5
    assert list(kv.free_queue) == [4, 5, 2, 1, 0]
    kv.add(3, [1, 1, 1, 1, 1, 1, 1])
    assert kv.block_table(3) == [4, 5, 2, 1]


def test_evicts_least_recently_released_cached_block_only_when_free_queue_is_empty():
    kv = KVSpec(4, 2, prefix_caching=True)
    kv.add(1, [1, 2, 3])          # blocks 0 (cached), 1
    kv.add(2, [4, 5, 6])          # blocks 2 (cached), 3
    kv.free(1)                    # 0 -> evictable, 1 -> free queue
    kv.free(2)                    # 2 -> evictable after 0, 3 -> free queue
    assert list(kv.evictable) == [0, 2] and list(kv.free_queue) == [1, 3]
    kv.add(3, [9, 9, 9, 9, 9])    # needs 3: takes 1, 3, then evicts 0
    assert kv.block_table(3) == [1, 3, 0]
    assert 0 not in kv.cached_blocks() and list(kv.evictable) == [2]
    with pytest.raises(OutOfBlocks) as caught:  # a hit reclaims block 2 itself: nothing else is left
        kv.add(4, [4, 5, 8])
    assert (caught.value.needed, caught.value.available) == (1, 0)
    kv.free(3)
    assert kv.add(4, [4, 5, 8]) == 2          # block 2 is still cached and hit
    assert kv.block_table(4)[0] == 2
    kv.check()


def test_prefix_hit_never_serves_the_whole_prompt():
    kv = KVSpec(8, 2, prefix_caching=True)
    kv.add(1, [1, 2, 3, 4])
    assert kv.add(2, [1, 2, 3, 4]) == 2       # (4 - 1) // 2 = 1 block at most
    assert kv.block_table(2)[0] == kv.block_table(1)[0]
    assert kv.block_table(2)[1] != kv.block_table(1)[1]
    kv.check()


def test_equal_full_blocks_are_all_indexed_and_the_lowest_numbered_serves():
    kv = KVSpec(8, 2, prefix_caching=True)
    kv.add(1, [1, 2])
    kv.add(2, [1, 2])             # no hit allowed (whole prompt): a second holder of the same content
    assert kv.cached_blocks() == {0: (1, 2), 1: (1, 2)}
    kv.free(2)                    # a released holder keeps its content: evictable, not wiped
    assert list(kv.evictable) == [1]
    assert kv.add(3, [1, 2, 3]) == 2 and kv.block_table(3)[0] == 0
    kv.check()


def test_evicting_one_holder_leaves_an_equal_block_serving():
    """Issue 13's vLLM program: when the indexed holder of a prefix is evicted, the equal block
    filled later still serves it (completeness), so the third prompt gets 4 cached tokens, not 2."""
    kv = KVSpec(3, 2, prefix_caching=True)
    kv.add(1, [0] * 6)
    kv.free(1)
    kv.add(2, [0] * 3)
    for _ in range(3):
        kv.append(2, 0)
    kv.free(2)
    assert kv.add(3, [0] * 5) == 4
    kv.check()


def test_the_index_is_exact_where_python_hashes_collide():
    """`t` and `t + 2**61 - 1` have one Python hash; keyed by content, both blocks are indexed and hit."""
    kv = KVSpec(8, 1, prefix_caching=True)
    colliding = 1 + 2 ** 61 - 1
    assert hash((None, (1,))) == hash((None, (colliding,)))
    kv.add(1, [1, 5])
    kv.add(2, [colliding, 5])
    assert kv.add(3, [colliding, 7]) == 1 and kv.block_table(3)[0] == kv.block_table(2)[0]
    assert [s.token for s in kv.read(3)] == [colliding, 7]
    kv.check()


def test_swapped_in_blocks_are_not_shared():
    kv = KVSpec(8, 2, num_cpu_blocks=4)
    kv.add(1, [1, 2, 3])
    kv.fork(1, 2)
    copies_out = kv.swap_out(2)
    assert [gpu for gpu, _ in copies_out] == kv.block_table(1)
    copies_in = kv.swap_in(2)
    assert not set(kv.block_table(2)) & set(kv.block_table(1))
    assert [cpu for cpu, _ in copies_in] == [cpu for _, cpu in copies_out]
    assert kv.read(2) == kv.read(1) and kv.num_free_cpu_blocks() == 4
    kv.check()


def test_recompute_resume_reuses_cached_prefix():
    kv = KVSpec(8, 2, prefix_caching=True)
    kv.add(1, [1, 2, 3, 4, 5])
    kv.preempt(1, "recompute")
    assert kv.block_table(1) == [] and kv.read(1) == [] and kv.status(1) == "waiting"
    assert kv.resume(1) == [] and kv.cached_tokens(1) == 4
    kv.check()


def test_step_preempts_latest_admitted_before_touching_any_table():
    kv = KVSpec(3, 2)
    kv.add(1, [1, 2])             # full tail: needs a block
    kv.add(2, [3, 4])             # full tail: needs a block
    result = kv.step({1: 5, 2: 6})  # 1 free block, 2 needed -> preempt 2, then 1 fits
    assert result.preempted == [2] and result.appended == [1]
    assert kv.status(2) == "waiting" and kv.tokens(2) == [3, 4] and kv.tokens(1) == [1, 2, 5]
    kv.check()


def test_step_counts_one_copy_per_sharer_except_the_last_writer():
    kv = KVSpec(3, 4)
    kv.add(1, [1, 2])
    kv.fork(1, 2)
    kv.fork(1, 3)                 # a partial tail shared three ways; 2 free blocks
    result = kv.step({1: 7, 2: 8, 3: 9})
    assert result.preempted == [] and len(result.copies) == 2
    assert [kv.read(s)[-1].token for s in (1, 2, 3)] == [7, 8, 9]
    kv.check()


# ------------------------------------------------------------------ properties

ops = st.lists(st.tuples(st.sampled_from(["add", "append", "fork", "free"]), st.integers(0, 5),
                         st.lists(st.integers(0, 3), min_size=1, max_size=7)), max_size=30)


@given(ops=ops, block_size=st.integers(1, 4))
def test_prefix_caching_never_changes_what_sequences_read(ops, block_size):
    """Metamorphic: with and without prefix caching, every sequence reads back the same KV."""
    plain, cached = KVSpec(64, block_size), KVSpec(64, block_size, prefix_caching=True)
    for op, seq_id, tokens in ops:
        outcomes = []
        for kv in (plain, cached):
            args = {"add": (seq_id, tokens), "append": (seq_id, tokens[0]), "fork": (seq_id, seq_id + 1),
                    "free": (seq_id,)}[op]
            try:
                getattr(kv, op)(*args)
                outcomes.append(None)
            except Exception as error:  # the same typed error on both sides
                outcomes.append(type(error))
        assert outcomes[0] == outcomes[1]
        for seq_id in plain.seq_ids():
            assert plain.read(seq_id) == cached.read(seq_id)
    cached.check()


@given(length=st.integers(0, 10_000), block_size=st.integers(1, 512))
def test_blocks_needed_is_the_ceiling(length, block_size):
    n = blocks_needed(length, block_size)
    assert n * block_size >= length and (n - 1) * block_size < max(length, 1)


@given(prompt=st.lists(st.integers(0, 50), min_size=1, max_size=40), block_size=st.integers(1, 8))
def test_add_writes_each_token_after_its_prefix(prompt, block_size):
    kv = KVSpec(blocks_needed(len(prompt), block_size), block_size)
    kv.add(7, prompt)
    assert kv.read(7) == [KV(tuple(prompt[:i]), t) for i, t in enumerate(prompt)]
    assert kv.num_free_blocks() == 0
    with pytest.raises(OutOfBlocks):
        kv.add(8, [1])
