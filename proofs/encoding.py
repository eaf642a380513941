"""Z3 encoding of `KVSpec`'s state and transitions, read alongside `pagedkv/spec/kvspec.py`.

State. Bounded arrays of Z3 terms: `num_blocks` (N) GPU blocks, `num_cpu_blocks` (C) CPU blocks,
`max_seqs` (S) sequence slots (sequence id = slot index), block tables of at most
`max_blocks_per_seq` (T) entries, so a sequence holds at most L = T * B tokens. Queues (free, LRU
evictable, CPU free) are arrays plus a length, front at index 0, exactly the spec's deque/OrderedDict
order. Entries past a length are "don't care": every comparison masks them (`same_state`).

Ghost content, exact. A slot's `KV(prefix, token)` is the token string `prefix + (token,)`, held as a
Z3 datatype list `Toks` built last token first (`cons(last, init)`), `nil` for an empty slot. So a slot
written at position p of a sequence holds that sequence's first p + 1 tokens, and a prefix cache key
is, as in the spec, the token string up to the end of its block. The spec's `block_key` is kept per
block (`hashed`, `key`); its `holders` (content -> blocks) is the inverse relation: several blocks may
hold one key, and a hit serves the lowest-numbered.

Transitions are programs over a `Run`: `fail_unless(cond, error)` raises (the spec checks before it
mutates), and every `update` takes effect only while no error has been raised and the current `when`
guard holds. So a failed operation's final state is whatever the program had done before it raised:
failure atomicity is a proof obligation, not an assumption. Every write records the exclusivity
condition `ref_count[block] == 1` at that moment.
"""
from contextlib import contextmanager
from dataclasses import dataclass, replace

import z3

RUNNING, WAITING, SWAPPED = 0, 1, 2
STATUS_NAMES = ("running", "waiting", "swapped")
ERRORS = ("ok", "InvalidArgument", "UnknownSequence", "DuplicateSequence", "InvalidState", "OutOfBlocks")
OK = 0


def _declare_toks():
    toks = z3.Datatype("Toks")
    toks.declare("nil")
    toks.declare("cons", ("last", z3.IntSort()), ("init", toks))
    return toks.create()


Toks = _declare_toks()
NIL = Toks.nil


@dataclass(frozen=True)
class Bounds:
    num_blocks: int
    block_size: int
    max_seqs: int
    max_blocks_per_seq: int
    num_cpu_blocks: int
    prefix_caching: bool = True

    @property
    def max_tokens(self) -> int:
        return self.max_blocks_per_seq * self.block_size

    def describe(self) -> str:
        return (f"N={self.num_blocks} B={self.block_size} S={self.max_seqs} T={self.max_blocks_per_seq} "
                f"C={self.num_cpu_blocks} cache={'on' if self.prefix_caching else 'off'}")


# ------------------------------------------------------------------ bounded arrays of terms

def at(items, index):
    """items[index] for a Python or symbolic index (a symbolic one out of range reads the last)."""
    if isinstance(index, int):
        return items[index]
    result = items[-1]
    for i in range(len(items) - 2, -1, -1):
        result = _at_entry(index == i, items[i], result)
    return result


def _at_entry(cond, item, rest):
    if isinstance(item, list):
        return [_at_entry(cond, a, b) for a, b in zip(item, rest)]
    return z3.If(cond, item, rest)


def put(items, index, value):
    """A copy of items with items[index] = value."""
    if isinstance(index, int):
        return items[:index] + [value] + items[index + 1:]
    return [merge(index == i, value, item) for i, item in enumerate(items)]


def put2(rows, row, col, value):
    """A copy of rows with rows[row][col] = value."""
    if isinstance(row, int):
        return put(rows, row, put(rows[row], col, value))
    return [merge(row == i, put(r, col, value), r) for i, r in enumerate(rows)]


def merge(cond, new, old):
    """If(cond, new, old), entry-wise through nested lists, skipping entries that did not change."""
    if isinstance(new, list):
        return [merge(cond, a, b) for a, b in zip(new, old)]
    if z3.is_true(cond) or new.eq(old):
        return new
    return z3.If(cond, new, old)


def count(conds) -> z3.ArithRef:
    return z3.Sum([z3.If(c, 1, 0) for c in conds]) if conds else z3.IntVal(0)


def in_queue(queue, length, item):
    return z3.Or(occurrences(queue, length, item))


def occurrences(queue, length, item) -> list:
    """One Bool per position of the queue: the item is there."""
    return [z3.And(i < length, q == item) for i, q in enumerate(queue)]


def prefixes(tokens):
    """[P_0 .. P_L]: P_k is the token string of the first k tokens (P_0 = nil)."""
    result = [NIL]
    for token in tokens:
        result.append(Toks.cons(token, result[-1]))
    return result


def blocks_needed(num_tokens, block_size: int):
    return (num_tokens + block_size - 1) / block_size


# ------------------------------------------------------------------ state

@dataclass(frozen=True)
class State:
    ref: list          # [N] ref counts
    slots: list        # [N][B] Toks: token string written there, nil when empty
    free: list         # [N] never-cached free queue, FIFO from index 0
    free_len: object
    evict: list        # [N] evictable LRU, least recently released at index 0
    evict_len: object
    hashed: list       # [N] Bool: block is in the prefix index
    key: list          # [N] Toks: its chained-hash key (the tokens up to the block's end)
    cpu_slots: list    # [C][B]
    cpu_free: list     # [C]
    cpu_free_len: object
    live: list         # [S] Bool: the sequence exists
    status: list       # [S] RUNNING / WAITING / SWAPPED
    ntok: list         # [S] its length
    toks: list         # [S][L] its tokens
    table: list        # [S][T] GPU block table
    tlen: list         # [S]
    cpu_table: list    # [S][T]
    cpu_tlen: list     # [S]
    admitted: list     # [S] admission number when it last became running
    cached: list       # [S] prompt tokens served from cache at its last allocation
    clock: object      # the spec's `admissions`: sequences admitted so far

    @staticmethod
    def fresh(b: Bounds, name: str) -> "State":
        """A state of unconstrained constants named after `name`."""
        def ints(field, *shape):
            return _grid(lambda idx: z3.Int(f"{name}.{field}{idx}"), shape)

        def toks(field, *shape):
            return _grid(lambda idx: z3.Const(f"{name}.{field}{idx}", Toks), shape)

        def bools(field, n):
            return _grid(lambda idx: z3.Bool(f"{name}.{field}{idx}"), (n,))

        N, B, S, T, C, L = (b.num_blocks, b.block_size, b.max_seqs, b.max_blocks_per_seq,
                            b.num_cpu_blocks, b.max_tokens)
        return State(ref=ints("ref", N), slots=toks("slot", N, B), free=ints("free", N),
                     free_len=z3.Int(f"{name}.free_len"), evict=ints("evict", N),
                     evict_len=z3.Int(f"{name}.evict_len"), hashed=bools("hashed", N),
                     key=toks("key", N), cpu_slots=toks("cpu_slot", C, B), cpu_free=ints("cpu_free", C),
                     cpu_free_len=z3.Int(f"{name}.cpu_free_len"), live=bools("live", S),
                     status=ints("status", S), ntok=ints("ntok", S), toks=ints("tok", S, L),
                     table=ints("table", S, T), tlen=ints("tlen", S), cpu_table=ints("cpu_table", S, T),
                     cpu_tlen=ints("cpu_tlen", S), admitted=ints("admitted", S), cached=ints("cached", S),
                     clock=z3.Int(f"{name}.clock"))

    def terms(self):
        """Every term of the state, flattened (for equating a state with fresh constants)."""
        return [t for value in vars(self).values() for t in _flatten(value)]


def _grid(make, shape, prefix=()):
    if len(shape) == 1:
        return [make(prefix + (i,)) for i in range(shape[0])]
    return [_grid(make, shape[1:], prefix + (i,)) for i in range(shape[0])]


def _flatten(value):
    if isinstance(value, list):
        return [t for item in value for t in _flatten(item)]
    return [value]


def same_state(b: Bounds, x: State, y: State):
    """x and y are the same spec state: every observable entry agrees, masked entries are ignored."""
    def queue(qx, lx, qy, ly):
        return [lx == ly] + [z3.Implies(i < lx, a == c) for i, (a, c) in enumerate(zip(qx, qy))]

    def row(rx, lx, ry):
        return [z3.Implies(i < lx, a == c) for i, (a, c) in enumerate(zip(rx, ry))]

    def seq(s):
        return z3.Implies(x.live[s], z3.And(
            x.status[s] == y.status[s], x.ntok[s] == y.ntok[s], x.tlen[s] == y.tlen[s],
            x.cpu_tlen[s] == y.cpu_tlen[s], x.admitted[s] == y.admitted[s], x.cached[s] == y.cached[s],
            *row(x.toks[s], x.ntok[s], y.toks[s]), *row(x.table[s], x.tlen[s], y.table[s]),
            *row(x.cpu_table[s], x.cpu_tlen[s], y.cpu_table[s])))

    return z3.And(
        *[a == c for a, c in zip(_flatten(x.ref + x.slots + x.cpu_slots), _flatten(y.ref + y.slots + y.cpu_slots))],
        *queue(x.free, x.free_len, y.free, y.free_len), *queue(x.evict, x.evict_len, y.evict, y.evict_len),
        *queue(x.cpu_free, x.cpu_free_len, y.cpu_free, y.cpu_free_len),
        *[z3.And(h == g, z3.Implies(h, k == j)) for h, g, k, j in zip(x.hashed, y.hashed, x.key, y.key)],
        *[lx == ly for lx, ly in zip(x.live, y.live)], *[seq(s) for s in range(b.max_seqs)],
        x.clock == y.clock)


# ------------------------------------------------------------------ programs over a state

class Run:
    """One execution of a transition: the current state, the raised error, the guard, the writes."""

    def __init__(self, state: State):
        self.state = state
        self.err = z3.IntVal(OK)
        self.guard = z3.BoolVal(True)
        self.writes = []     # exclusivity: (active, block, ref count of block) at each write
        self.checks = []     # conditions the encoding itself relies on (step's unrolling suffices)
        self.domain = []     # representable within the bounds (no sequence grows past L tokens)

    @property
    def active(self):
        return z3.And(self.guard, self.err == OK)

    @property
    def ok(self):
        return self.err == OK

    def fail_unless(self, cond, error: str) -> None:
        self.err = z3.If(z3.And(self.active, z3.Not(cond)), ERRORS.index(error), self.err)

    def update(self, **changes) -> None:
        active = self.active
        self.state = replace(self.state, **{f: merge(active, v, getattr(self.state, f)) for f, v in changes.items()})

    @contextmanager
    def when(self, cond):
        outer = self.guard
        self.guard = z3.And(outer, cond)
        yield
        self.guard = outer


# ------------------------------------------------------------------ the machine

class Machine:
    """KVSpec's operations over a `Run`. Method names follow the spec's; a wrong variant of a
    transition is a subclass overriding one helper (see `mutants.py`)."""

    def __init__(self, bounds: Bounds):
        self.b = bounds

    # ---------------------------------------------------------------- queries

    def num_free(self, s: State):
        return s.free_len + s.evict_len

    def is_running(self, s: State, sid):
        return z3.And(at(s.live, sid), at(s.status, sid) == RUNNING)

    def seq_prefixes(self, s: State, sid):
        return prefixes(at(s.toks, sid))

    # ---------------------------------------------------------------- operations

    def add(self, run: Run, sid, n, tokens) -> None:
        run.fail_unless(z3.And(n >= 1, *[z3.Implies(i < n, t >= 0) for i, t in enumerate(tokens)]),
                        "InvalidArgument")
        run.fail_unless(z3.Not(at(run.state.live, sid)), "DuplicateSequence")
        self.allocate_prompt(run, sid, n, tokens)
        s = run.state
        run.update(live=put(s.live, sid, z3.BoolVal(True)), ntok=put(s.ntok, sid, n),
                   toks=put(s.toks, sid, list(tokens)), cpu_tlen=put(s.cpu_tlen, sid, z3.IntVal(0)))

    def append(self, run: Run, sid, token) -> None:
        run.fail_unless(token >= 0, "InvalidArgument")
        self.require_running(run, sid)
        s, B = run.state, self.b.block_size
        position, tlen = at(s.ntok, sid), at(s.tlen, sid)
        run.domain.append(z3.Implies(run.active, position < self.b.max_tokens))
        new_block = position % B == 0
        with run.when(new_block):
            self.require_free(run, 1)
            block = self.take_block(run)
            run.update(table=put2(run.state.table, sid, tlen, block), tlen=put(run.state.tlen, sid, tlen + 1))
        with run.when(z3.And(z3.Not(new_block), at(s.ref, at(at(s.table, sid), tlen - 1)) > 1)):
            self.require_free(run, 1)
            self.copy_on_write(run, sid)
        run.update(toks=put2(run.state.toks, sid, position, token), ntok=put(run.state.ntok, sid, position + 1))
        value = at(self.seq_prefixes(run.state, sid)[1:], position)
        self.write(run, at(at(run.state.table, sid), position / B), position, value)

    def fork(self, run: Run, parent, child) -> None:
        self.require_exists(run, parent)
        run.fail_unless(z3.Not(at(run.state.live, child)), "DuplicateSequence")
        run.fail_unless(at(run.state.status, parent) == RUNNING, "InvalidState")
        s = run.state
        row, tlen = at(s.table, parent), at(s.tlen, parent)
        self.share_blocks(run, row, tlen)
        s = run.state
        run.update(live=put(s.live, child, z3.BoolVal(True)), status=put(s.status, child, z3.IntVal(RUNNING)),
                   ntok=put(s.ntok, child, at(s.ntok, parent)), toks=put(s.toks, child, at(s.toks, parent)),
                   table=put(s.table, child, row), tlen=put(s.tlen, child, tlen),
                   cpu_tlen=put(s.cpu_tlen, child, z3.IntVal(0)), cached=put(s.cached, child, z3.IntVal(0)))
        self.admit(run, child)

    def free(self, run: Run, sid) -> None:
        self.require_exists(run, sid)
        s = run.state
        self.release(run, at(s.table, sid), at(s.tlen, sid))
        self.release_cpu(run, at(s.cpu_table, sid), at(s.cpu_tlen, sid))
        s = run.state
        run.update(live=put(s.live, sid, z3.BoolVal(False)), tlen=put(s.tlen, sid, z3.IntVal(0)),
                   cpu_tlen=put(s.cpu_tlen, sid, z3.IntVal(0)))

    def preempt_recompute(self, run: Run, sid) -> None:
        self.require_running(run, sid)
        self.release_to_waiting(run, sid)

    def preempt_swap(self, run: Run, sid) -> None:
        self.require_running(run, sid)
        s = run.state
        row, tlen = at(s.table, sid), at(s.tlen, sid)
        run.fail_unless(tlen <= s.cpu_free_len, "OutOfBlocks")
        for j, gpu_block in enumerate(row):
            with run.when(j < tlen):
                cpu_block = run.state.cpu_free[0]
                run.update(cpu_free=run.state.cpu_free[1:] + run.state.cpu_free[:1], cpu_free_len=run.state.cpu_free_len - 1,
                           cpu_slots=put(run.state.cpu_slots, cpu_block, at(run.state.slots, gpu_block)),
                           cpu_table=put2(run.state.cpu_table, sid, j, cpu_block))
        self.release(run, row, tlen)
        s = run.state
        run.update(tlen=put(s.tlen, sid, z3.IntVal(0)), cpu_tlen=put(s.cpu_tlen, sid, tlen),
                   status=put(s.status, sid, z3.IntVal(SWAPPED)))

    def resume(self, run: Run, sid) -> None:
        self.require_exists(run, sid)
        status = at(run.state.status, sid)
        run.fail_unless(status != RUNNING, "InvalidState")
        with run.when(status == WAITING):
            self.allocate_prompt(run, sid, at(run.state.ntok, sid), at(run.state.toks, sid))
        with run.when(status == SWAPPED):
            self.swap_in(run, sid)

    def step(self, run: Run, batch) -> None:
        """`batch[s]` is (s is in the step's dict, its token); the dict is iterated in id order."""
        for member, token in batch:
            run.fail_unless(z3.Implies(member, token >= 0), "InvalidArgument")
        for s, (member, _) in enumerate(batch):
            with run.when(member):
                self.require_running(run, s)
        members = [member for member, _ in batch]
        for _ in range(self.b.max_seqs):   # each round preempts a running sequence or none
            short = self.blocks_for_step(run.state, members) > self.num_free(run.state)
            with run.when(short):
                victim = self.latest_running(run.state)
                self.preempt_recompute(run, victim)
            # Only a round that preempts drops its victim from the batch.
            members = [z3.And(m, z3.Not(z3.And(short, victim == s))) for s, m in enumerate(members)]
        run.checks.append(z3.Implies(run.active, self.blocks_for_step(run.state, members) <= self.num_free(run.state)))
        admitted = run.state.admitted
        rank = [count([z3.And(m2, a2 < a) for m2, a2 in zip(members, admitted)]) for a in admitted]
        for r in range(self.b.max_seqs):
            chosen = [z3.And(m, rank[s] == r) for s, m in enumerate(members)]
            who = z3.IntVal(0)
            for s in range(self.b.max_seqs):
                who = z3.If(chosen[s], s, who)
            with run.when(z3.Or(chosen)):
                self.append(run, who, at([token for _, token in batch], who))

    # ---------------------------------------------------------------- internals

    def require_exists(self, run: Run, sid) -> None:
        run.fail_unless(at(run.state.live, sid), "UnknownSequence")

    def require_running(self, run: Run, sid) -> None:
        self.require_exists(run, sid)
        run.fail_unless(at(run.state.status, sid) == RUNNING, "InvalidState")

    def require_free(self, run: Run, needed) -> None:
        run.fail_unless(needed <= self.num_free(run.state), "OutOfBlocks")

    def admit(self, run: Run, sid) -> None:
        """The spec's `_admit`: stamp the sequence with the next admission number."""
        s = run.state
        run.update(admitted=put(s.admitted, sid, s.clock + 1), clock=s.clock + 1)

    def allocate_prompt(self, run: Run, sid, n, tokens) -> None:
        """A full table for the prompt `tokens[:n]`, confirmed cached blocks first; then write."""
        B, T = self.b.block_size, self.b.max_blocks_per_seq
        P = prefixes(tokens)
        hits = self.cache_hits(run.state, n, P)
        num_hits = count([hit for hit, _ in hits])
        needed = blocks_needed(n, B) - num_hits
        reclaimed = count([z3.And(hit, in_queue(run.state.evict, run.state.evict_len, block)) for hit, block in hits])
        run.fail_unless(needed <= self.num_free(run.state) - reclaimed, "OutOfBlocks")
        for hit, block in hits:
            with run.when(hit):
                self.reclaim(run, block)
        row = []
        for j in range(T):
            hit, hit_block = hits[j] if j < len(hits) else (z3.BoolVal(False), z3.IntVal(0))
            with run.when(z3.And(z3.Not(hit), j < blocks_needed(n, B))):
                row.append(z3.If(hit, hit_block, self.take_block(run)))
        s = run.state
        run.update(table=put(s.table, sid, row), tlen=put(s.tlen, sid, blocks_needed(n, B)),
                   status=put(s.status, sid, z3.IntVal(RUNNING)), cached=put(s.cached, sid, num_hits * B))
        self.admit(run, sid)
        for p in range(self.b.max_tokens):
            with run.when(z3.And(num_hits * B <= p, p < n)):
                self.write(run, row[p // B], p, P[p + 1])

    def cache_hits(self, s: State, n, P) -> list:
        """[(hit, block)] for the prompt's leading full blocks, at most (n - 1) // B of them."""
        if not self.b.prefix_caching:
            return []
        B, hits, still = self.b.block_size, [], z3.BoolVal(True)
        for j in range(self.b.max_blocks_per_seq - 1):
            found = [z3.And(s.hashed[b], s.key[b] == P[(j + 1) * B],
                            *[s.slots[b][o] == P[j * B + o + 1] for o in range(B)])
                     for b in range(self.b.num_blocks)]
            still = z3.And(still, j < (n - 1) / B, z3.Or(found))
            block = z3.IntVal(0)
            for b in reversed(range(self.b.num_blocks)):
                block = z3.If(found[b], b, block)
            hits.append((still, block))
        return hits

    def reclaim(self, run: Run, block) -> None:
        """A cache hit: the block leaves the evictable set (if there) and gains a reference."""
        s = run.state
        kept = [z3.And(i < s.evict_len, e != block) for i, e in enumerate(s.evict)]
        run.update(evict=self.compact(s.evict, kept), evict_len=count(kept),
                   ref=put(s.ref, block, at(s.ref, block) + 1))

    @staticmethod
    def compact(queue, kept):
        """The entries of `queue` whose `kept` holds, in order, packed to the front."""
        out = list(queue)
        for i in range(len(queue)):
            # out[i] = the entry q[j] with kept[j] and exactly i kept entries before j
            value = queue[-1]
            for j in reversed(range(i, len(queue))):
                value = z3.If(z3.And(kept[j], count(kept[:j]) == i), queue[j], value)
            out[i] = value
        return out

    def take_block(self, run: Run):
        """The oldest never-cached free block, else evict the least recently released one."""
        s = run.state
        from_free = s.free_len > 0
        block = z3.If(from_free, s.free[0], s.evict[0])
        with run.when(from_free):
            run.update(free=s.free[1:] + s.free[:1], free_len=s.free_len - 1)
        with run.when(z3.Not(from_free)):
            self.evict(run)
        run.update(ref=put(run.state.ref, block, z3.IntVal(1)))
        return block

    def evict(self, run: Run) -> None:
        s = run.state
        block = s.evict[0]
        run.update(evict=s.evict[1:] + s.evict[:1], evict_len=s.evict_len - 1,
                   hashed=put(s.hashed, block, z3.BoolVal(False)), slots=self.wiped(s.slots, block))

    def wiped(self, slots, block):
        return put(slots, block, [NIL] * self.b.block_size)

    def copy_on_write(self, run: Run, sid) -> None:
        tail = at(run.state.tlen, sid) - 1
        src = at(at(run.state.table, sid), tail)
        dst = self.take_block(run)
        s = run.state
        run.update(slots=put(s.slots, dst, at(s.slots, src)), ref=put(s.ref, src, at(s.ref, src) - 1),
                   table=put2(s.table, sid, tail, dst))

    def share_blocks(self, run: Run, row, tlen) -> None:
        for j, block in enumerate(row):
            with run.when(j < tlen):
                run.update(ref=put(run.state.ref, block, at(run.state.ref, block) + 1))

    def write(self, run: Run, block, position, value) -> None:
        """Write `value` (the writer's tokens up to and including `position`) into its slot."""
        B = self.b.block_size
        run.writes.append((run.active, block, at(run.state.ref, block)))
        offset = position % B
        s = run.state
        run.update(slots=[[merge(z3.And(block == b, offset == o), value, slot) for o, slot in enumerate(row)]
                          for b, row in enumerate(s.slots)])
        with run.when((position + 1) % B == 0):
            self.index_full_block(run, block, value)

    def index_full_block(self, run: Run, block, key) -> None:
        if not self.b.prefix_caching:
            return
        s = run.state
        with run.when(z3.Not(at(s.hashed, block))):
            run.update(hashed=put(s.hashed, block, z3.BoolVal(True)), key=put(s.key, block, key))

    def release(self, run: Run, row, tlen) -> None:
        """Drop one reference to each block of the table, tail first."""
        for j in reversed(range(len(row))):
            with run.when(j < tlen):
                self.release_block(run, row[j])

    def release_block(self, run: Run, block) -> None:
        s = run.state
        ref = at(s.ref, block) - 1
        run.update(ref=put(s.ref, block, ref))
        with run.when(ref == 0):
            cached = at(s.hashed, block)
            with run.when(cached):
                run.update(evict=put(s.evict, s.evict_len, block), evict_len=s.evict_len + 1)
            with run.when(z3.Not(cached)):
                run.update(slots=self.wiped(s.slots, block), free=put(s.free, s.free_len, block),
                           free_len=s.free_len + 1)

    def release_cpu(self, run: Run, row, tlen) -> None:
        for j, block in enumerate(row):
            with run.when(j < tlen):
                s = run.state
                run.update(cpu_slots=put(s.cpu_slots, block, [NIL] * self.b.block_size),
                           cpu_free=put(s.cpu_free, s.cpu_free_len, block), cpu_free_len=s.cpu_free_len + 1)

    def release_to_waiting(self, run: Run, sid) -> None:
        s = run.state
        self.release(run, at(s.table, sid), at(s.tlen, sid))
        run.update(tlen=put(run.state.tlen, sid, z3.IntVal(0)), status=put(run.state.status, sid, z3.IntVal(WAITING)))

    def swap_in(self, run: Run, sid) -> None:
        s, B = run.state, self.b.block_size
        row, tlen = at(s.cpu_table, sid), at(s.cpu_tlen, sid)
        self.require_free(run, tlen)
        for j, cpu_block in enumerate(row):
            with run.when(j < tlen):
                block = self.take_block(run)
                run.update(slots=put(run.state.slots, block, at(run.state.cpu_slots, cpu_block)),
                           table=put2(run.state.table, sid, j, block))
        self.release_cpu(run, row, tlen)
        s = run.state
        run.update(tlen=put(s.tlen, sid, tlen), cpu_tlen=put(s.cpu_tlen, sid, z3.IntVal(0)),
                   status=put(s.status, sid, z3.IntVal(RUNNING)))
        self.admit(run, sid)
        P = self.seq_prefixes(run.state, sid)
        table = at(run.state.table, sid)
        for j in range(self.b.max_blocks_per_seq):
            with run.when(j < at(run.state.ntok, sid) / B):
                self.index_full_block(run, table[j], P[(j + 1) * B])

    def blocks_for_step(self, s: State, members):
        """New blocks the step's appends take: a fresh tail per full tail, and a copy for each
        sharer of a partly filled tail beyond the last (order-free: of k batch sharers of a tail
        held r times, min(k, r - 1) copy)."""
        B = self.b.block_size
        tails = [at(s.table[i], s.tlen[i] - 1) for i in range(self.b.max_seqs)]
        partial = [z3.And(m, s.ntok[i] % B != 0) for i, m in enumerate(members)]
        needed = []
        for i, m in enumerate(members):
            earlier_sharers = count([z3.And(partial[k], tails[k] == tails[i]) for k in range(i)])
            needed.append(z3.And(m, z3.Or(s.ntok[i] % B == 0, earlier_sharers < at(s.ref, tails[i]) - 1)))
        return count(needed)

    def latest_running(self, s: State):
        """The running sequence admitted last."""
        best, best_admitted, found = z3.IntVal(0), z3.IntVal(0), z3.BoolVal(False)
        for i in range(self.b.max_seqs):
            better = z3.And(self.is_running(s, i), z3.Or(z3.Not(found), s.admitted[i] > best_admitted))
            best, best_admitted = z3.If(better, i, best), z3.If(better, s.admitted[i], best_admitted)
            found = z3.Or(found, better)
        return best
