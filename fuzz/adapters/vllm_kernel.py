"""vLLM 0.33.0's Triton unified attention as a kernel target of the kit (`--kernel vllm`).

`unified_attention` (vllm/v1/attention/ops/triton_unified_attention.py) is the one kernel of vLLM's
Triton attention backend (`TRITON_ATTN`, vllm/v1/attention/backends/triton_attn.py) for decode,
chunked prefill and mixed batches. It is called here as that backend calls it:

- the cache: the backend's `[N, B, H, 2 * D]` buffer split into K and V views along the last dim
  (`kv_cache.transpose(1, 2).split(head_size, dim=-1)`), so the kernel reads strided, non-contiguous
  K and V as in vLLM; the kit's canonical `[N, B, H, D]` caches are packed into it;
- `window_size=(W - 1, 0)` for a sliding window of W keys (the backend's causal window), `(-1, -1)`
  without; `softcap` 0 for none; `k_descale`/`v_descale` the layer's unit scales expanded to
  `[S, Hkv]` (float caches: never read);
- the split-KV (3D) path's scratch buffers and threshold as the backend sizes them: 16 softmax
  segments (`NUM_PAR_SOFTMAX_SEGMENTS`), threshold `128 // Hkv` (`MIN_LAUNCH_GRID_SIZE_2D`), so a
  small decode batch runs split-KV with the reduce kernel, a large one or a prefill the 2D kernel.

Declared, as vLLM's backend declares it: block sizes multiples of 16 (`get_supported_kernel_block_sizes`:
`MultipleOf(16)`), head sizes >= 32 (`supports_head_size`), prefill, sliding window, softcap and
non-causal prefill (`causal=False`). Not declared: `split_kv` (the kernel reduces over
`tl.arange(0, NUM_SEGMENTS_PER_SEQ)`, so only powers of two can be asked of it, not the protocol's any
k; the backend's own 16 segments are exercised by every small decode batch) and `empty_rows` (a
decoded sequence always holds its own token in vLLM). `factory_any_block_size` declares every
block size, to show what the kernel's own address arithmetic does outside the backend's contract.

Loaded from the wheel cache with the block-manager adapter's stub table (vllm_v1.STUBS) plus one:
`vllm.triton_utils`, which decides between real Triton and a placeholder by counting active GPU
drivers (none on a CPU machine); here it is the real `triton` and `triton.language`, which run under
Triton's interpreter (`TRITON_INTERPRET=1`, set before Triton decorates anything).
"""

from __future__ import annotations

import functools
import os

import torch

if not torch.cuda.is_available():  # Triton reads this when @triton.jit decorates, at load time
    os.environ.setdefault("TRITON_INTERPRET", "1")

from . import vllm_v1, wheels  # noqa: E402
from .wheels import Stub  # noqa: E402

MODULE = "vllm.v1.attention.ops.triton_unified_attention"
SEGMENTS = 16                 # vllm/v1/attention/backends/triton_attn.py: NUM_PAR_SOFTMAX_SEGMENTS
MIN_LAUNCH_GRID_SIZE_2D = 128  # the same file: below it a decode batch runs the 3D (split-KV) kernel
DECODE_TILE = 16              # _get_tile_size: 16 for 2- and 4-byte queries outside Gemma3's window


def _real_triton(module) -> None:
    import triton
    import triton.language as tl
    module.triton, module.tl, module.HAS_TRITON = triton, tl, True


STUBS = dict(vllm_v1.STUBS, **{
    "vllm.triton_utils": Stub("Triton-or-placeholder choice by active GPU drivers (none here); the real "
                              "triton and triton.language are provided, run by Triton's interpreter",
                              _real_triton),
})


@functools.cache
def unified_attention():
    """vLLM's `unified_attention` of the pinned release (and the loaded engine to run it in)."""
    if wheels.importable("vllm", vllm_v1.VERSION):
        engine = wheels.installed([MODULE])
    else:
        root = wheels.install("vllm", vllm_v1.VERSION, keep=wheels.python_sources)
        engine = wheels.load([root], ["vllm"], [MODULE], STUBS)
    return engine, engine[MODULE].unified_attention


class VllmUnifiedAttention:
    capabilities = frozenset({"prefill", "sliding_window", "softcap", "non_causal"})
    block_sizes = frozenset(range(16, 1025, 16))
    head_dims = frozenset(range(32, 513))
    max_group = None
    tile_size = DECODE_TILE

    def __init__(self):
        self.dtypes = ("float32", "float16", "bfloat16") if torch.cuda.is_available() else ("float32", "float16")
        self._engine, self._attend = unified_attention()

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap):
        starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)  # one query per sequence
        return self._run(q, k_cache, v_cache, block_tables, seq_lens, starts, 1, scale=scale, causal=True,
                         sliding_window=sliding_window, softcap=softcap)

    def prefill(self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *, scale, causal,
                sliding_window, softcap):
        longest = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if len(seq_lens) else 0
        return self._run(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc.to(torch.int32), longest,
                         scale=scale, causal=causal, sliding_window=sliding_window, softcap=softcap)

    def _run(self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, *, scale,
             causal, sliding_window, softcap):
        head_dim, kv_heads = k_cache.shape[-1], k_cache.shape[2]
        # The backend's buffer [N, B, H, 2D], K and V as views of its halves (not contiguous).
        key_cache, value_cache = torch.cat((k_cache, v_cache), dim=-1).split(head_dim, dim=-1)
        num_seqs, tokens, heads = len(seq_lens), q.shape[0], q.shape[1]
        unit = torch.ones((), dtype=torch.float32, device=q.device).expand(num_seqs, kv_heads)
        padded = 1 << max(head_dim - 1, 0).bit_length()
        out = torch.empty_like(q)
        with self._engine.active():
            self._attend(
                q=q, k=key_cache, v=value_cache, out=out, cu_seqlens_q=query_start_loc, max_seqlen_q=max_query_len,
                seqused_k=seq_lens.to(torch.int32), max_seqlen_k=int(seq_lens.max()) if num_seqs else 0,
                softmax_scale=scale, causal=causal,
                window_size=(sliding_window - 1, 0) if sliding_window else (-1, -1),
                block_table=block_tables.to(torch.int32), softcap=softcap or 0.0,
                q_descale=None, k_descale=unit, v_descale=unit,
                seq_threshold_3D=MIN_LAUNCH_GRID_SIZE_2D // kv_heads, num_par_softmax_segments=SEGMENTS,
                softmax_segm_output=torch.empty((tokens, heads, SEGMENTS, padded), dtype=torch.float32,
                                                device=q.device),
                softmax_segm_max=torch.empty((tokens, heads, SEGMENTS), dtype=torch.float32, device=q.device),
                softmax_segm_expsum=torch.empty((tokens, heads, SEGMENTS), dtype=torch.float32, device=q.device))
        return out


class VllmUnifiedAttentionAnyBlockSize(VllmUnifiedAttention):
    """The same kernel declared for every block size and head dim: outside the backend's contract."""
    block_sizes = None
    head_dims = None


def factory() -> VllmUnifiedAttention:
    return VllmUnifiedAttention()


def factory_any_block_size() -> VllmUnifiedAttentionAnyBlockSize:
    return VllmUnifiedAttentionAnyBlockSize()
