"""Allocator bookkeeping benchmark: `BlockManager` against the way simple engines keep books.

The baseline is what a simple engine does (not the spec, which is deliberately slow): a deque free
list, a dict of Python-list block tables, one Python call per sequence per step, and the step's
block-table and slot-mapping tensors built from Python lists. Both sides do the same bookkeeping:

- decode step: append one token to every running sequence (a new block when the tail is full),
  then the int32 block tables and int64 slot mapping of the batch;
- add + free of a 2k-token prompt;
- the prefix lookup of a 32k-token prompt whose leading full blocks are all cached (baseline:
  chained xxhash per block, the hit confirmed against the block's stored tokens; impl: the public
  `cached_prefix_tokens`, which validates the prompt and walks the content trie), and add + free
  of that prompt.

Run: python bench/allocator.py [--block-size 16] [--steps 30]
"""

import argparse
import os
import random
import statistics
import time
from collections import deque

import numpy as np
import torch
import xxhash

from pagedkv.impl import BlockManager


class SimpleEngineBooks:
    """The baseline: per-sequence Python bookkeeping, as in small engines."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        self.block_size, self.prefix_caching = block_size, prefix_caching
        self.free_blocks = deque(range(num_blocks))
        self.tables, self.lengths = {}, {}
        self.hash_to_block, self.block_tokens = {}, {}

    def lookup(self, tokens: list) -> list:
        """Cached blocks of the prompt's leading full blocks: chained hash, then token check."""
        B, hits, parent = self.block_size, [], 0
        for j in range((len(tokens) - 1) // B if self.prefix_caching else 0):
            block_tokens = tokens[j * B:(j + 1) * B]
            parent = xxhash.xxh3_64_intdigest(np.array(block_tokens).tobytes(), seed=parent)
            block = self.hash_to_block.get(parent)
            if block is None or self.block_tokens[block] != block_tokens:
                break
            hits.append(block)
        return hits

    def add(self, seq_id: int, tokens: list) -> int:
        hits = self.lookup(tokens)
        table = hits + [self.free_blocks.popleft() for _ in range(-(-len(tokens) // self.block_size) - len(hits))]
        self.tables[seq_id], self.lengths[seq_id] = table, len(tokens)
        return len(hits) * self.block_size

    def cache(self, tokens: list, table: list) -> None:
        """Index a sequence's full blocks (the baseline keeps them out of the free list)."""
        B, parent = self.block_size, 0
        for j in range(len(tokens) // B):
            block_tokens = tokens[j * B:(j + 1) * B]
            parent = xxhash.xxh3_64_intdigest(np.array(block_tokens).tobytes(), seed=parent)
            self.hash_to_block[parent], self.block_tokens[table[j]] = table[j], block_tokens

    def append(self, seq_id: int, token: int) -> None:
        if self.lengths[seq_id] % self.block_size == 0:
            self.tables[seq_id].append(self.free_blocks.popleft())
        self.lengths[seq_id] += 1

    def free(self, seq_id: int) -> None:
        self.free_blocks.extend(reversed(self.tables.pop(seq_id)))
        del self.lengths[seq_id]

    def decode_step(self, seq_ids: list, tokens: list):
        for seq_id, token in zip(seq_ids, tokens):
            self.append(seq_id, token)
        tables = [self.tables[s] for s in seq_ids]
        width = max(map(len, tables))
        block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
        B = self.block_size
        slots = []
        for seq_id, table in zip(seq_ids, tables):
            position = self.lengths[seq_id] - 1
            slots.append(table[position // B] * B + position % B)
        return block_tables, torch.tensor(slots, dtype=torch.int64)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_decode(num_seqs: int, block_size: int, steps: int, rng: random.Random) -> dict:
    lengths = [rng.randint(64, 1024) for _ in range(num_seqs)]
    num_blocks = sum(-(-(n + steps * 3) // block_size) for n in lengths) + num_seqs
    base = SimpleEngineBooks(num_blocks, block_size)
    bm = BlockManager(num_blocks, block_size, max_seqs=num_seqs, max_blocks_per_seq=1024 // block_size + 8)
    for seq_id, n in enumerate(lengths):
        prompt = [rng.randrange(32000) for _ in range(n)]
        base.add(seq_id, prompt)
        bm.add(seq_id, prompt)
    seq_ids = list(range(num_seqs))
    sampled = [np.array([rng.randrange(32000) for _ in range(num_seqs)]) for _ in range(steps)]
    step = iter(range(10 ** 9))

    def impl_step():
        tokens = sampled[next(step) % steps]
        bm.append_batch(seq_ids, tokens)
        return bm.block_tables(seq_ids), bm.slot_mapping(seq_ids)

    def impl_step_new_batch():
        bm._last_batch = None   # as if the batch's membership changed: rows are looked up again
        return impl_step()

    base_step = iter(range(10 ** 9))
    base_s = median_time(lambda: base.decode_step(seq_ids, sampled[next(base_step) % steps].tolist()), steps)
    impl_s = median_time(impl_step, steps)
    impl_new_s = median_time(impl_step_new_batch, steps)
    return {"baseline": base_s, "impl": impl_s, "impl (batch changed)": impl_new_s}


def bench_add_free(prompt_len: int, block_size: int, repeats: int, rng: random.Random) -> dict:
    prompt = [rng.randrange(32000) for _ in range(prompt_len)]
    num_blocks = 4 * -(-prompt_len // block_size)
    base, bm = SimpleEngineBooks(num_blocks, block_size), BlockManager(num_blocks, block_size)

    def base_cycle():
        base.add(0, prompt)
        base.free(0)

    def impl_cycle():
        bm.add(0, prompt)
        bm.free(0)

    return {"baseline": median_time(base_cycle, repeats), "impl": median_time(impl_cycle, repeats)}


def bench_prefix(prompt_len: int, block_size: int, repeats: int, rng: random.Random) -> dict:
    """add + free of a prompt whose blocks are all cached but the last."""
    prompt = [rng.randrange(32000) for _ in range(prompt_len)]
    num_blocks = 4 * -(-prompt_len // block_size)
    base = SimpleEngineBooks(num_blocks, block_size, prefix_caching=True)
    base.add(0, prompt)
    base.cache(prompt, base.tables.pop(0))   # its blocks stay cached (and out of the free list)
    bm = BlockManager(num_blocks, block_size, prefix_caching=True)
    bm.add(0, prompt)
    bm.free(0)                               # its blocks wait, indexed, in the LRU

    def base_cycle():
        assert base.add(1, prompt) == (prompt_len - 1) // block_size * block_size
        base.tables[1] = base.tables[1][-1:]   # the shared blocks are not the baseline's to free
        base.free(1)

    def impl_cycle():
        assert bm.add(1, prompt) == (prompt_len - 1) // block_size * block_size
        bm.free(1)

    cached = (prompt_len - 1) // block_size
    assert len(base.lookup(prompt)) * block_size == bm.cached_prefix_tokens(prompt) == cached * block_size
    return {"lookup": {"baseline": median_time(lambda: base.lookup(prompt), repeats),
                       "impl": median_time(lambda: bm.cached_prefix_tokens(prompt), repeats)},
            "add+free": {"baseline": median_time(base_cycle, repeats), "impl": median_time(impl_cycle, repeats)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    rng = random.Random(0)
    torch.set_num_threads(1)
    rows = []
    for n in (256, 1024, 4096):
        rows.append((f"decode step, {n} seqs", bench_decode(n, args.block_size, args.steps, rng)))
    rows.append(("add + free, 2k-token prompt", bench_add_free(2048, args.block_size, 50, rng)))
    prefix = bench_prefix(32768, args.block_size, 20, rng)
    rows.append(("prefix lookup, 32k prompt", prefix["lookup"]))
    rows.append(("add + free, 32k prompt, prefix cached", prefix["add+free"]))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"block_size={args.block_size}; median of repeats; times in microseconds; load average {load}")
    print(f"{'case':40} {'baseline':>10} {'impl':>10} {'speedup':>8}")
    for name, result in rows:
        for variant, seconds in result.items():
            if variant == "baseline":
                continue
            label = name if variant == "impl" else f"{name} ({variant[6:-1]})"
            print(f"{label:40} {result['baseline'] * 1e6:10.1f} {seconds * 1e6:10.1f} "
                  f"{result['baseline'] / seconds:7.1f}x")


if __name__ == "__main__":
    main()
