"""The `sglang` kernel target: SGLang 0.5.23's Triton decode and extend kernels under the kit's protocol.

Each case is a kit case (shuffled block ids from a larger pool, NaN in every slot that holds no valid
token), judged by the kit against dense attention; on a CPU machine the kernels run under Triton's
interpreter, so the shapes are small. The first run installs the pinned wheel into pagedkv's wheel
cache; nothing is skipped when that fails.
"""

import pytest
import torch

from pagedkv.fuzz.kernel_corpus import Heads, run_case
from pagedkv.fuzz.kernel_kit.grids import slots_case
from pagedkv.fuzz.kernel_kit.layouts import token_cache, token_slots
from pagedkv.fuzz.kernel_kit.protocol import load_kernel
from pagedkv.kernels import reference_prefill

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GQA = Heads(num_kv_heads=2, group=2, head_dim=16)


@pytest.fixture(scope="module")
def sglang_kernels():
    return load_kernel("sglang")


def test_declares_what_the_kernels_honour(sglang_kernels):
    declared = sglang_kernels.declared
    assert declared.capabilities == {"prefill", "softcap", "split_kv", "non_causal"}
    assert declared.block_sizes is None and declared.max_group is None
    assert sglang_kernels.kernel._decode.__module__ == "sglang.kernels.ops.attention.decode_attention"
    assert sglang_kernels.kernel._extend.__module__ == "sglang.kernels.ops.attention.extend_attention"


@pytest.mark.parametrize("block_size, lengths", [(1, [1, 7]), (3, [5, 70]), (16, [33, 16])],
                         ids=["page1", "page3-two-tiles", "page16"])
def test_decode_cases_pass(sglang_kernels, block_size, lengths):
    case = slots_case("decode", block_size=block_size, heads=GQA, lengths=lengths, seed=block_size, share=1)
    outcome = run_case(case, sglang_kernels, DEVICE, torch.float32)
    assert outcome.status == "passed", outcome.detail


def test_decode_with_softcap_and_splits_in_half_precision(sglang_kernels):
    case = slots_case("decode", block_size=5, heads=Heads(num_kv_heads=1, group=3, head_dim=16), lengths=[9, 40],
                      seed=7, options={"softcap": 4.0, "num_splits": 3}, repeat_in_row=True)
    outcome = run_case(case, sglang_kernels, DEVICE, torch.float16)
    assert outcome.status == "passed", outcome.detail


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
def test_extend_over_a_cached_prefix_with_decode_rows_mixed_in(sglang_kernels, causal):
    case = slots_case("prefill", block_size=4, heads=GQA, lengths=[11, 6, 3], q_lens=[4, 1, 3], seed=11,
                      options={"causal": causal, "softcap": 8.0})
    outcome = run_case(case, sglang_kernels, DEVICE, torch.float32)
    assert outcome.status == "passed", outcome.detail


def test_length_zero_decode_row_is_skipped_not_failed(sglang_kernels):
    case = slots_case("decode", block_size=2, heads=GQA, lengths=[0, 5], seed=3)
    outcome = run_case(case, sglang_kernels, DEVICE, torch.float32)
    assert outcome.status == "skipped" and "empty_rows" in outcome.detail


def test_length_zero_decode_row_is_nan_which_is_why_empty_rows_is_not_declared(sglang_kernels):
    heads, dim = 2, 8
    k_cache = torch.randn(4, 2, heads, dim)
    q = torch.randn(2, heads, dim)
    tables = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    out = sglang_kernels.kernel.decode(q, k_cache, k_cache.clone(), tables, torch.tensor([0, 3], dtype=torch.int32),
                                       scale=0.5, sliding_window=None, softcap=None)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def test_window_is_not_declared_and_skipped(sglang_kernels):
    case = slots_case("decode", block_size=2, heads=GQA, lengths=[6], seed=5, options={"sliding_window": 3})
    outcome = run_case(case, sglang_kernels, DEVICE, torch.float32)
    assert outcome.status == "skipped" and "sliding_window" in outcome.detail


def test_extend_window_keeps_w_plus_one_keys_so_a_one_token_window_cannot_be_asked(sglang_kernels):
    """Why `sliding_window` is not declared (besides the decode kernel taking none): the extend kernel's
    `sliding_window_size = w` keeps keys p - w <= j <= p, and w = 0 means no window."""
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(8, 4, 2, 16), torch.randn(8, 4, 2, 16)
    tables = torch.tensor([[3, 1, 5, 0]], dtype=torch.int32)
    seq_lens, starts = torch.tensor([13], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32)
    q = torch.randn(5, 4, 16)
    prefix_indptr, prefix_indices = token_slots(tables, torch.tensor([8], dtype=torch.int32), 4)
    _, all_indices = token_slots(tables, seq_lens, 4)
    k_tokens, v_tokens = token_cache(k_cache), token_cache(v_cache)

    def extend(size):
        out = torch.empty_like(q)
        sglang_kernels.kernel._extend(q, k_tokens[all_indices[8:]].contiguous(), v_tokens[all_indices[8:]].contiguous(),
                                      out, k_tokens, v_tokens, starts, prefix_indptr, prefix_indices, None, True, None,
                                      5, 1.0, 1.0, sm_scale=0.25, sliding_window_size=size, page_size=4)
        return out

    def reference(window):
        return reference_prefill(q, k_cache, v_cache, tables, seq_lens, starts, scale=0.25, sliding_window=window)

    assert torch.allclose(extend(2), reference(3), atol=1e-5)
    assert torch.allclose(extend(0), reference(None), atol=1e-5)
    assert not torch.allclose(extend(0), reference(1), atol=1e-3)
