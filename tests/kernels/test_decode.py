"""Differential tests of paged_decode against dense float32 attention."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv.kernels as K
from pagedkv.kernels.testing import compare, edge_lengths, make_case


def run_decode(case, dtype, **kw):
    out = K.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, **kw)
    kw.pop("num_splits", None)
    kw.pop("_tile_rows", None)
    args = (case.q.cpu(), case.k_cache.cpu(), case.v_cache.cpu(), case.block_tables.cpu(), case.seq_lens.cpu())
    ref = K.reference_decode(*args, **kw)
    naive = K.reference_decode(*args, **kw, compute_dtype=dtype)
    ok, msg = compare(out.cpu(), ref, naive, dtype)
    assert ok, msg
    return out


@pytest.mark.parametrize("block_size", [1, 3, 8, 16, 32, 128])
def test_edge_lengths_mixed_in_one_batch(block_size, dtype, size, device, gen):
    lens = edge_lengths(block_size, size["long"]) * size["reps"]
    case = make_case(lens, block_size=block_size, group=2, dtype=dtype, device=device, generator=gen)
    out = run_decode(case, dtype, num_splits=1)
    assert torch.count_nonzero(out[0]) == 0  # length 0 -> zeros


@pytest.mark.parametrize("group,tile_rows", [(1, None), (2, None), (5, None), (8, None), (32, None), (32, 16), (5, 16)])
def test_gqa_groups(group, tile_rows, size, device, gen):
    """Any group size; (32, 16) spreads one group over two row tiles."""
    lens = [0, 1, 9, size["long"]] * size["reps"]
    case = make_case(lens, block_size=8, num_kv_heads=1 if group == 32 else 2, group=group,
                     dtype=torch.float16, device=device, generator=gen)
    run_decode(case, torch.float16, num_splits=1, _tile_rows=tile_rows)


@pytest.mark.parametrize("num_splits", [1, 2, 5, None])
@pytest.mark.parametrize("window,softcap", [(None, None), (13, None), (None, 2.0), (40, 30.0)])
def test_split_kv_and_options(num_splits, window, softcap, size, device, gen):
    lens = [0, 1, 17, 5 * size["long"]] * size["reps"]
    case = make_case(lens, block_size=16, group=3, dtype=torch.float32, device=device, generator=gen)
    run_decode(case, torch.float32, num_splits=num_splits, sliding_window=window, softcap=softcap)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_head_dims(head_dim, dtype, device, gen):
    case = make_case([1, 20, 33], block_size=16, head_dim=head_dim, dtype=dtype, device=device, generator=gen)
    run_decode(case, dtype, num_splits=2 if head_dim == 80 else 1)


def test_auto_split_is_chosen_for_long_sequences_and_small_batches():
    assert K.choose_num_splits(num_programs=2, max_seq_len=4096, parallelism=132) > 1
    assert K.choose_num_splits(num_programs=2, max_seq_len=100, parallelism=132) == 1
    assert K.choose_num_splits(num_programs=1024, max_seq_len=4096, parallelism=132) == 1
    assert K.choose_num_splits(num_programs=0, max_seq_len=0, parallelism=4) == 1


def test_auto_split_path_matches_reference(device, gen):
    # one sequence, one KV head: the automatic choice splits it (checked) and must stay exact.
    case = make_case([600], block_size=16, num_kv_heads=1, group=4, device=device, generator=gen)
    from pagedkv.kernels.decode import device_parallelism

    assert K.choose_num_splits(1, 600, device_parallelism(case.q.device)) > 1
    run_decode(case, torch.float32)


def test_softcap_cannot_overflow(device, gen):
    case = make_case([5, 40], block_size=8, dtype=torch.float16, device=device, generator=gen)
    case.q.mul_(300.0)  # scores ~ 1e4 * scale: tanh via exp(-2|x|) stays finite
    out = run_decode(case, torch.float16, softcap=20.0, num_splits=1)
    assert torch.isfinite(out.float()).all()


def test_all_lengths_zero_give_zeros(device, gen):
    case = make_case([0, 0, 0], block_size=4, device=device, generator=gen)
    for splits in (1, 3):
        out = K.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, num_splits=splits)
        assert torch.count_nonzero(out) == 0


def test_window_of_one_and_scale(device, gen):
    case = make_case([1, 7, 30], block_size=4, dtype=torch.float32, device=device, generator=gen)
    run_decode(case, torch.float32, sliding_window=1, scale=0.3, num_splits=1)
    run_decode(case, torch.float32, scale=-1.5, num_splits=3)


def test_int64_block_addressing(device):
    """Block id x block stride > 2**31 elements.

    A real cache that large does not fit, so the cache is a strided view with a block stride of
    2**30 + 64 elements (small enough that Triton passes the stride as an int32) over a lazily
    allocated float16 buffer of ~4 GiB of *virtual* memory; only the blocks used (ids 0 and 2) are
    ever written, so only their pages are committed. With int32 arithmetic, 2 * stride wraps to a
    negative offset and the kernel reads garbage before the buffer.
    """
    block_size, heads, d = 4, 1, 64
    stride_b = 2**30 + 64
    numel = 2 * stride_b + block_size * heads * d
    try:
        buf_k = torch.empty(numel, dtype=torch.float16, device=device)
        buf_v = torch.empty(numel, dtype=torch.float16, device=device)
    except (RuntimeError, MemoryError):
        pytest.skip("cannot reserve 2 x 4 GiB of virtual memory")
    shape = (3, block_size, heads, d)
    strides = (stride_b, heads * d, d, 1)
    k_cache = buf_k.as_strided(shape, strides)
    v_cache = buf_v.as_strided(shape, strides)
    g = torch.Generator().manual_seed(5)
    for cache in (k_cache, v_cache):
        for b in (0, 2):
            cache[b].copy_(torch.randn(shape[1:], generator=g).half())
    tables = torch.tensor([[2, 0], [2, 2]], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([7, 3], dtype=torch.int32, device=device)
    q = torch.randn(2, 2, d, generator=g).half().to(device)
    assert k_cache.stride(0) < 2**31 <= 2 * k_cache.stride(0)
    out = K.paged_decode(q, k_cache, v_cache, tables, seq_lens, num_splits=1)
    ref = K.reference_decode(q.cpu(), k_cache.cpu(), v_cache.cpu(), tables.cpu(), seq_lens.cpu())
    naive = K.reference_decode(q.cpu(), k_cache.cpu(), v_cache.cpu(), tables.cpu(), seq_lens.cpu(),
                               compute_dtype=torch.float16)
    ok, msg = compare(out.cpu(), ref, naive, torch.float16)
    assert ok, msg


def test_int64_split_addressing(device):
    """Split x split stride > 2**31 elements in the combine of a split decode.

    paged_decode's partial outputs are `[splits, seqs, heads, D]`: 9 splits of 2**28 + 64 elements
    each (a 2**21-sequence batch of one 128-wide head) put the last split past 2**31. The combine
    kernel is launched as paged_decode launches it, on a strided view over a lazily allocated
    float16 buffer of ~4 GiB of virtual memory (only the 9 rows read are written). With int32
    split offsets the last rows' addresses wrap before the buffer (garbage, or a crash)."""
    splits, d, stride_s = 9, 128, 2**28 + 64
    buf = torch.empty((splits - 1) * stride_s + d, dtype=torch.float16, device=device)
    part = buf.as_strided((splits, 1, 1, d), (stride_s, d, d, 1))
    for split in range(splits):
        part[split].fill_(split + 1)
    lse = torch.zeros(splits, 1, 1, dtype=torch.float32, device=device)   # equal weights
    out = torch.zeros(1, 1, d, dtype=torch.float32, device=device)
    assert part.stride(0) < 2**31 <= (splits - 1) * part.stride(0)
    K.decode._combine_splits_kernel[(1, 1)](
        part, lse, out, *part.stride()[:3], *lse.stride(), *out.stride()[:2],
        NUM_SPLITS=splits, SPLITS_P2=16, HEAD_DIM=d, BLOCK_D=d)
    assert out.cpu().eq(sum(range(1, splits + 1)) / splits).all()   # the mean of 1..9


@st.composite
def decode_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 32]))
    lens = draw(st.lists(st.integers(0, 3 * block_size + 2), min_size=1, max_size=5))
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.integers(1, 6))
    head_dim = draw(st.sampled_from([16, 40, 64]))
    window = draw(st.one_of(st.none(), st.integers(1, 40)))
    softcap = draw(st.one_of(st.none(), st.floats(0.5, 50.0)))
    splits = draw(st.sampled_from([1, 2, 3, None]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(block_size=block_size, lens=lens, kv_heads=kv_heads, group=group, head_dim=head_dim,
                window=window, softcap=softcap, splits=splits, seed=seed)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=decode_cases(), dt=st.sampled_from([torch.float32, torch.float16]))
def test_hypothesis_decode(c, dt):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = make_case(c["lens"], block_size=c["block_size"], num_kv_heads=c["kv_heads"], group=c["group"],
                     head_dim=c["head_dim"], dtype=dt, device=device, pool_factor=4,
                     generator=torch.Generator().manual_seed(c["seed"]))
    run_decode(case, dt, sliding_window=c["window"], softcap=c["softcap"], num_splits=c["splits"])


def test_reference_matches_sdpa(gen):
    """The dense reference itself agrees with torch's scaled_dot_product_attention."""
    case = make_case([1, 9, 33], block_size=4, num_kv_heads=2, group=3, q_lens=[1, 4, 33], generator=gen)
    ref = K.reference_prefill(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                              case.query_start_loc)
    qsl = case.query_start_loc.tolist()
    for i, n in enumerate(case.lens):
        k, v = K.gather_kv(case.k_cache, case.v_cache, case.block_tables[i], n)
        q = case.q[qsl[i] : qsl[i + 1]]
        t = q.shape[0]
        group = q.shape[1] // k.shape[1]
        mask = torch.arange(n)[None, :] <= torch.arange(n - t, n)[:, None]
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
            v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask, scale=1 / math.sqrt(q.shape[2]),
        ).transpose(0, 1)
        torch.testing.assert_close(ref[qsl[i] : qsl[i + 1]], sdpa, atol=1e-5, rtol=1e-5)
