"""Allocator bookkeeping, pagedkv against vLLM v1's real KVCacheManager, measured in one process.

    python bench/peers.py [--reps 3] [--steps 16] [--block-size 16] [--clock cpu|wall] [--quick]

The peer is vLLM 0.33.0's own `KVCacheManager` (with its block pool, free-block queue and request
block hasher), loaded by pagedkv's vLLM adapter (`pagedkv.fuzz.adapters.vllm_v1`, the optional
`pagedkv[vllm]` extra; on a machine without vLLM the adapter installs the pinned wheel into pagedkv's
wheel cache) and driven as vLLM's scheduler drives it. vLLM's worker-side block-table update and
slot mapping (a numpy row per request, new block ids appended each step, slots gathered from it) are
re-created in numpy, since the worker itself needs a GPU. pagedkv's side is the public `BlockManager`
API: `decode` (a decode step in one call: the append, then the batch's block tables and slot mapping,
as `append_batch`, `block_tables` and `slot_mapping` in turn would answer), `add`, `free`,
`cached_prefix_tokens`. Both sides get the batch as the same Python list (a tuple would save pagedkv
the list's memo check, `BlockManager._rows`).

Rows (block size 16, contexts of ~1000 tokens):
- decode step, 256 / 1024 / 4096 running sequences, prefix caching off and on: append one token to
  every sequence (a new block when the tail is full; with caching on, every block that fills is
  hashed and indexed), then the int32 block tables and int64 slot mapping of the batch;
- add + free of a fresh 2k-token prompt, caching off and on;
- the prefix lookup of a cached 32k-token prompt (vLLM: `get_computed_blocks` with the request's
  block hashes already computed, as its scheduler has them; pagedkv: `cached_prefix_tokens`, which
  validates every token of the prompt, then walks its content trie), and add + free of that prompt;
- the fresh-prompt and lookup rows twice: with the prompt as a Python list on both sides, and with
  pagedkv given it as an int64 numpy array (what a tokenizer returns with `return_tensors="np"`; a
  list's tokens are validated one Python object at a time, an array's in a few vectorised passes);
- memory per running sequence of ~1000 tokens (tracemalloc, bookkeeping only: both pools exist first);
- the old self-made "simple engine" baseline of bench/allocator.py, one labelled row, for reference.

Every row runs both sides in turn, `--reps` times interleaved; the table shows medians and the
ratio peer time / pagedkv time (> 1: pagedkv is faster), and the machine's load before and after.
Each call is timed by the thread's CPU clock (`--clock cpu`, the default): on a loaded machine the
wall clock (`--clock wall`) also counts the time a call waits for a core, which grows with the
call's length and so inflates the longer side (at load ~7, vLLM's 1024-sequence step read 27 ms by
the wall clock and 13.9 ms by the CPU clock). vLLM's manager is built without KV-cache events (its
engine's default; pagedkv's adapter turns them on for the conformance oracles, and undrained they
cost vLLM time and memory here).
No collection is forced before a timed call: a `gc.collect()` there leaves the caches cold and
multiplied both sides' add + free times by 3 to 5 (measured), which is not what an engine sees.
"""

import argparse
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

from pagedkv.fuzz.adapters.vllm_v1 import VERSION, VllmV1Subject
from pagedkv.impl import BlockManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allocator import SimpleEngineBooks  # noqa: E402  (a sibling script, not a package)

CONTEXT = 1000
CALLS_PER_REP = 20   # add + free and lookup calls timed per repetition and side (medians of 60 by default)
ARRAY_NOTE = " (pagedkv given an int64 array)"


def prompt(rng: random.Random, length: int) -> list:
    return [rng.randrange(32_000) for _ in range(length)]


# ---------------------------------------------------------------- the two sides

class VllmSide:
    """vLLM's manager plus its worker's block-table rows, as one engine step uses them."""

    name = f"vLLM {VERSION}"

    def __init__(self, num_blocks: int, block_size: int, caching: bool, max_seqs: int, max_blocks: int):
        self.subject = VllmV1Subject(num_blocks, block_size, prefix_caching=caching)
        self.manager, self.block_size = self.subject.manager, block_size
        self.manager.block_pool.enable_kv_cache_events = False   # the engine's default (see above)
        self.table = np.zeros((max_seqs, max_blocks), dtype=np.int32)   # the worker's BlockTable rows
        self.held = np.zeros(max_seqs, dtype=np.int64)
        self.lens = np.zeros(max_seqs, dtype=np.int64)

    def add(self, seq_id: int, tokens: list) -> None:
        self.subject.add(seq_id, tokens)

    def admit(self, seq_id: int, tokens: list) -> None:
        """`add`, then the worker's first write of the request's block-table row (decode rows)."""
        self.add(seq_id, tokens)
        (ids,) = self.manager.get_block_ids(str(seq_id))
        self.table[seq_id, :len(ids)] = ids
        self.held[seq_id], self.lens[seq_id] = len(ids), len(tokens)

    def free(self, seq_id: int) -> None:
        self.subject.free(seq_id)

    def decode_step(self, seq_ids: list, tokens: list):
        requests = self.subject.requests
        for seq_id, token in zip(seq_ids, tokens):
            request = requests[seq_id]
            request.append_output_token_ids(token)
            (new,) = self.manager.allocate_slots(request, 1).get_block_ids()
            request.num_computed_tokens += 1
            if new:   # the worker appends the step's new block ids to the request's row
                self.table[seq_id, self.held[seq_id]:self.held[seq_id] + len(new)] = new
                self.held[seq_id] += len(new)
        rows = np.asarray(seq_ids)
        self.lens[rows] += 1
        positions = self.lens[rows] - 1
        slots = self.table[rows, positions // self.block_size].astype(np.int64) * self.block_size \
            + positions % self.block_size
        width = int(self.held[rows].max())
        return torch.from_numpy(self.table[rows, :width]), torch.from_numpy(slots)

    def lookup(self, request) -> int:
        return self.manager.get_computed_blocks(request)[1]

    def cached_request(self, seq_id: int, tokens: list):
        """A request of `tokens` with its block hashes computed (vLLM hashes at request creation)."""
        s = self.subject
        return s._Request(request_id=str(seq_id), prompt_token_ids=list(tokens),
                          sampling_params=s._sampling(max_tokens=1 << 20), pooling_params=None,
                          block_hasher=s._hasher)


class PagedkvSide:
    name = "pagedkv"

    def __init__(self, num_blocks: int, block_size: int, caching: bool, max_seqs: int, max_blocks: int):
        self.bm = BlockManager(num_blocks, block_size, prefix_caching=caching, max_seqs=max_seqs,
                               max_blocks_per_seq=max_blocks)

    def add(self, seq_id: int, tokens: list) -> None:
        self.bm.add(seq_id, tokens)

    admit = add

    def free(self, seq_id: int) -> None:
        self.bm.free(seq_id)

    def decode_step(self, seq_ids: list, tokens: list):
        step = self.bm.decode(seq_ids, tokens)
        return step.block_tables, step.slot_mapping

    def lookup(self, tokens: list) -> int:
        return self.bm.cached_prefix_tokens(tokens)


SIDES = (VllmSide, PagedkvSide)


# ---------------------------------------------------------------- rows

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def timed(fn) -> float:
    started = clock()
    fn()
    return clock() - started


def decode_rows(num_seqs: int, caching: bool, args, rng) -> dict:
    """Median seconds per decode step for each side, after admitting `num_seqs` ~1000-token prompts."""
    B, steps = args.block_size, args.steps
    max_blocks = -(-(CONTEXT + B + steps * args.reps + 1) // B) + 1
    num_blocks = num_seqs * max_blocks
    prompts = [prompt(rng, CONTEXT + rng.randrange(B)) for _ in range(num_seqs)]
    sides = [side(num_blocks, B, caching, num_seqs, max_blocks) for side in SIDES]
    seq_ids = list(range(num_seqs))
    for side in sides:
        for seq_id, tokens in enumerate(prompts):
            side.admit(seq_id, tokens)
        side.decode_step(seq_ids, [0] * num_seqs)   # untimed: each side's first step after the prefills
    times = {side.name: [] for side in sides}
    for rep in range(args.reps):
        for side in sides:
            gc.collect()
            for step in range(steps):
                tokens = [(rep * steps + step + s) % 32_000 for s in seq_ids]
                times[side.name].append(timed(lambda: side.decode_step(seq_ids, tokens)))
    return {name: statistics.median(t) for name, t in times.items()}


def add_free_rows(length: int, caching: bool, cached: bool, args, rng, as_array: bool = False) -> dict:
    """Median seconds of add + free of one prompt: fresh each time, or one already cached. With
    `as_array`, pagedkv is given the prompt as an int64 numpy array (vLLM always a list)."""
    B = args.block_size
    num_blocks = 2 * (-(-length // B)) + 8
    sides = [side(num_blocks, B, caching, 4, -(-length // B) + 1) for side in SIDES]
    fixed = prompt(rng, length)
    for side in sides:   # warm the cache with the fixed prompt (released blocks stay indexed)
        side.add(0, fixed)
        side.free(0)
    times = {side.name: [] for side in sides}
    for rep in range(args.reps * CALLS_PER_REP):
        tokens = fixed if cached else prompt(rng, length)
        for side in sides:
            given = np.array(tokens, dtype=np.int64) if as_array and side.name == PagedkvSide.name else tokens
            times[side.name].append(timed(lambda: (side.add(1, given), side.free(1))))
    return {name: statistics.median(t) for name, t in times.items()}


def lookup_rows(length: int, args, rng, as_array: bool = False) -> dict:
    B = args.block_size
    num_blocks = -(-length // B) + 8
    vllm, paged = (side(num_blocks, B, True, 4, -(-length // B) + 1) for side in SIDES)
    tokens = prompt(rng, length)
    for side in (vllm, paged):
        side.add(0, tokens)
        side.free(0)
    request = vllm.cached_request(1, tokens)
    given = np.array(tokens, dtype=np.int64) if as_array else tokens
    assert vllm.lookup(request) == paged.lookup(given) == (length - 1) // B * B, "both must hit every full block"
    times = {vllm.name: [], paged.name: []}
    for _ in range(args.reps * CALLS_PER_REP):
        times[vllm.name].append(timed(lambda: vllm.lookup(request)))
        times[paged.name].append(timed(lambda: paged.lookup(given)))
    return {name: statistics.median(t) for name, t in times.items()}


def memory_rows(num_seqs: int, args, rng) -> dict:
    """Bytes of bookkeeping per running sequence of ~1000 tokens (caching on), pools built first."""
    B = args.block_size
    max_blocks = -(-(CONTEXT + B) // B) + 1
    prompts = [prompt(rng, CONTEXT + rng.randrange(B)) for _ in range(num_seqs)]
    result = {}
    for side_type in SIDES:
        gc.collect()
        tracemalloc.start()
        side = side_type(num_seqs * max_blocks, B, True, num_seqs, max_blocks)
        before = tracemalloc.get_traced_memory()[0]
        for seq_id, tokens in enumerate(prompts):
            side.admit(seq_id, tokens)
        gc.collect()
        result[side.name] = (tracemalloc.get_traced_memory()[0] - before) / num_seqs
        tracemalloc.stop()
        del side
    return result


def baseline_row(num_seqs: int, args, rng) -> float:
    """bench/allocator.py's simple-engine baseline, decode step (seconds, median)."""
    B = args.block_size
    books = SimpleEngineBooks(num_seqs * (-(-(CONTEXT + B + args.steps) // B) + 1), B)
    for seq_id in range(num_seqs):
        books.add(seq_id, prompt(rng, CONTEXT + rng.randrange(B)))
    seq_ids = list(range(num_seqs))
    return statistics.median(timed(lambda: books.decode_step(seq_ids, seq_ids)) for _ in range(args.steps))


# ---------------------------------------------------------------- the table

def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="pagedkv vs vLLM v1 allocator bookkeeping")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions per row")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per repetition")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="time each call by the thread's CPU time (default) or the wall clock")
    parser.add_argument("--quick", action="store_true", help="256 sequences only, smaller prompts (a smoke run)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.steps < 1 or args.block_size < 1:
        parser.error("--reps, --steps and --block-size must be >= 1")
    global clock
    clock = CLOCKS[args.clock]
    rng = random.Random(0)
    load_before = os.getloadavg()
    sizes = (256,) if args.quick else (256, 1024, 4096)
    rows = []
    for caching in (False, True):
        for n in sizes:
            rows.append((f"decode step, {n} seqs, caching {'on' if caching else 'off'}", decode_rows(n, caching, args, rng)))
    long = 4096 if args.quick else 32_768
    for caching in (False, True):
        for as_array in (False, True):
            rows.append((f"add + free, fresh 2k prompt, caching {'on' if caching else 'off'}"
                         f"{ARRAY_NOTE if as_array else ''}", add_free_rows(2048, caching, False, args, rng, as_array)))
    for as_array in (False, True):
        rows.append((f"prefix lookup, cached {long // 1024}k prompt{ARRAY_NOTE if as_array else ''}",
                     lookup_rows(long, args, rng, as_array)))
    rows.append((f"add + free, cached {long // 1024}k prompt", add_free_rows(long, True, True, args, rng)))
    memory = memory_rows(256 if args.quick else 1024, args, rng)
    baseline = baseline_row(sizes[-1], args, rng)
    load_after = os.getloadavg()

    peer, ours = VllmSide.name, PagedkvSide.name
    print(f"block size {args.block_size}, contexts ~{CONTEXT} tokens, {args.reps} interleaved reps, {args.clock} clock; "
          f"load (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f}; {os.cpu_count()} cores")
    print(f"| case | {peer} | {ours} | ratio |")
    print("|---|---:|---:|---:|")
    for case, times in rows:
        print(f"| {case} | {fmt_time(times[peer])} | {fmt_time(times[ours])} | {times[peer] / times[ours]:.1f}x |")
    print(f"| memory per running sequence (~{CONTEXT} tokens, caching on) | {memory[peer] / 1024:.1f} KiB | "
          f"{memory[ours] / 1024:.1f} KiB | {memory[peer] / memory[ours]:.1f}x |")
    print(f"| (reference) simple-engine baseline of bench/allocator.py, decode step, {sizes[-1]} seqs | "
          f"{fmt_time(baseline)} | {fmt_time(rows[len(sizes) - 1][1][ours])} | {baseline / rows[len(sizes) - 1][1][ours]:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
