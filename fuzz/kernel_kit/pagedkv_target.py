"""The built-in kernel target ``pagedkv``: pagedkv's own Triton kernels under the kit's protocol.

They declare everything the protocol knows, every block size, head dims up to 256, and any group.
bfloat16 is declared only where it can run (CUDA; the interpreter has none), so CPU replays skip it.
"""

from __future__ import annotations

import torch

from pagedkv.kernels import paged_decode, paged_prefill
from pagedkv.kernels.attention import tile_sizes
from pagedkv.kernels.validation import MAX_HEAD_DIM, is_interpreter

from .protocol import CAPABILITIES


class PagedkvKernels:
    capabilities = CAPABILITIES
    block_sizes = None
    head_dims = frozenset(range(1, MAX_HEAD_DIM + 1))
    max_group = None

    def __init__(self):
        on_cuda = torch.cuda.is_available() and not is_interpreter()
        self.on_gpu = on_cuda
        self.dtypes = ("float32", "float16", "bfloat16") if on_cuda else ("float32", "float16")

    def tile_size(self, head_dim: int) -> int:
        return tile_sizes(head_dim, 1, decode=True, tile_rows=None, on_gpu=self.on_gpu)[1]

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap,
               num_splits=None):
        return paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=scale,
                            sliding_window=sliding_window, softcap=softcap, num_splits=num_splits)

    def prefill(self, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *, scale, causal,
                sliding_window, softcap):
        return paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale=scale,
                             causal=causal, sliding_window=sliding_window, softcap=softcap)


def factory() -> PagedkvKernels:
    return PagedkvKernels()
