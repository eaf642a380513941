"""A bug zoo: a small correct block manager and broken variants, each one bug real engines shipped.

`Reference` is shaped like a production block pool (refcounts, a FIFO free queue, an LRU of released
cached blocks, a chained-hash prefix index whose hits are confirmed against the block's own tokens and
that keeps every full block, several under one hash, serving the lowest-numbered: the spec's choices).
Each bug is a subclass that overrides one method. Every class is a conformance-protocol factory, so
`pagedkv fuzz bug_zoo:CowInPlace` works with this directory on the path. `SingleFreeList` is not a bug:
a correct manager with other free choices than the spec's, which passes policy `any` only.
"""

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from pagedkv.spec import DuplicateSequence, OutOfBlocks, UnknownSequence, blocks_needed


def chain_hash(parent_hash: int, block_tokens: tuple) -> int:
    """A production-style chained block hash. The first block chains to 0, not None: hash(None)
    varies between processes before Python 3.12, and the zoo must behave alike on every worker."""
    return hash((parent_hash, block_tokens))


@dataclass
class Seq:
    tokens: list
    table: list


class Reference:
    """Correct: passes the conformance harness under both policies. Capabilities: fork and prefix
    caching with a complete cache (no swap)."""

    capabilities = frozenset({"fork", "prefix_caching", "complete_cache"})

    def __init__(self, num_blocks, block_size, *, prefix_caching=False, num_cpu_blocks=0):
        self.B, self.prefix_caching = block_size, prefix_caching
        self.refs = Counter()
        self.free_queue = deque(range(num_blocks))
        self.evictable = OrderedDict()  # released cached blocks, least recently released first
        self.index, self.block_hash, self.block_tokens = {}, {}, {}  # hash -> blocks, block -> hash / tokens
        self.seqs = {}

    # ------------------------------------------------------------------ protocol

    def add(self, seq_id, tokens):
        if seq_id in self.seqs:
            raise DuplicateSequence(seq_id)
        hits = self._hits(tokens)
        seq = Seq(list(tokens), self._allocate(hits, blocks_needed(len(tokens), self.B) - len(hits)))
        self.seqs[seq_id] = seq
        for j in range(len(hits), len(tokens) // self.B):
            self._register(seq, j)
        return len(hits) * self.B

    def append(self, seq_id, token):
        seq, copies = self._get(seq_id), []
        if self._tail_full(seq):
            self._require(1)
            seq.table.append(self._take())
        elif self._tail_shared(seq):
            self._require(1)
            copies.append(self._copy_on_write(seq))
        seq.tokens.append(token)
        if len(seq.tokens) % self.B == 0:
            self._register(seq, len(seq.tokens) // self.B - 1)
        return copies

    def fork(self, parent_id, child_id):
        parent = self._get(parent_id)
        if child_id in self.seqs:
            raise DuplicateSequence(child_id)
        self._share_all(parent.table)
        self.seqs[child_id] = Seq(list(parent.tokens), list(parent.table))

    def free(self, seq_id):
        self._release(self._get(seq_id).table)
        self._forget(seq_id)

    def block_table(self, seq_id):
        return list(self._get(seq_id).table)

    def num_free_blocks(self):
        return len(self.free_queue) + len(self.evictable)

    # ------------------------------------------------------------------ internals

    def _get(self, seq_id):
        if seq_id not in self.seqs:
            raise UnknownSequence(seq_id)
        return self.seqs[seq_id]

    def _forget(self, seq_id):
        del self.seqs[seq_id]

    def _require(self, needed):
        if needed > self.num_free_blocks():
            raise OutOfBlocks(needed, self.num_free_blocks())

    def _tail_full(self, seq):
        return len(seq.tokens) >= len(seq.table) * self.B

    def _tail_shared(self, seq):
        return self.refs[seq.table[-1]] > 1

    def _allocate(self, hits, needed):
        available = self.num_free_blocks() - sum(block in self.evictable for block in hits)
        if needed > available:
            raise OutOfBlocks(needed, available)
        return [self._share(block) for block in hits] + [self._take() for _ in range(needed)]

    def _share(self, block):
        self.evictable.pop(block, None)
        self.refs[block] += 1
        return block

    def _share_all(self, table):
        for block in table:
            self._share(block)

    def _take(self):
        block = self.free_queue.popleft() if self.free_queue else self._evict()
        self.refs[block] = 1
        return block

    def _evict(self):
        block, _ = self.evictable.popitem(last=False)
        self._unregister(block)
        return block

    def _unregister(self, block):
        h = self.block_hash.pop(block)
        self.index[h].discard(block)
        if not self.index[h]:
            del self.index[h]
        del self.block_tokens[block]

    def _copy_on_write(self, seq):
        src, dst = seq.table[-1], self._take()
        self.refs[src] -= 1
        seq.table[-1] = dst
        return (src, dst)

    def _release(self, table):
        for block in reversed(table):
            self._drop(block)

    def _drop(self, block):
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self.block_hash:
                self.evictable[block] = None
            else:
                self.free_queue.append(block)

    def _hash(self, parent, block_tokens):
        return chain_hash(parent, block_tokens)

    def _hashes(self, tokens, count):
        hashes, parent = [], 0
        for j in range(count):
            parent = self._hash(parent, tuple(tokens[j * self.B:(j + 1) * self.B]))
            hashes.append(parent)
        return hashes

    def _hits(self, tokens):
        """Indexed blocks for the prompt's leading full blocks (never its last token)."""
        if not self.prefix_caching:
            return []
        hits = []
        for j, h in enumerate(self._hashes(tokens, (len(tokens) - 1) // self.B)):
            confirmed = [block for block in self.index.get(h, ()) if self._confirmed(block, tokens, j)]
            if not confirmed:
                break
            hits.append(min(confirmed))
        return hits

    def _confirmed(self, block, tokens, j):
        return self.block_tokens[block] == tuple(tokens[j * self.B:(j + 1) * self.B])

    def _register(self, seq, j):
        """Index full block j (beside equal blocks) unless it already is; skip blocks the table lacks."""
        if not self.prefix_caching or j >= len(seq.table):
            return
        block, h = seq.table[j], self._hashes(seq.tokens, j + 1)[-1]
        if block not in self.block_hash:
            self.index.setdefault(h, set()).add(block)
            self.block_hash[block] = h
            self.block_tokens[block] = tuple(seq.tokens[j * self.B:(j + 1) * self.B])


# ---------------------------------------------------------------------- the zoo: one bug each

class CowInPlace(Reference):
    """Copy-on-write that writes in place: the shared tail is never copied."""

    def _tail_shared(self, seq):
        return False


class CowLeaksSource(Reference):
    """Copy-on-write that leaks its source: the source block's refcount is not decremented."""

    def _copy_on_write(self, seq):
        src, dst = seq.table[-1], self._take()
        seq.table[-1] = dst
        return (src, dst)


class FreeStillShared(Reference):
    """Free of a block still shared: releasing ignores the other holders' references."""

    def _drop(self, block):
        self.refs[block] = 1
        super()._drop(block)


class ForkNoRefcount(Reference):
    """Fork without refcount increments: the child shares blocks the pool thinks are exclusive."""

    def _share_all(self, table):
        pass


class EvictedStillIndexed(Reference):
    """An evicted block is left in the hash index: a later hit serves whatever overwrote it."""

    def _evict(self):
        block, _ = self.evictable.popitem(last=False)
        return block


class HashNotChained(Reference):
    """Block hashes not chained to their parent: equal blocks after different prefixes collide."""

    def _hash(self, parent, block_tokens):
        return chain_hash(0, block_tokens)


class UnconfirmedWeakHash(Reference):
    """A prefix hit not confirmed against collisions, under a weak (2-bit) hash."""

    def _hash(self, parent, block_tokens):
        return chain_hash(parent, block_tokens) % 4

    def _confirmed(self, block, tokens, j):
        return True


class AllocationNotUndone(Reference):
    """Allocation that is not undone when it fails half-way: blocks taken before the failure leak."""

    def _allocate(self, hits, needed):
        table = [self._share(block) for block in hits]
        for _ in range(needed):
            self._require(1)
            table.append(self._take())
        return table


class DoubleFreeAccepted(Reference):
    """A double free accepted: free() keeps the sequence, so freeing it again releases it again."""

    def _forget(self, seq_id):
        pass


class NewBlockLate(Reference):
    """A new block taken one token late: the token that fills the tail's last slot + 1 has no block."""

    def _tail_full(self, seq):
        return len(seq.tokens) > len(seq.table) * self.B


class NewBlockEarly(Reference):
    """A new block taken one token early: a block is added while the tail still has a free slot."""

    def _tail_full(self, seq):
        return len(seq.tokens) + 1 >= len(seq.table) * self.B


class TailFreedTwice(Reference):
    """The same block freed twice in one release: the tail is dropped in the loop and again after it."""

    def _release(self, table):
        super()._release(table)
        self._drop(table[-1])


class BlockIdsFromOne(Reference):
    """Block ids numbered 1..num_blocks (a reserved null block 0 ported without the pool shrinking)."""

    def __init__(self, num_blocks, block_size, **options):
        super().__init__(num_blocks, block_size, **options)
        self.free_queue = deque(range(1, num_blocks + 1))



class ForgetsReleased(Reference):
    """A cache that silently forgets: a released block leaves the index at once (no hit across requests)."""

    def _drop(self, block):
        if self.refs[block] == 1 and block in self.block_hash:
            self._unregister(block)
        super()._drop(block)


# ---------------------------------------------------------------------- correct, other free choices

class SingleFreeList(Reference):
    """Correct, with one FIFO free list for cached and never-cached blocks alike (issue 13, item 2):
    a released block joins the back of the list still indexed, and taking the front block evicts it
    when it is cached, even while a never-cached block waits behind it. Hits take their block out."""

    def __init__(self, num_blocks, block_size, **options):
        super().__init__(num_blocks, block_size, **options)
        self.free_list = deque(range(num_blocks))
        del self.free_queue, self.evictable

    def num_free_blocks(self):
        return len(self.free_list)

    def _allocate(self, hits, needed):
        available = len(self.free_list) - sum(block in self.free_list for block in hits)
        if needed > available:
            raise OutOfBlocks(needed, available)
        return [self._share(block) for block in hits] + [self._take() for _ in range(needed)]

    def _share(self, block):
        if self.refs[block] == 0:
            self.free_list.remove(block)
        self.refs[block] += 1
        return block

    def _take(self):
        block = self.free_list.popleft()
        if block in self.block_hash:
            self._unregister(block)
        self.refs[block] = 1
        return block

    def _drop(self, block):
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free_list.append(block)
