"""The cache-operation sweep of ``pagedkv check`` (check ``kernels``, for pagedkv's own kernels).

``run_cache_ops_sweep(profile)`` draws seeded cases of ``write_kv`` (slots shuffled over a larger
cache, every fourth slot -1: skipped) followed by ``copy_blocks`` and compares the caches with the
same writes and copies done by plain torch indexing, exactly. The attention kernels are swept by
``pagedkv.fuzz.kernel_kit.check`` (through the kernel protocol, so the same sweep tests anyone's
kernel), which calls this for the ``pagedkv`` target; the kernels room itself imports nothing of ours.
"""

from __future__ import annotations

import random

import torch

from . import copy_blocks, write_kv

PROFILES = {"ci": dict(cases=4, seed=20240601), "dev": dict(cases=16, seed=20240602),
            "deep": dict(cases=60, seed=20240603)}


def _cache_ops_case(rng: random.Random, device: str) -> tuple[bool, str]:
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


def run_cache_ops_sweep(profile: str) -> tuple[int, list[str]]:
    """(cases run, failure messages) of the write_kv + copy_blocks sweep sized by `profile`."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    cfg = PROFILES[profile]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = random.Random(cfg["seed"])
    failures = []
    for i in range(cfg["cases"]):
        try:
            ok, msg = _cache_ops_case(rng, device)
        except Exception as exc:  # a crash is a failure of the check, reported, not raised
            ok, msg = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            failures.append(f"cache ops case {i}: {msg}")
    return cfg["cases"], failures
