"""The contiguous baseline: every request reserves its KV slots up front, in one address range.

This is how KV caches were kept before paging: a request gets `reserve` slots (the engine's
max_seq_len per sequence, times its parallel samples) at consecutive addresses of one linear pool,
chosen first fit. The reservation never grows, so decoding never runs out of room; the price is
paid at admission: slots reserved but not yet (or never) written are internal waste, and the holes
freed requests leave between live ranges are external fragmentation: a request can be refused while
the free total would hold it (`fragmented_refusals` counts those).
"""
from bisect import insort
from dataclasses import dataclass


@dataclass
class Range:
    start: int
    size: int          # reserved slots
    used: int = 0      # slots holding a token's KV

    @property
    def end(self) -> int:
        return self.start + self.size


class ContiguousAllocator:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 slot, got {capacity}")
        self.capacity = capacity
        self.ranges: dict = {}        # owner -> Range
        self._starts: list = []       # (start, owner) by address (starts are distinct), for first fit
        self.refusals = 0
        self.fragmented_refusals = 0

    def admit(self, owner, reserve: int, used: int) -> bool:
        """Reserve `reserve` consecutive slots for `owner`, `used` of them written now (its prompt).
        False (nothing changed) when no free range is long enough."""
        if owner in self.ranges:
            raise KeyError(f"{owner!r} already holds a range")
        if not 0 <= used <= reserve or reserve < 1:
            raise ValueError(f"need 1 <= reserve and 0 <= used <= reserve, got reserve={reserve}, used={used}")
        start = self._first_fit(reserve)
        if start is None:
            self.refusals += 1
            self.fragmented_refusals += self.free_slots >= reserve
            return False
        self.ranges[owner] = Range(start, reserve, used)
        insort(self._starts, (start, owner))
        return True

    def grow(self, owner, tokens: int = 1) -> None:
        """Record `tokens` more written slots; the reservation must already hold them."""
        r = self.ranges[owner]
        if r.used + tokens > r.size:
            raise ValueError(f"{owner!r} would write {r.used + tokens} slots into a range of {r.size}")
        r.used += tokens

    def free(self, owner) -> None:
        r = self.ranges.pop(owner)
        self._starts.remove((r.start, owner))

    def _first_fit(self, size: int):
        cursor = 0
        for start, owner in self._starts:
            if start - cursor >= size:
                return cursor
            cursor = self.ranges[owner].end
        return cursor if self.capacity - cursor >= size else None

    def holes(self) -> list:
        """Sizes of the free ranges, in address order."""
        sizes, cursor = [], 0
        for start, owner in self._starts:
            sizes.append(start - cursor)
            cursor = self.ranges[owner].end
        sizes.append(self.capacity - cursor)
        return [s for s in sizes if s]

    @property
    def reserved_slots(self) -> int:
        return sum(r.size for r in self.ranges.values())

    @property
    def used_slots(self) -> int:
        return sum(r.used for r in self.ranges.values())

    @property
    def free_slots(self) -> int:
        return self.capacity - self.reserved_slots

    @property
    def largest_hole(self) -> int:
        return max(self.holes(), default=0)
