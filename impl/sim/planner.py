"""Capacity planning for a paged KV pool: how many blocks a byte budget buys, and how many requests fit.

All sizes are exact integers of bytes; binary units (KiB, MiB, GiB = 2^10, 2^20, 2^30) only appear
when printing. The pool is one device's budget for KV, measured after weights and workspace.

Tensor parallelism: each rank stores `kv_heads / tp` heads when `tp` divides `kv_heads`. When `tp`
exceeds `kv_heads`, engines replicate each KV head across `tp / kv_heads` ranks, so every rank still
stores one whole head; the replicated head is not divided again. Any other pairing (neither divides
the other) is rejected because no engine shards KV heads that way.
"""
import math
from dataclasses import asdict, dataclass

from pagedkv.spec.blocks import blocks_needed

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

KiB, MiB, GiB = 2**10, 2**20, 2**30


class PlanError(ValueError):
    """The model shape or pool does not describe a configuration an engine could run."""


@dataclass(frozen=True)
class CapacityPlan:
    """Request fields are None when no request length was given."""
    bytes_per_token: int      # K and V of one token, all layers, the heads this rank stores
    block_bytes: int          # one block of `block_size` tokens
    num_blocks: int           # whole blocks the pool holds
    blocks_per_request: int | None
    max_requests: int | None
    leftover_blocks: int | None   # blocks left once `max_requests` are placed
    leftover_bytes: int       # pool bytes too few to form one more block

    def to_dict(self) -> dict:
        return asdict(self)


def _require_positive(**values):
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlanError(f"{name} must be an integer, got {value!r}")
        if value <= 0:
            raise PlanError(f"{name} must be positive, got {value}")


def kv_heads_per_rank(kv_heads: int, tp: int = 1) -> int:
    _require_positive(kv_heads=kv_heads, tp=tp)
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1  # each head is replicated on tp / kv_heads ranks
    raise PlanError(f"tp={tp} neither divides nor is a multiple of kv_heads={kv_heads}")


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str, tp: int = 1) -> int:
    """2 (K and V) × layers × KV heads on this rank × head_dim × bytes per element."""
    _require_positive(layers=layers, head_dim=head_dim)
    return 2 * layers * kv_heads_per_rank(kv_heads, tp) * head_dim * dtype_bytes(dtype)


def blocks_for(tokens: int, block_size: int) -> int:
    _require_positive(tokens=tokens, block_size=block_size)
    return blocks_needed(tokens, block_size)


def plan(layers: int, kv_heads: int, head_dim: int, dtype: str, block_size: int,
         pool_bytes: int, tokens_per_request: int | None = None, tp: int = 1) -> CapacityPlan:
    """Requests fit in whole blocks and never share them, so this is the no-sharing worst case."""
    _require_positive(block_size=block_size, pool_bytes=pool_bytes,
                      tokens_per_request=tokens_per_request)
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim, dtype, tp)
    block_bytes = block_size * per_token
    num_blocks, leftover_bytes = divmod(pool_bytes, block_bytes)
    per_request = max_requests = leftover_blocks = None
    if tokens_per_request is not None:
        per_request = blocks_for(tokens_per_request, block_size)
        max_requests, leftover_blocks = divmod(num_blocks, per_request)
    return CapacityPlan(per_token, block_bytes, num_blocks, per_request, max_requests,
                        leftover_blocks, leftover_bytes)


def gib_to_bytes(gib: float) -> int:
    """Whole bytes in `gib` GiB, rounded down: a fraction of a byte holds no KV."""
    if not (math.isfinite(gib) and gib > 0):
        raise PlanError(f"pool size must be positive, got {gib} GiB")
    return int(gib * GiB)


def format_bytes(n: int) -> str:
    """Exact bytes plus the largest binary unit that keeps the figure at or above 1."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n:,} B ({n / size:,.2f} {unit})"
    return f"{n:,} B"
