"""The GPU block pool: ref counts, the never-cached free queue (FIFO) and the evictable LRU.

Every block is exactly one of: free (in `free_queue`), evictable (ref count 0, still indexed in the
prefix cache, in `evictable` from least to most recently released) or live (ref count > 0).
Taking, sharing and releasing are O(1) per block: deque ends and OrderedDict moves, no scans.
Every change goes through the manager's journal (`journal.py`), so a failed operation is undone.
"""

from collections import OrderedDict, deque
from itertools import islice

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int, journal, cache=None):
        self.num_blocks = num_blocks
        self.journal = journal
        self.ref_count = np.zeros(num_blocks, dtype=np.int32)
        self.free_queue = deque(range(num_blocks))
        self.evictable: OrderedDict = OrderedDict()   # block -> release stamp, least recent first
        self.cache = cache
        self.evictions = 0
        self.releases = 0                             # release stamps: larger = released later

    def num_free(self) -> int:
        """Blocks an allocation could take now."""
        return len(self.free_queue) + len(self.evictable)

    def take(self, n: int) -> list:
        """`n` new blocks with ref count 1: oldest free first, then evict least recently released.
        The caller has checked that `n <= num_free()`."""
        journal = self.journal
        from_queue = min(n, len(self.free_queue))
        journal.will_popleft(self.free_queue, from_queue)
        blocks = [self.free_queue.popleft() for _ in range(from_queue)]
        if n > from_queue:
            evicted = list(islice(self.evictable.items(), n - from_queue))   # least recent first
            journal.undo.append((self._restore_lru_front, (evicted,)))
            for _ in evicted:
                self.evictable.popitem(last=False)
            victims = [block for block, _ in evicted]
            self.cache.forget(victims)
            journal.set(self, "evictions", self.evictions + len(victims))
            blocks += victims
        journal.assign(self.ref_count, blocks, 1)
        return blocks

    def _restore_lru_front(self, evicted: list) -> None:
        """Undo of evicting `evicted` (block, stamp) from the LRU's front, oldest first."""
        for block, stamp in reversed(evicted):
            if block not in self.evictable:
                self.evictable[block] = stamp
                self.evictable.move_to_end(block, last=False)

    def share(self, blocks: list) -> None:
        """One more reference to each (distinct) block; an evictable one becomes live again."""
        for block in blocks:
            if block in self.evictable:
                self.journal.pop_ordered(self.evictable, block, self.evictable.__getitem__)
        self.journal.save(self.ref_count, blocks)
        self.ref_count[blocks] += 1

    def unshare(self, blocks) -> None:
        """One reference fewer to each block, all of them still held by someone (copy-on-write)."""
        self.journal.save(self.ref_count, blocks)
        np.subtract.at(self.ref_count, blocks, 1)

    def release(self, table) -> None:
        """Drop one reference to each block of a table, tail first, so a prefix's head is evicted
        last. A block nobody holds becomes evictable if indexed, else free (its content wiped)."""
        journal = self.journal
        table = np.asarray(table, dtype=np.int64)
        journal.save(self.ref_count, table)
        self.ref_count[table] -= 1
        dead = table[::-1][self.ref_count[table[::-1]] == 0].tolist()
        if self.cache is None:
            journal.will_append(self.free_queue)
            self.free_queue.extend(dead)
            return
        # Every indexed block keeps its KV for hits (evictable, newest release last); the others
        # hold nothing anyone can find again and are free.
        indexed = [block for block in dead if self.cache.is_indexed(block)]
        journal.will_append(self.free_queue)
        self.free_queue.extend(block for block in dead if not self.cache.is_indexed(block))
        journal.undo.append((self._unrelease, (indexed,)))
        first = self.releases + 1
        self.evictable.update(zip(indexed, range(first, first + len(indexed))))
        journal.set(self, "releases", self.releases + len(indexed))

    def _unrelease(self, indexed: list) -> None:
        for block in indexed:
            self.evictable.pop(block, None)

    def problems(self) -> list:
        """Broken parts of the `conservation` invariant for the GPU pool."""
        homes = np.zeros(self.num_blocks, dtype=np.int64)
        np.add.at(homes, np.fromiter(self.free_queue, np.int64, len(self.free_queue)), 1)
        np.add.at(homes, np.fromiter(self.evictable, np.int64, len(self.evictable)), 1)
        homes += self.ref_count > 0
        problems = [f"gpu block {b} is in {homes[b]} of free/evictable/live"
                    for b in np.flatnonzero(homes != 1).tolist()]
        if self.cache is not None:
            problems += [f"evictable block {b} is not in the prefix index"
                         for b in self.evictable if not self.cache.is_indexed(b)]
        stamps = list(self.evictable.values())
        if stamps != sorted(stamps):
            problems.append("the evictable LRU is out of release order")
        return problems
