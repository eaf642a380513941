"""Keys of block prefixes for the prefix index: a 64-bit hash of every token up to a block's end,
computed for a whole batch of blocks, or a whole prompt, in a few numpy passes.

A key only *finds* candidates; the index confirms every candidate by its content (the tokens) and
its parent, so two prefixes with one key are still told apart (tokens `t` and `t + 2**61 - 1`, which
share Python's integer hash, included). The hash is therefore chosen for speed and spread, not for
resistance to crafted collisions: those cost a slower path, never a wrong hit.

- A block's own hash is multilinear over its tokens (token j times a fixed odd 64-bit multiplier
  for position j, summed mod 2**64), then folded (the high half xored into the low): bit k of a
  product depends on the token's bits 0..k only, so folded bit i depends on bits 0..32+i, and the
  low bits, which pick a dict slot, depend on every bit of any token id below 2**33 (every real
  vocabulary). Larger ids that differ only in high bits may share low bits: a slower probe, never
  a wrong hit.
- A prefix's key chains its blocks' hashes: key(k) = key(k-1) * P + hash(k) mod 2**64, with
  key(-1) = ROOT. For a run of consecutive blocks that is a prefix sum, so a whole prompt is keyed
  with one prefix sum: key(k) = P**k * (start * P + sum over i <= k of hash(i) * P**-i).
"""

import numpy as np

MASK = (1 << 64) - 1
P = 0x9E3779B97F4A7C15             # odd, so invertible mod 2**64
P_INVERSE = pow(P, -1, 1 << 64)
ROOT = 0x243F6A8885A308D3          # the key "before" a sequence's first block
_FOLD = np.uint64(32)
_P = np.uint64(P)


class ContentKeys:
    """The block hash and the prefix chain for one block size (multipliers fixed: reproducible)."""

    def __init__(self, block_size: int):
        rng = np.random.default_rng(0x5EED)
        self.multipliers = rng.integers(0, 1 << 63, block_size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._p_powers = np.ones(1, dtype=np.uint64)        # P**k, then P**-k, for k < len: grown on demand
        self._inverse_powers = np.ones(1, dtype=np.uint64)

    def block_hashes(self, rows: np.ndarray) -> np.ndarray:
        """uint64 hash of each row of an [n, block_size] int64 array of tokens."""
        return self.word_hashes(rows.view(np.uint64))

    def word_hashes(self, words: np.ndarray) -> np.ndarray:
        """`block_hashes` of the tokens viewed as uint64 (a decode step reads a view made once)."""
        h = words @ self.multipliers   # integer matmul wraps mod 2**64, as a sum would
        h ^= h >> _FOLD   # one pass: a decode step pays for each
        return h

    def block_hash(self, row: np.ndarray) -> int:
        """`block_hashes` of one row of int64 tokens, as a Python int (a lookup's candidate for the
        next run, the invariant check: the fold in Python costs less than two array passes)."""
        h = int(row.view(np.uint64) @ self.multipliers)
        return h ^ (h >> 32)

    def after(self, parent_keys: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Keys of blocks that each follow their own parent prefix (uint64 arrays, elementwise)."""
        return parent_keys * _P + hashes

    def chain(self, start: int, hashes: np.ndarray) -> np.ndarray:
        """Keys of consecutive blocks after the prefix keyed `start` (a Python int)."""
        n = len(hashes)
        self._grow_powers(n)
        sums = np.add.accumulate(hashes * self._inverse_powers[:n])   # (np.cumsum costs 2 us more)
        sums += np.uint64((start * P) & MASK)
        sums *= self._p_powers[:n]
        return sums

    def _grow_powers(self, n: int) -> None:
        if len(self._p_powers) >= n:
            return
        size = max(n, 2 * len(self._p_powers))
        powers = np.cumprod(np.full(size, P, dtype=np.uint64), dtype=np.uint64) * np.uint64(P_INVERSE)
        inverses = np.cumprod(np.full(size, P_INVERSE, dtype=np.uint64), dtype=np.uint64) * np.uint64(P)
        self._p_powers, self._inverse_powers = powers, inverses   # one statement: never half grown


def dict_keys(keys: np.ndarray) -> list:
    """The Python ints the index files uint64 keys under: the keys themselves (an int of 64 bits
    hashes and converts as fast as one below 2**61; a shift would be one more array pass)."""
    return keys.tolist()


def dict_key(key: int) -> int:
    """The dict key of one key (the sequential paths; a test squeezes keys through it)."""
    return key


def step(parent_key: int, block_hash: int) -> int:
    """One link of the chain in Python ints (the sequential paths)."""
    return (parent_key * P + block_hash) & MASK
