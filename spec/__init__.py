"""pagedkv.spec: the reference state machine of a paged KV-cache block manager (stdlib only).

Read `kvspec.py` first: it explains PagedAttention's bookkeeping and states every operation.
"""
from .blocks import KV, blocks_needed, expected_slots, slot_of
from .errors import (DuplicateSequence, InvalidArgument, InvalidState, InvariantViolation,
                     OutOfBlocks, PagedKVError, UnknownSequence)
from .invariants import INVARIANTS, violations
from .kvspec import PREEMPT_MODES, RUNNING, SWAPPED, WAITING, KVSpec, StepResult

__all__ = [
    "KVSpec", "StepResult", "KV", "RUNNING", "WAITING", "SWAPPED", "PREEMPT_MODES",
    "blocks_needed", "slot_of", "expected_slots",
    "INVARIANTS", "violations",
    "PagedKVError", "OutOfBlocks", "UnknownSequence", "DuplicateSequence", "InvalidState",
    "InvalidArgument", "InvariantViolation",
]
