"""Managers in hand-built states, shared by the impl tests."""

from pagedkv.impl import BlockManager


def mixed_manager() -> BlockManager:
    """Running 1 (shared with its fork 2), waiting 3, swapped 4; 6 GPU blocks free, 1 CPU; no copies
    pending."""
    bm = BlockManager(8, 2, num_cpu_blocks=3, prefix_caching=True)
    bm.add(1, [1, 2, 3])
    bm.fork(1, 2)
    bm.add(3, [4, 5])
    bm.preempt(3, "recompute")
    bm.add(4, [6, 7, 8])
    bm.swap_out(4)
    bm.take_copies()
    return bm
