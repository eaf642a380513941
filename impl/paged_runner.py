"""Run `TinyTransformer` on a paged KV cache with the real kernels.

Per layer the device pool is a pair of caches [num_blocks, B, Hkv, D] and the swap pool a pair of
host tensors of the same block shape. One forward pass takes a mixed batch: prefill chunks (several
tokens of a sequence, attended with `paged_prefill`, which also reads the sequence's cached prefix)
then decode tokens (one per sequence, `paged_decode`). Every new token's K/V is stored by `write_kv`
at its slot, `block * B + offset`, from the sequence's block table; attention reads only through
the tables, so a wrong table, a missed copy or a stale block shows up as wrong logits.
"""
from dataclasses import dataclass

import torch

from pagedkv.kernels import copy_blocks, paged_decode, paged_prefill, write_kv

from .model import TinyTransformer


@dataclass
class Chunk:
    """Tokens of one sequence to compute now: `tokens` sit at positions start .. start+len-1, and the
    sequence's K/V for positions before `start` is already in the cache."""
    tokens: list
    start: int
    block_table: list


class PagedRunner:
    def __init__(self, model: TinyTransformer, num_blocks: int, block_size: int, num_cpu_blocks: int = 0):
        cfg = model.cfg
        self.model, self.block_size = model, block_size
        shape = (cfg.kv_heads, cfg.head_dim)
        # NaN in never-written slots: a kernel that reads past a sequence's length cannot hide it.
        self.k = [torch.full((num_blocks, block_size, *shape), float("nan")) for _ in range(cfg.layers)]
        self.v = [torch.full((num_blocks, block_size, *shape), float("nan")) for _ in range(cfg.layers)]
        self.cpu_k = [torch.zeros((num_cpu_blocks, block_size, *shape)) for _ in range(cfg.layers)]
        self.cpu_v = [torch.zeros((num_cpu_blocks, block_size, *shape)) for _ in range(cfg.layers)]

    def apply_copies(self, copies) -> None:
        """Perform a BlockManager's pending copies in their required order: swap-outs, swap-ins, then
        copy-on-writes."""
        for layer in range(len(self.k)):
            _copy_across(self.k[layer], self.cpu_k[layer], copies.swap_out)
            _copy_across(self.v[layer], self.cpu_v[layer], copies.swap_out)
            _copy_across(self.cpu_k[layer], self.k[layer], copies.swap_in)
            _copy_across(self.cpu_v[layer], self.v[layer], copies.swap_in)
            if len(copies.cow):
                copy_blocks(self.k[layer], self.v[layer], copies.cow)

    def forward(self, prefills: list, decodes: list) -> torch.Tensor:
        """Logits [len(prefills) + len(decodes), vocab] of each chunk's last token; decode chunks hold
        one token each."""
        chunks = prefills + decodes
        tokens = torch.tensor([t for c in chunks for t in c.tokens], dtype=torch.int64)
        positions = torch.cat([torch.arange(c.start, c.start + len(c.tokens)) for c in chunks])
        seq_lens = torch.tensor([c.start + len(c.tokens) for c in chunks], dtype=torch.int32)
        width = max(len(c.block_table) for c in chunks)
        tables = torch.tensor([c.block_table + [-1] * (width - len(c.block_table)) for c in chunks],
                              dtype=torch.int32)
        counts = torch.tensor([len(c.tokens) for c in chunks])
        rows = torch.repeat_interleave(torch.arange(len(chunks)), counts)
        slots = (tables[rows, positions // self.block_size].long() * self.block_size
                 + positions % self.block_size)
        num_prefill_tokens = int(counts[:len(prefills)].sum())
        query_start = torch.zeros(len(prefills) + 1, dtype=torch.int32)
        query_start[1:] = torch.cumsum(counts[:len(prefills)], 0)
        p = len(prefills)

        def attend(layer, q, k, v, _positions):
            k_cache, v_cache = self.k[layer], self.v[layer]
            write_kv(k, v, k_cache, v_cache, slots)
            parts = []
            if prefills:
                parts.append(paged_prefill(q[:num_prefill_tokens], k_cache, v_cache, tables[:p], seq_lens[:p],
                                           query_start))
            if decodes:
                parts.append(paged_decode(q[num_prefill_tokens:], k_cache, v_cache, tables[p:], seq_lens[p:]))
            return torch.cat(parts)

        logits = self.model.forward(tokens, positions, attend)
        return logits[torch.cumsum(counts, 0) - 1]


def _copy_across(src_cache: torch.Tensor, dst_cache: torch.Tensor, pairs: torch.Tensor) -> None:
    """Whole-block copies between two pools (device <-> host): `copy_blocks` works within one cache."""
    if len(pairs):
        dst_cache[pairs[:, 1]] = src_cache[pairs[:, 0]].to(dst_cache.device)
