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

from . import validation
from .attention import build_prefill_tiles, launch_attention, tile_sizes


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
    seq_lens_host=None,
    query_start_loc_host=None,
    block_tables_host=None,
    max_seq_len: int | None = None,
    _tile_rows: int | None = None,
) -> torch.Tensor:
    """Prefill (and mixed prefill/decode) attention over a paged KV cache; returns [T, Hq, D].

    Host metadata as in ``paged_decode``, plus ``query_start_loc_host`` (host copy of
    ``query_start_loc``). With ``validate=False`` and ``max_seq_len`` given, index tensors without
    a host copy are not read: the row tiles are built on the device (``build_prefill_tiles``) and
    the kernel clamps lengths and query rows to the tensors' bounds.
    """
    shape = validation.check_attention_shapes(q, k_cache, v_cache, block_tables, seq_lens)
    causal = validation.as_bool("causal", causal)
    scale = validation.check_scale(scale, shape.head_dim)
    softcap = validation.check_softcap(softcap)
    window = validation.check_window(sliding_window, shape.capacity)
    tile_rows = validation.check_tile_rows(_tile_rows)
    lens, _ = validation.host_lengths(shape, seq_lens, block_tables, seq_lens_host=seq_lens_host,
                             block_tables_host=block_tables_host, max_seq_len=max_seq_len,
                             validate=validate)
    validation.host_query_starts(query_start_loc, query_start_loc_host, num_tokens=q.shape[0],
                        num_seqs=shape.num_seqs, lens=lens, device=q.device,
                        read=not validation.reads_nothing(validate, max_seq_len))

    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // shape.num_kv_heads
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or shape.num_seqs == 0:
        return out
    on_gpu = q.device.type == "cuda"
    block_m, block_n, block_d = tile_sizes(head_dim, group, decode=False, tile_rows=tile_rows, on_gpu=on_gpu)
    tiles = build_prefill_tiles(query_start_loc, num_tokens, group, block_m)
    launch_attention(
        q, k_cache, v_cache, out, None, block_tables, seq_lens, query_start_loc, tiles,
        scale=scale, softcap=softcap, window=window, causal=causal, group=group, num_splits=1,
        block_m=block_m, block_n=block_n, block_d=block_d,
    )
    return out
