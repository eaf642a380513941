"""Row storage of the block tables: one preallocated numpy row per live sequence.

Each sequence owns a row of an int32 table array (`-1` past its blocks) and one entry of each
per-row array (length, blocks held, admission stamp, status), so a whole batch is read or written
with a handful of numpy operations. The tensor kernels read is the host array itself on CPU; on
any other device it is a copy synced row by row (only rows written since the last sync travel).
"""

import numpy as np
import torch

from pagedkv.spec import RUNNING, SWAPPED, WAITING

RUNNING_CODE, WAITING_CODE, SWAPPED_CODE, UNUSED_CODE = range(4)   # row_status values
STATUSES = (RUNNING, WAITING, SWAPPED)                             # row_status value -> spec status


class RowTables:
    def __init__(self, max_seqs: int, width: int, device: torch.device):
        self.device = device
        self.tables = np.full((max_seqs, width), -1, dtype=np.int32)
        self.seq_len = np.zeros(max_seqs, dtype=np.int64)
        self.num_held = np.zeros(max_seqs, dtype=np.int64)
        self.admitted = np.zeros(max_seqs, dtype=np.int64)   # admission stamp: larger = later
        self.row_status = np.full(max_seqs, UNUSED_CODE, dtype=np.int8)
        self.seq = [None] * max_seqs                          # row -> its sequence's record
        self.free_rows = list(range(max_seqs - 1, -1, -1))    # popped from the end: row 0 first
        self.version = 0                                      # bumped whenever a row is recycled
        self._new_device_tensor()

    @property
    def shares_host_memory(self) -> bool:
        """On CPU the table tensor is the host array itself; elsewhere a copy synced row by row."""
        return self.device.type == "cpu"

    def __len__(self) -> int:
        return len(self.seq_len)

    # ---------------------------------------------------------------- rows

    def take(self, record) -> int:
        if not self.free_rows:
            self._grow_rows()
        row = self.free_rows.pop()
        self.seq[row] = record
        return row

    def recycle(self, row: int) -> None:
        self.set_table(row, [])
        self.seq[row] = None
        self.row_status[row] = UNUSED_CODE
        self.free_rows.append(row)
        self.version += 1

    def _grow_rows(self) -> None:
        old = len(self)
        for name in ("tables", "seq_len", "num_held", "admitted", "row_status"):
            array = getattr(self, name)
            fill = {"tables": -1, "row_status": UNUSED_CODE}.get(name, 0)
            grown = np.full((2 * old, *array.shape[1:]), fill, dtype=array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self.seq += [None] * old
        self.free_rows = list(range(2 * old - 1, old - 1, -1))
        self._new_device_tensor()

    # ---------------------------------------------------------------- tables

    def table(self, row: int) -> list:
        return self.tables[row, :self.num_held[row]].tolist()

    def set_table(self, row: int, table: list) -> None:
        self.ensure_width(len(table))
        self.tables[row, :self.num_held[row]] = -1
        self.tables[row, :len(table)] = table
        self.num_held[row] = len(table)
        self.dirty[row] = True

    def ensure_width(self, width: int) -> None:
        if width > self.tables.shape[1]:
            old = self.tables
            self.tables = np.full((old.shape[0], max(width, 2 * old.shape[1])), -1, dtype=np.int32)
            self.tables[:, :old.shape[1]] = old
            self._new_device_tensor()

    def device_tables(self, rows: np.ndarray, width: int) -> torch.Tensor:
        """int32 [len(rows), width] tables on the device."""
        if self.shares_host_memory:
            return torch.from_numpy(self.tables[rows, :width])
        self._sync()
        return self.device_tensor[torch.from_numpy(rows).to(self.device), :width]

    def _new_device_tensor(self) -> None:
        # A new tensor holds nothing yet: every row must travel at the next sync.
        self.dirty = np.ones(len(self), dtype=bool)
        self.device_tensor = (torch.from_numpy(self.tables) if self.shares_host_memory
                              else torch.empty(self.tables.shape, dtype=torch.int32, device=self.device))

    def _sync(self) -> None:
        dirty = np.flatnonzero(self.dirty)
        if len(dirty):
            index = torch.from_numpy(dirty).to(self.device)
            self.device_tensor[index] = torch.from_numpy(self.tables[dirty]).to(self.device)
            self.dirty[dirty] = False

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
