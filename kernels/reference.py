"""Dense torch references for the paged kernels.

``gather_kv`` reads a sequence's contiguous K/V [L, Hkv, D] out of the paged cache through its block
table (token j = slot j % B of block table[j // B]); ``reference_prefill``/``reference_decode`` run
plain dense attention on that, one sequence at a time:

    S = scale * Q K^T  (softcap * tanh(S / softcap) if asked), masked to j <= p (causal) and
    j > p - window, P = softmax(S) (a row with no visible key gives 0), O = P V.

``compute_dtype=torch.float32`` is the ground truth (``torch.float64`` a stricter one, computed and
returned in float64, for checking the kernels' float32 arithmetic itself). Passing the input dtype (float16/bfloat16)
gives the *naive low-precision* computation: every intermediate (scores, probabilities, output)
is rounded to that dtype, which is the yardstick the tests use for tolerances.
"""

from __future__ import annotations

import torch

__all__ = ["gather_kv", "reference_prefill", "reference_decode", "dense_attention"]


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int):
    """Contiguous (K, V), each [seq_len, Hkv, D], of one sequence."""
    block_size = k_cache.shape[1]
    pos = torch.arange(seq_len, device=k_cache.device)
    table = block_table.to(torch.int64)
    blocks = table[pos // block_size]
    slots = pos % block_size
    return k_cache[blocks, slots], v_cache[blocks, slots]


def dense_attention(q, k, v, q_pos, *, scale, causal=True, sliding_window=None, softcap=None,
                    compute_dtype=torch.float32):
    """q [Tq, Hq, D], k/v [L, Hkv, D], q_pos [Tq] absolute positions; returns [Tq, Hq, D] in float32 (float64 with
    ``compute_dtype=torch.float64``)."""
    tq, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    exact = compute_dtype in (torch.float32, torch.float64)
    base = torch.float64 if compute_dtype == torch.float64 else torch.float32
    rnd = (lambda x: x) if exact else (lambda x: x.to(compute_dtype).float())
    qf = q.to(base)
    kf = k.to(base).repeat_interleave(group, dim=1)
    vf = v.to(base).repeat_interleave(group, dim=1)
    s = rnd(torch.einsum("thd,lhd->htl", qf, kf))
    s = rnd(s * scale)
    if softcap is not None:
        s = rnd(softcap * torch.tanh(s / softcap))
    j = torch.arange(k.shape[0], device=q.device)
    ok = torch.ones(tq, k.shape[0], dtype=torch.bool, device=q.device)
    if causal:
        ok &= j[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        ok &= j[None, :] > q_pos[:, None] - sliding_window
    s = s.masked_fill(~ok[None], float("-inf"))
    any_ok = ok.any(dim=1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(any_ok[None, :, None], p, torch.zeros_like(p))
    p = rnd(p)
    o = rnd(torch.einsum("htl,lhd->thd", p, vf))
    return o


def _result_dtype(compute_dtype):
    return torch.float64 if compute_dtype == torch.float64 else torch.float32


def reference_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *, scale=None,
                      causal=True, sliding_window=None, softcap=None, compute_dtype=torch.float32):
    """Float32 [T, Hq, D] reference for ``paged_prefill``."""
    d = q.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=_result_dtype(compute_dtype), device=q.device)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        a, b = qsl[i], qsl[i + 1]
        if b == a:
            continue
        k, v = gather_kv(k_cache, v_cache, block_tables[i], seq_len)
        q_pos = torch.arange(seq_len - (b - a), seq_len, device=q.device)
        out[a:b] = dense_attention(q[a:b], k, v, q_pos, scale=scale, causal=causal,
                                   sliding_window=sliding_window, softcap=softcap,
                                   compute_dtype=compute_dtype)
    return out


def reference_decode(q, k_cache, v_cache, block_tables, seq_lens, *, scale=None, sliding_window=None,
                     softcap=None, compute_dtype=torch.float32):
    """Float32 [S, Hq, D] reference for ``paged_decode`` (length 0 gives zeros)."""
    d = q.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=_result_dtype(compute_dtype), device=q.device)
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k, v = gather_kv(k_cache, v_cache, block_tables[i], seq_len)
        q_pos = torch.tensor([seq_len - 1], device=q.device)
        out[i : i + 1] = dense_attention(q[i : i + 1], k, v, q_pos, scale=scale, causal=True,
                                         sliding_window=sliding_window, softcap=softcap,
                                         compute_dtype=compute_dtype)
    return out
