"""The kernels' second line of defence: in the sync-free mode (validate=False, no host copies) or
with a host copy that lies, index values are not checked on the host, so the kernels themselves
keep every address inside the tensors they were given: lengths are clamped to the table capacity,
query rows to q, and slots past the cache are skipped. A wrong value then gives a wrong row, never
a read or write outside the tensors."""

import torch

import pagedkv.kernels as K


def full_table_case(device, gen, num_seqs=3, max_blocks=3, block_size=4):
    """Every table entry is a real block holding finite K/V, so a read past a row's end would
    silently use the next row's blocks (and change the result) instead of hitting NaN."""
    num_blocks = num_seqs * max_blocks
    tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(num_seqs, max_blocks).to(device)
    k = torch.randn(num_blocks, block_size, 2, 16, generator=gen).to(device)
    v = torch.randn(num_blocks, block_size, 2, 16, generator=gen).to(device)
    q = torch.randn(num_seqs, 4, 16, generator=gen).to(device)
    return q, k, v, tables, max_blocks * block_size


def test_decode_clamps_unchecked_lengths_to_the_table(device, gen):
    q, k, v, tables, capacity = full_table_case(device, gen)
    honest = torch.full((3,), capacity, dtype=torch.int32, device=device)
    lying = torch.tensor([capacity + 5, capacity * 7, 2**31 - 1], dtype=torch.int32, device=device)
    kw = dict(validate=False, max_seq_len=capacity, num_splits=1)
    want = K.paged_decode(q, k, v, tables, honest, **kw)
    got = K.paged_decode(q, k, v, tables, lying, **kw)
    assert torch.equal(got, want)


def test_decode_treats_unchecked_negative_lengths_as_empty(device, gen):
    q, k, v, tables, capacity = full_table_case(device, gen)
    lens = torch.tensor([-1, -(2**31), 5], dtype=torch.int32, device=device)
    out = K.paged_decode(q, k, v, tables, lens, validate=False, max_seq_len=capacity, num_splits=2)
    assert torch.count_nonzero(out[:2]) == 0
    ref = K.reference_decode(q.cpu(), k.cpu(), v.cpu(), tables.cpu(), torch.tensor([0, 0, 5], dtype=torch.int32))
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=0)


def test_prefill_never_addresses_query_rows_past_q(device, gen):
    """query_start_loc's last entry claims 40 more tokens than q has: the rows that exist are
    written, the others are neither read nor written (out has exactly q's rows)."""
    q, k, v, tables, capacity = full_table_case(device, gen)
    q = q[:3]
    lens = torch.tensor([2, 12, 12], dtype=torch.int32, device=device)
    good = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device)
    bad = torch.tensor([0, 1, 2, 43], dtype=torch.int32, device=device)
    kw = dict(validate=False, max_seq_len=capacity)
    want = K.paged_prefill(q, k, v, tables, lens, good, **kw)
    got = K.paged_prefill(q, k, v, tables, lens, bad, **kw)
    assert got.shape == q.shape
    assert torch.equal(got[:2], want[:2])      # the honest sequences are untouched by the lie
    assert torch.isfinite(got).all()


def test_write_kv_skips_slots_past_the_cache_when_the_host_copy_lies(device, gen):
    k = torch.zeros(4, 4, 2, 16, device=device)
    v = torch.zeros_like(k)
    key = torch.randn(2, 2, 16, generator=gen).to(device)
    value = torch.randn(2, 2, 16, generator=gen).to(device)
    slots = torch.tensor([3, 10**9], device=device)
    K.write_kv(key, value, k, v, slots, slot_mapping_host=[3, -1])
    assert torch.equal(k[0, 3], key[0]) and torch.equal(v[0, 3], value[0])
    k[0, 3] = 0
    v[0, 3] = 0
    assert torch.count_nonzero(k) == 0 and torch.count_nonzero(v) == 0


def test_attention_never_reads_a_block_id_past_the_cache(device, gen):
    """An unvalidated table naming blocks outside the cache (past its end, or negative) reads them
    as masked keys: the result is the attention over the row's real blocks alone, finite, with no
    read outside k and v (the ids are far enough out to fault)."""
    q, k, v, tables, capacity = full_table_case(device, gen)
    lens = torch.tensor([12, 8, 4], dtype=torch.int32, device=device)
    lying = tables.clone()
    lying[0, 2] = 2**31 - 1          # sequence 0's third block
    lying[1, 1] = -(2**31)           # sequence 1's second block
    out = K.paged_decode(q, k, v, lying, lens, validate=False, max_seq_len=capacity, num_splits=1)
    # The same keys dropped by hand: sequence 0 sees blocks 0-1 (8 tokens), sequence 1 block 0 (4).
    want = K.reference_decode(q.cpu(), k.cpu(), v.cpu(), tables.cpu(), torch.tensor([8, 4, 4], dtype=torch.int32))
    torch.testing.assert_close(out.cpu(), want, atol=2e-5, rtol=0)
    prefill = K.paged_prefill(q, k, v, lying, lens, torch.arange(4, dtype=torch.int32, device=device),
                              validate=False, max_seq_len=capacity)
    assert torch.isfinite(prefill).all()
