"""SGLang 0.5.23's Triton attention kernels as a kernel target of the kit (`--kernel sglang`).

- `decode`: `decode_attention_fwd` (`sglang/kernels/ops/attention/decode_attention.py`), the decode
  kernel of SGLang's Triton attention backend: split-KV stage 1, then the softmax/reduce stage 2.
- `prefill`: `extend_attention_fwd` (`extend_attention.py`), the backend's extend (prefill with a
  cached prefix) kernel: the new tokens' K/V come in as dense `k_extend`/`v_extend`, the prefix is read
  from the cache through `kv_indptr`/`kv_indices`.

Layout: SGLang addresses a token-level KV buffer `[slots, H, D]` with token indices (`kv_indptr`,
`kv_indices`), for every page size (`page_size` only changes its address arithmetic; it is passed, as
the backend passes its `--page-size`). The kit's canonical batch is converted with its layout
adapters `token_slots` and `token_cache`; the extend kernel's dense new-token K/V are gathered from
the canonical cache at the new positions (the backend hands the kernel the K/V it has just written
there). Decode splits: `num_splits=k` is `num_kv_splits = k` for every row and `max_kv_splits = k`;
without it, SGLang's static-split setting (`SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS`) with its
default `--triton-attention-num-kv-splits` of 8.

Declared: softcap (`logit_cap`), split_kv, prefill, non_causal (`is_causal=False`). Not declared:
- `empty_rows`: a decode row of length 0 comes out NaN (stage 1 stores nothing, stage 2 divides by
  a zero sum): outside SGLang's contract, where every decoded sequence holds at least its own token;
- `sliding_window`: the decode kernel has no window argument (the backend trims `kv_indices` to the
  window before calling it), and the extend kernel's `sliding_window_size` keeps keys `p - w <= j <= p`
  with `w = 0` meaning no window, so a window of one token (the protocol's `W = 1`) cannot be asked of
  it; a window is the backend's, not these kernels', to honour.
"""

from __future__ import annotations

import functools
import os

import torch

if not torch.cuda.is_available():  # Triton reads this when @triton.jit decorates, at load time
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pagedkv.fuzz.kernel_kit.layouts import token_cache, token_slots  # noqa: E402

from . import sglang  # noqa: E402  (the pinned wheel, its dependencies and its stub table)

MODULES = ("sglang.kernels.ops.attention.decode_attention", "sglang.kernels.ops.attention.extend_attention")
#: SGLang's default `--triton-attention-num-kv-splits`.
DEFAULT_KV_SPLITS = 8


@functools.lru_cache(maxsize=None)
def kernels():
    """(decode_attention_fwd, extend_attention_fwd) of the pinned release."""
    loaded = sglang.engine(MODULES)
    return (loaded["sglang.kernels.ops.attention.decode_attention"].decode_attention_fwd,
            loaded["sglang.kernels.ops.attention.extend_attention"].extend_attention_fwd)


class SGLangTritonAttention:
    capabilities = frozenset({"prefill", "softcap", "split_kv", "non_causal"})
    block_sizes = None     # any: token-level indices
    head_dims = None
    max_group = None

    def __init__(self):
        self.dtypes = ("float32", "float16", "bfloat16") if torch.cuda.is_available() else ("float32", "float16")
        self._decode, self._extend = kernels()

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap,
               num_splits=None):
        block_size = k_cache.shape[1]
        kv_indptr, kv_indices = token_slots(block_tables, seq_lens, block_size)
        splits = num_splits or DEFAULT_KV_SPLITS
        batch, heads, dim_v = q.shape[0], q.shape[1], v_cache.shape[-1]
        out = torch.empty(q.shape[:2] + (dim_v,), dtype=q.dtype, device=q.device)
        logits = torch.empty((batch, heads, splits, dim_v), dtype=torch.float32, device=q.device)
        lse = torch.empty((batch, heads, splits), dtype=torch.float32, device=q.device)
        self._decode(q, token_cache(k_cache), token_cache(v_cache), out, kv_indptr, kv_indices, logits, lse,
                     torch.full((batch,), splits, dtype=torch.int32, device=q.device), splits,
                     scale, 1.0, 1.0, logit_cap=softcap or 0.0, page_size=block_size)
        return out

    def prefill(self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *, scale, causal,
                sliding_window, softcap):
        block_size = k_cache.shape[1]
        lens, starts = seq_lens.tolist(), query_start_loc.tolist()
        queries = [end - start for start, end in zip(starts, starts[1:])]
        prefix_lens = torch.tensor([n - m for n, m in zip(lens, queries)], dtype=seq_lens.dtype,
                                   device=seq_lens.device)
        prefix_indptr, prefix_indices = token_slots(block_tables, prefix_lens, block_size)
        _, all_indices = token_slots(block_tables, seq_lens, block_size)
        new_slots = torch.cat([all_indices[end - m:end] for end, m in
                               zip(torch.tensor(lens).cumsum(0).tolist(), queries)])
        k_tokens, v_tokens = token_cache(k_cache), token_cache(v_cache)
        out = torch.empty(q.shape[:2] + (v_cache.shape[-1],), dtype=q.dtype, device=q.device)
        self._extend(q, k_tokens[new_slots].contiguous(), v_tokens[new_slots].contiguous(), out, k_tokens, v_tokens,
                     query_start_loc.to(torch.int32), prefix_indptr, prefix_indices, None, causal, None,
                     max(queries, default=0), 1.0, 1.0, sm_scale=scale, logit_cap=softcap or 0.0,
                     page_size=block_size, extend_seq_lens_cpu=queries)
        return out


def factory() -> SGLangTritonAttention:
    return SGLangTritonAttention()
