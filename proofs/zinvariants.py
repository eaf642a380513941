"""The spec's named invariants (`pagedkv/spec/invariants.py`) over an encoded `State`, and the
strengthening lemmas the induction needs on top of them.

Each function returns one Z3 Bool. `NAMED` mirrors the spec's `INVARIANTS`; `STRENGTHENING` holds
facts that are true of every reachable spec state but are not among the named invariants:

- `well_formed`: lengths, ids and statuses are in range (the spec gets this from Python's types);
- `admission_order`: live sequences have distinct `admitted` stamps, none above the admission count (so `step`'s
  "latest admitted" and "admission order" are total orders, as the spec's dict order never matters);
- `hashed_blocks_full`: a cached block at index j of a table lies wholly inside that sequence
  (its length is at least (j + 1) * B), so nobody writes into an indexed block.
"""
import z3

from .encoding import RUNNING, SWAPPED, WAITING, Bounds, State, Toks, at, blocks_needed, count, in_queue, occurrences, prefixes


def conservation(b: Bounds, s: State):
    """Every GPU block is exactly one of free, evictable, live; evictable blocks are indexed, free ones
    are not and hold no KV; every CPU block is exactly one of free or held by one swapped sequence."""
    gpu = [count(occurrences(s.free, s.free_len, blk) + occurrences(s.evict, s.evict_len, blk) + [s.ref[blk] > 0]) == 1
           for blk in range(b.num_blocks)]
    evictable_indexed = [z3.Implies(i < s.evict_len, at(s.hashed, e)) for i, e in enumerate(s.evict)]
    free_empty = [z3.Implies(i < s.free_len, z3.And(z3.Not(at(s.hashed, f)),
                                                     *[at(slots, f) == Toks.nil for slots in zip(*s.slots)]))
                  for i, f in enumerate(s.free)]
    cpu = [count(occurrences(s.cpu_free, s.cpu_free_len, c)
                 + [z3.And(s.live[q], j < s.cpu_tlen[q], cb == c)
                    for q in range(b.max_seqs) for j, cb in enumerate(s.cpu_table[q])]) == 1
           for c in range(b.num_cpu_blocks)]
    return z3.And(gpu + evictable_indexed + free_empty + cpu)


def refcount(b: Bounds, s: State):
    """A block's ref count is the number of live tables holding it; no table holds a block twice."""
    holds = [[z3.And(s.live[q], in_queue(s.table[q], s.tlen[q], blk)) for q in range(b.max_seqs)]
             for blk in range(b.num_blocks)]
    counts = [s.ref[blk] == count(holds[blk]) for blk in range(b.num_blocks)]
    distinct = [z3.Implies(z3.And(s.live[q], k < s.tlen[q]), s.table[q][j] != s.table[q][k])
                for q in range(b.max_seqs) for k in range(b.max_blocks_per_seq) for j in range(k)]
    return z3.And(counts + distinct)


def table_shape(b: Bounds, s: State):
    """Running: ceil(len/B) GPU blocks; swapped: as many CPU blocks; waiting: none; never both."""
    def shape(q):
        want = blocks_needed(s.ntok[q], b.block_size)
        expected = z3.If(s.status[q] == RUNNING, z3.And(s.tlen[q] == want, s.cpu_tlen[q] == 0),
                         z3.If(s.status[q] == SWAPPED, z3.And(s.tlen[q] == 0, s.cpu_tlen[q] == want),
                               z3.And(s.tlen[q] == 0, s.cpu_tlen[q] == 0)))
        return z3.Implies(s.live[q], expected)
    return z3.And([shape(q) for q in range(b.max_seqs)])


def read(b: Bounds, s: State, q, position: int):
    """The ghost slot a kernel reads for token `position` of sequence q (GPU or CPU table)."""
    B = b.block_size
    gpu = at(at(s.slots, s.table[q][position // B]), position % B)
    cpu = at(at(s.cpu_slots, s.cpu_table[q][position // B]), position % B) if b.num_cpu_blocks else gpu
    return z3.If(s.status[q] == SWAPPED, cpu, gpu)


def content(b: Bounds, s: State):
    """Every running and swapped sequence reads back each of its tokens after its own prefix."""
    def reads_back(q):
        P = prefixes(s.toks[q])
        return z3.Implies(z3.And(s.live[q], s.status[q] != WAITING),
                          z3.And([z3.Implies(p < s.ntok[q], read(b, s, q, p) == P[p + 1])
                                  for p in range(b.max_tokens)]))
    return z3.And([reads_back(q) for q in range(b.max_seqs)])


def cache_index(b: Bounds, s: State):
    """Indexed blocks are full and hold exactly the tokens their key names (several blocks may hold
    one key: the spec indexes every holder)."""
    def holds_key(blk):
        key, slots, parts = s.key[blk], s.slots[blk], []
        for o in reversed(range(b.block_size)):
            parts += [Toks.is_cons(key), slots[o] == key]
            key = Toks.init(key)
        return z3.Implies(s.hashed[blk], z3.And(parts))
    return z3.And([holds_key(blk) for blk in range(b.num_blocks)])


def well_formed(b: Bounds, s: State):
    def in_range(v, hi):
        return z3.And(0 <= v, v < hi)

    def queue(q, length, hi):
        return [0 <= length, length <= len(q)] + [z3.Implies(i < length, in_range(e, hi)) for i, e in enumerate(q)]

    def seq(q):
        return z3.And(
            0 <= s.ntok[q], s.ntok[q] <= b.max_tokens, 0 <= s.tlen[q], s.tlen[q] <= b.max_blocks_per_seq,
            0 <= s.cpu_tlen[q], s.cpu_tlen[q] <= b.max_blocks_per_seq,
            z3.Or(s.status[q] == RUNNING, s.status[q] == WAITING, s.status[q] == SWAPPED),
            *[z3.Implies(j < s.tlen[q], in_range(e, b.num_blocks)) for j, e in enumerate(s.table[q])],
            *[z3.Implies(j < s.cpu_tlen[q], in_range(e, b.num_cpu_blocks)) for j, e in enumerate(s.cpu_table[q])],
            z3.Implies(s.live[q], s.ntok[q] >= 1),
            z3.Implies(z3.Not(s.live[q]), z3.And(s.tlen[q] == 0, s.cpu_tlen[q] == 0)))
    return z3.And(queue(s.free, s.free_len, b.num_blocks) + queue(s.evict, s.evict_len, b.num_blocks)
                  + queue(s.cpu_free, s.cpu_free_len, b.num_cpu_blocks) + [seq(q) for q in range(b.max_seqs)])


def admission_order(b: Bounds, s: State):
    stamps = [z3.Implies(s.live[q], s.admitted[q] <= s.clock) for q in range(b.max_seqs)]
    distinct = [z3.Implies(z3.And(s.live[p], s.live[q]), s.admitted[p] != s.admitted[q])
                for q in range(b.max_seqs) for p in range(q)]
    return z3.And(stamps + distinct)


def hashed_blocks_full(b: Bounds, s: State):
    return z3.And([z3.Implies(z3.And(s.live[q], j < s.tlen[q], at(s.hashed, blk)), s.ntok[q] >= (j + 1) * b.block_size)
                   for q in range(b.max_seqs) for j, blk in enumerate(s.table[q])])


NAMED = {
    "conservation": conservation,
    "refcount": refcount,
    "table_shape": table_shape,
    "content": content,
    "cache_index": cache_index,
}

STRENGTHENING = {
    "well_formed": well_formed,
    "admission_order": admission_order,
    "hashed_blocks_full": hashed_blocks_full,
}

ALL = {**NAMED, **STRENGTHENING}


def inductive_invariant(b: Bounds, s: State):
    """The conjunction the induction assumes: every named invariant and every strengthening lemma."""
    return z3.And([inv(b, s) for inv in ALL.values()])
