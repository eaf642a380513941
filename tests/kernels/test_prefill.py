"""Differential tests of paged_prefill (chunked prefill with a cached prefix, mixed with decode rows)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv.kernels as K
from pagedkv.kernels.testing import compare, edge_lengths, make_case


def run_prefill(case, dtype, **kw):
    out = K.paged_prefill(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                          case.query_start_loc, **kw)
    kw.pop("_tile_rows", None)
    args = (case.q.cpu(), case.k_cache.cpu(), case.v_cache.cpu(), case.block_tables.cpu(),
            case.seq_lens.cpu(), case.query_start_loc.cpu())
    ref = K.reference_prefill(*args, **kw)
    naive = K.reference_prefill(*args, **kw, compute_dtype=dtype)
    ok, msg = compare(out.cpu(), ref, naive, dtype)
    assert ok, msg
    return out


def chunked_q_lens(lens):
    """A mix: full prefill, decode row (1), a chunk after a cached prefix, empty (0)."""
    pattern = [lambda n: n, lambda n: min(n, 1), lambda n: (n + 1) // 2, lambda n: 0]
    return [pattern[i % 4](n) for i, n in enumerate(lens)]


@pytest.mark.parametrize("block_size", [1, 3, 8, 16, 32, 128])
def test_edge_lengths_chunked(block_size, dtype, size, device, gen):
    lens = [n for n in edge_lengths(block_size, size["long"]) * size["reps"]]
    case = make_case(lens, q_lens=chunked_q_lens(lens), block_size=block_size, group=2, dtype=dtype,
                     device=device, generator=gen)
    run_prefill(case, dtype)


@pytest.mark.parametrize("group,tile_rows", [(1, None), (2, None), (5, 16), (8, None), (32, 16)])
def test_gqa_groups(group, tile_rows, device, gen):
    """Row tiles mix (token, head) pairs: with G=5 a 16-row tile ends mid-group; with G=32 one
    token's heads span two tiles."""
    lens = [1, 12, 23]
    case = make_case(lens, q_lens=[1, 12, 9], block_size=8, num_kv_heads=1, group=group,
                     dtype=torch.float16, device=device, generator=gen)
    run_prefill(case, torch.float16, _tile_rows=tile_rows)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 3.0), (17, 50.0)])
def test_options(causal, window, softcap, size, device, gen):
    lens = [3, 40, size["long"]] * size["reps"]
    q_lens = chunked_q_lens(lens)
    case = make_case(lens, q_lens=q_lens, block_size=16, group=3, dtype=torch.float32, device=device,
                     generator=gen)
    run_prefill(case, torch.float32, causal=causal, sliding_window=window, softcap=softcap)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_head_dims(head_dim, dtype, device, gen):
    case = make_case([5, 18], q_lens=[5, 7], block_size=16, head_dim=head_dim, dtype=dtype, device=device,
                     generator=gen)
    run_prefill(case, dtype)


def test_decode_rows_agree_with_paged_decode(device, gen):
    lens = [1, 9, 33]
    case = make_case(lens, q_lens=[1, 1, 1], block_size=4, device=device, generator=gen)
    a = K.paged_prefill(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.query_start_loc)
    b = K.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, num_splits=1)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_empty_batch_and_zero_queries(device, gen):
    case = make_case([0, 4], q_lens=[0, 0], block_size=4, device=device, generator=gen)
    out = K.paged_prefill(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.query_start_loc)
    assert out.shape == (0, case.q.shape[1], case.q.shape[2])


@st.composite
def prefill_cases(draw):
    block_size = draw(st.sampled_from([1, 3, 4, 8, 16]))
    lens = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    q_lens = [draw(st.integers(0, min(n, 20))) for n in lens]
    return dict(block_size=block_size, lens=lens, q_lens=q_lens,
                kv_heads=draw(st.integers(1, 2)), group=draw(st.integers(1, 5)),
                head_dim=draw(st.sampled_from([16, 48, 64])),
                causal=draw(st.booleans()),
                window=draw(st.one_of(st.none(), st.integers(1, 30))),
                softcap=draw(st.one_of(st.none(), st.floats(0.5, 30.0))),
                seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=prefill_cases(), dt=st.sampled_from([torch.float32, torch.float16]))
def test_hypothesis_prefill(c, dt):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = make_case(c["lens"], q_lens=c["q_lens"], block_size=c["block_size"], num_kv_heads=c["kv_heads"],
                     group=c["group"], head_dim=c["head_dim"], dtype=dt, device=device, pool_factor=4,
                     generator=torch.Generator().manual_seed(c["seed"]))
    run_prefill(case, dt, causal=c["causal"], sliding_window=c["window"], softcap=c["softcap"])


@pytest.mark.parametrize("softcap", [None, 4.0])
def test_rows_masked_in_early_key_tiles(softcap, device, gen):
    """With a narrow window and a tall row tile, the last rows see nothing in the first key tiles
    and their keys only later: the online softmax must not turn those fully masked tiles into NaN."""
    case = make_case([150, 9], q_lens=[150, 9], block_size=16, num_kv_heads=1, group=1, device=device,
                     generator=gen)
    run_prefill(case, torch.float32, sliding_window=5, softcap=softcap, _tile_rows=128)
