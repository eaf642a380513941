"""The copies an engine must perform for the block manager, queued until it drains them."""

from typing import NamedTuple

import torch

COPY_KINDS = ("swap_out", "swap_in", "cow")


class Copies(NamedTuple):
    """Pending block copies as int64 [P, 2] (src, dst) tensors, drained once per engine step and
    performed in field order, before the step's KV writes. Swap-outs go first: a block a victim
    released may be taken again in the same step (a copy-on-write target, a new tail). Swap-ins
    and copy-on-writes within one step touch disjoint blocks (both only blocks that stay live)."""

    swap_out: torch.Tensor   # (gpu, cpu)
    swap_in: torch.Tensor    # (cpu, gpu)
    cow: torch.Tensor        # (gpu, gpu)


class PendingCopies:
    def __init__(self, device: torch.device):
        self.device = device
        self.pairs = {kind: [] for kind in COPY_KINDS}

    def add(self, kind: str, pairs: list) -> None:
        self.pairs[kind] += pairs

    def take(self) -> Copies:
        drained = Copies(**{kind: torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2).to(self.device)
                            for kind, pairs in self.pairs.items()})
        self.pairs = {kind: [] for kind in COPY_KINDS}
        return drained
