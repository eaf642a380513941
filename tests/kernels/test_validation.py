"""Every boundary check of paged_decode/paged_prefill raises KernelArgumentError with a clear message."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pagedkv.kernels as K
from pagedkv.kernels.testing import make_case


@pytest.fixture
def decode_args(device, gen):
    case = make_case([5, 9], block_size=4, num_kv_heads=2, group=2, device=device, generator=gen)
    return dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_tables=case.block_tables,
                seq_lens=case.seq_lens)


@pytest.fixture
def prefill_args(device, gen):
    case = make_case([5, 9], q_lens=[2, 9], block_size=4, device=device, generator=gen)
    return dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_tables=case.block_tables,
                seq_lens=case.seq_lens, query_start_loc=case.query_start_loc)


def dev(a):
    return a["q"].device


COMMON = [
    ("q 2-d", lambda a: a.update(q=a["q"][0]), "dimensions"),
    ("cache 3-d", lambda a: a.update(k_cache=a["k_cache"][0]), "dimensions"),
    ("cache shapes differ", lambda a: a.update(v_cache=a["v_cache"][:3]), "same shape"),
    ("cache dtypes differ", lambda a: a.update(v_cache=a["v_cache"].half()), "same dtype"),
    ("q dtype differs", lambda a: a.update(q=a["q"].half()), "same dtype"),
    ("int dtype", lambda a: a.update(q=a["q"].int(), k_cache=a["k_cache"].int(), v_cache=a["v_cache"].int()), "dtype"),
    ("heads not a multiple", lambda a: a.update(q=a["q"][:, :3]), "multiple"),
    ("head dim differs", lambda a: a.update(q=a["q"][..., :32]), "head_dim"),
    ("q head dim strided", lambda a: a.update(q=a["q"].transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
    ("cache head dim strided", lambda a: a.update(k_cache=a["k_cache"].transpose(2, 3).contiguous().transpose(2, 3)), "contiguous"),
    ("tables int64", lambda a: a.update(block_tables=a["block_tables"].long()), "int32"),
    ("tables 1-d", lambda a: a.update(block_tables=a["block_tables"][0]), "dimensions"),
    ("tables rows", lambda a: a.update(block_tables=a["block_tables"][:1]), "rows"),
    ("tables columns strided", lambda a: a.update(block_tables=a["block_tables"].t().contiguous().t()), "contiguous"),
    ("seq_lens int64", lambda a: a.update(seq_lens=a["seq_lens"].long()), "int32"),
    ("seq_len over capacity", lambda a: a["seq_lens"].__setitem__(1, 4 * a["block_tables"].shape[1] + 1), "capacity"),
    ("negative seq_len", lambda a: a["seq_lens"].__setitem__(0, -1), "negative"),
    ("block id too large", lambda a: a["block_tables"].__setitem__((1, 2), a["k_cache"].shape[0]), "out of range"),
    ("block id negative", lambda a: a["block_tables"].__setitem__((0, 0), -1), "out of range"),
    ("scale nan", lambda a: a.update(scale=float("nan")), "scale"),
    ("softcap zero", lambda a: a.update(softcap=0.0), "softcap"),
    ("softcap inf", lambda a: a.update(softcap=float("inf")), "softcap"),
    ("window zero", lambda a: a.update(sliding_window=0), "sliding_window"),
    ("window float", lambda a: a.update(sliding_window=2.5), "sliding_window"),
    ("not a tensor", lambda a: a.update(seq_lens=[5, 9]), "torch.Tensor"),
]


@pytest.mark.parametrize("name,mutate,match", COMMON, ids=[c[0] for c in COMMON])
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_bad_arguments_raise(op, name, mutate, match, decode_args, prefill_args):
    args = dict(decode_args if op == "decode" else prefill_args)
    args = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    mutate(args)
    fn = K.paged_decode if op == "decode" else K.paged_prefill
    with pytest.raises(K.KernelArgumentError, match=match):
        fn(**args)


def test_block_ids_checked_only_when_validating(decode_args):
    decode_args["block_tables"][0, 0] = 10**6
    with pytest.raises(K.KernelArgumentError, match=r"block_tables\[0, 0\]"):
        K.paged_decode(**decode_args)
    # unused table entries (past ceil(len / B)) are never read and never checked
    decode_args["block_tables"][0, 0] = decode_args["block_tables"][1, 0]
    decode_args["block_tables"][0, -1] = -5
    K.paged_decode(**decode_args)


def test_decode_specific(decode_args):
    with pytest.raises(K.KernelArgumentError, match="one query per sequence"):
        K.paged_decode(**{**decode_args, "q": decode_args["q"][:1]})
    for bad in (0, -1, 1000, 2.0, True):
        with pytest.raises(K.KernelArgumentError, match="num_splits"):
            K.paged_decode(**decode_args, num_splits=bad)


@pytest.mark.parametrize("qsl,match", [
    ([1, 2, 11], r"query_start_loc\[0\]"),
    ([0, 2, 10], r"query_start_loc\[-1\]"),
    ([0, 6, 11], "only 5 tokens"),
    ([0, 12, 11], "non-decreasing"),
    ([0, 11], "entries"),
])
def test_prefill_query_start_loc(qsl, match, prefill_args):
    prefill_args["query_start_loc"] = torch.tensor(qsl, dtype=torch.int32, device=prefill_args["q"].device)
    with pytest.raises(K.KernelArgumentError, match=match):
        K.paged_prefill(**prefill_args)


def test_prefill_causal_must_be_bool(prefill_args):
    with pytest.raises(K.KernelArgumentError, match="causal"):
        K.paged_prefill(**prefill_args, causal="yes")


def test_bfloat16_rejected_under_interpreter(decode_args):
    if torch.cuda.is_available():
        pytest.skip("bfloat16 runs on CUDA")
    args = {k: (v.bfloat16() if v.is_floating_point() else v) for k, v in decode_args.items()}
    with pytest.raises(K.KernelArgumentError, match="bfloat16"):
        K.paged_decode(**args)


def test_error_is_a_value_error():
    assert issubclass(K.KernelArgumentError, ValueError)


# ---- scalar options (#12.8) ----------------------------------------------------------------------------

def _decode(args, **kw):
    return K.paged_decode(**args, num_splits=kw.pop("num_splits", 1), **kw)


@pytest.mark.parametrize("window", [2**31, 2**63 - 1, 2**63, 2**64, 10**30])
def test_huge_window_equals_no_window(window, decode_args):
    """A window at least the table capacity hides nothing; it used to wrap as uint64 (2**63) or
    raise a bare OverflowError (2**64)."""
    assert torch.equal(_decode(decode_args, sliding_window=window), _decode(decode_args))


def test_numpy_scalars_are_their_values(decode_args):
    np = pytest.importorskip("numpy")
    assert torch.equal(_decode(decode_args, sliding_window=np.int64(3)), _decode(decode_args, sliding_window=3))
    assert torch.equal(_decode(decode_args, scale=np.float32(0.25)), _decode(decode_args, scale=0.25))
    assert torch.equal(_decode(decode_args, softcap=np.float64(2.0)), _decode(decode_args, softcap=2.0))
    assert torch.equal(_decode(decode_args, num_splits=np.int32(2)), _decode(decode_args, num_splits=2))


BAD_OPTIONS = [
    ("sliding_window", True), ("sliding_window", 0), ("sliding_window", -(2**63)), ("sliding_window", 2.0),
    ("sliding_window", "4"),
    ("scale", True), ("scale", float("inf")), ("scale", float("-inf")), ("scale", float("nan")), ("scale", 1e39),
    ("scale", 10**400), ("scale", "0.1"), ("scale", torch.tensor(0.1)),
    ("softcap", True), ("softcap", -1.0), ("softcap", 0), ("softcap", float("nan")), ("softcap", 1e-40),
    ("softcap", 1e39), ("softcap", complex(1, 0)),
    ("num_splits", True), ("num_splits", 0), ("num_splits", 257), ("num_splits", 2**64), ("num_splits", 2.0),
    ("validate", 1), ("validate", "yes"), ("validate", None),
    ("_tile_rows", 8), ("_tile_rows", 24), ("_tile_rows", 512), ("_tile_rows", True),
    ("max_seq_len", -1), ("max_seq_len", True), ("max_seq_len", 1.5), ("max_seq_len", 10**6),
    ("max_seq_len", 8),  # below the longest sequence (9), which the host lengths show
]


BAD_OPTION_CALLS = [(op, o, v) for op in ("decode", "prefill") for o, v in BAD_OPTIONS
                    if not (op == "prefill" and o == "num_splits")]  # prefill has no split option


@pytest.mark.parametrize("op,option,value", BAD_OPTION_CALLS, ids=[f"{p}-{o}={v!r}" for p, o, v in BAD_OPTION_CALLS])
def test_bad_scalar_options_raise_the_one_error_class(op, option, value, decode_args, prefill_args):
    args = dict(decode_args if op == "decode" else prefill_args)
    args["seq_lens_host"] = args["seq_lens"].cpu()
    fn = K.paged_decode if op == "decode" else K.paged_prefill
    with pytest.raises(K.KernelArgumentError, match=option.lstrip("_")):
        fn(**args, **{option: value})


@pytest.mark.parametrize("value", [1, 0, "no", None])
def test_causal_must_be_a_bool(value, prefill_args):
    with pytest.raises(K.KernelArgumentError, match="causal"):
        K.paged_prefill(**prefill_args, causal=value)


# ---- aliasing (#12.10) ---------------------------------------------------------------------------------

def _write(device, gen, k, v, **kw):
    key = kw.pop("key", torch.randn(3, k.shape[2], k.shape[3], generator=gen).to(device))
    value = kw.pop("value", torch.randn(3, k.shape[2], k.shape[3], generator=gen).to(device))
    slots = torch.tensor([0, 5, 9], device=device)
    return key, value, slots


def _pool(device, gen, n=8):
    return torch.randn(n, 4, 2, 16, generator=gen).to(device)


ALIASED_CACHES = [
    ("same tensor", lambda pool: (pool[:4], pool[:4]), "share memory"),
    ("v half a pool over k", lambda pool: (pool[:4], pool[2:6]), "share memory"),
    ("v one slot after k", lambda pool: (pool.flatten()[:512].view(4, 4, 2, 16),
                                         pool.flatten()[32:544].view(4, 4, 2, 16)), "share memory"),
    ("block stride of half a block", lambda pool: (pool.flatten().as_strided((4, 4, 2, 16), (64, 32, 16, 1)),
                                                  pool[4:]), "overlaps itself"),
    ("expanded heads", lambda pool: (pool[:4, :, :1].expand(4, 4, 2, 16), pool[4:]), "overlaps itself"),
]


@pytest.mark.parametrize("name,make,match", ALIASED_CACHES, ids=[c[0] for c in ALIASED_CACHES])
@pytest.mark.parametrize("op", ["write_kv", "copy_blocks"])
def test_aliased_caches_refused_and_unchanged(op, name, make, match, device, gen):
    pool = _pool(device, gen)
    k, v = make(pool)
    before = pool.clone()
    key, value, slots = _write(device, gen, k, v)
    with pytest.raises(K.KernelArgumentError, match=match):
        if op == "write_kv":
            K.write_kv(key, value, k, v, slots)
        else:
            K.copy_blocks(k, v, torch.tensor([[0, 3], [1, 2]], device=device))
    assert torch.equal(pool, before)


def test_write_kv_refuses_inputs_inside_the_cache(device, gen):
    pool = _pool(device, gen)
    k, v = pool[:4], pool[4:]
    before = pool.clone()
    inside = k[1, :3]                                  # [3, 2, 16] rows of block 1 of the K cache
    for kw in ({"key": inside}, {"value": inside}):
        key, value, slots = _write(device, gen, k, v, **kw)
        with pytest.raises(K.KernelArgumentError, match="share memory"):
            K.write_kv(key, value, k, v, slots)
    assert torch.equal(pool, before)


def test_fused_cache_halves_are_disjoint_and_work(device, gen):
    """K and V as the two halves of a fused [N, 2, B, H, D] cache (interleaved block by block:
    their byte ranges intersect, their elements do not) are accepted and written correctly."""
    fused = torch.zeros(4, 2, 4, 2, 16, device=device)
    k, v = fused[:, 0], fused[:, 1]
    key, value, slots = _write(device, gen, k, v)
    K.write_kv(key, value, k, v, slots)
    s = slots.cpu()
    assert torch.equal(k[s // 4, s % 4], key) and torch.equal(v[s // 4, s % 4], value)
    K.copy_blocks(k, v, torch.tensor([[0, 3]], device=device))
    assert torch.equal(fused[3], fused[0])


def _addresses(t: torch.Tensor) -> set[int]:
    """Brute force: the element offsets (in elements of the base buffer) a view touches."""
    idx = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        idx = idx[..., None] + torch.arange(size) * stride
    return set((idx.flatten() + t.storage_offset()).tolist())


@st.composite
def strided_pair(draw):
    buf = torch.zeros(400)
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    strides_a = tuple(draw(st.integers(0, 12)) for _ in range(ndim))
    same_layout = draw(st.booleans())
    strides_b = strides_a if same_layout else tuple(draw(st.integers(0, 12)) for _ in range(ndim))
    off_a, off_b = draw(st.integers(0, 100)), draw(st.integers(0, 100))
    return buf.as_strided(shape, strides_a, off_a), buf.as_strided(shape, strides_b, off_b)


@settings(max_examples=300, deadline=None)
@given(pair=strided_pair())
def test_shares_memory_is_sound_and_exact_for_equal_nested_layouts(pair):
    from pagedkv.kernels.validation import _dims, _is_nested, shares_memory

    a, b = pair
    truth = bool(_addresses(a) & _addresses(b))
    claim = shares_memory(a, b)
    assert claim or not truth, "missed a shared element"
    if a.stride() == b.stride() and _is_nested(_dims(a)):
        assert claim == truth


def test_block_ids_against_an_empty_pool(device):
    """No physical block: empty sequences are fine (nothing is read), any token is refused."""
    k = torch.zeros(0, 4, 1, 16, device=device)
    q = torch.zeros(2, 1, 16, device=device)
    tables = torch.zeros(2, 1, dtype=torch.int32, device=device)
    out = K.paged_decode(q, k, k.clone(), tables, torch.tensor([0, 0], dtype=torch.int32, device=device))
    assert torch.count_nonzero(out) == 0
    with pytest.raises(K.KernelArgumentError, match=r"block_tables\[1, 0\] = 0 is out of range \[0, 0\)"):
        K.paged_decode(q, k, k.clone(), tables, torch.tensor([0, 1], dtype=torch.int32, device=device))
