"""The production side of pagedkv, four rooms with one-way imports:

    alloc  ->  sched  ->  {engine, sim}

- `pagedkv.impl.alloc`: `BlockManager` (GPU pool, CPU swap pool, prefix cache, row tables, copies);
- `pagedkv.impl.sched`: `Scheduler` (continuous batching, preemption, admission);
- `pagedkv.impl.engine`: a tiny transformer generating on the paged pieces and the real kernels
  (the only impl -> kernels arrow);
- `pagedkv.impl.sim`: capacity planner, request traces, trace-driven simulator, contiguous baseline.

The allocator and scheduler names are exported here; engine and sim are imported as subpackages
(they pull in the kernels and plotting).
"""

import importlib

#: exported name -> the room that defines it. Resolved on first use, so importing `pagedkv.impl.sim`
#: (the planner, traces) does not pay for torch, which the allocator needs.
_EXPORTS = {"BlockManager": "alloc", "Copies": "alloc", "PREEMPT_MODES": "alloc", "Prefill": "sched",
            "Scheduler": "sched", "SchedulerConfig": "sched", "SchedulerOutput": "sched"}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pagedkv.impl' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
