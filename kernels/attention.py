"""Paged attention tile kernel shared by decode and prefill.

Layout
------
    q        [T, Hq, D]            queries of all sequences packed; sequence i owns rows
                                   query_start_loc[i] : query_start_loc[i+1]
    k_cache  [N, B, Hkv, D]        N physical blocks of B slots (vLLM layout)
    v_cache  [N, B, Hkv, D]
    tables   int32 [S, M]          logical block j of sequence i lives in physical block tables[i, j]
    seq_lens int32 [S]             the sequence's tokens, L_i; the q_len_i queries are its LAST
                                   q_len_i positions: query t sits at position L_i - q_len_i + t

Math
----
For a query row at position p and key positions j of its sequence,

    s_j = scale * q . k_j                     (optionally  softcap * tanh(s_j / softcap))
    s_j = -inf  unless  j <= p (causal)  and  j > p - window (sliding window)
    out = sum_j softmax(s)_j v_j

computed as ONE online softmax over key tiles of BLOCK_N tokens (never an average of per-block
softmaxes): with running max m, running sum l and unnormalised accumulator acc,

    m' = max(m, max_j s_j);  a = exp(m - m');  p_j = exp(s_j - m')
    l  = a * l + sum_j p_j;  acc = a * acc + p @ V;  m = m'

and out = acc / l at the end (0 when l == 0: an empty or fully masked row gives zeros, never NaN).
Exponentials are taken base 2 on scores pre-multiplied by log2(e).

Tiling
------
Grouped-query attention: the Hq / Hkv = G query heads that share a KV head are processed by the
same program, so each K/V tile is loaded once per group. The program's BLOCK_M rows are
"(query token, head in group)" pairs of ONE sequence, row r <-> token r // G, head r % G, so any G
works (non-powers of two, G larger than the tile: the group is then spread over several tiles).
Grid = (row tiles, Hkv, splits). The key tile size BLOCK_N is independent of the cache block size:
each token j is gathered through the table as (tables[i, j // B], j % B), so any B >= 1 works; B
is a compile-time constant (BLOCK_SIZE), so for a power of two the division is a shift.

Row tiles are never listed on the host. Decode (DECODE_TILES): every sequence has one query, so
it owns the same ceil(G / BLOCK_M) tiles and a program finds its sequence from its id. Prefill:
``build_prefill_tiles`` builds the list on the device from query_start_loc, over a grid sized by
a host-side bound; the surplus tiles are padding with an empty key range. A launch therefore
needs no value of any index tensor, which keeps it free of device-to-host copies and capturable
in a CUDA graph. As a second line behind the host checks, each length is clamped to the table
capacity, each query row to q's rows, and a block id outside the cache is a masked key (never
loaded, never weighted), so unchecked values cannot address outside them.

Split-KV (flash-decoding): with NUM_SPLITS > 1 the key range of each tile is cut into NUM_SPLITS
chunks; each program writes its normalised partial output and its log-sum-exp (base 2), and
``decode._combine_splits_kernel`` merges them exactly.

Addresses: physical block ids are cast to int64 before they are multiplied by the block stride,
so N * stride may exceed 2**31. Every load of K/V is masked to valid tokens and real head-dim lanes
(the head dim is padded to a power of two), so slots past a sequence's end are never read.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Module constants a @triton.jit function reads must be constexpr (Triton 3.x refuses other globals).
LOG2E = tl.constexpr(1.4426950408889634)


# tanh(y) / y = 1 - y^2/3 + 2y^4/15 - 17y^6/315 + 62y^8/2835 - 1382y^10/155925 + ...; below
# SERIES_LIMIT the first omitted term is < 1e-8 of the sum, so the series is exact to fp32.
SERIES_LIMIT = tl.constexpr(0.25)


@triton.jit
def _softcap(x, cap):
    """cap * tanh(x / cap), accurate in fp32 for every ratio y = x / cap.

    For |y| < SERIES_LIMIT it is x * (tanh(y) / y) by the series above: the result stays relative
    to x, so a large cap (where x / cap is tiny) costs no precision. The closed form
    (1 - e) / (1 + e), e = exp(-2|y|), would cancel in 1 - e and lose cap * 2**-24 absolutely.
    For larger |y| the closed form is accurate (1 - e >= 0.39) and cannot overflow (e in (0, 1]).
    """
    y = x / cap
    small = tl.minimum(tl.abs(y), SERIES_LIMIT)  # the series is only used below the limit: no overflow
    y2 = small * small
    series = 1.0 + y2 * (-1.0 / 3.0 + y2 * (2.0 / 15.0 + y2 * (-17.0 / 315.0 + y2 * (
        62.0 / 2835.0 + y2 * (-1382.0 / 155925.0)))))
    e = tl.exp(-2.0 * tl.abs(y))
    t = (1.0 - e) / (1.0 + e)
    closed = cap * tl.where(y < 0, -t, t)
    return tl.where(small < SERIES_LIMIT, x * series, closed)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    tables_ptr, seq_lens_ptr, qsl_ptr, tile_seq_ptr, tile_row_ptr,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_os, stride_ot, stride_oh,
    stride_ls, stride_lt, stride_lh,
    stride_tab,
    scale, softcap, window, capacity, num_q_tokens, num_blocks,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    NUM_SPLITS: tl.constexpr, IEEE_DOT: tl.constexpr, DECODE_TILES: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    if DECODE_TILES:
        # decode: query i is row i of q, and each sequence owns the same ceil(G / BLOCK_M) tiles,
        # so the tile's sequence and first row follow from the program id (no tile list at all)
        tiles_per_seq = (GROUP + BLOCK_M - 1) // BLOCK_M
        seq = (tile // tiles_per_seq).to(tl.int64)
        row0 = (tile % tiles_per_seq) * BLOCK_M
        q_start = seq
        q_len = 1
    else:
        seq = tl.load(tile_seq_ptr + tile).to(tl.int64)
        row0 = tl.load(tile_row_ptr + tile)
        q_start = tl.load(qsl_ptr + seq)
        q_len = tl.load(qsl_ptr + seq + 1) - q_start
    # Clamped so that lengths nobody checked (validate=False without host copies) can never
    # address past the sequence's table row.
    seq_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + seq), 0), capacity)

    # ---- the rows of this tile: (query token, head of the group) pairs ------------------------
    rows = row0 + tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    q_tok = q_start + tok                                # row of q (and of out)
    row_ok = (tok < q_len) & (q_tok >= 0) & (q_tok < num_q_tokens)
    q_pos = seq_len - q_len + tok                       # absolute position of each query row
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_rows = q_tok.to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # ---- key range [lo, hi) any row of this tile may see, then this split's share of it --------
    first_tok = row0 // GROUP
    last_tok = tl.minimum((row0 + BLOCK_M - 1) // GROUP, q_len - 1)
    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, seq_len - q_len + last_tok + 1)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(0, seq_len - q_len + first_tok - window + 1)
    if not DECODE_TILES:
        hi = tl.where(row0 < q_len * GROUP, hi, lo)     # a padding tile (see build_prefill_tiles)
    span = tl.maximum(hi - lo, 0)
    per_split = tl.cdiv(tl.cdiv(span, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(hi, start + per_split)

    # ---- one online softmax over the key tiles -------------------------------------------------
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = scale * LOG2E

    table_row = tables_ptr + seq * stride_tab
    k_head = k_ptr + kvh.to(tl.int64) * stride_kh
    v_head = v_ptr + kvh.to(tl.int64) * stride_vh
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        # gather: token j lives in slot j % B of physical block tables[seq, j // B]
        block = tl.load(table_row + offs_n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        n_ok = n_ok & (block >= 0) & (block < num_blocks)   # an unchecked table's id past the cache
        slot = (offs_n % BLOCK_SIZE).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_head + (block * stride_kb + slot * stride_ks)[:, None] + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if IEEE_DOT:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if USE_SOFTCAP:
            s = _softcap(s * scale, softcap) * LOG2E
        else:
            s = s * qk_scale
        ok = row_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            ok = ok & (offs_n[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            ok = ok & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(ok, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # fully masked so far: no -inf - -inf
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(v_head + (block * stride_vb + slot * stride_vs)[:, None] + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if IEEE_DOT:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    out = tl.where(has[:, None], out, 0.0)
    o_rows = q_tok.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
    o_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        split_off = split.to(tl.int64)
        tl.store(out_ptr + split_off * stride_os + o_rows[:, None] + offs_d[None, :], out, mask=o_mask)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        l_rows = q_tok.to(tl.int64) * stride_lt + head.to(tl.int64) * stride_lh
        tl.store(lse_ptr + split_off * stride_ls + l_rows, lse, mask=row_ok)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_sizes(head_dim: int, group: int, *, decode: bool, tile_rows: int | None, on_gpu: bool):
    """(BLOCK_M, BLOCK_N, BLOCK_D). tl.dot wants every dimension >= 16."""
    block_d = max(16, next_pow2(head_dim))
    if tile_rows is not None:
        block_m = tile_rows
    elif decode:
        block_m = min(max(16, next_pow2(group)), 64)   # one tile per group in almost every model
    else:
        block_m = 64 if block_d <= 128 else 32
    if on_gpu:
        block_n = 64 if block_d <= 128 else 32
    else:
        block_n = 64  # the interpreter pays per loop iteration, not per element
    return block_m, block_n, block_d


# Row index given to padding tiles: past every real tile's rows, and row0 + BLOCK_M stays an int32.
PADDING_ROW = 2**30


def build_prefill_tiles(query_start_loc, num_tokens: int, group: int, block_m: int):
    """Row tiles of a prefill batch, built on q's device with vectorised ops and no host read.

    Sequence i needs n_i = ceil(q_len_i * G / BLOCK_M) tiles of consecutive rows. sum_i n_i is only
    known on the device, so the grid is its host-side bound ceil((T*G + S*(BLOCK_M-1)) / BLOCK_M)
    (each sequence wastes less than one tile): tile t belongs to the sequence whose range of tile
    numbers [end_i - n_i, end_i) holds t (a searchsorted over the running sum end), and the tiles
    past sum_i n_i are padding (row PADDING_ROW), which the kernel gives an empty key range.
    Returns (tile_seq, tile_row), int32 [bound] each.
    """
    import torch

    num_seqs = query_start_loc.shape[0] - 1
    bound = (num_tokens * group + num_seqs * (block_m - 1)) // block_m
    qsl = query_start_loc.to(torch.int64)
    q_lens = (qsl[1:] - qsl[:-1]).clamp(min=0)
    n = (q_lens * group + block_m - 1) // block_m
    end = torch.cumsum(n, 0)
    t = torch.arange(bound, dtype=torch.int64, device=qsl.device)
    seq = torch.searchsorted(end, t, right=True)
    real = seq < num_seqs
    seq = seq.clamp(max=num_seqs - 1)
    row = (t - (end - n)[seq]) * block_m
    row = torch.where(real, row, torch.full_like(row, PADDING_ROW))
    return seq.to(torch.int32), row.to(torch.int32)


def launch_attention(
    q, k_cache, v_cache, out, lse, block_tables, seq_lens, qsl_tensor, tiles, *,
    scale: float, softcap, window, causal: bool, group: int, num_splits: int,
    block_m: int, block_n: int, block_d: int,
):
    """Launch the tile kernel. ``out`` is [T, Hq, D] (num_splits == 1) or float32
    [splits, T, Hq, D] with ``lse`` float32 [splits, T, Hq] (num_splits > 1).

    ``tiles`` is (tile_seq, tile_row) from ``build_prefill_tiles``, or None for a decode batch,
    whose tiles the kernel derives from its program id (q row i is sequence i's query)."""
    import torch

    num_kv_heads = k_cache.shape[2]
    if tiles is None:
        num_tiles = q.shape[0] * -(-group // block_m)
        tile_seq = tile_row = seq_lens  # unused by DECODE_TILES
        qsl_tensor = seq_lens           # unused too
    else:
        tile_seq, tile_row = tiles
        num_tiles = tile_seq.shape[0]
    if num_tiles == 0:
        return
    if num_splits == 1:
        so, (sot, soh) = 0, out.stride()[:2]
        sls = slt = slh = 0
        lse_arg = out  # unused
    else:
        so, sot, soh = out.stride()[:3]
        sls, slt, slh = lse.stride()
        lse_arg = lse
    on_gpu = q.device.type == "cuda"
    extra = {"num_warps": 4 if block_d <= 128 else 8, "num_stages": 2} if on_gpu else {}
    grid = (num_tiles, num_kv_heads, num_splits)
    block_size = k_cache.shape[1]
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, lse_arg,
        block_tables, seq_lens, qsl_tensor, tile_seq, tile_row,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        so, sot, soh,
        sls, slt, slh,
        block_tables.stride(0),
        scale, softcap if softcap is not None else 1.0,
        window if window is not None else 0, block_tables.shape[1] * block_size, q.shape[0], k_cache.shape[0],
        GROUP=group, HEAD_DIM=q.shape[2], BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        CAUSAL=causal, USE_WINDOW=window is not None, USE_SOFTCAP=softcap is not None,
        NUM_SPLITS=num_splits, IEEE_DOT=q.dtype == torch.float32, DECODE_TILES=tiles is None,
        **extra,
    )
