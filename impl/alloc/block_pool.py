"""The GPU block pool: ref counts, the never-cached free queue (FIFO) and the evictable LRU.

Every block is exactly one of: free (in the free queue), evictable (ref count 0, still indexed in
the prefix cache, in `evictable` from least to most recently released) or live (ref count > 0).
The free queue is a ring of block ids (`ring`, read from `head`, `queued` long, wrapping), so an
allocation takes its blocks as one slice and a release appends a table in one write (two where
the ring wraps, never index arrays): no Python work per block. Sharing and releasing to the LRU are OrderedDict moves, no scans.
Every change goes through the manager's journal (`journal.py`), one undo record per call, so a
failed operation is undone.
"""

from collections import OrderedDict, deque
from itertools import islice
from operator import itemgetter

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int, journal, cache=None):
        self.num_blocks = num_blocks
        self.journal = journal
        self.ref_count = np.zeros(num_blocks, dtype=np.int32)
        self._ones = np.ones(num_blocks, dtype=np.int32).tobytes()   # ref counts of a table held once
        self.ring = np.arange(num_blocks, dtype=np.int64)   # the free queue: ring[head], ... (wrapping)
        self.head = 0
        self.queued = num_blocks
        self.evictable: OrderedDict = OrderedDict()   # block -> release stamp, least recent first
        self.cache = cache
        self.evictions = 0
        self.releases = 0                             # release stamps: larger = released later

    @property
    def free_queue(self) -> list:
        """The never-cached free blocks, oldest first (a copy)."""
        return self._ring_read(self.head, self.queued).tolist()

    def num_free(self) -> int:
        """Blocks an allocation could take now."""
        return self.queued + len(self.evictable)

    def _ring_read(self, start: int, count: int) -> np.ndarray:
        """A copy of ring positions start, start + 1, ... (`count` of them, wrapping): one slice,
        or two where they wrap (no index arrays)."""
        end = start + count
        if end <= self.num_blocks:
            return self.ring[start:end].copy()
        return np.concatenate((self.ring[start:], self.ring[:end - self.num_blocks]))

    def _ring_write(self, start: int, values: np.ndarray) -> None:
        """`values` into ring positions start, start + 1, ... (wrapping)."""
        end = start + len(values)
        if end <= self.num_blocks:
            self.ring[start:end] = values
        else:
            split = self.num_blocks - start
            self.ring[start:] = values[:split]
            self.ring[:end - self.num_blocks] = values[split:]

    def take(self, n: int) -> np.ndarray:
        """`n` new blocks with ref count 1 (int64): oldest free first, then evict least recently
        released. The caller has checked that `n <= num_free()`."""
        journal = self.journal
        from_queue = min(n, self.queued)
        blocks = self._ring_read(self.head, from_queue)
        if n > from_queue:
            victims = list(islice(self.evictable, n - from_queue))   # least recently released first
            stamps = []   # their release stamps, for the undo, as they leave
            journal.undo.append((self._restore_lru_front, (victims, stamps)))
            if len(victims) == len(self.evictable):
                stamps.extend(self.evictable.values())
                self.evictable.clear()
            else:
                stamps.extend(map(self.evictable.pop, victims))   # pop each, in C
            victims = np.fromiter(victims, np.int64, len(victims))
            self.cache.forget(victims)
            journal.set(self, "evictions", self.evictions + len(victims))
            blocks = np.concatenate([blocks, victims])
        # Free and evictable blocks all have ref count 0: the undo sets it back.
        journal.undo.append((self._untake, (blocks, self.head, self.queued)))
        self.head = (self.head + from_queue) % self.num_blocks
        self.queued -= from_queue
        self.ref_count[blocks] = 1
        return blocks

    def _untake(self, blocks: np.ndarray, head: int, queued: int) -> None:
        self.ref_count[blocks] = 0
        self.head, self.queued = head, queued

    def _restore_lru_front(self, victims: list, stamps: list) -> None:
        """Undo of evicting `victims` from the LRU's front, oldest first (those whose stamps were
        read: all, once the eviction ran)."""
        for block, stamp in reversed(list(zip(victims, stamps))):
            if block not in self.evictable:
                self.evictable[block] = stamp
                self.evictable.move_to_end(block, last=False)

    def share(self, blocks) -> None:
        """One more reference to each (distinct) block; an evictable one (nobody holds it: ref count
        0) becomes live again. One undo record for the LRU entries, one for the ref counts."""
        journal = self.journal
        refs = self.ref_count[blocks]
        revived = np.asarray(blocks, dtype=np.int64)[refs == 0].tolist()
        if revived:
            entries = list(zip(revived, map(self.evictable.__getitem__, revived)))
            journal.undo.append((self._restore_lru, (entries,)))
            deque(map(self.evictable.pop, revived), maxlen=0)
        journal.undo.append((self.ref_count.__setitem__, (blocks, refs)))
        self.ref_count[blocks] = refs + 1

    def _restore_lru(self, entries: list) -> None:
        """Undo of taking (block, stamp) entries out of the LRU: put back those not there, in
        release-stamp order (the LRU's order, see `problems`). O(evictable): the failure path."""
        missing = [(block, stamp) for block, stamp in entries if block not in self.evictable]
        if missing:
            ordered = sorted([*self.evictable.items(), *missing], key=itemgetter(1))
            self.evictable.clear()
            self.evictable.update(ordered)

    def unshare(self, blocks) -> None:
        """One reference fewer to each block, all of them still held by someone (copy-on-write)."""
        self.journal.save(self.ref_count, blocks)
        np.subtract.at(self.ref_count, blocks, 1)

    def release(self, table) -> None:
        """Drop one reference to each block of a table (an int array), tail first, so a prefix's head is evicted
        last. A block nobody holds becomes evictable if indexed, else free (its content then garbage: a free block holds no KV)."""
        journal = self.journal
        tail_first = table[::-1].astype(np.int64)   # a copy: the table's own storage changes next
        old = self.ref_count[tail_first]
        if old.tobytes() == self._ones[:4 * len(old)]:   # held once each (no fork, no hit): all die
            left, dead = 0, tail_first
        else:
            left = old - 1
            dead = tail_first[left == 0]
        if self.cache is None:
            free = dead
        else:
            # Every indexed block keeps its KV for hits (evictable, newest release last); the others
            # hold nothing anyone can find again and are free.
            cached = self.cache.indexed(dead)
            if np.count_nonzero(cached) == len(dead):   # a prompt's full blocks: all indexed
                free, indexed = dead[:0], dead.tolist()
            else:
                free, indexed = dead[~cached], dead[cached].tolist()
            journal.undo.append((self._unrelease, (indexed,)))
            first = self.releases + 1
            self.evictable.update(zip(indexed, range(first, first + len(indexed))))
            journal.set(self, "releases", self.releases + len(indexed))
        end = (self.head + self.queued) % self.num_blocks
        journal.undo.append((self._unrelease_refs, (tail_first, old, end, self._ring_read(end, len(free)), self.queued)))
        self.ref_count[tail_first] = left
        self._ring_write(end, free)
        self.queued += len(free)

    def _unrelease_refs(self, table: np.ndarray, old: np.ndarray, end: int, overwritten: np.ndarray, queued: int) -> None:
        self.ref_count[table] = old
        self._ring_write(end, overwritten)   # a transaction's older step may need these slots again
        self.queued = queued

    def _unrelease(self, indexed: list) -> None:
        for block in indexed:
            self.evictable.pop(block, None)

    def problems(self) -> list:
        """Broken parts of the `conservation` invariant for the GPU pool."""
        free = np.array(self.free_queue, dtype=np.int64)
        ids = np.concatenate([free, np.fromiter(self.evictable, np.int64, len(self.evictable))])
        inside = (ids >= 0) & (ids < self.num_blocks)
        problems = [f"gpu block id {b} outside the pool is free or evictable" for b in np.unique(ids[~inside]).tolist()]
        homes = np.bincount(ids[inside], minlength=self.num_blocks) + (self.ref_count > 0)
        problems += [f"gpu block {b} is in {homes[b]} of free/evictable/live"
                     for b in np.flatnonzero(homes != 1).tolist()]
        if self.cache is not None:
            problems += [f"evictable block {b} is not in the prefix index"
                         for b in self.evictable if 0 <= b < self.num_blocks and not self.cache.is_indexed(b)]
            # A free block is handed out and overwritten next: an index entry would serve its old prefix.
            free = free[(free >= 0) & (free < self.num_blocks)]
            problems += [f"free block {b} is in the prefix index" for b in free[self.cache.indexed(free)].tolist()]
        stamps = list(self.evictable.values())
        if stamps != sorted(stamps):
            problems.append("the evictable LRU is out of release order")
        return problems
