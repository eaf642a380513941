"""The allocator's cheaper fixed-cost paths (issue 15), each held to what it shortcuts: a token
list read from its marshal dump whatever its length, an empty batch list, a saved row restored
field by field."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.impl.alloc.rows import ROW_ARRAYS
from pagedkv.spec import InvalidArgument
from pagedkv.spec.arguments import check_prompt as spec_check_prompt

from test_fault_injection import manager_state

BAD_TOKENS = [-1, -2 ** 31, 2 ** 31, 2 ** 63, True, False, 1.0, np.int64(3), None]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 3000), st.integers(0, 2 ** 31 - 1), st.data())
def test_a_long_prompt_list_is_stored_or_refused_by_every_item(length, seed, data):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 2 ** 31, length).tolist()
    bm = BlockManager(-(-length // 8) + 2, 8, max_seqs=2)
    bad = data.draw(st.one_of(st.none(), st.sampled_from(BAD_TOKENS)))
    if bad is None:
        bm.add(1, tokens)
        assert bm.tokens(1) == tokens
        return
    at = data.draw(st.integers(0, length - 1))
    tokens[at] = bad
    before = manager_state(bm)
    try:
        expected = [int.__index__(token) for token in spec_check_prompt(tokens)]
    except InvalidArgument:
        with pytest.raises(InvalidArgument):
            bm.add(1, tokens)
        assert manager_state(bm) == before
        return
    bm.add(1, tokens)   # past 32 bits, or not a plain int the spec accepts: read item by item
    assert bm.tokens(1) == expected


def test_an_empty_list_is_an_empty_batch():
    bm = BlockManager(8, 4)
    bm.add(2, [3, 4, 5])
    before = manager_state(bm)
    assert bm.append_batch([], []) == []
    assert bm.append_batch((), ()) == []
    assert manager_state(bm) == before


def test_an_empty_batch_has_empty_tables():
    """M, the most blocks any of the batch holds, is 0 for no sequences (the spec's max of nothing)."""
    bm = BlockManager(8, 4)
    bm.add(2, [3, 4, 5])
    for empty in ([], (), np.zeros(0, dtype=np.int64)):
        tables = bm.block_tables(empty)
        assert tuple(tables.shape) == (0, 0) and tables.dtype == torch.int32


@pytest.mark.parametrize("name", list(ROW_ARRAYS))
def test_a_saved_row_is_restored_field_by_field(name):
    bm = BlockManager(16, 2, max_seqs=2)
    bm.add(1, [1, 2, 3])
    bm.add(2, [4])
    row = bm.row_of[1]
    fields = {field: getattr(bm.rows, field).copy() for field in ROW_ARRAYS}

    def change_the_field():
        bm.rows.save_row(row)
        getattr(bm.rows, name)[row] += 1
        raise RuntimeError("undo it")

    with pytest.raises(RuntimeError):
        bm.transaction(change_the_field)
    for field in ROW_ARRAYS:
        assert getattr(bm.rows, field).tolist() == fields[field].tolist(), field
