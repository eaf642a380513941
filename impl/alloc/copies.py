"""The copies an engine must perform for the block manager, queued in call order until drained."""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from pagedkv.spec.arguments import require

COPY_KINDS = ("swap_out", "swap_in", "cow")


class CopyPhase(NamedTuple):
    kind: str             # "swap_out" (gpu, cpu), "swap_in" (cpu, gpu) or "cow" (gpu, gpu)
    pairs: torch.Tensor   # int64 [P, 2] (src, dst), no hazard among them: one launch may do all


@dataclass(frozen=True)
class Copies:
    """Every block copy the manager asked for since the last drain, as *phases* in the order the
    calls asked for them. The contract:

    - perform the phases in order, and all of them before this step's KV writes (the forward pass
      writes at `slot_mapping`): a later phase may read what an earlier one wrote (a block swapped
      in, then swapped out again) or overwrite what an earlier one read (a block a victim released
      to the CPU, then taken again for a copy-on-write);
    - within a phase the pairs are independent (no destination twice, and for copy-on-write no
      block both a source and a destination), so one batched copy may perform them in any order;
      consecutive calls of one kind share a phase only when that stays true;
    - a copy reads KV that earlier steps wrote. A block written in this step (a new prompt or
      token) holds its KV only after the forward pass, so copying it in the same step copies
      stale memory: the Scheduler never does; a caller driving the manager by hand drains (and
      runs the forward pass) between writing a block and swapping it out or forking and
      appending to it.

    `perform_copies` (`pagedkv.impl.engine.cache_copies`) performs them on real caches."""

    phases: tuple = ()

    def of_kind(self, kind: str) -> torch.Tensor:
        """Every pair of one kind, in call order (to count or inspect them; performing them by
        kind instead of by phase breaks the order above)."""
        require(kind in COPY_KINDS, f"copy kinds are {COPY_KINDS}, got {kind!r}")
        pairs = [phase.pairs for phase in self.phases if phase.kind == kind]
        return torch.cat(pairs) if pairs else torch.zeros((0, 2), dtype=torch.int64)

    @property
    def swap_out(self) -> torch.Tensor:
        return self.of_kind("swap_out")

    @property
    def swap_in(self) -> torch.Tensor:
        return self.of_kind("swap_in")

    @property
    def cow(self) -> torch.Tensor:
        return self.of_kind("cow")

    def without(self, kind: str) -> "Copies":
        """These copies but those of one kind (a fault a test plants: a dropped copy)."""
        require(kind in COPY_KINDS, f"copy kinds are {COPY_KINDS}, got {kind!r}")
        return Copies(tuple(phase for phase in self.phases if phase.kind != kind))

    def __len__(self) -> int:
        return sum(len(phase.pairs) for phase in self.phases)


class _Phase:
    """A phase being collected: its pairs and the blocks they read and write."""

    __slots__ = ("kind", "pairs", "sources", "targets")

    def __init__(self, kind: str):
        self.kind, self.pairs, self.sources, self.targets = kind, [], set(), set()

    def accepts(self, kind: str, pairs: list) -> bool:
        """Whether `pairs` may join without a hazard: no destination written twice and, when source
        and destination are one pool (copy-on-write), no block read and written."""
        if kind != self.kind:
            return False
        dsts = [dst for _, dst in pairs]
        if len(set(dsts)) != len(dsts) or not self.targets.isdisjoint(dsts):
            return False
        if kind != "cow":
            return True
        return self.targets.isdisjoint(src for src, _ in pairs) and self.sources.isdisjoint(dsts)


class PendingCopies:
    def __init__(self, device: torch.device, journal):
        self.device = device
        self.journal = journal
        self.phases = []   # _Phase, in call order

    def add(self, kind: str, pairs: list) -> None:
        if not pairs:
            return
        journal = self.journal
        phase = self.phases[-1] if self.phases else None
        if phase is None or not phase.accepts(kind, pairs):
            journal.will_append(self.phases)
            phase = _Phase(kind)
            self.phases.append(phase)
        journal.will_append(phase.pairs)
        phase.pairs.extend(pairs)
        journal.add_to_set(phase.sources, [src for src, _ in pairs])
        journal.add_to_set(phase.targets, [dst for _, dst in pairs])

    def pending(self) -> list:
        """(kind, pairs) of each queued phase, in order (what the next drain returns)."""
        return [(phase.kind, list(phase.pairs)) for phase in self.phases]

    def take(self) -> Copies:
        drained = Copies(tuple(CopyPhase(phase.kind, torch.tensor(phase.pairs, dtype=torch.int64).to(self.device))
                               for phase in self.phases))
        self.journal.set(self, "phases", [])
        return drained
