"""Continuous batching over the allocator: `Scheduler`, its config and per-step output."""

from .scheduler import Prefill, Scheduler, SchedulerConfig, SchedulerOutput

__all__ = ["Prefill", "Scheduler", "SchedulerConfig", "SchedulerOutput"]
