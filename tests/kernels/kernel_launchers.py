"""Small valid calls of every kernel launcher, shared by the strided-view and hostile-value tests.

``CALLS[name]()`` returns (fn, kwargs): a valid call with every tensor argument (host copies
included) given by keyword. ``run(fn, kwargs)`` performs it and returns what it produced: the
output tensor for attention, the two caches for the cache writers (which write in place).
"""

from __future__ import annotations

import torch

import pagedkv.kernels as K
from pagedkv.kernels.testing import make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _attention_kwargs(case, host: bool) -> dict:
    kw = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_tables=case.block_tables,
              seq_lens=case.seq_lens)
    if host:
        kw.update(seq_lens_host=case.seq_lens.cpu(), block_tables_host=case.block_tables.cpu())
    return kw


def decode_call(host: bool = True):
    case = make_case([5, 9, 0], block_size=4, num_kv_heads=2, group=2, head_dim=16, device=DEVICE,
                     generator=torch.Generator().manual_seed(7))
    return K.paged_decode, _attention_kwargs(case, host)


def prefill_call(host: bool = True):
    case = make_case([5, 9, 3], q_lens=[2, 9, 0], block_size=4, num_kv_heads=1, group=2, head_dim=16,
                     device=DEVICE, generator=torch.Generator().manual_seed(8))
    kw = _attention_kwargs(case, host)
    kw["query_start_loc"] = case.query_start_loc
    if host:
        kw["query_start_loc_host"] = case.query_start_loc.cpu()
    return K.paged_prefill, kw


def _caches(gen):
    k = torch.randn(6, 4, 2, 16, generator=gen).to(DEVICE)
    v = torch.randn(6, 4, 2, 16, generator=gen).to(DEVICE)
    return k, v


def write_call(host: bool = True):
    gen = torch.Generator().manual_seed(9)
    k, v = _caches(gen)
    key = torch.randn(5, 2, 16, generator=gen).to(DEVICE)
    value = torch.randn(5, 2, 16, generator=gen).to(DEVICE)
    slots = torch.tensor([0, 22, -1, 7, 13], device=DEVICE)
    kw = dict(key=key, value=value, k_cache=k, v_cache=v, slot_mapping=slots)
    if host:
        kw["slot_mapping_host"] = slots.cpu()
    return K.write_kv, kw


def copy_call(host: bool = True):
    k, v = _caches(torch.Generator().manual_seed(10))
    pairs = torch.tensor([[0, 3], [0, 4], [2, 5]], device=DEVICE)
    kw = dict(k_cache=k, v_cache=v, pairs=pairs)
    if host:
        kw["pairs_host"] = pairs.cpu()
    return K.copy_blocks, kw


CALLS = {"paged_decode": decode_call, "paged_prefill": prefill_call, "write_kv": write_call,
         "copy_blocks": copy_call}


def run(fn, kwargs: dict):
    out = fn(**kwargs)
    if out is None:
        return kwargs["k_cache"].clone(), kwargs["v_cache"].clone()
    return (out,)


def snapshot(kwargs: dict) -> dict:
    """Copies of every tensor argument that holds data (not meta or sparse ones a hostile test
    substituted), to assert a refused call changed nothing."""
    return {k: v.clone() for k, v in kwargs.items()
            if isinstance(v, torch.Tensor) and v.layout == torch.strided and v.device.type != "meta"}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element by element, NaN equal to NaN (the test caches are NaN-poisoned)."""
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    return torch.equal(a, b)


def unchanged(kwargs: dict, before: dict) -> bool:
    return all(same(kwargs[k], v) for k, v in before.items())
