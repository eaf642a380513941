"""Run `TinyTransformer` on a paged KV cache with the real kernels.

Per layer the device pool is a pair of caches [num_blocks, B, Hkv, D] and the swap pool a pair of
host tensors of the same block shape. One forward pass takes a mixed batch: prefill chunks (several
tokens of a sequence, attended with `paged_prefill`, which also reads the sequence's cached prefix)
then decode tokens (one per sequence, `paged_decode`). Every new token's K/V is stored by `write_kv`
at the slot the block manager assigned (`block * B + offset`); attention reads only through the
block tables, so a wrong table, a missed copy or a stale block shows up as wrong logits.
"""
from dataclasses import dataclass

import torch

from pagedkv.kernels import paged_decode, paged_prefill, write_kv

from .cache_copies import perform_copies

from .model import TinyTransformer


@dataclass
class Batch:
    """One forward pass: prefill rows first (several tokens each; a prefill's queries are the last
    `query_lens[i]` of its `seq_lens[i]` tokens), then decode rows (one token each)."""
    tokens: torch.Tensor         # int64 [T], row by row
    query_lens: torch.Tensor     # int64 [S]
    seq_lens: torch.Tensor       # int32 [S]: tokens in the cache once this pass has written
    block_tables: torch.Tensor   # int32 [S, M]
    slot_mapping: torch.Tensor   # int64 [T]
    num_prefills: int


class PagedRunner:
    def __init__(self, model: TinyTransformer, num_blocks: int, block_size: int, num_cpu_blocks: int = 0):
        cfg = model.cfg
        self.model = model
        shape = (cfg.kv_heads, cfg.head_dim)
        # NaN in never-written slots: a kernel that reads past a sequence's length cannot hide it.
        self.k = [torch.full((num_blocks, block_size, *shape), float("nan")) for _ in range(cfg.layers)]
        self.v = [torch.full((num_blocks, block_size, *shape), float("nan")) for _ in range(cfg.layers)]
        self.cpu_k = [torch.zeros((num_cpu_blocks, block_size, *shape)) for _ in range(cfg.layers)]
        self.cpu_v = [torch.zeros((num_cpu_blocks, block_size, *shape)) for _ in range(cfg.layers)]

    def apply_copies(self, copies) -> None:
        """Perform a BlockManager's drained copies, phase by phase in call order."""
        perform_copies(copies, list(zip(self.k, self.v)), list(zip(self.cpu_k, self.cpu_v)))

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [S, vocab] of each row's last token."""
        p = batch.num_prefills
        rows = torch.repeat_interleave(torch.arange(len(batch.query_lens)), batch.query_lens)
        ends = torch.cumsum(batch.query_lens, 0)
        # A row's tokens are the last query_lens of its seq_lens positions.
        positions = torch.arange(len(rows)) - (ends - batch.query_lens)[rows] \
            + (batch.seq_lens.long() - batch.query_lens)[rows]
        num_prefill_tokens = int(ends[p - 1]) if p else 0
        query_start = torch.zeros(p + 1, dtype=torch.int32)
        query_start[1:] = ends[:p]
        tables, lens = batch.block_tables, batch.seq_lens

        def attend(layer, q, k, v, _positions):
            k_cache, v_cache = self.k[layer], self.v[layer]
            write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
            parts = []
            if p:
                parts.append(paged_prefill(q[:num_prefill_tokens], k_cache, v_cache, tables[:p], lens[:p], query_start))
            if p < len(lens):
                parts.append(paged_decode(q[num_prefill_tokens:], k_cache, v_cache, tables[p:], lens[p:]))
            return torch.cat(parts)

        return self.model.forward(batch.tokens, positions, attend)[ends - 1]

