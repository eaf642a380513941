"""write_kv and copy_blocks against plain torch indexing; rejected calls leave the caches unchanged."""

import pytest
import torch

import pagedkv.kernels as K


def caches(num_blocks, block_size, heads, d, dtype, device, gen):
    k = torch.randn(num_blocks, block_size, heads, d, generator=gen).to(dtype=dtype, device=device)
    v = torch.randn(num_blocks, block_size, heads, d, generator=gen).to(dtype=dtype, device=device)
    return k, v


@pytest.mark.parametrize("block_size,head_dim", [(1, 64), (3, 80), (16, 128), (32, 256)])
def test_write_kv_matches_indexing(block_size, head_dim, dtype, device, gen):
    heads, t = 2, 20
    num_blocks = 7 + 40 // block_size
    k, v = caches(num_blocks, block_size, heads, head_dim, dtype, device, gen)
    key = torch.randn(t, heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    value = torch.randn(t, heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t]
    slots[::3] = -1  # padding tokens are skipped
    slots = slots.to(device)
    ek, ev = k.clone(), v.clone()
    keep = slots >= 0
    s = slots[keep]
    ek[s // block_size, s % block_size] = key[keep]
    ev[s // block_size, s % block_size] = value[keep]
    K.write_kv(key, value, k, v, slots)
    assert torch.equal(k, ek) and torch.equal(v, ev)


def test_write_kv_strided_inputs_and_cache_view(device, gen):
    """key/value as slices of a fused qkv tensor; the cache a view of a [2, N, B, H, D] buffer."""
    buf = torch.randn(2, 5, 4, 2, 64, generator=gen).to(device)
    k, v = buf[0], buf[1]
    qkv = torch.randn(6, 3, 2, 64, generator=gen).to(device)
    key, value = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([0, 5, 19, -1, 7, 12], device=device)
    ek, ev = k.clone(), v.clone()
    keep = slots >= 0
    s = slots[keep]
    ek[s // 4, s % 4] = key[keep]
    ev[s // 4, s % 4] = value[keep]
    K.write_kv(key, value, k, v, slots)
    assert torch.equal(k, ek) and torch.equal(v, ev)


@pytest.mark.parametrize("block_size", [1, 3, 16, 100])
def test_copy_blocks(block_size, dtype, device, gen):
    k, v = caches(9, block_size, 2, 64, dtype, device, gen)
    pairs = torch.tensor([[0, 3], [0, 4], [2, 8], [5, 1]], device=device)
    ek, ev = k.clone(), v.clone()
    for src, dst in pairs.tolist():
        ek[dst] = k[src]
        ev[dst] = v[src]
    K.copy_blocks(k, v, pairs)
    assert torch.equal(k, ek) and torch.equal(v, ev)
    K.copy_blocks(k, v, torch.empty(0, 2, dtype=torch.int64, device=device))  # no-op


def test_write_then_read_back_through_attention(device, gen):
    """write_kv into a shuffled cache, then decode over it equals dense attention."""
    from pagedkv.kernels.testing import compare

    block_size, heads, d, n = 3, 2, 64, 10
    k = torch.full((8, block_size, heads, d), float("nan"), device=device)
    v = k.clone()
    table = torch.tensor([[6, 2, 7, 0]], dtype=torch.int32, device=device)
    pos = torch.arange(n, device=device)
    slots = (table[0, pos // block_size].long() * block_size + pos % block_size)
    key = torch.randn(n, heads, d, generator=gen).to(device)
    value = torch.randn(n, heads, d, generator=gen).to(device)
    K.write_kv(key, value, k, v, slots)
    q = torch.randn(1, 4, d, generator=gen).to(device)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    out = K.paged_decode(q, k, v, table, lens)
    ref = K.dense_attention(q.cpu(), key.cpu(), value.cpu(), torch.tensor([n - 1]), scale=d ** -0.5)
    ok, msg = compare(out.cpu(), ref, ref, torch.float32)
    assert ok, msg


# ---- rejected calls ---------------------------------------------------------------------------------

def _write_args(device, gen):
    k, v = caches(4, 4, 2, 64, torch.float32, device, gen)
    key = torch.randn(3, 2, 64, generator=gen).to(device)
    value = torch.randn(3, 2, 64, generator=gen).to(device)
    slots = torch.tensor([0, 5, -1], device=device)
    return dict(key=key, value=value, k_cache=k, v_cache=v, slot_mapping=slots)


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.update(slot_mapping=torch.tensor([0, 16, 1], device=a["key"].device)), "out of range"),
    (lambda a: a.update(slot_mapping=torch.tensor([0, -2, 1], device=a["key"].device)), "out of range"),
    (lambda a: a.update(slot_mapping=torch.tensor([3, 3, 1], device=a["key"].device)), "same slot twice"),
    (lambda a: a.update(slot_mapping=a["slot_mapping"].int()), "dtype"),
    (lambda a: a.update(slot_mapping=a["slot_mapping"][:2]), "entries"),
    (lambda a: a.update(key=a["key"].half()), "dtype"),
    (lambda a: a.update(value=a["value"][:, :1]), "must be"),
    (lambda a: a.update(key=a["key"][:2]), "tokens"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :2]), "same shape"),
    (lambda a: a.update(k_cache=a["k_cache"][:1].expand(4, 4, 2, 64)), "overlaps itself"),
    (lambda a: a.update(key=a["key"].transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
    (lambda a: a.update(key=a["key"].tolist()), "torch.Tensor"),
])
def test_write_kv_rejects_bad_arguments_and_changes_nothing(mutate, match, device, gen):
    args = _write_args(device, gen)
    mutate(args)
    before = (args["k_cache"].clone(), args["v_cache"].clone())
    with pytest.raises(K.KernelArgumentError, match=match):
        K.write_kv(**args)
    assert torch.equal(args["k_cache"], before[0]) and torch.equal(args["v_cache"], before[1])


@pytest.mark.parametrize("pairs,match", [
    ([[0, 9]], "not a block id"),
    ([[-1, 2]], "not a block id"),
    ([[0, 2], [1, 2]], "destination block twice"),
    ([[0, 1], [1, 2]], "both a source and a destination"),
    ([[3, 3]], "both a source and a destination"),
])
def test_copy_blocks_rejects_bad_pairs_and_changes_nothing(pairs, match, device, gen):
    k, v = caches(4, 4, 2, 64, torch.float32, device, gen)
    before = (k.clone(), v.clone())
    with pytest.raises(K.KernelArgumentError, match=match):
        K.copy_blocks(k, v, torch.tensor(pairs, device=device))
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])


def test_copy_blocks_rejects_wrong_shape_and_dtype(device, gen):
    k, v = caches(4, 4, 2, 64, torch.float32, device, gen)
    with pytest.raises(K.KernelArgumentError, match="P, 2"):
        K.copy_blocks(k, v, torch.tensor([0, 1], device=device))
    with pytest.raises(K.KernelArgumentError, match="dtype"):
        K.copy_blocks(k, v, torch.tensor([[0, 1]], dtype=torch.int32, device=device))
