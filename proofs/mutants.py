"""Known-wrong variants of the transitions: the proofs must find a counterexample for each.

Each mutant overrides one helper of `Machine` with the bug; `MUTANTS` pairs it with the operation
case that exercises it. `hunt(mutant)` returns the counterexample (rendered in domain terms by
`Counterexample.render`) or None if the proofs missed the bug.
"""
from dataclasses import dataclass

from .encoding import Machine, Run, at, put, put2
from .obligations import CASES, Counterexample, find_violation


class CowKeepsSourceRef(Machine):
    """Copy-on-write that forgets to drop the writer's reference to the shared source block."""

    def copy_on_write(self, run: Run, sid) -> None:
        tail = at(run.state.tlen, sid) - 1
        src = at(at(run.state.table, sid), tail)
        dst = self.take_block(run)
        s = run.state
        run.update(slots=put(s.slots, dst, at(s.slots, src)), table=put2(s.table, sid, tail, dst))


class ForkWithoutIncref(Machine):
    """Fork that shares the parent's blocks without raising their ref counts."""

    def share_blocks(self, run: Run, row, tlen) -> None:
        pass


class FreeReturnsShared(Machine):
    """Release that returns every block to the free queue, even one other tables still hold."""

    def release_block(self, run: Run, block) -> None:
        s = run.state
        run.update(ref=put(s.ref, block, at(s.ref, block) - 1), slots=self.wiped(s.slots, block),
                   free=put(s.free, s.free_len, block), free_len=s.free_len + 1)


class EvictionKeepsHash(Machine):
    """Eviction that reuses a cached block but leaves its hash in the prefix index."""

    def evict(self, run: Run) -> None:
        s = run.state
        run.update(evict=s.evict[1:] + s.evict[:1], evict_len=s.evict_len - 1,
                   slots=self.wiped(s.slots, s.evict[0]))


@dataclass(frozen=True)
class Mutant:
    name: str
    machine: type
    case: str


MUTANTS = [
    Mutant("copy-on-write forgets to decrement the source", CowKeepsSourceRef, "append, copy-on-write"),
    Mutant("fork without ref count increments", ForkWithoutIncref, "fork"),
    Mutant("free returns a shared block", FreeReturnsShared, "free"),
    Mutant("eviction leaves the hash indexed", EvictionKeepsHash, "append, new block by eviction"),
]


def hunt(mutant: Mutant, bounds, timeout_s: float = 120) -> "Counterexample | None":
    case = next(c for c in CASES if c.name == mutant.case)
    return find_violation(mutant.machine(bounds), case, timeout_s)

