"""Explicit-state bounded model checking of the executable spec itself.

Breadth-first from the empty `KVSpec`, every operation of a finite alphabet (every op, every id,
a few prompts and tokens, good and bad arguments alike) is applied to every reached state, to depth
k. States equal up to symmetry are merged: renaming sequence ids, block ids or admission stamps
(keeping their order) cannot change what the spec does next (see `canonical`). Each reached state must satisfy every named invariant; every failed
operation must have left its state unchanged; and freeing every sequence must return both pools to
full. Where the Z3 BMC runs out of solver time at depth 2-3, this covers depth 6 and beyond, at
the price of a finite alphabet (stated in the bounds).
"""

import pickle
import time
from collections import Counter
from dataclasses import dataclass

from pagedkv.spec import KVSpec, PagedKVError, violations


@dataclass(frozen=True)
class Alphabet:
    num_blocks: int = 4
    block_size: int = 2
    num_cpu_blocks: int = 2
    prefix_caching: bool = True
    seq_ids: tuple = (1, 2, 3)
    prompts: tuple = ((0, 1, 0), (0, 1, 1), (1,))   # share a first block; 2, 2 and 1 blocks
    tokens: tuple = (0, 1)

    def describe(self, depth: int) -> str:
        return (f"depth {depth}; N={self.num_blocks} B={self.block_size} C={self.num_cpu_blocks} "
                f"cache={'on' if self.prefix_caching else 'off'}; ids {list(self.seq_ids)}; "
                f"prompts {[list(p) for p in self.prompts]}; tokens {list(self.tokens)}")

    def actions(self) -> list:
        ids = self.seq_ids
        return ([("add", (s, list(p))) for s in ids for p in self.prompts]
                + [("append", (s, t)) for s in ids for t in self.tokens]
                + [("fork", (p, c)) for p in ids for c in ids if p != c]
                + [("free", (s,)) for s in ids]
                + [("preempt", (s, mode)) for s in ids for mode in ("recompute", "swap")]
                + [("resume", (s,)) for s in ids]
                + [("step", ({s: self.tokens[0] for s in batch},)) for batch in _nonempty_subsets(ids)])


def _nonempty_subsets(ids) -> list:
    return [tuple(s for i, s in enumerate(ids) if mask >> i & 1) for mask in range(1, 2 ** len(ids))]


def canonical(kv: KVSpec) -> tuple:
    """A hashable key of the state up to symmetry: sequences renamed by admission order (the alphabet
    treats every id alike), GPU and CPU blocks renamed by first appearance (the spec never looks
    at a block id's value, only at where the id sits), admission stamps replaced by their ranks."""
    seqs = sorted(kv.seqs.values(), key=lambda seq: seq.admitted)
    # Blocks a broken state holds nowhere (leaked) are named last, by id, so such states still get a key.
    gpu = _first_appearance([b for seq in seqs for b in seq.block_table] + list(kv.free_queue) + list(kv.evictable)
                            + list(range(kv.num_blocks)))
    cpu = _first_appearance([b for seq in seqs for b in seq.cpu_block_table] + list(kv.cpu_free_queue)
                            + list(range(kv.num_cpu_blocks)))
    by_gpu, by_cpu = sorted(gpu, key=gpu.get), sorted(cpu, key=cpu.get)
    return (tuple((tuple(seq.tokens), seq.status, tuple(gpu[b] for b in seq.block_table),
                   tuple(cpu[b] for b in seq.cpu_block_table), seq.cached_tokens) for seq in seqs),
            tuple(kv.ref_count[b] for b in by_gpu), tuple(tuple(kv.slots[b]) for b in by_gpu),
            tuple(gpu[b] for b in kv.free_queue), tuple(gpu[b] for b in kv.evictable),
            tuple(sorted((gpu[b], key) for b, key in kv.cached_blocks().items())),
            tuple(tuple(kv.cpu_slots[b]) for b in by_cpu), tuple(cpu[b] for b in kv.cpu_free_queue))


def _first_appearance(block_ids) -> dict:
    names = {}
    for block in block_ids:
        names.setdefault(block, len(names))
    return names


def _frees_everything(kv: KVSpec) -> bool:
    for seq_id in list(kv.seqs):
        kv.free(seq_id)
    return kv.num_free_blocks() == kv.num_blocks and kv.num_free_cpu_blocks() == kv.num_cpu_blocks


@dataclass
class Exploration:
    depth: int
    states: int = 0
    transitions: int = 0
    failures: list = None
    reached: Counter = None   # interesting situations seen: exhaustion, three-way sharing, eviction

    def problem(self, trace, message):
        if len(self.failures) < 3:
            self.failures.append(f"after {' ; '.join(trace) or 'nothing'}: {message}")


def explore(alphabet: Alphabet, depth: int, spec_class=KVSpec) -> Exploration:
    result = Exploration(depth, failures=[], reached=Counter())
    start = spec_class(alphabet.num_blocks, alphabet.block_size, num_cpu_blocks=alphabet.num_cpu_blocks,
                   prefix_caching=alphabet.prefix_caching)
    frontier = [(pickle.dumps(start), ())]
    seen = {canonical(start)}
    actions = alphabet.actions()
    for _ in range(depth):
        next_frontier = []
        for blob, trace in frontier:
            for operation, args in actions:
                kv = pickle.loads(blob)
                before = canonical(kv)
                result.transitions += 1
                indexed = kv.cached_blocks()
                try:
                    getattr(kv, operation)(*args)
                except PagedKVError:
                    if canonical(kv) != before:
                        result.problem(trace, f"failed {operation}{args} changed the state")
                    continue
                key = canonical(kv)
                if key in seen:
                    continue
                seen.add(key)
                step = trace + (f"{operation}{args}",)
                _note_situations(result.reached, kv, indexed)
                broken = violations(kv)
                if broken:
                    result.problem(step, f"invariants broken: {broken}")
                blob_next = pickle.dumps(kv)
                if not _frees_everything(kv):
                    result.problem(step, "freeing every sequence does not return both pools to full")
                next_frontier.append((blob_next, step))
        frontier = next_frontier
    result.states = len(seen)
    return result


def _note_situations(reached: Counter, kv: KVSpec, indexed_before: dict) -> None:
    if kv.num_free_blocks() == 0:
        reached["pool exhausted"] += 1
    if any(count >= 3 for count in kv.ref_count):
        reached["block in three tables"] += 1
    if indexed_before.items() - kv.cached_blocks().items():
        reached["eviction"] += 1
    if any(seq.status == "swapped" for seq in kv.seqs.values()):
        reached["swapped"] += 1


SITUATIONS = ("pool exhausted", "block in three tables", "eviction", "swapped")


def check(alphabet: Alphabet, depth: int, spec_class=KVSpec):
    """(passed, bounds, detail): invariants, atomicity, no leak, and every situation reached."""
    started = time.perf_counter()
    result = explore(alphabet, depth, spec_class)
    missed = [s for s in SITUATIONS if not result.reached[s]]
    detail = (f"{result.states} states, {result.transitions} transitions in {time.perf_counter() - started:.0f}s; "
              + ", ".join(f"{s}: {result.reached[s]}" for s in SITUATIONS))
    if missed:
        result.failures.append(f"bounds too small: never reached {', '.join(missed)}")
    return not result.failures, alphabet.describe(depth), "; ".join(result.failures) or detail
