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

from .alloc import PREEMPT_MODES, BlockManager, Copies
from .sched import Prefill, Scheduler, SchedulerConfig, SchedulerOutput

__all__ = ["BlockManager", "Copies", "PREEMPT_MODES", "Prefill", "Scheduler", "SchedulerConfig",
           "SchedulerOutput"]
