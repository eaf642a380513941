"""Row storage of the block tables: per-row arrays plus one arena of table segments.

Each live sequence owns a *row*: one entry of each per-row array (length, blocks held, admission
stamp, status, where its table lives), so a whole batch is read or written with a handful of numpy
operations. Its block table is a *segment* of one int32 arena: `capacity` slots (a power of two, at
least `MIN_CAPACITY`) from `start`, the first `num_held` of them its blocks. So

- memory is proportional to the blocks held (each segment at most twice its table, plus segments
  freed and not yet reused), not to the longest table times the number of rows;
- a table that outgrows its segment moves to one twice as large: that copies its own blocks only,
  amortized O(1) per block; the arena itself grows by doubling (one memcpy of the used part,
  4 bytes per block held, amortized as well) and shrinks when three quarters of it are unused;
- a batch's [N, M] tables are gathered in one fancy index (`arena[start + column]`), O(N * M).

Freed segments wait in per-capacity free lists; one ending at the arena's used end is given back
to it. Every change goes through the manager's journal (`journal.py`), so a failed operation is
undone. The tensor kernels read is gathered per call on the host and moved to the device.
"""

import numpy as np
import torch

from pagedkv.spec import RUNNING, SWAPPED, WAITING

RUNNING_CODE, WAITING_CODE, SWAPPED_CODE, UNUSED_CODE = range(4)   # row_status values
STATUSES = (RUNNING, WAITING, SWAPPED)                             # row_status value -> spec status
MIN_CAPACITY = 4                                                   # smallest segment, in blocks
ROW_ARRAYS = {"seq_len": (np.int64, 0), "num_held": (np.int64, 0), "admitted": (np.int64, 0),
              "row_status": (np.int8, UNUSED_CODE), "start": (np.int64, 0), "capacity": (np.int64, 0)}


def capacity_for(blocks: int) -> int:
    """The segment size a table of `blocks` blocks lives in (0: an empty table needs none)."""
    return 0 if blocks == 0 else max(MIN_CAPACITY, 1 << (blocks - 1).bit_length())


class RowTables:
    def __init__(self, max_seqs: int, blocks_per_seq: int, device: torch.device, journal):
        self.device = device
        self.journal = journal
        for name, (dtype, fill) in ROW_ARRAYS.items():
            setattr(self, name, np.full(max_seqs, fill, dtype=dtype))
        self.seq = [None] * max_seqs                          # row -> its sequence's record
        self.free_rows = list(range(max_seqs - 1, -1, -1))    # popped from the end: row 0 first
        self.version = 0                                      # bumped whenever a row is recycled
        self.min_arena = max_seqs * capacity_for(blocks_per_seq)
        self.arena = np.full(self.min_arena, -1, dtype=np.int32)
        self.used = 0                                         # arena[used:] holds no segment
        self.free_segments: dict = {}                         # capacity -> {start: None}, free
        self.free_ending_at: dict = {}                        # end -> start of a free segment

    def __len__(self) -> int:
        return len(self.seq_len)

    @property
    def nbytes(self) -> int:
        """Host memory of the tables and per-row arrays."""
        return self.arena.nbytes + sum(getattr(self, name).nbytes for name in ROW_ARRAYS)

    # ---------------------------------------------------------------- rows

    def take(self, record) -> int:
        if not self.free_rows:
            self._grow_rows()
        journal = self.journal
        journal.will_pop(self.free_rows)
        row = self.free_rows.pop()
        journal.assign(self.seq, row, record)
        return row

    def recycle(self, row: int) -> None:
        journal = self.journal
        self.set_table(row, [])
        journal.assign(self.seq, row, None)
        journal.assign(self.row_status, row, UNUSED_CODE)
        journal.will_append(self.free_rows)
        self.free_rows.append(row)
        self.version += 1   # never undone: a memo of rows only has to see that rows changed

    def _grow_rows(self) -> None:
        journal, old = self.journal, len(self)
        for name, (dtype, fill) in ROW_ARRAYS.items():
            grown = np.full(2 * old, fill, dtype=dtype)
            grown[:old] = getattr(self, name)
            journal.set(self, name, grown)
        journal.set(self, "seq", self.seq + [None] * old)
        journal.set(self, "free_rows", list(range(2 * old - 1, old - 1, -1)))

    # ---------------------------------------------------------------- tables

    def table(self, row: int) -> list:
        start = int(self.start[row])
        return self.arena[start:start + int(self.num_held[row])].tolist()

    def set_table(self, row: int, table: list) -> None:
        journal = self.journal
        if capacity_for(len(table)) != self.capacity[row]:
            self._free_segment(row)
            self._place(row, capacity_for(len(table)))
        start = int(self.start[row])
        journal.assign(self.arena, slice(start, start + len(table)), table)
        journal.assign(self.num_held, row, len(table))

    def tails(self, rows: np.ndarray) -> np.ndarray:
        """The last block of each row's table (every row holds at least one)."""
        return self.arena[self.start[rows] + self.num_held[rows] - 1].astype(np.int64)

    def set_tails(self, rows: np.ndarray, blocks: np.ndarray) -> None:
        self.journal.assign(self.arena, self.start[rows] + self.num_held[rows] - 1, blocks)

    def push(self, rows: np.ndarray, blocks: np.ndarray) -> None:
        """Append blocks[i] to the table of rows[i] (distinct rows)."""
        journal = self.journal
        held = self.num_held[rows]
        for i in np.flatnonzero(held >= self.capacity[rows]).tolist():
            self._move(int(rows[i]), capacity_for(int(held[i]) + 1))
        journal.assign(self.arena, self.start[rows] + held, blocks)
        journal.assign(self.num_held, rows, held + 1)

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """int32 [len(rows), width] tables, -1 past each row's own blocks."""
        columns = np.arange(width)
        held = columns < self.num_held[rows][:, None]
        return np.where(held, self.arena[np.where(held, self.start[rows][:, None] + columns, 0)], -1) \
            .astype(np.int32, copy=False)

    def blocks_at(self, rows: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Block `index[i]` of the table of rows[i] (each index below that row's blocks held)."""
        return self.arena[self.start[rows] + index].astype(np.int64)

    def device_tables(self, rows: np.ndarray, width: int) -> torch.Tensor:
        """int32 [len(rows), width] tables on the device."""
        return torch.from_numpy(self.gather(rows, width)).to(self.device)

    # ---------------------------------------------------------------- segments

    def _move(self, row: int, capacity: int) -> None:
        """Give a row a segment of `capacity`, its blocks copied there."""
        table = self.table(row)
        self._free_segment(row)
        self._place(row, capacity)
        start = int(self.start[row])
        self.journal.assign(self.arena, slice(start, start + len(table)), table)

    def _place(self, row: int, capacity: int) -> None:
        journal = self.journal
        journal.assign(self.capacity, row, capacity)
        if capacity == 0:
            journal.assign(self.start, row, 0)
            return
        free = self.free_segments.get(capacity)
        if free:
            start = next(iter(free))
            journal.pop(free, start)
            journal.pop(self.free_ending_at, start + capacity)
        else:
            start = self.used
            if start + capacity > len(self.arena):
                self._resize(max(2 * len(self.arena), start + capacity))
            journal.set(self, "used", start + capacity)
        journal.assign(self.start, row, start)

    def _free_segment(self, row: int) -> None:
        journal = self.journal
        start, capacity = int(self.start[row]), int(self.capacity[row])
        if capacity == 0:
            return
        journal.assign(self.arena, slice(start, start + capacity), -1)
        journal.assign(self.capacity, row, 0)
        if start + capacity < self.used:
            journal.put(self.free_segments.setdefault(capacity, {}), start, None)
            journal.put(self.free_ending_at, start + capacity, start)
            return
        used = start   # the segment ends the used part: give it back, with free ones before it
        while used in self.free_ending_at:
            below = journal.pop(self.free_ending_at, used)
            journal.pop(self.free_segments[used - below], below)
            used = below
        journal.set(self, "used", used)
        if self.used <= len(self.arena) // 4 and len(self.arena) > self.min_arena:
            self._resize(max(self.min_arena, 2 * self.used))

    def _resize(self, size: int) -> None:
        arena = np.full(size, -1, dtype=np.int32)
        arena[:self.used] = self.arena[:self.used]
        self.journal.set(self, "arena", arena)

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
        """Broken parts of `table_shape` in the storage: each table inside its own segment, the
        segments of live rows and the free ones disjoint and below `used`, slots past a table -1."""
        owned = np.zeros(self.used, dtype=np.int64)
        problems = []
        live = [row for row, record in enumerate(self.seq) if record is not None]
        spans = [(int(self.start[r]), int(self.capacity[r]), f"row {r}") for r in live if self.capacity[r]]
        spans += [(start, cap, "a free segment") for cap, free in self.free_segments.items() for start in free]
        for start, cap, owner in spans:
            if start + cap > self.used:
                problems.append(f"{owner}'s segment {start}+{cap} is past the used arena ({self.used})")
            else:
                owned[start:start + cap] += 1
        problems += [f"arena slot {i} is in {owned[i]} segments" for i in np.flatnonzero(owned > 1)[:3].tolist()]
        for row in live:
            start, held, cap = int(self.start[row]), int(self.num_held[row]), int(self.capacity[row])
            if held > cap or (held == 0) != (cap == 0):
                problems.append(f"row {row} holds {held} blocks in a segment of {cap}")
            elif (self.arena[start + held:start + cap] != -1).any():
                problems.append(f"row {row} has blocks past its {held} in its segment")
        return problems
