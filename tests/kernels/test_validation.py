"""Every boundary check of paged_decode/paged_prefill raises KernelArgumentError with a clear message."""

import pytest
import torch

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
