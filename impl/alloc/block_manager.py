"""BlockManager: the production paged KV-cache allocator, observably equal to `pagedkv.spec.KVSpec`.

Same operations, errors (checked in the spec's order), deterministic choices and failure atomicity
as the spec; the differential fuzz test (`pagedkv.fuzz.differential`) holds it to that. What differs
is how state is kept, so that an engine's per-step work is a handful of numpy operations:

- each sequence owns a *row* of per-row arrays (status, length, admission stamp: the running
  list is derived from them) and a block table stored as a segment of one int32 arena, sized by
  the blocks it holds (`rows.py`); a batch's [N, M] tables are gathered per call;
- `block_tokens[b]` holds the token ids written into block b, as a real cache holds their KV, so a
  running sequence's tokens are read back through its table and nothing else is stored per token;
- ref counts, lengths and statuses are numpy arrays, so `append_batch` for a whole batch is
  vectorized; only the rare sequences that copy-on-write or fill a block under prefix caching
  take a short Python loop;
- an engine's decode step is one call: `decode(seq_ids, tokens)` appends like `append_batch` and
  hands back, in a `DecodeStep`, the copies and the batch's block tables and slot mapping (what
  `block_tables` and `slot_mapping` would answer right after), checking the batch once, under one
  lock and one transaction. The rows of the last batch checked are remembered (`_rows`): a list
  is compared with its marshal dump on each use (it may have changed in place), a tuple by
  identity alone (its items cannot change), so a tuple batch is the cheapest to pass;
- copies the engine must perform (copy-on-write, swap out, swap in) queue up, in call order,
  until `take_copies` (`copies.py`); the GPU pool (`block_pool.py`), CPU swap pool (`cpu_pool.py`),
  prefix cache (`prefix_cache.py`), argument checks (`arguments.py`), invariants (`invariants.py`)
  and the undo log (`journal.py`) each have their own file, so this one reads like the spec's
  operations.

Reliability: arguments are checked (and normalised to plain ints: an `int` subclass is read by its
value) before anything changes, in the spec's error order; then every mutation goes through the
undo log, so an operation that fails later, for whatever reason (a MemoryError, a bug, a
`preempt_mode` callback that raises), leaves the state exactly as it was. `tests/impl/
test_fault_injection.py` raises at every line each operation reaches to hold it to that.

Concurrency: every public method holds one re-entrant lock, so a manager may be shared between
threads; each call is a transaction, and `transaction(body)` makes several calls one.

Limits beyond the spec: token ids must fit in int64; `max_seqs` and `max_blocks_per_seq` only
size the initial row arrays and arena, which grow as a workload needs.
"""

import functools
import math
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from pagedkv.spec import (DuplicateSequence, InvalidArgument, InvalidState, InvariantViolation, OutOfBlocks,
                          StepResult, UnknownSequence)
from pagedkv.spec.arguments import check_block, check_int, check_step_tokens, check_token, require
from pagedkv.spec.blocks import blocks_needed

from .arguments import (check_device, check_prompt, check_token_batch, check_token_counts, marshalled,
                        plain_seq_id, plain_seq_ids)
from .block_pool import BlockPool
from .copies import Copies, PendingCopies
from .cpu_pool import CpuPool
from .invariants import invariant_problems
from .journal import Journal, atomic
from .prefix_cache import PrefixCache
from .rows import RUNNING_CODE, STATUSES, SWAPPED_CODE, WAITING_CODE, DecodeRun, RowTables

PREEMPT_MODES = ("recompute", "swap")


@dataclass
class _Seq:
    """What a sequence holds beyond its row's arrays."""
    seq_id: int
    created: int                                          # creation stamp: `seq_ids()` order
    cached_tokens: int = 0
    waiting_tokens: list = field(default_factory=list)   # only while waiting (it holds no blocks)
    cpu_block_table: list = field(default_factory=list)  # only while swapped


class DecodeStep(NamedTuple):
    """What `BlockManager.decode` did, and what the step's forward pass reads."""
    copies: list                 # the copy-on-write (src, dst) pairs, as `append_batch` returns them
    block_tables: torch.Tensor   # the batch's tables after the append, as `block_tables` gives them
    slot_mapping: torch.Tensor   # the slot each new token went to, as `slot_mapping` gives it


def _locked(method):
    """A query: under the lock, changes nothing."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


class BlockManager:
    capabilities = frozenset({"fork", "prefix_caching", "swap", "complete_cache", "spec_defaults", "batch_tables"})

    def __init__(self, num_blocks: int, block_size: int, *, num_cpu_blocks: int = 0,
                 prefix_caching: bool = False, device="cpu", max_seqs: int = 256,
                 max_blocks_per_seq: int = 64):
        # Plain ints: an int subclass's operators would otherwise run the pool's ring arithmetic.
        num_blocks = check_int(num_blocks, 1, math.inf, "num_blocks must be >= 1")
        block_size = check_int(block_size, 1, math.inf, "block_size must be >= 1")
        num_cpu_blocks = check_int(num_cpu_blocks, 0, math.inf, "num_cpu_blocks must be >= 0")
        require(isinstance(prefix_caching, bool), f"prefix_caching must be True or False, got {prefix_caching!r}")
        max_seqs = check_int(max_seqs, 1, math.inf, "max_seqs must be >= 1")
        max_blocks_per_seq = check_int(max_blocks_per_seq, 1, math.inf, "max_blocks_per_seq must be >= 1")
        self.device = check_device(device)
        self.num_blocks, self.block_size, self.num_cpu_blocks = num_blocks, block_size, num_cpu_blocks
        self.prefix_caching = prefix_caching
        self.journal = Journal()
        # Written now (np.zeros would map the pages lazily): a page first touched by a decode step
        # costs that step a page fault, several per step while fresh blocks are handed out.
        self.block_tokens = np.full((num_blocks, block_size), 0, dtype=np.int64)
        # The same memory, one item of B int64 per block: numpy copies whole items fastest.
        self._block_items = self.block_tokens.view(np.dtype((np.void, 8 * block_size))).reshape(num_blocks)
        self._token_slots = self.block_tokens.reshape(-1)   # and one item per slot (block * B + offset)
        self.cache = PrefixCache(self.journal, self.block_tokens) if prefix_caching else None
        self.pool = BlockPool(num_blocks, self.journal, self.cache)
        self.cpu_pool = CpuPool(num_cpu_blocks, block_size, self.journal)
        self.rows = RowTables(max_seqs, max_blocks_per_seq, self.device, self.journal)
        self.row_of: dict = {}                # seq_id -> row, in creation order
        self.copies = PendingCopies(self.device, self.journal)
        self._admissions = 0
        self._creations = 0
        self._last_batch = None               # (the list or tuple, a list's dump, its rows, rows.version)
        # What the last batch append learnt, valid while no table changes (`rows.changes`, which
        # every admission, preemption, resumption and free bumps): those rows all run, the slots
        # their new tokens went to (the decode slot mapping), their lengths (`DecodeRun`).
        self._run = None
        self.stats = dict.fromkeys(("prompt_tokens", "cached_tokens", "copies", "swap_outs",
                                    "swap_ins", "preempt_recompute", "preempt_swap"), 0)
        self._lock = threading.RLock()

    @atomic
    def transaction(self, body):
        """Run `body()` as one transaction with the manager's own: if it raises, every manager call
        it made is undone (the Scheduler makes a whole step atomic with it)."""
        require(callable(body), f"a transaction runs a callable, got {body!r}")
        return body()

    # ---------------------------------------------------------------- spec operations

    @atomic
    def add(self, seq_id: int, tokens: list) -> int:
        """Admit a prompt: ceil(len/B) blocks, the longest confirmed cached prefix shared.
        Returns the prompt tokens served from cache."""
        seq_id = plain_seq_id(seq_id)
        written = check_prompt(tokens)
        if seq_id in self.row_of:
            raise DuplicateSequence(seq_id)
        hits, needed = self._plan_prompt(written)
        cached = len(hits) * self.block_size
        self._place_prompt(self._new_row(seq_id, cached), written, hits, needed)
        return cached

    @atomic
    def append(self, seq_id: int, token: int) -> list:
        """Append one decoded token; returns the copy-on-write copies [(src, dst)]."""
        token = check_token(token)
        row = self._running_row(seq_id)
        return self._append_rows(np.array([row]), np.array([token], dtype=np.int64))

    @atomic
    def fork(self, parent_id: int, child_id: int) -> None:
        """Start `child_id` sharing every block of running `parent_id` (ref count + 1 each)."""
        parent_id, child_id = plain_seq_id(parent_id), plain_seq_id(child_id)
        parent = self._row(parent_id)
        if child_id in self.row_of:
            raise DuplicateSequence(child_id)
        if self.rows.row_status[parent] != RUNNING_CODE:
            raise InvalidState(f"cannot fork sequence {parent_id!r}: it is {self.status(parent_id)}")
        table = self.rows.table(parent)
        self.pool.share(table)
        child = self._new_row(child_id)   # a row `take` saved
        self.rows.seq_len[child] = self.rows.seq_len[parent]
        self.rows.place_table(child, table)
        self._make_running(child)

    @atomic
    def free(self, seq_id: int) -> None:
        """Finish or cancel a sequence in any status and release everything it holds."""
        row = self._row(seq_id)
        seq = self.rows.seq[row]
        if seq.cpu_block_table:   # only while swapped
            self.cpu_pool.release(seq.cpu_block_table)
        self.journal.pop_ordered(self.row_of, seq.seq_id, self._creation)
        self.pool.release(self.rows.recycle(row))

    @atomic
    def preempt(self, seq_id: int, mode: str = "recompute") -> list:
        """Take a running sequence off the GPU. By "recompute": release its blocks, keep its tokens
        (waiting). By "swap": copy each block to a new CPU block, then release the GPU blocks
        (swapped). Returns the (gpu, cpu) copies."""
        if not (isinstance(mode, str) and mode in PREEMPT_MODES):
            raise InvalidArgument(f"preempt mode must be one of {PREEMPT_MODES}, got {mode!r}")
        row = self._running_row(seq_id)
        journal, seq, table = self.journal, self.rows.seq[row], self.rows.table(row)
        self.rows.save_row(row)
        copies = []
        if mode == "recompute":
            journal.set(seq, "waiting_tokens", self._running_tokens(row))
            self._count("preempt_recompute", 1)
        else:
            if len(table) > self.cpu_pool.num_free():
                raise OutOfBlocks(len(table), self.cpu_pool.num_free(), pool="cpu")
            cpu_table = self.cpu_pool.take(len(table))
            journal.set(seq, "cpu_block_table", cpu_table)
            journal.assign(self.cpu_pool.block_tokens, cpu_table, self.block_tokens[table])
            copies = list(zip(table, cpu_table))
            self.copies.add("swap_out", copies)
            self._count("preempt_swap", 1)
            self._count("swap_outs", len(copies))
        self.pool.release(self.rows.table_view(row))
        self.rows.clear_table(row)
        self.rows.row_status[row] = WAITING_CODE if mode == "recompute" else SWAPPED_CODE
        return copies

    @atomic
    def resume(self, seq_id: int) -> list:
        """Waiting: allocate like `add` of its tokens. Swapped: new unshared GPU blocks copied
        back from the CPU blocks, which are freed. Returns the (cpu, gpu) copies."""
        row = self._row(seq_id)
        journal, seq, status = self.journal, self.rows.seq[row], self.rows.row_status[row]
        if status == RUNNING_CODE:
            raise InvalidState(f"sequence {seq_id!r} is already running")
        self.rows.save_row(row)
        if status == WAITING_CODE:
            tokens = np.array(seq.waiting_tokens, dtype=np.int64)
            hits, needed = self._plan_prompt(tokens)
            self._place_prompt(row, tokens, hits, needed)
            journal.set(seq, "cached_tokens", len(hits) * self.block_size)
            journal.set(seq, "waiting_tokens", [])
            return []
        cpu_table = seq.cpu_block_table
        self._require_free(len(cpu_table))
        table = self.pool.take(len(cpu_table)).tolist()
        self._write_blocks(table, self.cpu_pool.block_tokens[cpu_table])
        self.cpu_pool.release(cpu_table)
        journal.set(seq, "cpu_block_table", [])
        self.rows.place_table(row, table)
        self._make_running(row)
        self._fill_cache(table, 0, int(self.rows.seq_len[row]) // self.block_size)
        copies = list(zip(cpu_table, table))
        self.copies.add("swap_in", copies)
        self._count("swap_ins", len(copies))
        return copies

    def swap_out(self, seq_id: int) -> list:
        return self.preempt(seq_id, "swap")

    @atomic
    def swap_in(self, seq_id: int) -> list:
        if self.rows.row_status[self._row(seq_id)] != SWAPPED_CODE:
            raise InvalidState(f"sequence {seq_id!r} is not swapped")
        return self.resume(seq_id)

    @atomic
    def step(self, tokens: dict, preempt_mode=lambda seq_id: "recompute") -> StepResult:
        """One batched decode step, as the spec's: while the step's new blocks exceed the free
        ones, preempt the latest admitted running sequence and drop its token; then append the
        rest in admission order. The spec preempts by recompute; a scheduler may pass
        `preempt_mode(victim) -> "recompute" | "swap"` to choose per victim. All or nothing: if
        `preempt_mode` raises or answers badly, nothing was preempted or appended."""
        batch = check_step_tokens(tokens)
        require(callable(preempt_mode), f"preempt_mode must be callable, got {preempt_mode!r}")
        for seq_id in batch:
            self._running_row(seq_id)
        preempted = []
        while self.blocks_for_append(list(batch)) > self.pool.num_free():
            victim = self.rows.seq[self.rows.latest_running_row()].seq_id
            self.preempt(victim, preempt_mode(victim))
            preempted.append(victim)
            batch.pop(victim, None)
        order = sorted(batch, key=lambda s: self.rows.admitted[self.row_of[s]])
        copies = self.append_batch(order, [batch[s] for s in order]) if order else []
        return StepResult(appended=order, preempted=preempted, copies=copies)

    # ---------------------------------------------------------------- batched forms

    @atomic
    def append_batch(self, seq_ids, tokens) -> list:
        """Append tokens[i] to seq_ids[i] for every i, exactly as that many `append` calls in this
        order would, but all or nothing. Returns the copy-on-write copies."""
        return self._append_batch(seq_ids, tokens)[1]

    @atomic
    def decode(self, seq_ids, tokens) -> DecodeStep:
        """A decode step in one call: `append_batch(seq_ids, tokens)`, then the batch's
        `block_tables(seq_ids)` and `slot_mapping(seq_ids)` as they would answer right after, with
        the batch checked once. All or nothing, errors as `append_batch`'s."""
        rows, copies = self._append_batch(seq_ids, tokens)
        return DecodeStep(copies, self._tables(rows), self._decode_slots(rows))

    @_locked
    def blocks_for_append(self, seq_ids) -> int:
        """New blocks appending one token to each of these running sequences would take."""
        rows = self._rows(seq_ids)
        self._require_running(rows)
        return len(self._plan_append(rows)[0])

    @atomic   # a query, but it may compact the table arena to read windows off its end
    def block_tables(self, seq_ids) -> torch.Tensor:
        """int32 [N, M] block tables of these sequences on `device`, M = the most blocks any of
        them holds, -1 past a sequence's own blocks."""
        return self._tables(self._rows(seq_ids))

    @_locked
    def seq_lens(self, seq_ids) -> torch.Tensor:
        return torch.from_numpy(self.rows.seq_len[self._rows(seq_ids)].astype(np.int32)).to(self.device)

    @_locked
    def slot_mapping(self, seq_ids, num_tokens=1) -> torch.Tensor:
        """int64 slots (block * B + offset) of the last `num_tokens` tokens of each running
        sequence, concatenated: what a forward pass writes (prefill: length - cached; decode: 1).
        `num_tokens`: one int for all, or one per sequence."""
        rows = self._rows(seq_ids)
        if type(num_tokens) is int and num_tokens == 1:
            return self._decode_slots(rows)
        self._require_running(rows)
        lens = self.rows.seq_len[rows]
        counts = check_token_counts(num_tokens, lens)
        ends = np.cumsum(counts)
        positions = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - counts, counts) \
            + np.repeat(lens - counts, counts)
        return self._slots_at(np.repeat(rows, counts), positions)

    @atomic
    def take_copies(self) -> Copies:
        """Drain the pending copies, in call order (see `Copies` for how to perform them)."""
        return self.copies.take()

    # ---------------------------------------------------------------- queries

    @_locked
    def block_table(self, seq_id: int) -> list:
        return self.rows.table(self._row(seq_id))

    @_locked
    def cpu_block_table(self, seq_id: int) -> list:
        return list(self.rows.seq[self._row(seq_id)].cpu_block_table)

    @_locked
    def length(self, seq_id: int) -> int:
        return int(self.rows.seq_len[self._row(seq_id)])

    @_locked
    def tokens(self, seq_id: int) -> list:
        row = self._row(seq_id)
        seq, status = self.rows.seq[row], self.rows.row_status[row]
        if status == WAITING_CODE:
            return list(seq.waiting_tokens)
        if status == SWAPPED_CODE:
            return self.cpu_pool.block_tokens[seq.cpu_block_table].ravel()[:self.rows.seq_len[row]].tolist()
        return self._running_tokens(row)

    @_locked
    def status(self, seq_id: int) -> str:
        return STATUSES[self.rows.row_status[self._row(seq_id)]]

    @_locked
    def cached_tokens(self, seq_id: int) -> int:
        return self.rows.seq[self._row(seq_id)].cached_tokens

    @_locked
    def seq_ids(self) -> list:
        """Live sequence ids in creation order."""
        return list(self.row_of)

    @_locked
    def running(self) -> list:
        """Running sequence ids, earliest admitted first (the last is the next preemption victim)."""
        return [self.rows.seq[row].seq_id for row in self.rows.running_rows().tolist()]

    @_locked
    def cached_prefix_tokens(self, tokens: list) -> int:
        """Prompt tokens an `add` of `tokens` would serve from the prefix cache now (a lookup
        that changes nothing)."""
        tokens = check_prompt(tokens)
        B = self.block_size
        return len(self.cache.lookup(tokens, (len(tokens) - 1) // B)) * B if self.cache else 0

    @_locked
    def refcount(self, block: int) -> int:
        return int(self.pool.ref_count[check_block(block, self.num_blocks)])

    @_locked
    def num_free_blocks(self) -> int:
        return self.pool.num_free()

    @_locked
    def num_evictable_blocks(self) -> int:
        return self.pool.num_evictable

    @_locked
    def num_active_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free()

    @_locked
    def num_free_cpu_blocks(self) -> int:
        return self.cpu_pool.num_free()

    @_locked
    def num_evictions(self) -> int:
        """Released cached blocks handed out again (evicted) since construction."""
        return self.pool.evictions

    @_locked
    def uncached_free_blocks(self) -> list:
        """Free GPU blocks that hold no cached content, oldest first: what an engine may treat as
        garbage (evictable cached blocks keep their KV for hits and are not listed)."""
        return self.pool.free_queue

    @_locked
    def metrics(self) -> dict:
        active = self.num_blocks - self.pool.num_free()
        looked_up = self.stats["prompt_tokens"]
        return {
            "free_blocks": self.pool.queued,
            "evictable_blocks": self.pool.num_evictable,
            "active_blocks": active,
            "usage": active / self.num_blocks,
            "prefix_hit_rate": self.stats["cached_tokens"] / looked_up if looked_up else 0.0,
            "evictions": self.pool.evictions,
            **self.stats,
        }

    @_locked
    def check(self) -> None:
        """Raise InvariantViolation naming the first broken invariant among those that need no
        ghost content: conservation, refcount, table_shape, cache_index."""
        for name, problems in invariant_problems(self).items():
            if problems:
                raise InvariantViolation(name, "; ".join(problems[:3]))

    # ---------------------------------------------------------------- internals: sequences

    def _row(self, seq_id) -> int:
        seq_id = plain_seq_id(seq_id)
        row = self.row_of.get(seq_id)
        if row is None:
            raise UnknownSequence(seq_id)
        return row

    def _creation(self, seq_id) -> int:
        return self.rows.seq[self.row_of[seq_id]].created

    def _new_row(self, seq_id: int, cached_tokens: int = 0) -> int:
        self._creations += 1
        row = self.rows.take(_Seq(seq_id, self._creations, cached_tokens))
        self.journal.put(self.row_of, seq_id, row)
        return row

    def _running_row(self, seq_id) -> int:
        row = self._row(seq_id)
        if self.rows.row_status[row] != RUNNING_CODE:
            raise InvalidState(f"sequence {seq_id!r} is {STATUSES[self.rows.row_status[row]]}, not running")
        return row

    def _rows(self, seq_ids) -> np.ndarray:
        """Rows of distinct known sequences. Engines pass one batch to several calls of a step
        (and often the same one step after step), so the rows of the last list or tuple checked
        are remembered until a row is recycled. A hit needs that very object, unchanged, item
        types included. A list may have been changed in place, and equality alone would let
        [False, True] or [0.0, 1.0] pass as [0, 1] without their checks, so its marshal dump (one C
        pass that writes each item's exact type) is compared instead. A tuple that passed cannot
        change (its items are ints, a subclass's value as immutable as an int's), so identity
        suffices: no dump (remembered as None)."""
        last = self._last_batch
        if last is not None and seq_ids is last[0] and last[3] == self.rows.version \
                and (last[1] is None or marshalled(seq_ids) == last[1]):
            return last[2]
        ids = plain_seq_ids(seq_ids)
        try:
            rows = np.fromiter(map(self.row_of.__getitem__, ids), np.int64, len(ids))
        except KeyError as missing:
            raise UnknownSequence(missing.args[0]) from None
        seen = np.zeros(len(self.rows), dtype=bool)
        seen[rows] = True
        require(np.count_nonzero(seen) == len(rows), "a batch names a sequence twice")
        rows.setflags(write=False)   # shared with the memo: nobody may change it
        if type(seq_ids) is tuple:
            self._last_batch = (seq_ids, None, rows, self.rows.version)
        elif type(seq_ids) is list:
            dump = marshalled(seq_ids)
            if dump is not None:
                self._last_batch = (seq_ids, dump, rows, self.rows.version)
        return rows

    def _append_batch(self, seq_ids, tokens):
        """`append_batch`'s checks and append: the batch's rows and the copies."""
        tokens = check_token_batch(tokens)
        rows = self._rows(seq_ids)
        if len(rows) != len(tokens):   # (a require() would format its message every step)
            raise InvalidArgument(f"{len(rows)} sequences but {len(tokens)} tokens")
        self._require_running(rows)
        return rows, self._append_rows(rows, tokens)

    def _tables(self, rows: np.ndarray) -> torch.Tensor:
        tables = self.rows.current_tables(rows)   # the batch's last tables, if no table changed
        return self.rows.device_tables(rows) if tables is None else tables

    def _decode_slots(self, rows: np.ndarray) -> torch.Tensor:
        """The slot of each running row's last token: the last batch append's, if it was of these
        rows and no table changed since."""
        run = self._run
        if run is not None and run.rows is rows and run.stamp == self.rows.changes:
            return self.rows.on_device(torch.from_numpy(run.slots.copy()))
        self._require_running(rows)
        return self._slots_at(rows, self.rows.seq_len[rows] - 1)

    def _slots_at(self, rows: np.ndarray, positions: np.ndarray) -> torch.Tensor:
        """Slots (block * B + offset) of these token positions, positions[i] in rows[i]'s table."""
        blocks = self.rows.blocks_at(rows, positions // self.block_size)
        return self.rows.on_device(torch.from_numpy(blocks * self.block_size + positions % self.block_size))

    def _forget_memo(self) -> None:
        """After a rollback: rows the memo saw may have been recycled and restored, and tables
        gathered, slots written or rows found running inside the transaction may show changes that
        were undone (most undo steps stamp nothing)."""
        self._last_batch = self._run = None
        self.rows.last_gather = None

    def _require_running(self, rows: np.ndarray) -> None:
        run = self._run
        if run is not None and run.rows is rows and run.stamp == self.rows.changes:
            return
        not_running = (self.rows.row_status[rows] != RUNNING_CODE).nonzero()[0]
        if len(not_running):
            row = rows[not_running[0]]
            raise InvalidState(f"a sequence in the batch is {STATUSES[self.rows.row_status[row]]}, not running")

    def _make_running(self, row: int) -> None:
        """Admit a row this call has saved (`RowTables.save_row`: its fields change unrecorded)."""
        self._admissions += 1
        self.rows.admitted[row] = self._admissions
        self.rows.row_status[row] = RUNNING_CODE

    def _running_tokens(self, row: int) -> list:
        return self.block_tokens[self.rows.table(row)].ravel()[:self.rows.seq_len[row]].tolist()

    def _count(self, stat: str, n: int) -> None:
        self.stats[stat] += n   # saved when the transaction began

    def _save_counters(self) -> None:
        """A transaction's first undo record (`journal.atomic` calls it): the creation and admission
        stamps and the stats, which operations then change unrecorded."""
        self.journal.undo.append((self._restore_counters, (self._creations, self._admissions, self.stats.copy())))

    def _restore_counters(self, creations: int, admissions: int, stats: dict) -> None:
        self._creations, self._admissions = creations, admissions
        self.stats.update(stats)

    # ---------------------------------------------------------------- internals: allocation

    def _require_free(self, needed: int) -> None:
        if needed > self.pool.num_free():
            raise OutOfBlocks(needed, self.pool.num_free())

    def _plan_prompt(self, tokens: np.ndarray):
        """Confirmed cache hits for a prompt and how many new blocks it needs; raises OutOfBlocks
        (nothing changed) when they are not there. Hits waiting in the LRU are not available.
        At most (len - 1) // B blocks hit: the prompt's last token is always computed."""
        B = self.block_size
        hits = self.cache.lookup(tokens, (len(tokens) - 1) // B) if self.cache else []
        needed = blocks_needed(len(tokens), B) - len(hits)
        available = self.pool.num_free() - (np.count_nonzero(self.pool.ref_count[hits] == 0) if len(hits) else 0)
        if needed > available:
            raise OutOfBlocks(needed, available)
        return hits, needed

    def _place_prompt(self, row: int, tokens: np.ndarray, hits: list, needed: int) -> None:
        """Give a prompt's blocks to a row holding none (the caller records its cached tokens)."""
        B = self.block_size
        if len(hits):
            self.pool.share(hits)
        fresh = self.pool.take(needed)
        cached = len(hits) * B
        written = tokens[cached:] if cached else tokens   # what the fresh blocks hold, the last one padded with zeros
        if len(written) < needed * B:
            written = np.concatenate([written, np.zeros(needed * B - len(written), dtype=np.int64)])
        self._write_blocks(fresh, written)
        table = np.concatenate([np.asarray(hits, dtype=np.int64), fresh]) if len(hits) else fresh
        self.rows.place_table(row, table)   # a row `add` or `resume` saved, holding none
        self.rows.seq_len[row] = len(tokens)
        self._make_running(row)
        self._count("prompt_tokens", len(tokens))
        self._count("cached_tokens", cached)
        if self.cache is not None:
            self._fill_cache(table, len(hits), len(tokens) // B)

    def _write_blocks(self, blocks, contents: np.ndarray) -> None:
        """`block_tokens[blocks] = contents` (int64, len(blocks) * B of them, flat or [len(blocks), B]),
        recorded. One item of B tokens per block (`put`: some 10% cheaper than an indexed write)."""
        items = self._block_items
        self.journal.undo.append((items.__setitem__, (blocks, items.take(blocks))))
        items.put(blocks, np.ascontiguousarray(contents).reshape(-1).view(items.dtype))

    def _fill_cache(self, table: list, first: int, stop: int) -> None:
        """Record blocks first..stop-1 of a table, all just filled, in the prefix cache in order."""
        if self.cache is None:
            return
        if stop > first:
            if first:
                parents = table[first - 1:stop - 1]
            else:   # the first block follows none (an array built whole: a list of numpy ints costs ~6x)
                parents = np.full(stop, -1, dtype=np.int64)
                parents[1:] = table[:stop - 1]
            self.cache.fill(table[first:stop], parents)

    def _plan_append(self, rows: np.ndarray):
        """For appending one token to each row in this order: `needy` lists the rows that need a
        new block, either a fresh tail (tail full) or a copy of a shared partial tail (`cow`, None
        when no row copies). Sharers copy in order; when every holder of a tail is in the batch,
        the last one writes in place. Also each row's length, tail block and the tail's offset."""
        lens = self.rows.seq_len[rows]
        offsets = lens % self.block_size
        tails = self.rows.tails(rows)
        needs_tail = offsets == 0
        shared = self.pool.ref_count[tails] > 1
        if not np.count_nonzero(shared):   # the common case: nothing to copy
            return needs_tail.nonzero()[0], needs_tail, None, lens, offsets, tails
        cow = shared & ~needs_tail
        pending_refs = {}
        for i in cow.nonzero()[0].tolist():
            tail = tails[i]
            refs = pending_refs.get(tail, self.pool.ref_count[tail])
            cow[i] = refs > 1
            pending_refs[tail] = refs - 1
        return (needs_tail | cow).nonzero()[0], needs_tail, cow, lens, offsets, tails

    def _append_rows(self, rows: np.ndarray, tokens: np.ndarray) -> list:
        run = self._run
        if run is not None and run.rows is rows and run.stamp == self.rows.changes:
            return self._append_again(rows, tokens, run)
        return self._append_planned(rows, tokens)

    def _append_again(self, rows: np.ndarray, tokens: np.ndarray, run: DecodeRun) -> list:
        """The decode step right after a batch append of the same rows, no table changed since
        (`rows.changes`). Each row's last token went to run.slots[i], so its next one goes to
        the next slot, or to a new block where that tail is full: the rows in the phase whose
        offset comes round to 0 (`DecodeRun`). No partial tail is shared: that append left each
        tail it wrote held once (fresh, copied, or its sharers copied), and only a fork or an
        admission shares a partial block again, and both change a table."""
        B = self.block_size
        if run.order is None:
            run.phases(B)
            if self.cache is not None:
                run.parents = self._last_full_blocks(rows, run.lens)
        step = run.steps + 1
        needy = run.at_offset(-step % B)
        self._require_free(len(needy))
        if self.cache is not None and len(needy) > self.pool.queued:
            return self._append_planned(rows, tokens)   # evictions: the order-keeping path
        slots = run.slots + 1
        if len(needy):
            new_blocks = self.pool.take(len(needy))
            self.rows.push_in_batch(rows, needy, new_blocks)
            slots[needy] = new_blocks * B
        lens = self._write_appended(rows, tokens, slots, run.lens)
        run.slots, run.lens, run.stamp, run.steps = slots, lens, self.rows.changes, step
        if self.cache is not None:
            filled = run.at_offset((B - 1 - step) % B)
            if len(filled):
                tails = slots[filled] // B
                self.cache.fill_arrays(tails, run.parents[filled])
                run.parents[filled] = tails   # what their next filled blocks follow
        return []

    def _last_full_blocks(self, rows: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """The last full block of each row's table (-1: none is full), of these lengths: what the
        block each row fills next follows in the prefix index."""
        full = lens // self.block_size
        return np.where(full > 0, self.rows.blocks_at(rows, np.maximum(full - 1, 0)), -1)

    def _write_appended(self, rows: np.ndarray, tokens: np.ndarray, slots: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """Write each row's new token to its slot and count it (`lens`: the rows' lengths before);
        returns their lengths now."""
        self.journal.undo.append((self._token_slots.__setitem__, (slots, self._token_slots.take(slots))))
        self._token_slots[slots] = tokens
        grown = lens + 1
        self.journal.assign(self.rows.seq_len, rows, grown, old=lens)
        return grown

    def _append_planned(self, rows: np.ndarray, tokens: np.ndarray) -> list:
        needy, needs_tail, cow, lens, offsets, tails = self._plan_append(rows)
        self._require_free(len(needy))
        if self.cache is not None and len(needy) > self.pool.queued and len(rows) > 1:
            # An eviction unindexes a block; an earlier sequence's filled block must be indexed
            # before that, as appending one at a time would. Rare: keep that order literally.
            return [copy for i in range(len(rows)) for copy in self._append_rows(rows[i:i + 1], tokens[i:i + 1])]
        copies = []
        if len(needy):
            new_blocks = self.pool.take(len(needy))
            if cow is None:
                self.rows.push(rows[needy], new_blocks)
            else:
                is_tail = needs_tail[needy]
                self.rows.push(rows[needy[is_tail]], new_blocks[is_tail])
                copies = self._copy_on_write(rows[needy[~is_tail]], tails[needy[~is_tail]], new_blocks[~is_tail])
            tails[needy] = new_blocks   # a fresh tail or the copy: either way the block written now
        slots = tails * self.block_size + offsets
        # Remembered (the rows run, their slots and lengths) until a table changes.
        self._run = DecodeRun(rows, slots, self._write_appended(rows, tokens, slots, lens), self.rows.changes)
        if self.cache is not None:
            filled = (offsets == self.block_size - 1).nonzero()[0]
            if len(filled):
                self._index_filled_tails(rows[filled], tails[filled])
        return copies

    def _index_filled_tails(self, rows: np.ndarray, tails: np.ndarray) -> None:
        """Index the tail block each of these rows just filled (`tails`), after the block before
        it, in batch order (gathered in a few numpy operations, indexed in one batched cache call)."""
        held = self.rows.num_held[rows]
        if held[held.argmin()] > 1:   # the usual case: no row filled its first block (no np.where)
            parents = self.rows.blocks_at(rows, held - 2)
        else:
            parents = np.where(held > 1, self.rows.blocks_at(rows, np.maximum(held - 2, 0)), -1)
        self.cache.fill_arrays(tails, parents)

    def _copy_on_write(self, rows, src, dst) -> list:
        if not len(rows):
            return []
        self.rows.set_tails(rows, dst)
        self.pool.unshare(src)
        self._write_blocks(dst, self.block_tokens[src])
        copies = list(zip(src.tolist(), dst.tolist()))
        self.copies.add("cow", copies)
        self._count("copies", len(copies))
        return copies

    def __repr__(self):
        return (f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"num_cpu_blocks={self.num_cpu_blocks}, prefix_caching={self.prefix_caching}, "
                f"seqs={len(self.row_of)}, free={self.pool.num_free()})")

