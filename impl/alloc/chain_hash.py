"""Chained block hashes of the production prefix cache.

They differ from the spec's on purpose (xxhash or sha256 instead of Python's `hash`): a hash only
names a block's content; every hit is confirmed by the content itself (`prefix_cache.py`).
"""

import hashlib
import struct
from typing import Callable, Optional

import xxhash

ChainHash = Callable[[Optional[int], tuple], int]


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
