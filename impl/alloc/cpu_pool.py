"""The CPU swap pool: blocks a swapped-out sequence's KV is copied to, FIFO like the spec's."""

from collections import deque

import numpy as np


class CpuPool:
    def __init__(self, num_blocks: int, block_size: int, journal):
        self.num_blocks = num_blocks
        self.journal = journal
        self.free_queue = deque(range(num_blocks))
        self.block_tokens = np.zeros((num_blocks, block_size), dtype=np.int64)

    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self, n: int) -> list:
        """`n` CPU blocks, oldest free first. The caller has checked `n <= num_free()`."""
        self.journal.will_popleft(self.free_queue, n)
        return [self.free_queue.popleft() for _ in range(n)]

    def release(self, blocks: list) -> None:
        if not blocks:
            return
        self.journal.will_append(self.free_queue)
        self.free_queue.extend(blocks)

    def problems(self, held: list) -> list:
        """Broken parts of `conservation` for the CPU pool: each block free or held, exactly once,
        and no id outside the pool free or held."""
        ids = np.array(list(self.free_queue) + list(held), dtype=np.int64)
        inside = (ids >= 0) & (ids < self.num_blocks)
        homes = np.bincount(ids[inside], minlength=self.num_blocks)
        return [f"cpu block {b} is in {homes[b]} of free/held" for b in np.flatnonzero(homes != 1).tolist()] + \
            [f"cpu block id {b} outside the pool is free or held" for b in np.unique(ids[~inside]).tolist()]
