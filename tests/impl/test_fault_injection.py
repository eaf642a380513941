"""Fault injection: an exception raised at any line an operation reaches leaves the allocator (and
the scheduler) exactly as before, with every invariant holding, and the same call then succeeds as
on an undisturbed replica.

A `sys.settrace` hook counts the line events of the code under test (impl/alloc and impl/sched)
and raises a planted exception at the k-th one. Only the transaction wrapper itself
(`journal.atomic`) is exempt: its last statement is the commit point, after which the call has
happened. The normal run tries a bounded, evenly spread sample of points per operation;
`PAGEDKV_FAULTS=all` tries every point (the longer profile).
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import pagedkv.impl.alloc as alloc
import pagedkv.impl.sched as sched
from pagedkv.impl import BlockManager, Scheduler, SchedulerConfig
from pagedkv.impl.alloc.prefix_cache import PrefixCache
from pagedkv.impl.alloc.rows import RowTables

CODE_UNDER_TEST = tuple(str(Path(package.__file__).parent) + os.sep for package in (alloc, sched))
COMMIT_WRAPPER = BlockManager.add.__code__          # every `atomic` method shares this wrapper
SAMPLE = None if os.environ.get("PAGEDKV_FAULTS") == "all" else 30


class Planted(Exception):
    """The injected fault."""


class FaultInjector:
    """Raise `error` at the `at`-th line event of the code under test (never, if `at` is None)."""

    def __init__(self, at=None, error=Planted):
        self.at, self.error, self.lines = at, error, 0

    def __enter__(self):
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)

    def _call(self, frame, event, arg):
        code = frame.f_code
        if code is not COMMIT_WRAPPER and code.co_filename.startswith(CODE_UNDER_TEST):
            return self._line
        return None

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                raise self.error(f"planted at line event {self.at}")
        return self._line


# ------------------------------------------------------------------ what is observable

def manager_state(bm: BlockManager) -> dict:
    """Everything a caller can see, and the internal orders that decide future answers."""
    ids = bm.seq_ids()
    state = {
        "seqs": [(s, bm.status(s), bm.length(s), bm.tokens(s), bm.cached_tokens(s), bm.block_table(s),
                  bm.cpu_block_table(s), int(bm.rows.admitted[bm.row_of[s]])) for s in ids],
        "running": bm.running(),
        "free_queue": list(bm.pool.free_queue), "evictable": list(bm.pool.evictable),
        "cpu_free_queue": list(bm.cpu_pool.free_queue),
        "ref_count": bm.pool.ref_count.tolist(),
        "block_tokens": bm.block_tokens.tolist(), "cpu_block_tokens": bm.cpu_pool.block_tokens.tolist(),
        "pending": bm.copies.pending(), "metrics": bm.metrics(),
        "stamps": (bm._admissions, bm._creations),
        "arena": (bm.rows.used, bm.rows.live, len(bm.rows.arena)),   # block_tables may compact: not called here
    }
    if bm.cache is not None:
        state["contents"] = bm.cache.contents()        # indexed block -> its prefix, as tokens
        state["holders"] = bm.cache.holder_lists()     # every content's prefix -> its holders, in order
    return state


def scheduler_state(scheduler: Scheduler) -> dict:
    return {
        "waiting": [r.req_id for r in scheduler.waiting], "preempted": list(scheduler.preempted),
        "swapped": list(scheduler.swapped), "pending": dict(scheduler.pending),
        "generated": dict(scheduler.generated), "requests": sorted(scheduler.request_of),
        "awaiting": sorted(scheduler.awaiting), "next_seq_id": scheduler.next_seq_id,
        "bm": manager_state(scheduler.bm),
    }


def observe(subject) -> dict:
    return scheduler_state(subject) if isinstance(subject, Scheduler) else manager_state(subject)


def check(subject) -> None:
    (subject.bm if isinstance(subject, Scheduler) else subject).check()


# ------------------------------------------------------------------ operations under fault

def cached_pool():
    """Prefix caching with cached blocks evictable, a fork family, a waiting and a swapped one."""
    bm = BlockManager(12, 2, num_cpu_blocks=6, prefix_caching=True, max_seqs=2, max_blocks_per_seq=1)
    bm.add(1, [1, 2, 3, 4, 5])
    bm.add(2, [9, 9, 8, 8])
    bm.free(2)                                  # (9,9), (8,8) evictable, indexed
    bm.fork(1, 3)
    bm.add(4, [6, 7, 1])
    bm.preempt(4, "recompute")
    bm.add(5, [5, 5, 5])
    bm.swap_out(5)
    bm.take_copies()
    return bm


def crowded_pool():
    """Every block but one held, two sequences on the edge of a new block: a step preempts."""
    bm = BlockManager(7, 2, num_cpu_blocks=4, prefix_caching=True, max_seqs=1, max_blocks_per_seq=1)
    bm.add(1, [1, 2, 3, 4])
    bm.add(2, [5, 6])
    bm.add(3, [7, 8, 9])
    bm.fork(3, 4)
    return bm


def evicting_pool():
    """The free queue runs dry mid-batch: a batch append evicts cached blocks one row at a time."""
    bm = cached_pool()
    bm.add(6, [2] * 8)
    return bm


DECODE_BATCH = [1, 2]   # one list object, step after step, as an engine passes its batch


def decoding_pool():
    """A decode step of DECODE_BATCH done and its tables read: the next step of the same batch
    takes the short path (a new block for sequence 1 patched into the remembered tables,
    sequence 2 fills and indexes its tail)."""
    bm = BlockManager(12, 2, prefix_caching=True)
    bm.add(1, [1, 2, 3])
    bm.add(2, [4, 5, 6, 7])
    bm.append_batch(DECODE_BATCH, [8, 8])
    bm.block_tables(DECODE_BATCH)
    return bm


def decoding_full_tables():
    """A decode step of DECODE_BATCH done at block size 1, both tables filling their segments: the
    next step's short path moves both tables to larger segments, compacting the arena to fit them."""
    bm = BlockManager(24, 1, max_seqs=4, max_blocks_per_seq=4)
    bm.add(1, [1, 2, 3])
    bm.add(2, [4, 5, 6])
    bm.append_batch(DECODE_BATCH, [7, 7])
    bm.block_tables(DECODE_BATCH)
    assert bm.rows.num_held[[bm.row_of[1], bm.row_of[2]]].tolist() == bm.rows.capacity[[bm.row_of[1], bm.row_of[2]]].tolist()
    return bm


def swapped_back_in():
    bm = cached_pool()
    bm.swap_in(5)
    return bm


def arena_at_its_end():
    """The table arena used to its last slot: reading a batch's windows off its end compacts it."""
    bm = BlockManager(16, 1, max_seqs=2, max_blocks_per_seq=1)
    bm.add(1, [1, 2, 3])
    bm.add(2, [4, 5])
    assert bm.rows.used == len(bm.rows.arena)
    return bm


def scheduler_mid_run():
    """Two steps in: prefills done, a fork family decoding, the next step preempts by swap."""
    bm = BlockManager(6, 2, num_cpu_blocks=8, prefix_caching=True)
    scheduler = Scheduler(bm, SchedulerConfig(watermark=0.0, prefill_tokens_per_s=1.0, swap_bytes_per_s=1e18))
    scheduler.add_request("a", [1, 2, 3], 4, n=2)
    scheduler.add_request("b", [1, 2, 4], 3)
    for _ in range(2):
        out = scheduler.schedule()
        scheduler.update({s: 7 for s in out.seq_ids + list(out.forked)})
    scheduler.add_request("c", [4, 4], 2)
    return scheduler


def scheduler_awaiting():
    scheduler = scheduler_mid_run()
    out = scheduler.schedule()
    scheduler.ran = out.seq_ids + list(out.forked)
    return scheduler


def step_summary(out) -> tuple:
    """What a step decided (plain fields: a property of the output would run traced code after
    the commit point)."""
    return (out.prefills, out.decodes, out.forked, out.preempted, out.swapped_out, out.swapped_in, out.aborted,
            out.block_tables.tolist(), out.slot_mapping.tolist())


def decode_answer(bm, batch, tokens) -> tuple:
    """`decode`'s answer as plain values (a tensor's own methods run no traced code)."""
    out = bm.decode(batch, tokens)
    return out.copies, out.block_tables.tolist(), out.slot_mapping.tolist()


OPERATIONS = {
    "add hits, evicts, grows rows": (cached_pool, lambda bm: bm.add(6, [9, 9, 8, 8, 1, 1, 2, 2, 3])),
    "add a long prompt (table grows)": (cached_pool, lambda bm: bm.add(6, list(range(11)))),
    "append copy-on-write": (cached_pool, lambda bm: bm.append(3, 7)),
    "append fills a block": (cached_pool, lambda bm: bm.append(1, 6)),
    "append_batch": (cached_pool, lambda bm: bm.append_batch([3, 1], [7, 6])),
    "append_batch again (the decode short path)": (decoding_pool, lambda bm: bm.append_batch(DECODE_BATCH, [9, 9])),
    "append_batch again, tables move": (decoding_full_tables, lambda bm: bm.append_batch(DECODE_BATCH, [9, 9])),
    "append_batch evicting in order": (evicting_pool, lambda bm: bm.append_batch([6, 1, 3], [2, 6, 6])),
    "decode copy-on-write": (cached_pool, lambda bm: decode_answer(bm, [3, 1], [7, 6])),
    "decode again (the short path)": (decoding_pool, lambda bm: decode_answer(bm, DECODE_BATCH, [9, 9])),
    "decode again, tables move": (decoding_full_tables, lambda bm: decode_answer(bm, DECODE_BATCH, [9, 9])),
    "decode evicting in order": (evicting_pool, lambda bm: decode_answer(bm, [6, 1, 3], [2, 6, 6])),
    "decode compacting the arena": (arena_at_its_end, lambda bm: decode_answer(bm, (1, 2), [7, 7])),
    "fork": (cached_pool, lambda bm: bm.fork(1, 6)),
    "free shared": (cached_pool, lambda bm: bm.free(1)),
    "free swapped": (cached_pool, lambda bm: bm.free(5)),
    "preempt recompute": (cached_pool, lambda bm: bm.preempt(1, "recompute")),
    "preempt swap": (cached_pool, lambda bm: bm.preempt(3, "swap")),
    "resume waiting": (cached_pool, lambda bm: bm.resume(4)),
    "swap_in": (cached_pool, lambda bm: bm.swap_in(5)),
    "take_copies": (swapped_back_in, lambda bm: [(kind, pairs.tolist()) for kind, pairs in bm.take_copies().phases]),
    "block_tables compacting the arena": (arena_at_its_end, lambda bm: bm.block_tables([1, 2]).tolist()),
    "step preempting": (crowded_pool, lambda bm: bm.step({1: 1, 2: 2, 3: 3, 4: 4},
                                                          preempt_mode=lambda s: "swap" if s == 4 else "recompute")),
    "schedule": (scheduler_mid_run, lambda s: step_summary(s.schedule())),
    "update": (scheduler_awaiting, lambda s: s.update({seq_id: 3 for seq_id in s.ran})),
}


def line_events(setup, operation) -> int:
    subject = setup()
    observe(subject)   # as the trials do: its queries leave a memo of the last batch's rows
    with FaultInjector() as injector:
        operation(subject)
    return injector.lines


def fault_points(total: int) -> list:
    if SAMPLE is None or total <= SAMPLE:
        return list(range(1, total + 1))
    return sorted(set(np.linspace(1, total, SAMPLE).round().astype(int).tolist()))


def assert_fault_changes_nothing(setup, operation, at: int, error=Planted):
    subject = setup()
    before = observe(subject)
    with pytest.raises(error, match="planted"):
        with FaultInjector(at, error):
            operation(subject)
    assert observe(subject) == before, f"fault at line event {at} changed the state"
    check(subject)
    undisturbed = setup()
    assert operation(subject) == operation(undisturbed), f"after a fault at {at} the call answers differently"
    assert observe(subject) == observe(undisturbed)
    check(subject)


@pytest.mark.parametrize("name", OPERATIONS)
def test_a_fault_at_any_line_changes_nothing(name):
    setup, operation = OPERATIONS[name]
    total = line_events(setup, operation)
    assert total >= 10, f"{name} reached only {total} lines: the tracer is not watching it"
    for at in fault_points(total):
        assert_fault_changes_nothing(setup, operation, at)


MANAGER_OPERATIONS = [name for name, (setup, _) in OPERATIONS.items()
                      if setup not in (scheduler_mid_run, scheduler_awaiting)]


@pytest.mark.parametrize("name", MANAGER_OPERATIONS)
def test_a_fault_caught_inside_a_transaction_changes_nothing(name):
    """A call nested in `transaction` (as the Scheduler makes every call) that fails is undone at
    once: a body that catches the error commits the state from before the call, not half of it."""
    setup, operation = OPERATIONS[name]
    for at in fault_points(line_events(setup, operation))[::3]:
        bm = setup()
        before = manager_state(bm)

        def body():
            with pytest.raises(Planted, match="planted"):
                with FaultInjector(at):
                    operation(bm)

        bm.transaction(body)
        assert manager_state(bm) == before, f"a fault at line event {at}, caught, left part of the call"
        bm.check()


@pytest.mark.parametrize("name", ["add a long prompt (table grows)", "append_batch evicting in order",
                                  "append_batch again, tables move", "schedule"])
def test_memory_error_at_any_line_changes_nothing(name):
    setup, operation = OPERATIONS[name]
    for at in fault_points(line_events(setup, operation)):
        assert_fault_changes_nothing(setup, operation, at, MemoryError)


def test_memory_error_while_the_table_arena_grows(monkeypatch):
    bm = BlockManager(4000, 1, max_seqs=1, max_blocks_per_seq=1)
    bm.add(1, [1, 2])
    before = manager_state(bm)

    def out_of_memory(self, room):
        raise MemoryError(f"cannot allocate a table arena with {room} free slots")

    monkeypatch.setattr(RowTables, "_compact", out_of_memory)
    with pytest.raises(MemoryError):
        bm.add(2, list(range(3000)))
    assert manager_state(bm) == before and bm.num_free_blocks() == 3998
    bm.check()
    monkeypatch.undo()
    assert bm.add(2, list(range(3000))) == 0 and bm.length(2) == 3000
    bm.check()


def test_a_cache_fill_that_raises_leaves_no_sequence_behind(monkeypatch):
    fill = PrefixCache.fill

    def flaky_fill(self, blocks, parents):
        fill(self, blocks[:1], parents[:1])        # the first block is indexed,
        raise RuntimeError("cache index down")     # then the index fails

    bm = BlockManager(16, 2, prefix_caching=True)
    bm.add(1, [1, 2, 3, 4])                    # indexes 2 blocks
    monkeypatch.setattr(PrefixCache, "fill", flaky_fill)
    before = manager_state(bm)
    with pytest.raises(RuntimeError, match="cache index down"):
        bm.add(2, [5, 6, 7, 8, 9])
    assert manager_state(bm) == before and bm.seq_ids() == [1]
    bm.check()
    monkeypatch.undo()
    assert bm.add(2, [5, 6, 7, 8, 9]) == 0     # the index is back
    assert bm.add(3, [5, 6, 7, 8, 1]) == 4
    bm.check()
