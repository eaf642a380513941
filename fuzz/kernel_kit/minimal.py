"""A minimal paged decode kernel: the kit's second, independent target, and its planted twin.

One program per (sequence, query head) walks the sequence's keys in tiles of TILE tokens with an
online softmax, gathering token j from slot j % B of block table[j // B]. It declares no capability
(decode only, causal, no window or softcap) and in particular not "empty_rows": a sequence of length
0 gives 0 / 0 = NaN, outside its contract, so the kit must skip such rows rather than fail them.

``tile_offset_bug`` is the same kernel with a bug found in a vLLM-lineage unified-attention fork
planted: the slot inside a block is computed from the offset within the key tile, ``o % B``, instead
of from the token position, ``(n0 + o) % B``. That is right only when B divides the tile width, or
when the sequence fits in one tile: short corpora (every sequence within one tile) cannot see it.

    pagedkv check --only kernels --kernel pagedkv.fuzz.kernel_kit.minimal:factory           # passes
    pagedkv check --only kernels --kernel pagedkv.fuzz.kernel_kit.minimal:tile_offset_bug   # must fail
"""

from __future__ import annotations

import torch

from pagedkv.kernels.validation import is_interpreter  # first: it selects Triton's interpreter without CUDA

import triton  # noqa: E402  (Triton reads TRITON_INTERPRET when it is imported)
import triton.language as tl  # noqa: E402

TILE = 16


@triton.jit
def _minimal_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_os, stride_oh, stride_tab,
    scale, block_size, group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, TILE_N: tl.constexpr, TILE_OFFSET_BUG: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    kv_head = head // group
    length = tl.load(lens_ptr + seq)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + head * stride_qh + offs_d, mask=d_ok, other=0.0).to(tl.float32)

    m_i = tl.zeros([1], tl.float32) - float("inf")
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for n0 in range(0, length, TILE_N):
        offs = tl.arange(0, TILE_N)
        pos = n0 + offs
        ok = pos < length
        block = tl.load(tables_ptr + seq * stride_tab + pos // block_size, mask=ok, other=0).to(tl.int64)
        if TILE_OFFSET_BUG:
            slot = (offs % block_size).to(tl.int64)        # planted: the offset within the tile
        else:
            slot = (pos % block_size).to(tl.int64)         # the token's position within its block
        kv_ok = ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + (block * stride_kb + slot * stride_ks + kv_head * stride_kh)[:, None] + offs_d[None, :],
                    mask=kv_ok, other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        v = tl.load(v_ptr + (block * stride_vb + slot * stride_vs + kv_head * stride_vh)[:, None] + offs_d[None, :],
                    mask=kv_ok, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m_i = m_new
    out = acc / l_i                                            # length 0: 0 / 0 (no "empty_rows")
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


class MinimalDecode:
    capabilities = frozenset()
    block_sizes = None
    head_dims = None
    max_group = None
    tile_size = TILE

    def __init__(self, tile_offset_bug: bool = False):
        self.tile_offset_bug = tile_offset_bug
        on_cuda = torch.cuda.is_available() and not is_interpreter()
        self.dtypes = ("float32", "float16", "bfloat16") if on_cuda else ("float32", "float16")

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap):
        if sliding_window is not None or softcap is not None:
            raise ValueError("MinimalDecode supports neither sliding_window nor softcap (it declares neither)")
        num_seqs, num_q_heads, head_dim = q.shape
        out = torch.empty_like(q)
        if num_seqs == 0:
            return out
        _minimal_decode_kernel[(num_seqs, num_q_heads)](
            q, k_cache, v_cache, out, block_tables, seq_lens,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
            block_tables.stride(0), float(scale), k_cache.shape[1], num_q_heads // k_cache.shape[2],
            HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), TILE_N=TILE,
            TILE_OFFSET_BUG=self.tile_offset_bug,
        )
        return out


def factory() -> MinimalDecode:
    return MinimalDecode()


def tile_offset_bug() -> MinimalDecode:
    return MinimalDecode(tile_offset_bug=True)
