"""The `vllm` kernel target: vLLM 0.33.0's Triton unified attention under the kit's kernel protocol,
run by Triton's interpreter on small shapes (the pinned wheel is installed on first use; nothing is
skipped when that fails)."""

import pytest
import torch

from pagedkv.fuzz.adapters import vllm_kernel
from pagedkv.fuzz.kernel_corpus import Heads, run_case
from pagedkv.fuzz.kernel_kit.grids import slots_case
from pagedkv.fuzz.kernel_kit.protocol import LoadedKernel, declaration_of, load_kernel

HEADS = Heads(num_kv_heads=2, group=2, head_dim=32)   # the smallest head size vLLM's backend supports


def case(kind="decode", *, block_size=16, lengths=(17, 33, 65), q_lens=None, options=None, heads=HEADS):
    return slots_case(kind, block_size=block_size, heads=heads, lengths=list(lengths), seed=sum(lengths),
                      q_lens=None if q_lens is None else list(q_lens), options=options, share=1)


def outcome(loaded, the_case, dtype=torch.float32):
    return run_case(the_case, loaded, "cpu", dtype)


@pytest.fixture(scope="module")
def vllm():
    return load_kernel("vllm")


def test_declares_what_vllms_backend_declares(vllm):
    declared = vllm.declared
    assert declared.capabilities == {"prefill", "sliding_window", "softcap", "non_causal"}
    assert 16 in declared.block_sizes and 48 in declared.block_sizes and 24 not in declared.block_sizes
    assert min(declared.head_dims) == 32
    assert vllm.kernel._attend.__module__ == vllm_kernel.MODULE


@pytest.mark.parametrize("the_case", [
    case(),                                                              # split-KV (3D) path, 1 to 5 tiles
    case(lengths=(1, 16, 31)),                                           # a single token, exact block
    case(options={"sliding_window": 20, "softcap": 5.0}),
    case("prefill", lengths=(70, 33), q_lens=(21, 33)),                  # chunked prefill, 2D kernel
    case("prefill", lengths=(40, 9), q_lens=(3, 9), options={"causal": False}),  # short: 3D kernel
    case(block_size=32, lengths=(65, 7), heads=Heads(num_kv_heads=1, group=4, head_dim=48)),
], ids=["decode", "edges", "window+softcap", "prefill", "non-causal", "B32-D48"])
def test_vllm_kernel_passes_the_kit(vllm, the_case):
    result = outcome(vllm, the_case)
    assert result.status == "passed", result.detail


def test_a_large_decode_batch_runs_the_2d_kernel(vllm):
    """Past 128 // Hkv sequences vLLM's backend launches the 2D kernel for decode too."""
    heads = Heads(num_kv_heads=4, group=1, head_dim=32)
    result = outcome(vllm, case(lengths=[3 + i % 5 for i in range(33)], heads=heads))
    assert result.status == "passed", result.detail


def test_outside_the_contract_is_skipped_not_failed(vllm):
    assert outcome(vllm, case(block_size=24)).status == "skipped"
    assert outcome(vllm, case(lengths=(0, 17))).status == "skipped"        # empty rows: not declared
    assert outcome(vllm, case(options={"num_splits": 3})).status == "skipped"


def test_the_kernels_own_arithmetic_at_block_sizes_vllm_does_not_declare():
    """No tile-offset bug: block sizes that do not divide the 16/32-wide tiles read the right slots."""
    any_size = load_kernel("pagedkv.fuzz.adapters.vllm_kernel:factory_any_block_size")
    for block_size in (3, 24):
        result = outcome(any_size, case(block_size=block_size, lengths=(17, 40)))
        assert result.status == "passed", f"B={block_size}: {result.detail}"


class WindowOffByOne(vllm_kernel.VllmUnifiedAttention):
    """A wrong translation of the protocol's window (W keys) into vLLM's (W - 1, 0): the kit sees it."""

    def _run(self, *args, sliding_window, **kwargs):
        return super()._run(*args, sliding_window=sliding_window and sliding_window + 1, **kwargs)


def test_a_mistranslated_window_fails():
    kernel = WindowOffByOne()
    loaded = LoadedKernel("window-off-by-one", kernel, declaration_of(kernel))
    assert outcome(loaded, case(options={"sliding_window": 20})).status == "failed"
    assert outcome(loaded, case()).status == "passed"
