"""KVSpec: the reference state machine of a paged KV-cache block manager.

PagedAttention keeps each sequence's keys and values in fixed-size *blocks* of `block_size` (B)
token slots, drawn from one pool of `num_blocks`. A sequence's *block table* lists its blocks in
order, so token i lives in slot i % B of block table[i // B]. Blocks are taken on demand, one
whenever the last (tail) block is full, so a sequence wastes at most B - 1 slots.

Sharing. `fork` gives a child the parent's blocks; each block's *ref count* says how many tables
hold it. A block with ref count > 1 is read-only: appending into a shared, partly filled tail first
copies it to a fresh block (*copy-on-write*) and returns the copy for the engine to perform.

Prefix caching. A full block is indexed by its content: every token up to its end (the prefix it
completes), so the index is exact by construction (no hash can collide). Every full block is indexed
when it fills, also when an equal block already is: one content may have several holders, and a hit
serves the lowest-numbered one. A new prompt reuses indexed blocks for its longest matching prefix
(never the whole prompt: its last token must be computed to produce logits). A released cached block
is not wiped: it waits in an LRU *evictable* set, still indexed, and is evicted only when the free
queue is empty; evicting it drops only that holder, so an equal block still serves the prefix.
Hence the spec is *complete*: a released full block that has not been handed out again, and is the
newest holder of its content, still serves its prefix (docs/conformance.md, "Completeness").

Preemption. When blocks run short a running sequence is preempted: by *recompute* (its blocks are
released and its tokens re-prefilled later by `resume`) or by *swap* (its blocks are copied to a CPU
pool and back on `resume`).

Every operation validates all of its preconditions before changing anything, so an operation that
raises leaves the state exactly as it was. Errors are checked in this order: malformed arguments
(InvalidArgument), unknown or duplicate ids, the sequence's status (InvalidState), capacity
(OutOfBlocks).

The spec is deliberately simple and slow. Ghost content (`KV` per slot) makes "every sequence reads
back exactly its own KV" a checkable invariant; `check()` runs all named invariants.
"""

import copy
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .arguments import check_block, check_int, check_prompt, check_seq_id, check_step_tokens, check_token, require
from .blocks import KV, blocks_needed
from .errors import DuplicateSequence, InvalidArgument, InvalidState, OutOfBlocks, UnknownSequence

RUNNING, WAITING, SWAPPED = "running", "waiting", "swapped"
PREEMPT_MODES = ("recompute", "swap")


@dataclass
class Sequence:
    tokens: list
    status: str = RUNNING
    block_table: list = field(default_factory=list)
    cpu_block_table: list = field(default_factory=list)
    admitted: int = 0        # when it last became running; `step` preempts the latest first
    cached_tokens: int = 0   # prompt tokens served from the prefix cache at its last allocation


@dataclass
class StepResult:
    appended: list   # sequences that received their token, in admission order
    preempted: list  # sequences preempted by recompute to make room, latest admitted first
    copies: list     # copy-on-write (src, dst) pairs to perform before writing


class KVSpec:
    capabilities = frozenset({"fork", "prefix_caching", "swap", "complete_cache", "spec_defaults"})

    def __init__(self, num_blocks: int, block_size: int, *, num_cpu_blocks: int = 0,
                 prefix_caching: bool = False):
        num_blocks = check_int(num_blocks, 1, math.inf, "num_blocks must be >= 1")
        block_size = check_int(block_size, 1, math.inf, "block_size must be >= 1")
        num_cpu_blocks = check_int(num_cpu_blocks, 0, math.inf, "num_cpu_blocks must be >= 0")
        require(isinstance(prefix_caching, bool), f"prefix_caching must be True or False, got {prefix_caching!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        self.prefix_caching = prefix_caching
        self.seqs: dict = {}
        self.ref_count = [0] * num_blocks
        self.slots = [self._empty_block() for _ in range(num_blocks)]
        self.free_queue = deque(range(num_blocks))   # never-cached free blocks, FIFO
        self.evictable: OrderedDict = OrderedDict()  # released cached blocks, least recent first
        self.block_key: dict = {}                    # indexed block -> its content (tokens up to its end)
        self.holders: dict = {}                      # content -> the indexed blocks holding it
        self.cpu_slots = [self._empty_block() for _ in range(num_cpu_blocks)]
        self.cpu_free_queue = deque(range(num_cpu_blocks))
        self.admissions = 0  # sequences admitted so far; orders preemption victims

    # ---------------------------------------------------------------- operations

    def add(self, seq_id: int, tokens: list) -> int:
        """Admit a prompt. Pre: `tokens` is a non-empty list of ints >= 0 and `seq_id` is new.
        Effect: the sequence runs with ceil(len/B) blocks, the longest confirmed cached prefix
        (at most (len-1)//B blocks) shared, the rest taken fresh and written.
        Returns the prompt tokens served from cache.

        pre: seq_id not in self.seqs and len(tokens) > 0 and all(type(t) is int and t >= 0 for t in tokens)
        post: __return__ % self.block_size == 0
        post: 0 <= __return__ < len(tokens)
        post: len(self.block_table(seq_id)) == blocks_needed(len(tokens), self.block_size)
        post: self.status(seq_id) == RUNNING
        """
        seq_id, tokens = check_seq_id(seq_id), check_prompt(tokens)
        if seq_id in self.seqs:
            raise DuplicateSequence(seq_id)
        seq = Sequence(tokens=tokens)
        self._allocate_prompt(seq)
        self.seqs[seq_id] = seq
        return seq.cached_tokens

    def append(self, seq_id: int, token: int) -> list:
        """Append one decoded token. Pre: the sequence is running.
        Effect: a full (or missing) tail gets a new block after it; a shared, partly filled tail
        is first copied to a new block (copy-on-write). Returns the copies [(src, dst)].

        pre: seq_id in self.seqs and self.status(seq_id) == RUNNING and token >= 0
        post: len(__return__) <= 1
        post: self.tokens(seq_id)[-1] == token
        post: len(self.block_table(seq_id)) == blocks_needed(self.length(seq_id), self.block_size)
        post: self.refcount(self.block_table(seq_id)[-1]) == 1
        """
        token = check_token(token)
        seq = self._running(seq_id)
        position = len(seq.tokens)
        copies = []
        if position % self.block_size == 0:
            self._require_free(1)
            seq.block_table.append(self._take_block())
        elif self.ref_count[seq.block_table[-1]] > 1:
            self._require_free(1)
            copies.append(self._copy_on_write(seq))
        seq.tokens.append(token)
        self._write(seq, position)
        return copies

    def fork(self, parent_id: int, child_id: int) -> None:
        """Start `child_id` as a copy of running `parent_id`, sharing every block (ref count + 1).

        pre: parent_id in self.seqs and child_id not in self.seqs and self.status(parent_id) == RUNNING
        post: self.block_table(child_id) == self.block_table(parent_id)
        post: self.tokens(child_id) == self.tokens(parent_id)
        """
        parent_id, child_id = check_seq_id(parent_id), check_seq_id(child_id)
        parent = self._get(parent_id)
        if child_id in self.seqs:
            raise DuplicateSequence(child_id)
        if parent.status != RUNNING:
            raise InvalidState(f"cannot fork sequence {parent_id!r}: it is {parent.status}")
        for block in parent.block_table:
            self.ref_count[block] += 1
        self.seqs[child_id] = Sequence(tokens=list(parent.tokens), block_table=list(parent.block_table),
                                       admitted=self._admit())

    def free(self, seq_id: int) -> None:
        """Finish or cancel a sequence in any status and release everything it holds.

        pre: seq_id in self.seqs
        post: seq_id not in self.seqs
        """
        seq_id = check_seq_id(seq_id)
        seq = self._get(seq_id)
        self._release(seq.block_table)
        self._release_cpu(seq.cpu_block_table)
        del self.seqs[seq_id]

    def preempt(self, seq_id: int, mode: str = "recompute") -> list:
        """Take a running sequence off the GPU. "recompute": release its blocks, keep its tokens
        (status waiting). "swap": copy each block to a new CPU block, then release the GPU blocks
        (status swapped). Returns the (gpu, cpu) copies; none for recompute.

        pre: seq_id in self.seqs and self.status(seq_id) == RUNNING and mode in PREEMPT_MODES
        post: self.status(seq_id) == (WAITING if mode == "recompute" else SWAPPED)
        post: self.block_table(seq_id) == []
        post: [cpu for _, cpu in __return__] == self.cpu_block_table(seq_id)
        """
        if mode not in PREEMPT_MODES:
            raise InvalidArgument(f"preempt mode must be one of {PREEMPT_MODES}, got {mode!r}")
        seq = self._running(seq_id)
        if mode == "recompute":
            self._release(seq.block_table)
            seq.block_table, seq.status = [], WAITING
            return []
        needed = len(seq.block_table)
        if needed > len(self.cpu_free_queue):
            raise OutOfBlocks(needed, len(self.cpu_free_queue), pool="cpu")
        copies = []
        for gpu_block in seq.block_table:
            cpu_block = self.cpu_free_queue.popleft()
            self.cpu_slots[cpu_block] = list(self.slots[gpu_block])
            seq.cpu_block_table.append(cpu_block)
            copies.append((gpu_block, cpu_block))
        self._release(seq.block_table)
        seq.block_table, seq.status = [], SWAPPED
        return copies

    def resume(self, seq_id: int) -> list:
        """Bring a preempted sequence back. Waiting: allocate like `add` of its tokens (cache hits
        allowed). Swapped: new, unshared GPU blocks, copied back from the CPU blocks, which are
        freed. Returns the (cpu, gpu) copies; none for recompute.

        pre: seq_id in self.seqs and self.status(seq_id) != RUNNING
        post: self.status(seq_id) == RUNNING
        post: self.cpu_block_table(seq_id) == []
        post: len(self.block_table(seq_id)) == blocks_needed(self.length(seq_id), self.block_size)
        """
        seq = self._get(seq_id)
        if seq.status == RUNNING:
            raise InvalidState(f"sequence {seq_id!r} is already running")
        if seq.status == WAITING:
            self._allocate_prompt(seq)
            return []
        self._require_free(len(seq.cpu_block_table))
        copies = []
        for cpu_block in seq.cpu_block_table:
            gpu_block = self._take_block()
            self.slots[gpu_block] = list(self.cpu_slots[cpu_block])
            seq.block_table.append(gpu_block)
            copies.append((cpu_block, gpu_block))
        self._release_cpu(seq.cpu_block_table)
        seq.cpu_block_table, seq.status, seq.admitted = [], RUNNING, self._admit()
        for j in range(len(seq.tokens) // self.block_size):
            self._index_full_block(seq, j)
        return copies

    def swap_out(self, seq_id: int) -> list:
        return self.preempt(seq_id, "swap")

    def swap_in(self, seq_id: int) -> list:
        if self._get(seq_id).status != SWAPPED:
            raise InvalidState(f"sequence {seq_id!r} is not swapped")
        return self.resume(seq_id)

    def step(self, tokens: dict) -> StepResult:
        """One batched decode step: `tokens` maps running sequences to their next token.
        While the step's new blocks (fresh tails and copy-on-write copies) exceed the free blocks,
        preempt by recompute the most recently admitted running sequence (dropping its token).
        Only then append, in admission order; nothing is appended before the capacity check.

        pre: all(s in self.seqs and self.status(s) == RUNNING and t >= 0 for s, t in tokens.items())
        post: set(__return__.appended) | set(__return__.preempted) >= set(tokens)
        post: not set(__return__.appended) & set(__return__.preempted)
        """
        batch = check_step_tokens(tokens)
        for seq_id in batch:
            self._running(seq_id)
        preempted = []
        while self._blocks_for_step(batch) > self.num_free_blocks():
            victim = max(self._running_ids(), key=lambda s: self.seqs[s].admitted)
            self.preempt(victim, "recompute")
            preempted.append(victim)
            batch.pop(victim, None)
        order = sorted(batch, key=lambda s: self.seqs[s].admitted)
        copies = [copy for seq_id in order for copy in self.append(seq_id, batch[seq_id])]
        return StepResult(appended=order, preempted=preempted, copies=copies)

    # ---------------------------------------------------------------- queries

    def block_table(self, seq_id: int) -> list:
        return list(self._get(seq_id).block_table)

    def cpu_block_table(self, seq_id: int) -> list:
        return list(self._get(seq_id).cpu_block_table)

    def length(self, seq_id: int) -> int:
        return len(self._get(seq_id).tokens)

    def tokens(self, seq_id: int) -> list:
        return list(self._get(seq_id).tokens)

    def status(self, seq_id: int) -> str:
        return self._get(seq_id).status

    def cached_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).cached_tokens

    def seq_ids(self) -> list:
        return list(self.seqs)

    def read(self, seq_id: int) -> list:
        """The ghost KV a kernel would read through the sequence's current table (GPU when running,
        CPU when swapped, nothing when waiting)."""
        seq = self._get(seq_id)
        if seq.status == WAITING:
            return []
        table, pool = ((seq.cpu_block_table, self.cpu_slots) if seq.status == SWAPPED
                       else (seq.block_table, self.slots))
        return [pool[table[i // self.block_size]][i % self.block_size] for i in range(len(seq.tokens))]

    def refcount(self, block: int) -> int:
        return self.ref_count[check_block(block, self.num_blocks)]

    def num_free_blocks(self) -> int:
        """Blocks an allocation could take now: never-cached free plus evictable cached.

        post: 0 <= __return__ <= self.num_blocks
        """
        return len(self.free_queue) + len(self.evictable)

    def num_evictable_blocks(self) -> int:
        return len(self.evictable)

    def num_active_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks()

    def num_free_cpu_blocks(self) -> int:
        return len(self.cpu_free_queue)

    def cached_blocks(self) -> dict:
        """Indexed block -> the tokens its content completes (every token up to the block's end)."""
        return dict(self.block_key)

    def snapshot(self) -> dict:
        """A deep copy of the whole state, to compare before and after a failed operation."""
        return copy.deepcopy(vars(self))

    def check(self) -> None:
        """Raise InvariantViolation naming the first broken invariant."""
        from .invariants import check_all
        check_all(self)

    # ---------------------------------------------------------------- internals

    def _empty_block(self):
        return [None] * self.block_size

    def _get(self, seq_id) -> Sequence:
        seq_id = check_seq_id(seq_id)
        if seq_id not in self.seqs:
            raise UnknownSequence(seq_id)
        return self.seqs[seq_id]

    def _running(self, seq_id) -> Sequence:
        seq = self._get(seq_id)
        if seq.status != RUNNING:
            raise InvalidState(f"sequence {seq_id!r} is {seq.status}, not running")
        return seq

    def _admit(self) -> int:
        self.admissions += 1
        return self.admissions

    def _running_ids(self):
        return [s for s, seq in self.seqs.items() if seq.status == RUNNING]

    def _require_free(self, needed: int) -> None:
        if needed > self.num_free_blocks():
            raise OutOfBlocks(needed, self.num_free_blocks())

    def _allocate_prompt(self, seq: Sequence) -> None:
        """Give `seq` a full table for its tokens, sharing confirmed cached blocks first."""
        hits = self._cache_hits(seq.tokens)
        needed = blocks_needed(len(seq.tokens), self.block_size) - len(hits)
        reclaimed_from_lru = sum(1 for block in hits if block in self.evictable)
        available = self.num_free_blocks() - reclaimed_from_lru
        if needed > available:
            raise OutOfBlocks(needed, available)
        for block in hits:
            self.evictable.pop(block, None)
            self.ref_count[block] += 1
        seq.block_table = hits + [self._take_block() for _ in range(needed)]
        seq.status, seq.admitted = RUNNING, self._admit()
        seq.cached_tokens = len(hits) * self.block_size
        for position in range(seq.cached_tokens, len(seq.tokens)):
            self._write(seq, position)

    def _cache_hits(self, tokens) -> list:
        """The lowest-numbered indexed holder of each of the prompt's leading full blocks."""
        if not self.prefix_caching:
            return []
        B = self.block_size
        hits = []
        for j in range((len(tokens) - 1) // B):
            holders = self.holders.get(tuple(tokens[:(j + 1) * B]))
            if not holders:
                break
            hits.append(min(holders))
        return hits

    def _take_block(self) -> int:
        """A new block with ref count 1: the oldest never-cached free block, else evict the least
        recently released cached block (its hash leaves the index)."""
        if self.free_queue:
            block = self.free_queue.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)
            self._unindex(block)
            self.slots[block] = self._empty_block()
        self.ref_count[block] = 1
        return block

    def _copy_on_write(self, seq: Sequence) -> tuple:
        src = seq.block_table[-1]
        dst = self._take_block()
        self.slots[dst] = list(self.slots[src])
        self.ref_count[src] -= 1
        seq.block_table[-1] = dst
        return (src, dst)

    def _write(self, seq: Sequence, position: int) -> None:
        block = seq.block_table[position // self.block_size]
        assert self.ref_count[block] == 1, f"write into shared block {block}"
        self.slots[block][position % self.block_size] = KV(tuple(seq.tokens[:position]), seq.tokens[position])
        if (position + 1) % self.block_size == 0:
            self._index_full_block(seq, position // self.block_size)

    def _index_full_block(self, seq: Sequence, j: int) -> None:
        """Index full block j of `seq` under its content (beside any equal block already indexed)."""
        if not self.prefix_caching:
            return
        block = seq.block_table[j]
        if block not in self.block_key:
            key = tuple(seq.tokens[:(j + 1) * self.block_size])
            self.block_key[block] = key
            self.holders.setdefault(key, set()).add(block)

    def _unindex(self, block: int) -> None:
        key = self.block_key.pop(block)
        self.holders[key].discard(block)
        if not self.holders[key]:
            del self.holders[key]

    def _release(self, table: list) -> None:
        """Drop one reference to each block, tail first, so a prefix's head is evicted last."""
        for block in reversed(table):
            self.ref_count[block] -= 1
            if self.ref_count[block] > 0:
                continue
            if block in self.block_key:
                self.evictable[block] = None
            else:
                self.slots[block] = self._empty_block()
                self.free_queue.append(block)

    def _release_cpu(self, table: list) -> None:
        for block in table:
            self.cpu_slots[block] = self._empty_block()
            self.cpu_free_queue.append(block)

    def _blocks_for_step(self, batch: dict) -> int:
        """New blocks appending `batch` in admission order would take: a fresh tail for each full
        tail, a copy for each shared partial tail (the last sharer to write keeps the original)."""
        pending_refs, needed = {}, 0
        for seq_id in sorted(batch, key=lambda s: self.seqs[s].admitted):
            seq = self.seqs[seq_id]
            if len(seq.tokens) % self.block_size == 0:
                needed += 1
                continue
            tail = seq.block_table[-1]
            refs = pending_refs.get(tail, self.ref_count[tail])
            if refs > 1:
                needed += 1
                pending_refs[tail] = refs - 1
        return needed

    def __repr__(self):
        return (f"KVSpec(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"num_cpu_blocks={self.num_cpu_blocks}, prefix_caching={self.prefix_caching}, "
                f"seqs={len(self.seqs)}, free={self.num_free_blocks()})")
