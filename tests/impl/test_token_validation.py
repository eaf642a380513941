"""A token list is validated in C passes (a marshal dump read by numpy) with a per-item fallback:
whatever the items, the allocator accepts exactly what the spec's per-item check accepts, stores
the same values, and refuses the rest with InvalidArgument and nothing changed."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidArgument
from pagedkv.spec.arguments import check_prompt as spec_check_prompt

from test_fault_injection import manager_state


class Small(int):
    """An int subclass: accepted by its value."""


def item_kinds():
    plain = st.one_of(st.integers(0, 40), st.integers(2 ** 31 - 3, 2 ** 31 + 3), st.integers(2 ** 63 - 2, 2 ** 63 + 1),
                      st.integers(-3, -1))
    return st.one_of(
        plain, plain,   # mostly plain ints, on both sides of the 32-bit and 64-bit edges
        st.booleans(),
        plain.filter(lambda n: n >= 0).map(Small),
        st.integers(0, 100).map(np.int64), st.integers(0, 100).map(np.int32), st.integers(0, 100).map(np.uint8),
        st.floats(0, 10).map(float), st.just(np.float64(1.0)), st.just("7"), st.none(), st.just([1]),
    )


def spec_answer(tokens):
    try:
        return [int.__index__(t) for t in spec_check_prompt(tokens)]
    except InvalidArgument:
        return InvalidArgument


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(item_kinds(), min_size=1, max_size=12), st.booleans())
def test_a_prompt_passes_exactly_when_the_spec_passes_it(tokens, as_tuple):
    given_tokens = tuple(tokens) if as_tuple else tokens
    expected = spec_answer(given_tokens)
    bm = BlockManager(64, 4)
    decoding = [10 + i for i in range(len(tokens))]
    for seq_id in decoding:
        bm.add(seq_id, [5, 5])
    before = manager_state(bm)
    if expected is InvalidArgument:
        with pytest.raises(InvalidArgument):
            bm.add(1, given_tokens)
        assert manager_state(bm) == before
        with pytest.raises(InvalidArgument):
            bm.append_batch(decoding, given_tokens)
        assert manager_state(bm) == before
        return
    bm.add(1, given_tokens)
    assert bm.tokens(1) == expected and all(type(t) is int for t in bm.tokens(1))
    bm.append_batch(decoding, given_tokens)
    assert [bm.tokens(seq_id)[-1] for seq_id in decoding] == expected


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2 ** 31 - 1), min_size=1, max_size=600))
def test_long_plain_lists_are_stored_as_given(tokens):
    bm = BlockManager(200, 16)
    bm.add(1, tokens)
    assert bm.tokens(1) == tokens
    assert bm.cached_prefix_tokens(tokens) == 0


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2 ** 40), min_size=1, max_size=70), st.integers(1, 3))
def test_a_strided_array_prompt_is_stored_as_its_values(tokens, stride):
    """An array given without a copy (a view with a stride) is read, not kept: changing it after
    the call changes nothing."""
    backing = np.zeros(len(tokens) * stride, dtype=np.int64)
    backing[::stride] = tokens
    bm = BlockManager(200, 4)
    bm.add(1, backing[::stride])
    backing[:] = 7
    assert bm.tokens(1) == tokens


# Around the int64 edges, with each byte's top bit set or not.
INT64_EDGES = [0, 1, 2 ** 7, 2 ** 55, 2 ** 56 - 1, 2 ** 56, 2 ** 62, 2 ** 63 - 1,
               -1, -2, -2 ** 7, -2 ** 55, -2 ** 56, -2 ** 62, -2 ** 63]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.sampled_from(INT64_EDGES), st.integers(-2 ** 63, 2 ** 63 - 1), st.integers(0, 40)),
                min_size=1, max_size=40),
       st.sampled_from(["<i8", ">i8"]), st.sampled_from([1, 2, -1]))
def test_an_int64_array_passes_exactly_when_no_token_is_negative(tokens, byte_order, stride):
    """Either byte order, contiguous or a strided or reversed view: accepted (and stored as its
    values) exactly when every token is >= 0; refused with nothing changed otherwise."""
    backing = np.zeros(len(tokens) * abs(stride), dtype=byte_order)
    view = backing[::stride] if stride > 0 else backing[::-1]
    view[:] = tokens
    bm = BlockManager(64, 4)
    decoding = [10 + i for i in range(len(tokens))]
    for seq_id in decoding:
        bm.add(seq_id, [3, 4, 5])
    before = manager_state(bm)
    if min(tokens) < 0:
        for call in (lambda: bm.add(1, view), lambda: bm.append_batch(decoding, view),
                     lambda: bm.cached_prefix_tokens(view)):
            with pytest.raises(InvalidArgument, match="tokens are ints"):
                call()
            assert manager_state(bm) == before
        return
    bm.add(1, view)
    assert bm.tokens(1) == tokens
    bm.append_batch(decoding, view)
    assert [bm.tokens(seq_id)[-1] for seq_id in decoding] == tokens


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64])
def test_an_empty_array_is_an_empty_batch_and_no_prompt(dtype):
    bm = BlockManager(8, 4)
    bm.add(2, [3, 4, 5])
    before = manager_state(bm)
    assert bm.append_batch([], np.zeros(0, dtype=dtype)) == []
    with pytest.raises(InvalidArgument, match="at least one token"):
        bm.add(1, np.zeros(0, dtype=dtype))
    assert manager_state(bm) == before
