"""Pure bookkeeping helpers of the production allocator: twins of `pagedkv.spec.blocks`.

Each function keeps the contract written in the spec's docstring of the same name, so CrossHair can
compare them (`crosshair diffbehavior pagedkv.impl.hashing.slot_of pagedkv.spec.blocks.slot_of`).
The chained hashes differ from the spec's on purpose (xxhash or sha256 instead of Python's `hash`),
so their twin is `prefix_hashes` with the spec's `chain_hash` passed in.
"""

import hashlib
import struct
from typing import Callable, Optional, Sequence

import xxhash

ChainHash = Callable[[Optional[int], tuple], int]


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens: ceil(num_tokens / block_size).

    pre: num_tokens >= 0
    pre: block_size >= 1
    post: __return__ * block_size >= num_tokens
    post: (__return__ - 1) * block_size < num_tokens or __return__ == 0
    """
    return -(-num_tokens // block_size)


def slot_of(block_table: Sequence[int], position: int, block_size: int) -> int:
    """Flat cache slot of token `position`: its block's id times B plus its offset in the block.

    pre: block_size >= 1
    pre: 0 <= position < len(block_table) * block_size
    post: __return__ // block_size == block_table[position // block_size]
    post: __return__ % block_size == position % block_size
    """
    block, offset = divmod(position, block_size)
    return block_table[block] * block_size + offset


def slot_mapping(block_table: Sequence[int], start: int, stop: int, block_size: int) -> list:
    """Slots of positions start..stop-1, the tokens a forward pass writes (prefill or decode).

    pre: block_size >= 1
    pre: 0 <= start <= stop <= len(block_table) * block_size
    post: len(__return__) == stop - start
    """
    return [slot_of(block_table, position, block_size) for position in range(start, stop)]


def _block_bytes(parent_hash: Optional[int], block_tokens: tuple) -> bytes:
    # The root block has no parent bytes, so it can never alias a child whose parent hash is 0.
    parent = b"" if parent_hash is None else parent_hash.to_bytes(32, "little")
    return parent + struct.pack(f"<{len(block_tokens)}q", *block_tokens)


def xxhash_chain_hash(parent_hash: Optional[int], block_tokens: tuple) -> int:
    """64-bit xxh3 of the parent's hash and this block's tokens: fast, collisions possible."""
    return xxhash.xxh3_64_intdigest(_block_bytes(parent_hash, block_tokens))


def sha256_chain_hash(parent_hash: Optional[int], block_tokens: tuple) -> int:
    """Full 256-bit sha256, for deployments that want collisions to be out of reach."""
    return int.from_bytes(hashlib.sha256(_block_bytes(parent_hash, block_tokens)).digest(), "little")


CHAIN_HASHES = {"xxhash": xxhash_chain_hash, "sha256": sha256_chain_hash}


def prefix_hashes(tokens: Sequence[int], block_size: int, num_blocks: int,
                  chain_hash: ChainHash = xxhash_chain_hash) -> list:
    """Chained hashes of the first `num_blocks` full blocks of `tokens`.

    pre: block_size >= 1
    pre: 0 <= num_blocks <= len(tokens) // block_size
    post: len(__return__) == num_blocks
    """
    hashes, parent = [], None
    for j in range(num_blocks):
        parent = chain_hash(parent, tuple(tokens[j * block_size:(j + 1) * block_size]))
        hashes.append(parent)
    return hashes
