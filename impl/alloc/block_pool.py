"""The GPU block pool: ref counts, the never-cached free queue (FIFO) and the evictable LRU.

Every block is exactly one of: free (in the free queue), evictable (ref count 0, still indexed in
the prefix cache, in `evictable` from least to most recently released) or live (ref count > 0).
The free queue is a ring of block ids (`ring`, read from `head`, `queued` long, wrapping), so an
allocation takes its blocks as one slice and a release appends a table in a few slice writes
(never index arrays): no Python work per block. The ring is stored twice, end to end (ring[p] ==
ring[p + num_blocks]), so any run of positions from one below num_blocks is one slice to read,
even where it wraps; each write goes to both copies.

The evictable LRU is arrays too: `stamp[b]`, block b's release stamp while it is evictable (0
otherwise), and a log of (block, stamp) entries in release order (`lru_block`, `lru_stamp`, from
`lru_head` to `lru_tail`). An entry is current while its block still has its stamp; reviving a
block (a cache hit) zeroes its stamp, leaving its entry stale, never to match again (stamps only
grow). So a release appends its blocks in one write, a hit revives its blocks in one write, and an
eviction takes the first current entries from the head, passing the stale ones for good. A full
log is rebuilt from its current entries into fresh arrays of twice their number (amortized O(1)
per release; the undo puts the old arrays back).
Every change goes through the manager's journal (`journal.py`), one undo record per change, so a
failed operation is undone.
"""

import numpy as np

MIN_LOG = 64   # the smallest LRU log, in entries


class BlockPool:
    def __init__(self, num_blocks: int, journal, cache=None):
        self.num_blocks = num_blocks
        self.journal = journal
        self.ref_count = np.zeros(num_blocks, dtype=np.int32)
        self._ones = np.ones(num_blocks, dtype=np.int32).tobytes()   # ref counts of a table held once
        self.ring = np.tile(np.arange(num_blocks, dtype=np.int64), 2)   # the free queue, twice: ring[head], ...
        self.head = 0
        self.queued = num_blocks
        self.stamp = np.zeros(num_blocks, dtype=np.int64)      # release stamp while evictable, else 0
        self.lru_block = np.zeros(MIN_LOG, dtype=np.int64)     # the LRU log: releases, oldest first
        self.lru_stamp = np.zeros(MIN_LOG, dtype=np.int64)
        self.lru_head = self.lru_tail = 0
        self.num_evictable = 0
        self.cache = cache
        self.evictions = 0
        self.releases = 0                             # release stamps: larger = released later

    @property
    def free_queue(self) -> list:
        """The never-cached free blocks, oldest first (a copy)."""
        return self.ring[self.head:self.head + self.queued].tolist()

    @property
    def evictable(self) -> list:
        """The evictable blocks, least recently released first (a copy)."""
        return self._lru_current(self.lru_head, self.lru_tail)[0].tolist()

    def _lru_current(self, start: int, stop: int):
        """The current entries among log positions start..stop-1: their blocks and stamps, and
        their positions."""
        blocks, stamps = self.lru_block[start:stop], self.lru_stamp[start:stop]
        current = (self.stamp[blocks] == stamps).nonzero()[0]
        return blocks[current], stamps[current], current + start

    def num_free(self) -> int:
        """Blocks an allocation could take now."""
        return self.queued + self.num_evictable

    def _ring_write(self, start: int, values: np.ndarray) -> None:
        """`values` into ring positions start, start + 1, ... (wrapping; start < num_blocks), in
        both copies."""
        ring, n, end = self.ring, self.num_blocks, start + len(values)
        ring[start:end] = values
        if end <= n:
            ring[start + n:end + n] = values
        else:   # positions past the first copy: their other copy is at the front
            ring[start + n:] = values[:n - start]
            ring[:end - n] = values[n - start:]

    def take(self, n: int) -> np.ndarray:
        """`n` new blocks with ref count 1 (int64): oldest free first, then evict least recently
        released. The caller has checked that `n <= num_free()`."""
        journal = self.journal
        from_queue = min(n, self.queued)
        blocks = self.ring[self.head:self.head + from_queue].copy()
        if n > from_queue:
            victims = self._evict(n - from_queue)
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

    def _evict(self, n: int) -> np.ndarray:
        """Take the `n` least recently released evictable blocks out of the LRU (n <= num_evictable):
        the first current entries from the head, read a window at a time, each twice the last
        (from twice `n`), so a run of stale entries costs a few windows, not a pass per entry."""
        start, blocks, stamps = self.lru_head, [], []
        missing, width = n, max(2 * n, 8)
        while missing:
            if start >= self.lru_tail:   # a broken count: fail (and be undone), never spin
                raise RuntimeError(f"the LRU holds fewer than the {self.num_evictable} evictable blocks it counts")
            stop = min(start + width, self.lru_tail)
            width *= 2
            found, found_stamps, positions = self._lru_current(start, stop)
            found, found_stamps = found[:missing], found_stamps[:missing]
            blocks.append(found)
            stamps.append(found_stamps)
            missing -= len(found)
            start = stop if missing else int(positions[len(found) - 1]) + 1
        victims = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        self.journal.undo.append((self._unevict, (victims, np.concatenate(stamps) if len(stamps) > 1 else stamps[0],
                                                  self.lru_head, self.num_evictable)))
        self.stamp[victims] = 0
        self.lru_head = start
        self.num_evictable -= n
        return victims

    def _unevict(self, victims: np.ndarray, stamps: np.ndarray, head: int, num_evictable: int) -> None:
        self.stamp[victims] = stamps
        self.lru_head, self.num_evictable = head, num_evictable

    def share(self, blocks) -> None:
        """One more reference to each (distinct) block; an evictable one (nobody holds it: ref count
        0) becomes live again. One undo record for the LRU entries, one for the ref counts."""
        journal = self.journal
        refs = self.ref_count[blocks]
        revived = np.asarray(blocks, dtype=np.int64)[refs == 0]
        if len(revived):   # their log entries go stale
            journal.undo.append((self._unrevive, (revived, self.stamp[revived], self.num_evictable)))
            self.stamp[revived] = 0
            self.num_evictable -= len(revived)
        journal.undo.append((self.ref_count.__setitem__, (blocks, refs)))
        self.ref_count[blocks] = refs + 1

    def _unrevive(self, revived: np.ndarray, stamps: np.ndarray, num_evictable: int) -> None:
        self.stamp[revived] = stamps
        self.num_evictable = num_evictable

    def unshare(self, blocks) -> None:
        """One reference fewer to each block, all of them still held by someone (copy-on-write)."""
        self.journal.save(self.ref_count, blocks)
        np.subtract.at(self.ref_count, blocks, 1)

    def release(self, table) -> None:
        """Drop one reference to each block of a table (an int array), tail first, so a prefix's
        head is evicted last. A block nobody holds becomes evictable if indexed, else free (its
        content then garbage: a free block holds no KV)."""
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
                free, indexed = dead[:0], dead
            else:
                free, indexed = dead[~cached], dead[cached]
            if len(indexed):
                self._file_evictable(indexed)
        end = (self.head + self.queued) % self.num_blocks
        overwritten = self.ring[end:end + len(free)].copy()
        journal.undo.append((self._unrelease_refs, (tail_first, old, end, overwritten, self.queued)))
        self.ref_count[tail_first] = left
        self._ring_write(end, free)
        self.queued += len(free)

    def _unrelease_refs(self, table: np.ndarray, old: np.ndarray, end: int, overwritten: np.ndarray,
                        queued: int) -> None:
        self.ref_count[table] = old
        self._ring_write(end, overwritten)   # a transaction's older step may need these slots again
        self.queued = queued

    def _file_evictable(self, blocks: np.ndarray) -> None:
        """Append these blocks (none evictable now) to the LRU, in this order, stamped as released now."""
        n, tail = len(blocks), self.lru_tail
        if tail + n > len(self.lru_block):
            self._rebuild_log(n)
            tail = self.lru_tail
        stamps = np.arange(self.releases + 1, self.releases + 1 + n, dtype=np.int64)
        self.journal.undo.append((self._unfile, (blocks, tail, self.num_evictable, self.releases)))
        self.lru_block[tail:tail + n] = blocks
        self.lru_stamp[tail:tail + n] = stamps
        self.stamp[blocks] = stamps
        self.lru_tail = tail + n
        self.num_evictable += n
        self.releases += n

    def _unfile(self, blocks: np.ndarray, tail: int, num_evictable: int, releases: int) -> None:
        self.stamp[blocks] = 0   # (log entries past the tail are never read)
        self.lru_tail, self.num_evictable, self.releases = tail, num_evictable, releases

    def _rebuild_log(self, room: int) -> None:
        """Fresh log arrays holding the current entries, in order, and room for twice that plus
        `room` (the old arrays are kept unchanged for the undo)."""
        blocks, stamps, _ = self._lru_current(self.lru_head, self.lru_tail)
        self.journal.undo.append((self._restore_log, (self.lru_block, self.lru_stamp, self.lru_head, self.lru_tail)))
        size = max(MIN_LOG, 2 * (len(blocks) + room))
        self.lru_block, self.lru_stamp = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
        self.lru_block[:len(blocks)], self.lru_stamp[:len(blocks)] = blocks, stamps
        self.lru_head, self.lru_tail = 0, len(blocks)

    def _restore_log(self, blocks: np.ndarray, stamps: np.ndarray, head: int, tail: int) -> None:
        self.lru_block, self.lru_stamp, self.lru_head, self.lru_tail = blocks, stamps, head, tail

    def problems(self) -> list:
        """Broken parts of the `conservation` invariant for the GPU pool."""
        free = np.array(self.free_queue, dtype=np.int64)
        # The log's current entries; one naming a block outside the pool is reported as such (it
        # has no stamp to go stale by).
        logged, logged_stamps = self.lru_block[self.lru_head:self.lru_tail], self.lru_stamp[self.lru_head:self.lru_tail]
        current = (logged < 0) | (logged >= self.num_blocks)
        current[~current] = self.stamp[logged[~current]] == logged_stamps[~current]
        evictable, stamps = logged[current], logged_stamps[current]
        ids = np.concatenate([free, evictable])
        inside = (ids >= 0) & (ids < self.num_blocks)
        problems = [f"gpu block id {b} outside the pool is free or evictable" for b in np.unique(ids[~inside]).tolist()]
        if not np.array_equal(self.ring[:self.num_blocks], self.ring[self.num_blocks:]):
            problems.append("the free queue's two copies differ")   # a take would read the wrong one
        homes = np.bincount(ids[inside], minlength=self.num_blocks) + (self.ref_count > 0)
        problems += [f"gpu block {b} is in {homes[b]} of free/evictable/live"
                     for b in np.flatnonzero(homes != 1).tolist()]
        if self.cache is not None:
            problems += [f"evictable block {b} is not in the prefix index"
                         for b in evictable.tolist() if 0 <= b < self.num_blocks and not self.cache.is_indexed(b)]
            # A free block is handed out and overwritten next: an index entry would serve its old prefix.
            free = free[(free >= 0) & (free < self.num_blocks)]
            problems += [f"free block {b} is in the prefix index" for b in free[self.cache.indexed(free)].tolist()]
        if np.count_nonzero(stamps[1:] <= stamps[:-1]):
            problems.append("the evictable LRU is out of release order")
        if self.num_evictable != len(evictable):   # what allocations count on
            problems.append(f"the pool counts {self.num_evictable} evictable blocks, its LRU holds {len(evictable)}")
        top = int(self.stamp.max())
        if top > self.releases:   # the next release would stamp an old entry current again
            problems.append(f"a release stamp ({top}) is past the release count ({self.releases})")
        return problems
