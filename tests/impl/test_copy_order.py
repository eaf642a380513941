"""Drained copies performed on real caches (`perform_copies`, the engine's helper) leave every
sequence reading its own KV, whatever order the calls of one drain came in (issue 12, item 2).

The caches hold, for each written slot, a code naming the exact token prefix it was computed for
(as real K/V depends on every token before it), NaN where nothing was written. After each drain the
test performs the copies, then writes the KV of the tokens the calls since the last drain added (as
a forward pass does), and reads every sequence back through its table: running ones from the GPU
cache, swapped ones from the CPU pool.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from pagedkv.impl import BlockManager
from pagedkv.impl.engine import perform_copies
from pagedkv.spec import InvalidArgument, PagedKVError


class Engine:
    """A manager plus one layer of real caches and the codes each slot should hold."""

    def __init__(self, num_blocks=8, block_size=2, num_cpu_blocks=8, prefix_caching=False):
        self.bm = BlockManager(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks, prefix_caching=prefix_caching)
        shape = (block_size, 1, 1)
        self.k = torch.full((num_blocks, *shape), math.nan)
        self.v = self.k.clone()
        self.cpu_k = torch.full((num_cpu_blocks, *shape), math.nan)
        self.cpu_v = self.cpu_k.clone()
        self.codes = {}     # token prefix -> its code
        self.unwritten = {}  # seq id -> positions added since the last drain (their KV is not written yet)

    def code(self, prefix: tuple) -> float:
        return float(self.codes.setdefault(prefix, len(self.codes) + 1))

    def call(self, name, *args):
        """One manager call; remember which positions it added whose KV the forward pass writes:
        a new prompt's uncached ones, a recomputed sequence's, an appended token (not a fork's or a
        swap-in's, whose KV is shared or copied back)."""
        bm = self.bm
        was = {s: (bm.status(s), bm.length(s)) for s in bm.seq_ids()}
        result = getattr(bm, name)(*args)
        unwritten = {}
        for s in bm.seq_ids():
            if bm.status(s) != "running":
                continue
            status, length = was.get(s, ("new", 0))
            if status == "running":
                start = length
            elif status in ("new", "waiting") and name != "fork":
                start = bm.cached_tokens(s)
            else:
                start = bm.length(s)      # a fork's child, or swapped back in
            unwritten[s] = self.unwritten.get(s, set()) | set(range(start, bm.length(s))) \
                if status == "running" else set(range(start, bm.length(s)))
        self.unwritten = {s: positions for s, positions in unwritten.items() if positions}
        return result

    def shares_unwritten(self, seq_id) -> bool:
        """Whether a block of `seq_id` holds (or will hold) KV the forward pass has not written."""
        bm, B = self.bm, self.bm.block_size
        mine = set(bm.block_table(seq_id))
        return any(bm.block_table(s)[i // B] in mine for s, positions in self.unwritten.items() for i in positions)

    def drain(self):
        """Perform the drained copies, then write the KV of every token added since the last drain."""
        perform_copies(self.bm.take_copies(), [(self.k, self.v)], [(self.cpu_k, self.cpu_v)])
        B = self.bm.block_size
        for s, positions in self.unwritten.items():
            tokens, table = self.bm.tokens(s), self.bm.block_table(s)
            for i in positions:
                value = self.code(tuple(tokens[:i + 1]))
                self.k[table[i // B], i % B] = value
                self.v[table[i // B], i % B] = -value
        self.unwritten = {}

    def check_reads(self):
        """Every running sequence reads its own KV through its table; every swapped one has it in
        its CPU blocks."""
        bm, B = self.bm, self.bm.block_size
        for s in bm.seq_ids():
            status = bm.status(s)
            if status == "waiting":
                continue
            table, k = (bm.block_table(s), self.k) if status == "running" else (bm.cpu_block_table(s), self.cpu_k)
            v = self.v if status == "running" else self.cpu_v
            tokens = bm.tokens(s)
            got = [k[table[i // B], i % B].flatten().item() for i in range(len(tokens))]
            want = [self.code(tuple(tokens[:i + 1])) for i in range(len(tokens))]
            assert got == want, f"sequence {s} ({status}) reads {got}, its KV is {want}"
            assert [v[table[i // B], i % B].flatten().item() for i in range(len(tokens))] == [-w for w in want]


def started(prompts: dict, **pool) -> Engine:
    engine = Engine(**pool)
    for seq_id, prompt in prompts.items():
        engine.call("add", seq_id, prompt)
    engine.drain()
    return engine


def test_swap_out_in_then_another_swap_out_in_one_drain():
    """The issue's sequence: drained by kind (all swap-outs first), sequence 0 read sequence 1's KV."""
    engine = started({0: [1, 2, 3], 1: [7, 8, 9]}, num_blocks=4, num_cpu_blocks=2)
    for name, seq_id in (("swap_out", 0), ("swap_in", 0), ("swap_out", 1)):
        engine.call(name, seq_id)
    engine.drain()
    engine.check_reads()


def test_swap_in_then_out_again_in_one_drain():
    """Drained by kind, the swap-out ran before the swap-in had filled the blocks: NaN."""
    engine = started({0: [1, 2, 3]})
    engine.call("swap_out", 0)
    engine.drain()
    engine.call("swap_in", 0)
    engine.call("swap_out", 0)
    engine.drain()
    engine.check_reads()


def test_copy_on_write_then_swap_out_of_the_copy():
    """Drained by kind, the child's swap-out ran before its copy-on-write filled the new block, so
    the copied prefix was lost. (The token the append itself added has no KV before a forward pass:
    a caller that swaps it out in the same drain breaks the `Copies` contract, and only that
    position is missing.)"""
    engine = started({0: [1, 2, 3]})
    engine.call("fork", 0, 1)
    engine.drain()
    engine.call("append", 1, 5)       # copies the shared tail (1, 2 | 3) into a new block for 1
    engine.call("swap_out", 1)        # ... which moves to the CPU in the same drain
    engine.drain()
    B, table = engine.bm.block_size, engine.bm.cpu_block_table(1)
    got = [engine.cpu_k[table[i // B], i % B].item() for i in range(4)]
    assert got[:3] == [engine.code((1,)), engine.code((1, 2)), engine.code((1, 2, 3))]
    assert math.isnan(got[3])


def test_phases_keep_call_order_and_merge_only_independent_copies():
    bm = BlockManager(8, 2, num_cpu_blocks=8)
    bm.add(0, [1, 2, 3])
    bm.add(1, [4, 5, 6])
    bm.take_copies()
    out0 = bm.swap_out(0)
    out1 = bm.swap_out(1)              # independent of the first: one phase
    back0 = bm.swap_in(0)
    again0 = bm.swap_out(0)            # writes CPU blocks the first phase wrote? no: new ones
    phases = [(kind, pairs.tolist()) for kind, pairs in bm.take_copies().phases]
    assert phases == [("swap_out", [list(p) for p in out0 + out1]), ("swap_in", [list(p) for p in back0]),
                      ("swap_out", [list(p) for p in again0])]


def test_copies_that_would_race_in_one_launch_get_separate_phases():
    bm = BlockManager(8, 4)
    bm.add(0, [1])
    bm.fork(0, 1)
    first = bm.append(1, 2)            # 0's block -> a new block for 1
    bm.fork(1, 2)
    second = bm.append(2, 3)           # reads the block the first copy writes
    phases = bm.take_copies().phases
    assert [p.pairs.tolist() for p in phases] == [[list(first[0])], [list(second[0])]]
    assert first[0][1] == second[0][0]


# ------------------------------------------------------------------ any accepted program

OPERATIONS = st.sampled_from(["add", "append", "fork", "swap_out", "swap_in", "preempt", "resume", "free", "drain"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(OPERATIONS, st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=40),
       st.booleans())
def test_every_accepted_program_reads_its_own_kv(program, prefix_caching):
    """Random programs, drained at random points. A drain is forced only where the `Copies`
    contract asks for one: before a call would copy a block holding KV not written yet."""
    engine = Engine(num_blocks=10, block_size=2, num_cpu_blocks=6, prefix_caching=prefix_caching)
    next_id = 0
    for name, pick, token in program:
        ids = engine.bm.seq_ids()
        target = ids[pick % len(ids)] if ids else None
        if name == "drain":
            engine.drain()
            engine.check_reads()
            continue
        if name == "add" or target is None:
            name, args = "add", (next_id, [token] * (pick + 1))
            next_id += 1
        elif name == "fork":
            args = (target, next_id)
            next_id += 1
        elif name == "append":
            args = (target, token)
        elif name == "preempt":
            args = (target, "recompute")
        else:
            args = (target,)
        if name in ("swap_out", "append", "free", "preempt") and engine.bm.status(target) == "running" \
                and engine.shares_unwritten(target):
            engine.drain()   # the contract: a block's KV is written before it is copied or released
        try:
            engine.call(name, *args)
        except PagedKVError:
            continue
    engine.drain()
    engine.check_reads()
    engine.bm.check()


def test_perform_copies_moves_shadow_arrays_along():
    bm = BlockManager(4, 2, num_cpu_blocks=2)
    bm.add(0, [1, 2])
    bm.take_copies()
    bm.swap_out(0)
    k = torch.arange(4 * 2, dtype=torch.float32).reshape(4, 2, 1, 1)
    cpu_k = torch.zeros(2, 2, 1, 1)
    keys, cpu_keys = np.arange(8).reshape(4, 2), np.full((2, 2), -1)
    perform_copies(bm.take_copies(), [(k, k.clone())], [(cpu_k, cpu_k.clone())], shadows=[(keys, cpu_keys)])
    assert cpu_keys.tolist() == [[0, 1], [-1, -1]] and cpu_k.flatten().tolist()[:2] == [0.0, 1.0]


@pytest.mark.parametrize("kind", ["cow", "swap_out", "swap_in"])
def test_without_drops_one_kind_only(kind):
    bm = BlockManager(8, 2, num_cpu_blocks=4)
    bm.add(0, [1])
    bm.fork(0, 1)
    bm.append(1, 2)
    bm.swap_out(0)
    bm.swap_in(0)
    copies = bm.take_copies()
    kept = copies.without(kind)
    assert [p.kind for p in kept.phases] == [p.kind for p in copies.phases if p.kind != kind]
    assert len(getattr(kept, kind)) == 0 and len(kept) == len(copies) - len(getattr(copies, kind))


@pytest.mark.parametrize("kind", ["swap", "COW", None, 0])
def test_unknown_copy_kinds_are_refused(kind):
    copies = BlockManager(4, 2).take_copies()
    for method in (copies.without, copies.of_kind):
        with pytest.raises(InvalidArgument, match="copy kinds"):
            method(kind)
