"""Every error path of the spec raises its typed error and leaves the state exactly as it was."""

import pytest

from pagedkv.spec import (DuplicateSequence, InvalidArgument, InvalidState, KVSpec, OutOfBlocks,
                          PagedKVError, UnknownSequence)


def busy_spec() -> KVSpec:
    """A small pool in every status at once: running (shared), waiting, swapped, cached, full."""
    kv = KVSpec(6, 2, num_cpu_blocks=2, prefix_caching=True)
    kv.add(1, [1, 2, 3])          # blocks: [1,2] full+cached, [3] partial
    kv.fork(1, 2)                 # shares both
    kv.add(3, [7])
    kv.preempt(3, "recompute")    # waiting
    kv.add(4, [8, 9])
    kv.swap_out(4)                # swapped; its cached block is evictable now
    kv.add(5, [4, 4, 4])          # running, no sharing
    kv.check()
    return kv


def fill_pool(kv: KVSpec) -> None:
    while kv.num_free_blocks():
        kv.add(100 + kv.num_free_blocks(), [9] * kv.block_size)


CASES = [
    # (operation, args, error type, prepare)
    ("add", (1, [1]), DuplicateSequence, None),
    ("add", (9, []), InvalidArgument, None),
    ("add", (9, [1, -1]), InvalidArgument, None),
    ("add", (9, [1.0]), InvalidArgument, None),
    ("add", (9, "12"), InvalidArgument, None),
    ("add", ("9", [1]), InvalidArgument, None),
    ("add", (9, [5] * 20), OutOfBlocks, None),
    ("append", (99, 1), UnknownSequence, None),
    ("append", (1, -5), InvalidArgument, None),
    ("append", (1, True), InvalidArgument, None),
    ("append", (1, 2 ** 63), InvalidArgument, None),
    ("append", (3, 1), InvalidState, None),
    ("append", (4, 1), InvalidState, None),
    ("append", (1, 1), OutOfBlocks, fill_pool),        # shared partial tail: copy-on-write needs a block
    ("fork", (99, 10), UnknownSequence, None),
    ("fork", (1, 2), DuplicateSequence, None),
    ("fork", (3, 10), InvalidState, None),
    ("fork", (4, 10), InvalidState, None),
    ("fork", (1, None), InvalidArgument, None),
    ("free", (99,), UnknownSequence, None),
    ("free", ([1],), InvalidArgument, None),
    ("preempt", (99, "swap"), UnknownSequence, None),
    ("preempt", (1, "drop"), InvalidArgument, None),
    ("preempt", (3, "recompute"), InvalidState, None),
    ("preempt", (4, "swap"), InvalidState, None),
    ("preempt", (5, "swap"), OutOfBlocks, None),       # 2 blocks needed, CPU pool holds 4's block
    ("resume", (99,), UnknownSequence, None),
    ("resume", (1,), InvalidState, None),
    ("resume", (3,), OutOfBlocks, fill_pool),
    ("resume", (4,), OutOfBlocks, fill_pool),
    ("swap_in", (3,), InvalidState, None),
    ("swap_out", (3,), InvalidState, None),
    ("step", ({99: 1},), UnknownSequence, None),
    ("step", ({3: 1},), InvalidState, None),
    ("step", ({1: -1},), InvalidArgument, None),
    ("step", ([1],), InvalidArgument, None),
    ("refcount", (6,), InvalidArgument, None),
    ("refcount", (-1,), InvalidArgument, None),
    ("block_table", (99,), UnknownSequence, None),
    ("read", (99,), UnknownSequence, None),
]


@pytest.mark.parametrize("operation, args, error, prepare", CASES,
                         ids=[f"{c[0]}-{c[2].__name__}-{i}" for i, c in enumerate(CASES)])
def test_error_leaves_state_unchanged(operation, args, error, prepare):
    kv = busy_spec()
    if prepare:
        prepare(kv)
    before = kv.snapshot()
    with pytest.raises(error):
        getattr(kv, operation)(*args)
    assert kv.snapshot() == before
    kv.check()


def test_plain_write_into_unshared_tail_needs_no_free_block():
    kv = busy_spec()
    fill_pool(kv)
    assert kv.append(5, 1) == []      # 5's tail holds one of two slots and nobody shares it
    assert kv.read(5)[-1].token == 1
    kv.check()


def test_error_classes_are_also_builtin_errors():
    assert issubclass(UnknownSequence, KeyError) and issubclass(InvalidArgument, ValueError)
    for cls in (OutOfBlocks, UnknownSequence, DuplicateSequence, InvalidState, InvalidArgument):
        assert issubclass(cls, PagedKVError)


def test_out_of_blocks_reports_needed_and_available():
    kv = KVSpec(3, 4)
    with pytest.raises(OutOfBlocks) as caught:
        kv.add(1, list(range(13)))
    assert (caught.value.needed, caught.value.available) == (4, 3)


@pytest.mark.parametrize("kwargs", [dict(num_blocks=0, block_size=1), dict(num_blocks=1, block_size=0),
                                    dict(num_blocks=1, block_size=1, num_cpu_blocks=-1),
                                    dict(num_blocks=1.5, block_size=1)])
def test_constructor_rejects_bad_pools(kwargs):
    with pytest.raises(InvalidArgument):
        KVSpec(**kwargs)
