"""Paged decode attention: one query token per sequence, optionally split over the KV length.

Layout: q [S, Hq, D]; caches [N, B, Hkv, D]; block_tables int32 [S, M]; seq_lens int32 [S].
Sequence i's query is its last position, L_i - 1, and attends to keys 0 .. L_i - 1 (or the last
``sliding_window`` of them). L_i = 0 gives a zero output row.

Split-KV ("flash-decoding"): when there are few (sequence, KV head) programs but long sequences,
the GPU would idle; the key range is then cut into ``num_splits`` chunks processed in parallel by
``attention._paged_attention_kernel``, each writing a normalised partial output o_s and its base-2
log-sum-exp lse_s. ``_combine_splits_kernel`` merges them exactly:

    m = max_s lse_s;  w_s = 2^(lse_s - m);  out = sum_s w_s o_s / sum_s w_s

(splits that saw no key have lse_s = -inf and weight 0; if every split is empty the row is zero).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import validation
from .attention import launch_attention, tile_sizes

MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 32


@triton.jit
def _combine_splits_kernel(
    part_ptr, lse_ptr, out_ptr,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt, stride_lh,
    stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, SPLITS_P2).to(tl.int64)   # split x split stride passes 2**31 in big batches
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < NUM_SPLITS
    d_ok = offs_d < HEAD_DIM

    lse = tl.load(lse_ptr + offs_s * stride_ls + t * stride_lt + h * stride_lh,
                  mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)                                   # 0 for empty splits
    part = tl.load(part_ptr + offs_s[:, None] * stride_ps + t * stride_pt + h * stride_ph + offs_d[None, :],
                   mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * part, 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_parallelism(device: torch.device) -> int:
    """How many programs keep the device busy: SM count on CUDA (asked once per device, a host-side
    property query), a small constant on the interpreter."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 4


def choose_num_splits(num_programs: int, max_seq_len: int, parallelism: int) -> int:
    """Auto split: enough programs to fill ~2 waves of the device, but never fewer than
    MIN_TOKENS_PER_SPLIT keys per split (the combine step is not free)."""
    if num_programs <= 0 or max_seq_len <= 0:
        return 1
    want = -(-2 * parallelism // num_programs)
    by_len = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    return int(max(1, min(want, by_len, MAX_SPLITS)))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    num_splits: int | None = None,
    validate: bool = True,
    *,
    seq_lens_host=None,
    block_tables_host=None,
    max_seq_len: int | None = None,
    _tile_rows: int | None = None,
) -> torch.Tensor:
    """Decode attention over a paged KV cache; returns [S, Hq, D] in q's dtype.

    num_splits: None chooses split-KV automatically (see ``choose_num_splits``); 1 forces the
    single-pass kernel; k > 1 forces k splits. ``validate`` additionally checks that every block id
    a sequence reads is within [0, num_blocks).

    Host metadata (the launch path without device-to-host copies). By default ``seq_lens`` (and,
    with ``validate``, ``block_tables``) are copied to the host to be checked and to size the split;
    on a GPU each copy is a sync. A caller that already holds them on the host passes them:

    * ``seq_lens_host``: host copy of ``seq_lens`` (CPU int tensor or sequence of ints);
    * ``block_tables_host``: host copy of ``block_tables``, used for the block-id check;
    * ``max_seq_len``: an upper bound of the lengths (sizes the split). With ``validate=False`` and
      no ``seq_lens_host`` nothing is read at all (what a CUDA graph needs); the kernel then clamps
      each length to the table capacity, so wrong lengths give wrong rows but never a read outside
      the block table.

    Host copies are trusted to equal the device tensors. The launch itself builds no tile list:
    the kernel finds its sequence from its program id.
    """
    shape = validation.check_attention_shapes(q, k_cache, v_cache, block_tables, seq_lens)
    if q.shape[0] != shape.num_seqs:
        raise validation.KernelArgumentError(
            f"decode has one query per sequence: q.shape[0] = {q.shape[0]} but there are {shape.num_seqs} sequences"
        )
    num_splits = validation.check_num_splits(num_splits)
    scale = validation.check_scale(scale, shape.head_dim)
    softcap = validation.check_softcap(softcap)
    window = validation.check_window(sliding_window, shape.capacity)
    tile_rows = validation.check_tile_rows(_tile_rows)
    _, longest = validation.host_lengths(shape, seq_lens, block_tables, seq_lens_host=seq_lens_host,
                                block_tables_host=block_tables_host, max_seq_len=max_seq_len,
                                validate=validate)

    num_seqs, num_q_heads, head_dim = q.shape
    group = num_q_heads // shape.num_kv_heads
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out
    on_gpu = q.device.type == "cuda"
    block_m, block_n, block_d = tile_sizes(head_dim, group, decode=True, tile_rows=tile_rows, on_gpu=on_gpu)
    if window is not None:
        longest = min(longest, window)
    if num_splits is None:
        num_programs = num_seqs * -(-group // block_m) * shape.num_kv_heads
        num_splits = choose_num_splits(num_programs, longest, device_parallelism(q.device))

    common = dict(scale=scale, softcap=softcap, window=window, causal=True, group=group,
                  block_m=block_m, block_n=block_n, block_d=block_d)
    if num_splits == 1:
        launch_attention(q, k_cache, v_cache, out, None, block_tables, seq_lens, None, None,
                         num_splits=1, **common)
        return out

    part = torch.empty((num_splits, num_seqs, num_q_heads, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((num_splits, num_seqs, num_q_heads), dtype=torch.float32, device=q.device)
    launch_attention(q, k_cache, v_cache, part, lse, block_tables, seq_lens, None, None,
                     num_splits=num_splits, **common)
    _combine_splits_kernel[(num_seqs, num_q_heads)](
        part, lse, out,
        part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, SPLITS_P2=max(2, triton.next_power_of_2(num_splits)),
        HEAD_DIM=head_dim, BLOCK_D=block_d,
    )
    return out
