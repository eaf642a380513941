"""Host time of one paged_decode call, kernel launch stubbed out (runs on a CPU).

What a decode step costs on the host before the GPU does anything: argument checks, host
metadata, split choice, output allocation, grid. The Triton kernels are replaced by a recorder, so
the figures are pure host work. Rows: 32, 256 and 4096 sequences of ~1000 tokens (block size 16,
32 query / 8 KV heads, head dim 128, fp16), for

    host+validate   seq_lens_host and block_tables_host given, block ids checked (production)
    host            seq_lens_host given, validate=False
    graph           validate=False, max_seq_len only: nothing read (CUDA-graph mode)
    default         no host metadata: seq_lens and block_tables copied to the host (on a GPU
                    these are two device-to-host syncs; on a CPU the copies are free, so this row
                    understates its GPU cost)

It also counts the torch calls each launch makes (a TorchFunctionMode): a constant count across
batch sizes means no per-sequence Python work; the remaining growth in time is vectorised torch
work on the host copies (the block-id check reads S x max_blocks ids).

    python bench/launch.py [--reps N] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.overrides import TorchFunctionMode

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pagedkv.kernels as K  # noqa: E402
from pagedkv.kernels import attention, decode  # noqa: E402

BATCHES = (32, 256, 4096)
BLOCK, KV_HEADS, GROUP, HEAD_DIM, CONTEXT = 16, 8, 4, 128, 1000


class _Stub:
    """Stands in for a @triton.jit kernel: kernel[grid](...) does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


class _CountCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def batch(num_seqs: int, gen: torch.Generator) -> dict:
    """A decode batch. The cache is one block expanded over the pool: the host path reads only its
    shape and strides, and a real 4096 x 64-block fp16 pool would need 8.6 GB."""
    lens = torch.randint(CONTEXT // 2, CONTEXT + CONTEXT // 2, (num_seqs,), generator=gen, dtype=torch.int32)
    max_blocks = -(-int(lens.max()) // BLOCK)
    num_blocks = num_seqs * max_blocks
    tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(num_seqs, max_blocks)
    cache = torch.zeros(1, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.float16).expand(num_blocks, -1, -1, -1)
    q = torch.zeros(num_seqs, KV_HEADS * GROUP, HEAD_DIM, dtype=torch.float16)
    return dict(q=q, k_cache=cache, v_cache=cache, block_tables=tables, seq_lens=lens)


def modes(b: dict) -> dict:
    capacity = b["block_tables"].shape[1] * BLOCK
    lens_host, tables_host = b["seq_lens"].clone(), b["block_tables"].clone()
    return {
        "host+validate": dict(seq_lens_host=lens_host, block_tables_host=tables_host),
        "host": dict(seq_lens_host=lens_host, validate=False),
        "graph": dict(validate=False, max_seq_len=capacity),
        "default": dict(),
    }


def time_call(b: dict, extra: dict, reps: int) -> tuple[float, int]:
    """Median host time (µs) of one call, and the torch calls it makes."""
    K.paged_decode(**b, **extra)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        K.paged_decode(**b, **extra)
        samples.append(time.perf_counter() - t0)
    with _CountCalls() as mode:
        K.paged_decode(**b, **extra)
    return statistics.median(samples) * 1e6, mode.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: stable figures on a shared machine)")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    attention._paged_attention_kernel = _Stub()
    decode._combine_splits_kernel = _Stub()
    gen = torch.Generator().manual_seed(0)
    batches = {n: batch(n, gen) for n in BATCHES}
    results = {n: {m: time_call(batches[n], extra, opts.reps) for m, extra in modes(batches[n]).items()}
               for n in BATCHES}
    names = list(results[BATCHES[0]])
    print(f"paged_decode host time per call, kernels stubbed; load {os.getloadavg()[0]:.1f}, "
          f"{opts.threads} thread(s), {opts.reps} reps, median µs (torch calls)")
    print(f"{'mode':<15}" + "".join(f"{f'S={n}':>18}" for n in BATCHES) + f"{'4096/32':>10}")
    for m in names:
        row = "".join(f"{results[n][m][0]:>10.0f} ({results[n][m][1]:>3})" for n in BATCHES)
        ratio = results[BATCHES[-1]][m][0] / results[BATCHES[0]][m][0]
        print(f"{m:<15}{row}{ratio:>9.1f}x")
    flat = all(len({results[n][m][1] for n in BATCHES}) == 1 for m in names)
    print("torch calls per launch are the same at every batch size: no per-sequence Python work"
          if flat else "torch calls per launch grow with the batch: per-sequence work on the host path")


if __name__ == "__main__":
    main()
