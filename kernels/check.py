"""Kernel differential sweep for ``pagedkv check``.

``run_kernel_check(profile)`` draws seeded random cases (decode with every split path, prefill with
cached prefixes and decode rows, write_kv and copy_blocks), runs the Triton kernels (natively on
CUDA, under the interpreter elsewhere) and compares them with the dense float32 reference under
the FlashAttention-style tolerance of ``testing.compare``. Profiles size the sweep:

    ci    ~20 cases, small shapes   (< 60 s on a 2-core CPU under the interpreter)
    dev   ~80 cases
    deep  ~300 cases, longer sequences
"""

from __future__ import annotations

import random
import time

import torch

from . import copy_blocks, paged_decode, paged_prefill, reference_decode, reference_prefill, write_kv
from .testing import compare, edge_lengths, make_case

PROFILES = {
    "ci": dict(cases=20, long=60, seed=20240601),
    "dev": dict(cases=80, long=200, seed=20240602),
    "deep": dict(cases=300, long=600, seed=20240603),
}


def _attention_case(rng: random.Random, long: int, device: str, dtypes: list):
    block_size = rng.choice([1, 3, 8, 16, 32, 128])
    group = rng.choice([1, 2, 5, 8])
    kv_heads = rng.choice([1, 2])
    head_dim = rng.choice([64, 80, 96, 128, 256])
    dtype = rng.choice(dtypes)
    pool = edge_lengths(block_size, rng.randint(block_size, max(long, block_size)))
    lens = rng.sample(pool, k=rng.randint(1, 4))
    window = rng.choice([None, None, rng.randint(1, 50)])
    softcap = rng.choice([None, None, rng.uniform(1.0, 50.0)])
    decode = rng.random() < 0.5
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    if decode:
        splits = rng.choice([1, 2, 4, None])
        case = make_case(lens, block_size=block_size, num_kv_heads=kv_heads, group=group, head_dim=head_dim,
                         dtype=dtype, device=device, generator=gen)
        out = paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                           sliding_window=window, softcap=softcap, num_splits=splits)
        cpu = [t.cpu() for t in (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)]
        ref = reference_decode(*cpu, sliding_window=window, softcap=softcap)
        naive = reference_decode(*cpu, sliding_window=window, softcap=softcap, compute_dtype=dtype)
        what = f"decode B={block_size} G={group} D={head_dim} {str(dtype)[6:]} lens={lens} splits={splits}"
    else:
        q_lens = [rng.randint(0, n) for n in lens]
        causal = rng.random() < 0.8
        case = make_case(lens, q_lens=q_lens, block_size=block_size, num_kv_heads=kv_heads, group=group,
                         head_dim=head_dim, dtype=dtype, device=device, generator=gen)
        out = paged_prefill(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                            case.query_start_loc, causal=causal, sliding_window=window, softcap=softcap)
        cpu = [t.cpu() for t in (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                 case.query_start_loc)]
        ref = reference_prefill(*cpu, causal=causal, sliding_window=window, softcap=softcap)
        naive = reference_prefill(*cpu, causal=causal, sliding_window=window, softcap=softcap, compute_dtype=dtype)
        what = f"prefill B={block_size} G={group} D={head_dim} {str(dtype)[6:]} lens={lens} q_lens={q_lens}"
    ok, msg = compare(out.cpu(), ref, naive, dtype)
    return ("decode" if decode else "prefill"), ok, f"{what} window={window} softcap={softcap}: {msg}"


def _cache_ops_case(rng: random.Random, device: str):
    block_size = rng.choice([1, 3, 16])
    num_blocks, heads, d, t = 6, 2, 64, 12
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    k = torch.randn(num_blocks + t, block_size, heads, d, generator=gen).to(device)
    v = torch.randn_like(k)
    slots = torch.randperm(k.shape[0] * block_size, generator=gen)[:t]
    slots[::4] = -1
    key = torch.randn(t, heads, d, generator=gen).to(device)
    value = torch.randn(t, heads, d, generator=gen).to(device)
    ek, ev = k.clone(), v.clone()
    keep = slots >= 0
    s = slots[keep].to(device)
    ek[s // block_size, s % block_size] = key[keep.to(device)]
    ev[s // block_size, s % block_size] = value[keep.to(device)]
    write_kv(key, value, k, v, slots.to(device))
    ok_w = torch.equal(k, ek) and torch.equal(v, ev)
    ids = rng.sample(range(k.shape[0]), 4)
    pairs = torch.tensor([[ids[0], ids[2]], [ids[1], ids[3]]], dtype=torch.int64)
    for src, dst in pairs.tolist():
        ek[dst] = ek[src]
        ev[dst] = ev[src]
    copy_blocks(k, v, pairs.to(device))
    ok_c = torch.equal(k, ek) and torch.equal(v, ev)
    return ok_w and ok_c, f"write_kv/copy_blocks B={block_size}: write {'ok' if ok_w else 'MISMATCH'}, copy {'ok' if ok_c else 'MISMATCH'}"


def run_kernel_check(profile: str) -> dict:
    """Run the kernel differential sweep sized by ``profile`` ("ci", "dev" or "deep")."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    cfg = PROFILES[profile]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    rng = random.Random(cfg["seed"])
    counts = {"decode": 0, "prefill": 0, "cache_ops": 0}
    failures: list[str] = []
    start = time.perf_counter()
    for i in range(cfg["cases"]):
        try:
            if i % 5 == 4:
                kind, (ok, msg) = "cache_ops", _cache_ops_case(rng, device)
            else:
                kind, ok, msg = _attention_case(rng, cfg["long"], device, dtypes)
        except Exception as exc:  # a crash is a failure of the check, reported, not raised
            kind, ok, msg = "error", False, f"case {i}: {type(exc).__name__}: {exc}"
        counts[kind] = counts.get(kind, 0) + 1
        if not ok:
            failures.append(f"case {i}: {msg}")
    elapsed = time.perf_counter() - start
    covered = (f"{cfg['cases']} cases: {counts['decode']} decode, {counts['prefill']} prefill, "
               f"{counts['cache_ops']} write_kv+copy_blocks on {device}"
               f"{' (Triton interpreter)' if device == 'cpu' else ''}")
    detail = (f"all within tolerance in {elapsed:.1f}s" if not failures
              else f"{len(failures)} failed in {elapsed:.1f}s; " + " | ".join(failures[:5]))
    return {"name": "kernels", "covered": covered, "passed": not failures, "detail": detail}


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    print(json.dumps(run_kernel_check(sys.argv[1] if len(sys.argv) > 1 else "ci"), indent=2))
