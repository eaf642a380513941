"""Block-table memory and lock time with one long sequence among many short ones (issue 12, item 4).

A pool at block size 1 holds `--short` sequences of `--short-len` tokens and one of `--long-len`
tokens. Measured on `BlockManager`:

- table bytes: host memory of the row tables (`rows.nbytes`) after the long prompt, against the
  int32 ids the tables hold (4 bytes per block held by each sequence);
- `add` of the long prompt, then one `append` to it and to a short sequence, and a decode step of
  the short batch (`append_batch` + `block_tables` + `slot_mapping`), in seconds. Every call holds
  the manager's lock throughout, so these are also the longest lock holds.

Run: python bench/table_memory.py [--long-len 1000000] [--short 256] [--short-len 64]
"""

import argparse
import time

import numpy as np

from pagedkv.impl import BlockManager


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(long_len: int, num_short: int, short_len: int) -> dict:
    bm = BlockManager(long_len + num_short * (short_len + 8) + 8, 1, max_seqs=num_short + 1)
    rng = np.random.default_rng(0)
    short_ids = list(range(1, num_short + 1))
    for seq_id in short_ids:
        bm.add(seq_id, rng.integers(0, 32000, short_len).tolist())
    long_prompt = rng.integers(0, 32000, long_len).tolist()
    result = {"add long prompt (s)": timed(lambda: bm.add(0, long_prompt))}
    held = sum(len(bm.block_table(s)) for s in bm.seq_ids())
    result["table bytes"] = bm.rows.nbytes
    result["bytes of ids held"] = 4 * held
    result["append to the long one (s)"] = timed(lambda: bm.append(0, 1))
    result["append to a short one (s)"] = timed(lambda: bm.append(1, 1))
    tokens = rng.integers(0, 32000, num_short)

    def decode_step():
        bm.append_batch(short_ids, tokens)
        bm.block_tables(short_ids)
        bm.slot_mapping(short_ids)

    decode_step()
    result["short decode step (s)"] = min(timed(decode_step) for _ in range(5))
    result["free the long one (s)"] = timed(lambda: bm.free(0))
    result["table bytes after free"] = bm.rows.nbytes
    bm.check()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-len", type=int, default=1_000_000)
    parser.add_argument("--short", type=int, default=256)
    parser.add_argument("--short-len", type=int, default=64)
    args = parser.parse_args()
    result = measure(args.long_len, args.short, args.short_len)
    print(f"block size 1; {args.short} sequences of {args.short_len} tokens and one of {args.long_len}")
    for name, value in result.items():
        text = f"{value / 2 ** 20:10.2f} MiB" if "bytes" in name else f"{value:10.4f} s"
        print(f"{name:32} {text}")


if __name__ == "__main__":
    main()
