"""The production allocator: `BlockManager` and the pieces it is built from (one job per file)."""

from .block_manager import PREEMPT_MODES, BlockManager
from .copies import Copies

__all__ = ["BlockManager", "Copies", "PREEMPT_MODES"]
