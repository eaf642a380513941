"""Row storage of the block tables: per-row arrays plus one arena of table segments.

Each live sequence owns a *row*: one entry of each per-row array (length, blocks held, admission
stamp, status, where its table lives), so a whole batch is read or written with a handful of numpy
operations. Its block table is a *segment* of one int32 arena: `capacity` slots (a power of two, at
least `MIN_CAPACITY`) from `start`, the first `num_held` of them its blocks, the rest -1. So

- memory is proportional to the blocks held: each segment is at most twice its table, and the
  arena is at most four times the live segments plus what was placed since the last compaction
  (a table is never stored at the width of the longest one);
- new segments are placed at the arena's used end (bump allocation, no free lists). A table that
  outgrows its segment moves to one twice as large, copying its own blocks only (amortized O(1)
  per block; all of a batch's moves in a few numpy operations);
- when the used end reaches the arena's end, or when three quarters of the arena hold no live
  segment (a long table was freed), the live segments are *compacted* into a fresh arena twice
  their size: O(live slots), paid for by the at least as many slots placed or freed since the last
  compaction, so amortized O(1) per block as well;
- a batch's [N, M] tables are gathered through a sliding-window view: one fancy index, O(N * M).

Every change goes through the manager's journal (`journal.py`), so a failed operation is undone.
The tensor kernels read is gathered per call on the host and moved to the device.
"""

from operator import attrgetter

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from pagedkv.spec import RUNNING, SWAPPED, WAITING

RUNNING_CODE, WAITING_CODE, SWAPPED_CODE, UNUSED_CODE = range(4)   # row_status values
STATUSES = (RUNNING, WAITING, SWAPPED)                             # row_status value -> spec status
MIN_CAPACITY = 4                                                   # smallest segment, in blocks
ROW_ARRAYS = {"seq_len": (np.int64, 0), "num_held": (np.int64, 0), "admitted": (np.int64, 0),
              "row_status": (np.int8, UNUSED_CODE), "start": (np.int64, 0), "capacity": (np.int64, 0)}
_row_arrays = attrgetter(*ROW_ARRAYS)                              # RowTables -> its per-row arrays
FREE_FIELDS = tuple(fill for _, fill in ROW_ARRAYS.values())       # a free row's fields (`recycle` resets them)


def capacity_for(blocks: int) -> int:
    """The segment size a table of `blocks` blocks lives in (0: an empty table needs none)."""
    if blocks > MIN_CAPACITY:   # (no max(): a builtin call costs about what the rest does)
        return 1 << (blocks - 1).bit_length()
    return MIN_CAPACITY if blocks else 0


class RowTables:
    def __init__(self, max_seqs: int, blocks_per_seq: int, device: torch.device, journal):
        self.device = device
        self._on_host = device.type == "cpu"                  # tensors handed out need no move
        self.journal = journal
        for name, (dtype, fill) in ROW_ARRAYS.items():
            setattr(self, name, np.full(max_seqs, fill, dtype=dtype))
        self.seq = [None] * max_seqs                          # row -> its sequence's record
        self.free_rows = list(range(max_seqs - 1, -1, -1))    # popped from the end: row 0 first
        self.version = 0                                      # bumped whenever a row is recycled
        self.min_arena = max_seqs * capacity_for(blocks_per_seq)
        self.arena = np.full(self.min_arena, -1, dtype=np.int32)
        self.used = 0                                         # arena[used:] is -1, never placed
        self.live = 0                                         # slots in segments of live rows
        # The last batch's gathered tables, kept so that the next call with the same rows gathers
        # again only the rows whose tables changed since (engines repeat batches step after step).
        # A cache, not state: never journaled; a change stamps its rows, an undone change too.
        self.changed_at = np.zeros(max_seqs, dtype=np.int64)  # row -> stamp of its last table change
        self.changes = 0
        self.last_gather = None                               # (rows, width, tables, stamp)
        self.window_view = None                               # (arena, width, its window view)

    def __len__(self) -> int:
        return len(self.seq_len)

    @property
    def nbytes(self) -> int:
        """Host memory of the tables and per-row arrays (the change stamps included)."""
        return self.arena.nbytes + self.changed_at.nbytes + sum(getattr(self, name).nbytes for name in ROW_ARRAYS)

    # ---------------------------------------------------------------- rows

    def take(self, record) -> int:
        if not self.free_rows:
            self._grow_rows()
        row = self.free_rows[-1]
        # `save_row` of a free row, whose fields are known (`FREE_FIELDS`): nothing to read.
        self.journal.undo.append((self._restore_row, (row, FREE_FIELDS, None, len(self.free_rows), self.used,
                                                      self.live)))
        self.free_rows.pop()
        self.seq[row] = record
        return row

    def recycle(self, row: int) -> np.ndarray:
        """Free a row; returns the blocks it held (as `clear_table`). It is left with `FREE_FIELDS`."""
        self.save_row(row)
        blocks = self.clear_table(row)
        self.seq_len[row] = self.admitted[row] = 0
        self.seq[row] = None
        self.row_status[row] = UNUSED_CODE
        self.free_rows.append(row)
        self.version += 1   # never undone: a memo of rows only has to see that rows changed
        return blocks

    def save_row(self, row: int) -> None:
        """One undo record for what an operation may then change about `row` directly, unrecorded:
        its fields, its record, its place on the free-row list, the arena's used and live counts.
        (Arena slots and arrays replaced whole are recorded where they are written.) Every
        operation saves each row it changes this way, once, before changing it; `take` records the
        free row it hands out as holding FREE_FIELDS (what a free row holds), reading nothing."""
        # The fields in ROW_ARRAYS order, read one by one (a loop over the arrays costs twice this).
        fields = (self.seq_len[row], self.num_held[row], self.admitted[row], self.row_status[row], self.start[row],
                  self.capacity[row])
        self.journal.undo.append((self._restore_row, (row, fields, self.seq[row], len(self.free_rows),
                                                      self.used, self.live)))

    def _restore_row(self, row: int, fields: list, record, free_rows: int, used: int, live: int) -> None:
        for array, value in zip(_row_arrays(self), fields):
            array[row] = value
        self.seq[row] = record
        if len(self.free_rows) < free_rows:   # it was taken off the list
            self.free_rows.append(row)
        del self.free_rows[free_rows:]        # or put back on it
        self.used, self.live = used, live
        self._stamp(row)

    def _grow_rows(self) -> None:
        journal, old = self.journal, len(self)
        self.changed_at = np.concatenate([self.changed_at, np.zeros(old, dtype=np.int64)])
        for name, (dtype, fill) in ROW_ARRAYS.items():
            grown = np.full(2 * old, fill, dtype=dtype)
            grown[:old] = getattr(self, name)
            journal.set(self, name, grown)
        journal.set(self, "seq", self.seq + [None] * old)
        journal.set(self, "free_rows", list(range(2 * old - 1, old - 1, -1)))

    # ---------------------------------------------------------------- tables

    def table(self, row: int) -> list:
        return self.table_view(row).tolist()

    def table_view(self, row: int) -> np.ndarray:
        """The row's blocks as a read-only int32 view of the arena (valid until the next change)."""
        start = self.start.item(row)   # (item: a Python int, cheaper than int() of a numpy scalar)
        view = self.arena[start:start + self.num_held.item(row)]
        view.setflags(write=False)     # (setting view.flags.writeable costs ~4x)
        return view

    def place_table(self, row: int, table) -> None:
        """Make `table` (a non-empty list or int array) the blocks of a saved row that holds none,
        in a new segment of its size at the used end. Those slots were -1, as past `used`: the
        undo writes -1 back, reading nothing."""
        held = len(table)
        capacity = capacity_for(held)
        if self.used + capacity > len(self.arena):
            self._compact(room=capacity)
        start, arena = self.used, self.arena
        self.journal.undo.append((arena.__setitem__, (slice(start, start + held), -1)))
        arena[start:start + held] = table
        self.start[row], self.capacity[row], self.num_held[row] = start, capacity, held
        self.used += capacity
        self.live += capacity
        self._stamp(row)

    def clear_table(self, row: int) -> np.ndarray:
        """A saved row holds no blocks now (its segment dropped); returns the blocks it held, as
        int32 (a copy an undo record may share: read it, never write it)."""
        blocks = self._drop_segment(row)
        self.num_held[row] = 0
        self._stamp(row)
        return blocks

    def tails(self, rows: np.ndarray) -> np.ndarray:
        """The last block of each row's table (every row holds at least one)."""
        return self.arena[self.start[rows] + self.num_held[rows] - 1].astype(np.int64)

    def set_tails(self, rows: np.ndarray, blocks: np.ndarray) -> None:
        self.journal.assign(self.arena, self.start[rows] + self.num_held[rows] - 1, blocks)
        self._stamp(rows)

    def push(self, rows: np.ndarray, blocks: np.ndarray, batch=None) -> np.ndarray:
        """Append blocks[i] to the table of rows[i] (distinct rows); returns the blocks each held.
        Full tables move to larger segments first: those of `rows`, or, when a decode batch is
        given (its rows include `rows`), every full table of the batch."""
        journal = self.journal
        held = self.num_held[rows]
        full = held >= self.capacity[rows]
        if np.count_nonzero(full):
            self._move(rows[full] if batch is None else batch[self.num_held[batch] >= self.capacity[batch]])
        slots = self.start[rows] + held
        journal.undo.append((self._unpush, (rows, held, slots)))
        self.arena[slots] = blocks.astype(np.int32)   # a fancy write that casts costs ~2x the cast
        self.num_held[rows] = held + 1
        self._stamp(rows)
        return held

    def push_in_batch(self, batch: np.ndarray, positions: np.ndarray, blocks: np.ndarray) -> None:
        """`push(batch[positions], blocks)`. When the last gather was of `batch` and nothing
        changed since, the new blocks are written into its tables too (a column more when the
        widest grows), so the next gather of the batch copies them instead of gathering those
        rows again. A rollback drops the gather (`last_gather`), so a push undone is never seen
        there.
        A table that must move takes every full table of the batch along: a decode step appends
        to each of them within the next block's worth of steps, and one move of them all costs
        about what a move of a few does (a run of steps pays once per doubling of its tables)."""
        last = self.last_gather
        current = last is not None and last[0] is batch and last[3] == self.changes
        held = self.push(batch[positions], blocks, batch)
        if current:
            # The most blocks a pushed row holds now (argmax: a plain C loop, max(): a ufunc's setup).
            tables, top = last[2], int(held[held.argmax()]) + 1
            if top > last[1]:   # once per block's worth of steps: widened here, copied whole per call
                tables = np.concatenate([tables, np.full((len(batch), top - last[1]), -1, dtype=np.int32)], axis=1)
            tables[positions, held] = blocks
            self.last_gather = (batch, max(last[1], top), tables, self.changes)

    def _unpush(self, rows: np.ndarray, held: np.ndarray, slots: np.ndarray) -> None:
        self.arena[slots] = -1   # past each table inside its segment, as before the push
        self.num_held[rows] = held

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """int32 [len(rows), width] tables, -1 past each row's own blocks.

        Each row reads `width` slots from its segment's start through a sliding-window view of
        the arena (one fancy index, like the rows of a 2-D table). Slots past a table inside its
        segment are -1 already; a row whose segment is narrower than `width` read past it, so
        those columns are reset, one capacity (a power of two below `width`, from the smallest
        present) at a time."""
        if len(rows) == 0 or width == 0:
            return np.full((len(rows), width), -1, dtype=np.int32)
        self._ensure_tail_room(width)
        windows = self._windows(width)
        caps = self.capacity[rows]
        out = windows[self.start[rows]]
        capacity = int(caps.min())
        while capacity < width:
            narrow = caps == capacity
            if np.count_nonzero(narrow):
                out[narrow, capacity:] = -1
            capacity = MIN_CAPACITY if capacity == 0 else 2 * capacity
        return out

    def blocks_at(self, rows: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Block `index[i]` of the table of rows[i] (each index below that row's blocks held)."""
        return self.arena[self.start[rows] + index].astype(np.int64)

    def device_tables(self, rows: np.ndarray) -> torch.Tensor:
        """int32 [len(rows), M] tables on the device (a new tensor the caller owns), M = the most
        blocks any of the rows holds, -1 past each row's own blocks."""
        tables = torch.from_numpy(self._gather_again(rows))
        return self.on_device(tables)

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor handed out on the tables' device (the same tensor on the CPU: no copy)."""
        return tensor if self._on_host else tensor.to(self.device)

    def current_tables(self, rows: np.ndarray):
        """`device_tables(rows)` when the last gather was of this very `rows` and no table changed
        since (a copy of it, nothing else read); None otherwise."""
        last = self.last_gather
        if last is None or last[0] is not rows or last[3] != self.changes:
            return None
        tables = torch.from_numpy(last[2].copy())
        return self.on_device(tables)

    def _gather_again(self, rows: np.ndarray) -> np.ndarray:
        """`gather` at the most blocks any row holds, reusing the last call's tables when it asked
        for the same rows: only rows stamped since are gathered again, then the whole is copied
        once (kept C-contiguous: a strided copy of [4096, 65] costs ~4x a contiguous one). A
        width that changed keeps the other rows too: they hold at most both widths' blocks, -1
        after them."""
        held = self.num_held[rows]
        width = int(held[held.argmax()]) if len(held) else 0   # (argmax: no ufunc reduction's setup)
        last = self.last_gather
        if last is not None and (last[0] is rows or (
                len(last[0]) == len(rows) and not np.count_nonzero(last[0] != rows))):
            tables = last[2]
            if width != last[1]:
                tables = np.concatenate([tables, np.full((len(rows), width - last[1]), -1, dtype=np.int32)], axis=1) \
                    if width > last[1] else np.ascontiguousarray(tables[:, :width])
            if last[3] != self.changes:   # some table changed since: gather its rows again
                changed = (self.changed_at[rows] > last[3]).nonzero()[0]
                if len(changed):
                    tables[changed] = self.gather(rows[changed], width)
        else:
            tables = self.gather(rows, width)
        self.last_gather = (rows, width, tables, self.changes)
        return tables.copy()

    def _windows(self, width: int) -> np.ndarray:
        """The arena as overlapping rows of `width` slots (row i starts at slot i), a read-only view
        kept while the arena object and the width stay the same."""
        cached = self.window_view
        if cached is None or cached[0] is not self.arena or cached[1] != width:
            view = as_strided(self.arena, shape=(len(self.arena) - width + 1, width),
                              strides=(self.arena.strides[0],) * 2, writeable=False)
            cached = self.window_view = (self.arena, width, view)
        return cached[2]

    def _stamp(self, rows) -> None:
        self.changes += 1
        self.changed_at[rows] = self.changes

    # ---------------------------------------------------------------- segments

    def _move(self, rows: np.ndarray) -> None:
        """Move each full row's table (as many blocks as its segment holds, at least one) to a
        segment twice its size at the used end, compacting first if the arena has no room. The
        rows of one capacity are copied as one block of the arena (few numpy operations for a
        decode step's rows, which mostly share it). One undo record: the slots written were past
        the used end, so -1 (`problems`); the rows' fields are read after any compaction."""
        caps = self.capacity[rows]
        need = 2 * int(caps.sum())
        if self.used + need > len(self.arena):
            self._compact(room=need)
        used, old_starts = self.used, self.start[rows]
        self.journal.undo.append((self._unmove, (rows, old_starts, caps, used, used + need, self.live)))
        starts = np.empty_like(old_starts)
        sizes = sorted(set(caps.tolist()))
        for cap in sizes:
            group = (caps == cap).nonzero()[0] if len(sizes) > 1 else slice(None)
            count = len(rows) if len(sizes) == 1 else len(group)
            segments = self.arena[used:used + 2 * cap * count].reshape(count, 2 * cap)
            segments[:, :cap] = self.arena[old_starts[group, None] + np.arange(cap)]
            starts[group] = np.arange(used, used + 2 * cap * count, 2 * cap)
            used += 2 * cap * count
        self.start[rows] = starts
        self.capacity[rows] = 2 * caps
        self.live += need // 2   # each segment given up for one twice its size
        self.used = used

    def _unmove(self, rows: np.ndarray, starts: np.ndarray, caps: np.ndarray, used: int, end: int,
                live: int) -> None:
        self.arena[used:end] = -1   # the new segments, written or not
        self.start[rows], self.capacity[rows] = starts, caps
        self.used, self.live = used, live

    def _drop_segment(self, row: int) -> np.ndarray:
        """The (saved) row's segment is garbage now (its slots are never read again: a window that
        reads past a narrower segment is reset); compact if three quarters of the arena are garbage.
        The segment placed last is given back to the used end instead (its blocks reset to -1, as
        past `used`): a sequence freed right after its admission, or preempted, leaves no garbage,
        so admitting and freeing one after another never compacts. Returns a copy of the row's
        blocks (the undo of that reset writes them back)."""
        start, held, capacity = self.start.item(row), self.num_held.item(row), self.capacity.item(row)
        blocks = self.arena[start:start + held].copy()
        if capacity == 0:
            return blocks
        if start + capacity == self.used:
            self.journal.undo.append((self.arena.__setitem__, (slice(start, start + held), blocks)))
            self.arena[start:start + held] = -1
            self.used = start
        self.capacity[row] = self.start[row] = 0
        self.live -= capacity
        if self.live <= len(self.arena) // 4 and len(self.arena) > self.min_arena:
            self._compact(room=0)
        return blocks

    def _compact(self, room: int) -> None:
        """Copy every live segment, in row order, into a fresh arena of twice their size plus
        `room` free slots at its used end."""
        journal = self.journal
        rows = np.flatnonzero(self.capacity > 0)
        caps = self.capacity[rows]
        starts = np.cumsum(caps) - caps
        arena = np.full(max(self.min_arena, 2 * (self.live + room)), -1, dtype=np.int32)
        offsets = np.arange(self.live) - np.repeat(starts, caps)
        arena[:self.live] = self.arena[np.repeat(self.start[rows], caps) + offsets]
        start = self.start.copy()
        start[rows] = starts
        journal.set(self, "arena", arena)
        journal.set(self, "start", start)
        journal.set(self, "used", self.live)

    def _ensure_tail_room(self, width: int) -> None:
        """A window of `width` slots from any segment's start must stay inside the arena."""
        if self.used + width > len(self.arena):
            self._compact(room=width)

    # ---------------------------------------------------------------- running order

    def running_rows(self) -> np.ndarray:
        """Rows of running sequences, earliest admitted first."""
        rows = np.flatnonzero(self.row_status == RUNNING_CODE)
        return rows[np.argsort(self.admitted[rows])]

    def latest_running_row(self) -> int:
        """The running row admitted last (the spec's preemption victim); -1 if none runs."""
        stamps = np.where(self.row_status == RUNNING_CODE, self.admitted, -1)
        row = int(np.argmax(stamps))
        return row if stamps[row] >= 0 else -1

    def problems(self) -> list:
        """Broken parts of `table_shape` in the storage: live segments disjoint and below `used`,
        each table inside its own segment, slots past a table -1, the arena past `used` -1, every
        row either free (listed once) or live."""
        live = [row for row, record in enumerate(self.seq) if record is not None]
        problems, owned = [], np.zeros(self.used, dtype=np.int64)
        for row in live:
            start, held, cap = int(self.start[row]), int(self.num_held[row]), int(self.capacity[row])
            if held > cap or (held == 0) != (cap == 0) or start + cap > self.used:
                problems.append(f"row {row} holds {held} blocks in a segment of {cap} at {start} (used {self.used})")
                continue
            owned[start:start + cap] += 1
            if (self.arena[start + held:start + cap] != -1).any():
                problems.append(f"row {row} has blocks past its {held} in its segment")
        problems += [f"arena slot {i} is in {owned[i]} segments" for i in np.flatnonzero(owned > 1)[:3].tolist()]
        if self.live != sum(int(self.capacity[r]) for r in live):
            problems.append(f"{self.live} live arena slots counted, the live rows' segments hold another number")
        if (self.arena[self.used:] != -1).any():
            problems.append("the arena past its used end holds blocks")
        # A row both free and live is handed to the next sequence while its own still uses it.
        free = self.free_rows
        problems += [f"row {row} is free and live" for row in sorted(set(free) & set(live))]
        if len(set(free)) != len(free) or len(set(free) | set(live)) != len(self):
            problems.append("the free rows and the live rows do not partition the rows")
        # `take` records a free row as holding FREE_FIELDS without reading them: it must.
        unused = [row for row, record in enumerate(self.seq) if record is None]
        fields = np.array([array[unused] for array in _row_arrays(self)]).T if unused else []
        problems += [f"free row {row} has fields {tuple(f)}, not {FREE_FIELDS}"
                     for row, f in zip(unused, np.asarray(fields).tolist()) if tuple(f) != FREE_FIELDS][:3]
        return problems


class DecodeRun:
    """What the last batch append learnt about its rows (`rows`, the batch's row array), valid
    while no table changes (`RowTables.changes == stamp`): those rows all run, the last token of
    rows[i] went to slot slots[i], and its length is lens[i].

    Each append of the same batch after it moves every row one slot on, so a row starts a new
    block every B appends, in step with the rows whose slots had the same offset in their block:
    `phases` sorts the positions by that offset (at `steps` == 0, when built), so the rows that
    start or fill a block at an append are one slice of it, found with no pass over the batch.
    With prefix caching, `parents[i]` is the last full block of rows[i] (-1: none), which the
    block it fills next follows (kept by the manager's appends, from the phases on)."""

    __slots__ = ("rows", "slots", "lens", "stamp", "steps", "order", "bounds", "parents")

    def __init__(self, rows: np.ndarray, slots: np.ndarray, lens: np.ndarray, stamp: int):
        self.rows, self.slots, self.lens, self.stamp = rows, slots, lens, stamp
        self.steps = 0
        self.order = self.bounds = self.parents = None   # built by the first append that needs them

    def phases(self, block_size: int) -> None:
        offsets = self.slots % block_size
        self.order = np.argsort(offsets, kind="stable")   # positions ascending within an offset
        counts = np.bincount(offsets, minlength=block_size)
        self.bounds = [0, *np.cumsum(counts).tolist()]
        self.steps = 0

    def at_offset(self, offset: int) -> np.ndarray:
        """Positions (ascending) whose slot had this offset in its block when the phases were built."""
        return self.order[self.bounds[offset]:self.bounds[offset + 1]]
