"""Layout adapters: a canonical paged batch (see ``protocol``) in the layouts other engines use.

Each function takes canonical tensors and returns what a kernel of that lineage is called with, on the
same device. Caches keep their NaN poison: a converted cache holds NaN exactly where the canonical one
does, and ``fused_qkv`` surrounds q with NaN, so a kernel that reads outside its data still shows it.

    token_slots       page size 1 (SGLang's ``kv_indptr`` / ``kv_indices`` into a token-level buffer)
    token_cache       the [N * B, H, D] token-level view of a [N, B, H, D] cache (no copy)
    flashinfer_pages  FlashInfer's ``indptr`` / ``indices`` / ``last_page_len``
    to_hnd            HND cache [N, H, B, D] (copied into that memory order)
    combined_cache    vLLM's combined cache [N, 2, B, H, D] and its K / V views (strided, not copies)
    fused_qkv         q as a strided view of a fused [T, (Hq + 2 Hkv) * D] qkv projection

Lengths and tables are read to the host once: these adapters are for tests, not for a hot path.
"""

from __future__ import annotations

import torch

__all__ = ["token_slots", "token_cache", "flashinfer_pages", "to_hnd", "combined_cache", "fused_qkv"]


def _rows(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> list[tuple[list[int], int]]:
    """(the blocks each sequence reads, its length), on the host."""
    lens = seq_lens.tolist()
    tables = block_tables.tolist()
    return [(table[:-(-n // block_size)], n) for table, n in zip(tables, lens)]


def token_slots(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, *,
                index_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr int32 [S + 1], kv_indices [sum L]): sequence i's tokens, in order, are the rows
    kv_indices[kv_indptr[i] : kv_indptr[i + 1]] of ``token_cache(cache)`` (slot = block * B + offset)."""
    indices, indptr = [], [0]
    for blocks, n in _rows(block_tables, seq_lens, block_size):
        indices.extend(blocks[j // block_size] * block_size + j % block_size for j in range(n))
        indptr.append(len(indices))
    device = block_tables.device
    return (torch.tensor(indptr, dtype=torch.int32, device=device),
            torch.tensor(indices, dtype=index_dtype, device=device))


def token_cache(cache: torch.Tensor) -> torch.Tensor:
    """The [N * B, H, D] token-level view of a contiguous [N, B, H, D] cache (shares its memory)."""
    num_blocks, block_size, heads, dim = cache.shape
    return cache.view(num_blocks * block_size, heads, dim)


def flashinfer_pages(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr int32 [S + 1], indices int32 [sum pages], last_page_len int32 [S]) as FlashInfer's paged
    kernels take them: sequence i's pages are indices[indptr[i] : indptr[i + 1]], all full but the last,
    which holds last_page_len[i] tokens (1..B; 0 for a sequence with no token and no page)."""
    indices, indptr, last = [], [0], []
    for blocks, n in _rows(block_tables, seq_lens, block_size):
        indices.extend(blocks)
        indptr.append(len(indices))
        last.append((n - 1) % block_size + 1 if n else 0)
    device = block_tables.device
    as_int32 = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    return as_int32(indptr), as_int32(indices), as_int32(last)


def to_hnd(cache: torch.Tensor) -> torch.Tensor:
    """The [N, H, B, D] (HND) cache holding the same data, contiguous in that order."""
    return cache.permute(0, 2, 1, 3).contiguous()


def combined_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kv [N, 2, B, H, D], k_view, v_view): vLLM's combined cache and the [N, B, H, D] views of it that
    its attention backends hand to the kernels (block stride 2 * B * H * D: not contiguous)."""
    kv = torch.stack((k_cache, v_cache), dim=1)
    return kv, kv[:, 0], kv[:, 1]


def fused_qkv(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [T, Hq, D] as the first Hq * D columns of a fused [T, (Hq + 2 Hkv) * D] qkv tensor whose K and V
    columns are NaN: the returned view has row stride (Hq + 2 Hkv) * D, as q sliced out of one
    projection does in most engines."""
    tokens, heads, dim = q.shape
    fused = torch.full((tokens, (heads + 2 * num_kv_heads) * dim), float("nan"), dtype=q.dtype, device=q.device)
    fused[:, : heads * dim] = q.reshape(tokens, heads * dim)
    return fused[:, : heads * dim].view(tokens, heads, dim)
