"""Designed kernel cases: the multi-tile grid, ports of peers' test grids, and seeded random draws.

A kernel walks a sequence's keys in tiles of T tokens (T = 16..128 in every kernel we know) while
the cache hands them out in blocks of B slots. Bugs live where the two disagree: a sequence that
needs several tiles, a length that is no multiple of T or B, B not dividing T (B = 3, 5, 6, 24, 48,
128 against T = 16, 32, 64) and T not dividing B (T = 32 or 64 against B = 24, 48, 96), and tables
that name one block twice. The corpus that `gen-kernel-tests` wrote before had sequences of at most
22 tokens (one tile), so a kernel computing a slot as ``offset_in_tile % B`` passed all of it.

Every case here is a *slots* case (`kernel_corpus`): shuffled block ids from a pool twice the size
needed, NaN in every slot no sequence reads, and each table padded with a block nobody reads (all
NaN), so reading past a sequence's last block shows. Sizes are scaled for Triton's interpreter.
"""

from __future__ import annotations

import random

from ..kernel_corpus import Heads, make_case

#: Key-tile widths the lengths are placed around.
TILES = (16, 32, 64)
#: Block sizes that do not divide the tiles, tiles that do not divide them, and powers of two.
BLOCK_SIZES = (1, 3, 5, 6, 16, 24, 48, 128)
#: GQA with a group that is no power of two, and a head dim every kernel we know supports (vLLM's >= 32).
SMALL = Heads(num_kv_heads=1, group=3, head_dim=32)


def slots_case(kind: str, *, block_size: int, heads: Heads, lengths: list[int], seed: int,
               q_lens: list[int] | None = None, options: dict | None = None, share: int = 0,
               repeat_in_row: bool = False, source: str | None = None) -> dict:
    """A slots case. Sequence i > 0 reuses the first `share` blocks of sequence 0 (repeated ids
    between rows); with `repeat_in_row` the longest sequence's last block id is its first one as well."""
    rng = random.Random(seed)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = 2 * sum(need) + 2
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    pad_block, ids = ids[0], ids[1:]
    tables, used = [], 0
    for i, count in enumerate(need):
        shared = tables[0][:min(share, count, need[0])] if i and share else []
        own = ids[used:used + count - len(shared)]
        used += len(own)
        tables.append(shared + own)
    if repeat_in_row:
        longest = max(range(len(lengths)), key=lambda i: need[i])
        if need[longest] >= 2:
            tables[longest][-1] = tables[longest][0]
    width = max(need) + 1
    seqs = [{"length": n, "table": table + [pad_block] * (width - len(table)),
             "queries": 1 if q_lens is None else q_lens[i]}
            for i, (n, table) in enumerate(zip(lengths, tables))]
    return make_case(kernel=kind, block_size=block_size, num_blocks=num_blocks, heads=heads,
                     kv_seed=rng.randrange(2 ** 32), query_seed=rng.randrange(2 ** 32), seqs=seqs,
                     options=options, source=source)


def tile_grid(profile: str) -> list[dict]:
    """Decode and prefill batches whose lengths sit around 1, 2 and 3 tiles of every width in TILES,
    at every block size of BLOCK_SIZES; the ci profile keeps block sizes that break tile maths, two of
    them multiples of 16 (48, 128: what kernels restricted to such blocks, like vLLM's, declare)."""
    sizes = (3, 24, 48, 128) if profile == "ci" else BLOCK_SIZES
    cases = []
    for b, block_size in enumerate(sizes):
        around = sorted({t * k + d for t in TILES for k, d in ((1, -1), (1, 1), (2, 3), (3, -5))})
        picks = around if profile != "ci" else [17, 33, 65, 139]
        for start in range(0, len(picks), 4):
            lengths = picks[start:start + 4]
            cases.append(slots_case("decode", block_size=block_size, heads=SMALL, lengths=lengths,
                                    seed=1000 + 10 * b + start, share=1, repeat_in_row=start == 0,
                                    source=f"multi-tile grid: lengths around tiles {TILES}, B={block_size}"))
        cases.append(slots_case("prefill", block_size=block_size, heads=SMALL, lengths=[70, 33],
                                q_lens=[21, 33], seed=2000 + b,
                                source=f"multi-tile grid: chunked prefill across tiles, B={block_size}"))
    return cases


def peer_grids() -> list[dict]:
    """Ideas of other projects' kernel tests as cases, scaled for the interpreter (no code copied)."""
    h = Heads
    return [
        # vLLM tests/kernels/attention/test_triton_unified_attention.py: a mixed batch of (query_len,
        # kv_len) pairs with one decode row, a short and a long chunk, softcap 50, blocks 16 and 64.
        slots_case("prefill", block_size=16, heads=h(2, 1, 64), lengths=[166, 18, 58], q_lens=[1, 5, 33], seed=11,
                   source="vLLM unified attention: mixed (q_len, kv_len) batch"),
        slots_case("prefill", block_size=64, heads=h(1, 4, 64), lengths=[166, 18, 58], q_lens=[1, 5, 33], seed=12,
                   options={"softcap": 50.0}, source="vLLM unified attention: softcap 50, block 64, GQA 4"),
        slots_case("prefill", block_size=16, heads=h(1, 4, 32), lengths=[130, 40], q_lens=[30, 1], seed=13,
                   options={"sliding_window": 16}, source="vLLM unified attention: sliding window"),
        # vLLM tests/kernels/attention/test_prefix_prefill.py: cached context + new queries, shuffled
        # cache blocks, block 32, head sizes 24 and 96 (not powers of two), 8 queries per KV head,
        # sliding windows 16 and 64.
        slots_case("prefill", block_size=32, heads=h(1, 8, 24), lengths=[53, 70, 9, 40], q_lens=[13, 20, 9, 1],
                   seed=21, source="vLLM prefix prefill: head size 24, 8 queries per KV head"),
        slots_case("prefill", block_size=32, heads=h(2, 2, 96), lengths=[90, 31], q_lens=[25, 31], seed=22,
                   options={"sliding_window": 64}, source="vLLM prefix prefill: head size 96, window 64"),
        # SGLang test/srt/test_triton_attention_kernels.py: extend over a random prefix at page size 1,
        # and grouped decode with many query heads per KV head and KV splits.
        slots_case("prefill", block_size=1, heads=h(2, 2, 32), lengths=[47, 12, 33], q_lens=[17, 12, 3], seed=31,
                   source="SGLang extend attention: page size 1, random prefix and extend lengths"),
        slots_case("decode", block_size=1, heads=h(1, 16, 32), lengths=[10, 77, 140], seed=32,
                   source="SGLang grouped decode: 16 query heads per KV head, page size 1"),
        slots_case("decode", block_size=1, heads=h(1, 16, 32), lengths=[10, 77, 140], seed=33,
                   options={"num_splits": 4}, source="SGLang grouped decode: 4 KV splits"),
        # FlashInfer tests/test_batch_decode_kernels.py: kv lengths 54 and 97 (not multiples of the
        # page), pages of 1, 8 and 16, 4 query heads per KV head, logits soft cap 30.
        slots_case("decode", block_size=8, heads=h(2, 4, 64), lengths=[54, 97, 54, 97, 1, 7], seed=41,
                   source="FlashInfer batch decode: kv_len 54/97, page 8"),
        slots_case("decode", block_size=16, heads=h(2, 4, 64), lengths=[54, 97, 33], seed=42,
                   options={"softcap": 30.0}, source="FlashInfer batch decode: logits soft cap 30, page 16"),
        # FlashAttention tests/test_flash_attn.py (test_flash_attn_kvcache, paged): block tables from a
        # permutation of the pool, blocks of 256 (larger than any tile), lengths within one block and
        # across two. Its tolerance rule, max|out - ref| <= k x max|naive - ref| + atol, is the one
        # pagedkv.kernels.testing.compare applies.
        slots_case("decode", block_size=256, heads=h(1, 2, 64), lengths=[70, 300, 256], seed=51,
                   source="FlashAttention paged KV cache: block 256"),
        slots_case("prefill", block_size=256, heads=h(1, 2, 64), lengths=[300, 80], q_lens=[44, 80], seed=52,
                   options={"causal": False}, source="FlashAttention paged KV cache: non-causal, block 256"),
    ]


def random_cases(count: int, *, seed: int, long: int) -> list[dict]:
    """`count` seeded draws over block sizes, GQA groups, head dims, lengths (edge lengths around
    the block and the tiles, up to `long`), windows, softcaps, split counts and causality."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        block_size = rng.choice([1, 3, 5, 8, 16, 24, 32, 48, 128])
        heads = Heads(rng.choice([1, 2]), rng.choice([1, 2, 3, 5, 8]), rng.choice([16, 24, 64, 80, 128]))
        pool = [0, 1, block_size - 1 or 1, block_size, block_size + 1, 2 * block_size + 1,
                *(t + d for t in TILES for d in (-1, 1)), rng.randint(1, long)]
        lengths = rng.sample(pool, k=rng.randint(1, 4))
        options = {"sliding_window": rng.choice([None, None, rng.randint(1, 50)]),
                   "softcap": rng.choice([None, None, round(rng.uniform(1.0, 50.0), 3)])}
        if rng.random() < 0.5:
            options["num_splits"] = rng.choice([None, None, 2, 4])
            cases.append(slots_case("decode", block_size=block_size, heads=heads, lengths=lengths,
                                    seed=rng.randrange(2 ** 32), options=options, share=rng.choice([0, 0, 1]),
                                    source="random draw"))
        else:
            options["causal"] = rng.random() < 0.8
            q_lens = [rng.randint(0, n) for n in lengths]
            cases.append(slots_case("prefill", block_size=block_size, heads=heads, lengths=lengths, q_lens=q_lens,
                                    seed=rng.randrange(2 ** 32), options=options, source="random draw"))
    return cases


def designed_corpus(profile: str) -> list[dict]:
    """What `gen-kernel-tests` writes next to the state-machine corpus: the tile grid and the peers."""
    return tile_grid(profile) + peer_grids()
