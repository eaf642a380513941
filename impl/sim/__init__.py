"""Capacity and workload tools over the allocator: the capacity `planner`, request `trace`s, the
trace-driven `simulator` (paged `Scheduler` + `BlockManager`, or the `contiguous` first-fit
baseline) and its `report` (tables, CSV/JSON, plots). Import the modules by name."""
