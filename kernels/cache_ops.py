"""KV-cache writes and block copies.

Layout: caches [N, B, Hkv, D]. A *slot* is ``block * B + offset``.

``write_kv(key, value, k_cache, v_cache, slot_mapping)``: key/value [T, Hkv, D], slot_mapping
int64 [T]; token t is stored at (slot // B, slot % B); slot -1 skips the token (padding).
Grid (token tiles, Hkv): each program moves a [BLOCK_T, D] tile of one head for K and for validation.

``copy_blocks(k_cache, v_cache, pairs)``: pairs int64 [P, 2] of (src, dst) physical blocks, the
copy-on-write copies of the block manager. Grid (P, Hkv): each program copies one head of one
block, BLOCK_S slots at a time, for K and validation.

Both do their address arithmetic in int64 and validate every index before launching, so a rejected
call leaves the caches untouched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import validation
from .attention import next_pow2


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_ptr, v_ptr, slots_ptr, num_tokens, num_slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch, stride_db, stride_ds, stride_dh,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    h = tl.program_id(1).to(tl.int64)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < num_tokens
    slot = tl.load(slots_ptr + offs_t, mask=t_ok, other=-1).to(tl.int64)
    # slots past the cache are skipped like -1: unchecked slots (a caller's wrong host copy) can
    # never write outside the cache
    ok = t_ok & (slot >= 0) & (slot < num_slots)
    mask = ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    block = tl.where(ok, slot // BLOCK_SIZE, 0)
    off = tl.where(ok, slot % BLOCK_SIZE, 0)
    t64 = offs_t.to(tl.int64)

    key = tl.load(key_ptr + (t64 * stride_kt + h * stride_kh)[:, None] + offs_d[None, :], mask=mask)
    value = tl.load(value_ptr + (t64 * stride_vt + h * stride_vh)[:, None] + offs_d[None, :], mask=mask)
    tl.store(k_ptr + (block * stride_cb + off * stride_cs + h * stride_ch)[:, None] + offs_d[None, :],
             key, mask=mask)
    tl.store(v_ptr + (block * stride_db + off * stride_ds + h * stride_dh)[:, None] + offs_d[None, :],
             value, mask=mask)


@triton.jit
def _copy_blocks_kernel(
    k_ptr, v_ptr, pairs_ptr,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    src = tl.load(pairs_ptr + 2 * p).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * p + 1).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for s0 in range(0, BLOCK_SIZE, BLOCK_S):
        offs_s = (s0 + tl.arange(0, BLOCK_S)).to(tl.int64)
        mask = (offs_s < BLOCK_SIZE)[:, None] & d_ok[None, :]
        k_off = (offs_s * stride_ks + h * stride_kh)[:, None] + offs_d[None, :]
        v_off = (offs_s * stride_vs + h * stride_vh)[:, None] + offs_d[None, :]
        k = tl.load(k_ptr + src * stride_kb + k_off, mask=mask)
        tl.store(k_ptr + dst * stride_kb + k_off, k, mask=mask)
        v = tl.load(v_ptr + src * stride_vb + v_off, mask=mask)
        tl.store(v_ptr + dst * stride_vb + v_off, v, mask=mask)


def _check_slots(slots: torch.Tensor, capacity: int) -> None:
    bad = (slots < -1) | (slots >= capacity)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        validation._fail(f"slot_mapping[{i}] = {int(slots[i])} is out of range: slots are -1 (skip) or in [0, {capacity})")
    used = slots[slots >= 0]
    if used.numel() != torch.unique(used).numel():
        validation._fail("slot_mapping writes the same slot twice; the result would depend on thread order")


def write_kv(key, value, k_cache, v_cache, slot_mapping, *, slot_mapping_host=None) -> None:
    """Store key/value [T, Hkv, D] into the caches at ``slot_mapping`` (int64 [T], -1 skips).

    The slots are checked (in range, no slot twice) on ``slot_mapping_host`` if the caller passes
    its host copy (CPU int tensor or sequence of ints, trusted to equal ``slot_mapping``), else on
    a copy read from the device.
    """
    num_blocks, block_size, num_kv_heads, head_dim = validation.check_cache_pair(k_cache, v_cache)
    validation.check_tensor("key", key, ndim=3, device=k_cache.device)
    validation.check_tensor("value", value, ndim=3, device=k_cache.device)
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape[1:]) != (num_kv_heads, head_dim):
            validation._fail(f"{name} must be [T, {num_kv_heads}, {head_dim}] to match the cache, got {tuple(t.shape)}")
        if t.dtype != k_cache.dtype:
            validation._fail(f"{name} dtype {t.dtype} differs from the cache dtype {k_cache.dtype}")
        validation.check_last_dim_contiguous(name, t)
    if key.shape[0] != value.shape[0]:
        validation._fail(f"key has {key.shape[0]} tokens but value has {value.shape[0]}")
    validation.check_index_tensor("slot_mapping", slot_mapping, ndim=1, dtype=torch.int64, device=k_cache.device)
    num_tokens = key.shape[0]
    if slot_mapping.shape[0] != num_tokens:
        validation._fail(f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    validation.check_written_caches(k_cache, v_cache, {"key": key, "value": value, "slot_mapping": slot_mapping})
    if slot_mapping_host is not None:
        slots = validation.host_ints("slot_mapping_host", slot_mapping_host, (num_tokens,))
    else:
        slots = validation.read_to_host(slot_mapping)
    slots = slots.to(torch.int64)
    capacity = num_blocks * block_size
    _check_slots(slots, capacity)
    if num_tokens == 0:
        return
    block_t = 16
    block_d = max(16, next_pow2(head_dim))
    grid = (triton.cdiv(num_tokens, block_t), num_kv_heads)
    _write_kv_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping, num_tokens, capacity,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_T=block_t, BLOCK_D=block_d,
    )


def _check_pairs(host: torch.Tensor, num_blocks: int) -> None:
    bad = (host < 0) | (host >= num_blocks)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        validation._fail(f"pairs[{i}, {j}] = {int(host[i, j])} is not a block id in [0, {num_blocks})")
    src, dst = host[:, 0], host[:, 1]
    if torch.unique(dst).numel() != dst.numel():
        validation._fail("pairs has a destination block twice; the result would depend on thread order")
    both = src[torch.isin(src, dst)]
    if both.numel():
        validation._fail(f"block {int(both.min())} is both a source and a destination in pairs; copies must be independent")


def copy_blocks(k_cache, v_cache, pairs, *, pairs_host=None) -> None:
    """Copy whole blocks ``src -> dst`` for every row (src, dst) of ``pairs`` (int64 [P, 2]).

    The pairs are checked (block ids in range, no destination twice, no block both a source and a
    destination) on ``pairs_host`` if given (host copy, trusted to equal ``pairs``), else on a copy
    read from the device.
    """
    num_blocks, block_size, num_kv_heads, head_dim = validation.check_cache_pair(k_cache, v_cache)
    validation.check_tensor("pairs", pairs, dtype=torch.int64, device=k_cache.device)
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        validation._fail(f"pairs must be [P, 2] (src, dst), got shape {tuple(pairs.shape)}")
    validation.check_index_tensor("pairs", pairs, ndim=2, dtype=torch.int64, device=k_cache.device)
    validation.check_written_caches(k_cache, v_cache, {"pairs": pairs})
    if pairs_host is not None:
        host = validation.host_ints("pairs_host", pairs_host, tuple(pairs.shape))
    else:
        host = validation.read_to_host(pairs)
    host = host.to(torch.int64)
    _check_pairs(host, num_blocks)
    if host.shape[0] == 0:
        return
    block_s = min(64, max(16, next_pow2(block_size)))
    block_d = max(16, next_pow2(head_dim))
    _copy_blocks_kernel[(host.shape[0], num_kv_heads)](
        k_cache, v_cache, pairs,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_D=block_d,
    )
