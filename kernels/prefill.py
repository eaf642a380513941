"""Paged prefill attention: variable-length query chunks over a cache that already holds them.

Layout: q [T, Hq, D] packs the queries of S sequences, sequence i owning rows
query_start_loc[i] : query_start_loc[i+1] (int32 [S+1]); caches [N, B, Hkv, D]; block_tables
int32 [S, M]; seq_lens int32 [S] counts every token of the sequence INCLUDING the new queries,
whose K/V must already be written (``write_kv``). The q_len_i queries are the last positions
L_i - q_len_i .. L_i - 1 (chunked prefill with a cached prefix); a row with q_len = 1 is a decode
row and q_len = 0 contributes nothing.

Math (per query at position p, causal): attend to keys j <= p (and j > p - window); see
``attention`` for the online softmax. With ``causal=False`` every query sees all L_i keys (the
window, if any, still bounds them from the left). Each program handles BLOCK_M (token, head) rows
of one sequence and one KV head, so its key range stops at the tile's last query position.
"""

from __future__ import annotations

import torch

from . import validation as V
from .attention import build_tiles, launch_attention, tile_sizes


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    softcap: float | None = None,
    validate: bool = True,
    *,
    _tile_rows: int | None = None,
) -> torch.Tensor:
    """Prefill (and mixed prefill/decode) attention over a paged KV cache; returns [T, Hq, D]."""
    info = V.check_attention_args(q, k_cache, v_cache, block_tables, seq_lens)
    qsl = V.check_query_start_loc(query_start_loc, q.shape[0], info["seq_lens"], q.device)
    if not isinstance(causal, bool):
        raise V.KernelArgumentError(f"causal must be a bool, got {causal!r}")
    scale = V.check_attention_options(info, block_tables, scale, sliding_window, softcap, _tile_rows, validate)

    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // info["num_kv_heads"]
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    on_gpu = q.device.type == "cuda"
    block_m, block_n, block_d = tile_sizes(head_dim, group, decode=False, tile_rows=_tile_rows, on_gpu=on_gpu)
    tile_seq, tile_row = build_tiles(qsl, group, block_m, q.device)
    launch_attention(
        q, k_cache, v_cache, out, None, block_tables, seq_lens, query_start_loc, tile_seq, tile_row,
        scale=scale, softcap=softcap, window=sliding_window, causal=causal, group=group, num_splits=1,
        block_m=block_m, block_n=block_n, block_d=block_d,
    )
    return out
