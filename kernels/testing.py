"""Builders and tolerance rules for differential tests of the paged kernels.

Used by ``tests/kernels``; the tolerance rule (``compare``, ``RTOL_FACTOR``, ``ATOL``) also by the kernel
conformance kit (``pagedkv.fuzz.kernel_kit``), which judges anyone's kernel with it.

A case scatters random K/V for every sequence into a cache whose physical blocks are a random
permutation drawn from a pool ``pool_factor`` times larger than needed. Every slot that does not
hold a valid token is NaN, and block-table entries past a sequence's last block hold a huge bogus
id, so any read past the end (or of an unused table entry) poisons the output.

Tolerance (FlashAttention-style): with ``ref`` the float32 dense result and ``naive`` the same
dense computation rounded to the input dtype at every step,

    max|kernel - ref| <= RTOL_FACTOR * max|naive - ref| + ATOL[dtype]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RTOL_FACTOR = 3.0
ATOL = {torch.float32: 2e-5, torch.float16: 5e-4, torch.bfloat16: 4e-3}
BOGUS_BLOCK = 1 << 30


@dataclass
class PagedCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_size: int

    @property
    def lens(self) -> list[int]:
        return self.seq_lens.tolist()


def make_case(
    lens: list[int],
    *,
    block_size: int,
    num_kv_heads: int = 2,
    group: int = 2,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    q_lens: list[int] | None = None,
    pool_factor: int = 3,
    extra_table_cols: int = 1,
    generator: torch.Generator | None = None,
) -> PagedCase:
    """A batch of sequences of ``lens`` tokens in a shuffled, NaN-poisoned paged cache.

    ``q_lens=None`` makes a decode batch (one query per sequence); otherwise q_lens[i] <= lens[i]
    queries per sequence, packed with query_start_loc.
    """
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    n_blocks = [-(-n // block_size) for n in lens]
    need = sum(n_blocks)
    num_blocks = max(4, pool_factor * need)
    max_blocks = max([1, *n_blocks]) + extra_table_cols
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.full((len(lens), max_blocks), BOGUS_BLOCK, dtype=torch.int32)
    k = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=torch.float32)
    v = k.clone()
    used = 0
    for i, (n, nb) in enumerate(zip(lens, n_blocks)):
        tables[i, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
        if n:
            pos = torch.arange(n)
            blocks = tables[i, pos // block_size].long()
            slots = pos % block_size
            k[blocks, slots] = torch.randn(n, num_kv_heads, head_dim, generator=g)
            v[blocks, slots] = torch.randn(n, num_kv_heads, head_dim, generator=g)
    if q_lens is None:
        num_q = len(lens)
        qsl = torch.arange(len(lens) + 1, dtype=torch.int32)
    else:
        assert all(0 <= a <= b for a, b in zip(q_lens, lens))
        qsl = torch.tensor([0, *torch.tensor(q_lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
        num_q = int(qsl[-1])
    q = torch.randn(num_q, num_kv_heads * group, head_dim, generator=g)
    return PagedCase(
        q=q.to(dtype=dtype, device=device),
        k_cache=k.to(dtype=dtype, device=device),
        v_cache=v.to(dtype=dtype, device=device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device),
        block_size=block_size,
    )


def compare(out: torch.Tensor, ref: torch.Tensor, naive: torch.Tensor, dtype: torch.dtype) -> tuple[bool, str]:
    """FlashAttention-style check; returns (ok, human-readable summary)."""
    if out.shape != ref.shape:
        return False, f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o = out.float()
    if not torch.isfinite(o).all():
        return False, f"non-finite output ({int((~torch.isfinite(o)).sum())} entries)"
    err = (o - ref).abs().max().item() if o.numel() else 0.0
    base = (naive - ref).abs().max().item() if o.numel() else 0.0
    bound = RTOL_FACTOR * base + ATOL[dtype]
    return err <= bound, f"err {err:.3g} <= {RTOL_FACTOR:g} x naive {base:.3g} + {ATOL[dtype]:g} = {bound:.3g}"


def edge_lengths(block_size: int, long: int) -> list[int]:
    """0, 1, B-1, B, B+1, 2B+1 and a long one (duplicates and B-1 = 0 kept: they are cheap)."""
    return [0, 1, max(block_size - 1, 0), block_size, block_size + 1, 2 * block_size + 1, long]
