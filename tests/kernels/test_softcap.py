"""Softcap precision: cap * tanh(x / cap) must stay accurate in fp32 for every cap, in particular
large caps where x / cap is tiny (the closed form (1 - e) / (1 + e) cancels there and lost up to
0.78 at cap 1e8). Checked element-wise on the kernels' own _softcap and end to end through both
attention launchers, against float64."""

import math

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import pagedkv.kernels as K
from pagedkv.kernels.attention import _softcap
from pagedkv.kernels.testing import make_case

CAPS = [1.0, 3.0, 30.0, 1e2, 1e4, 1e6, 1e8]


@triton.jit
def _softcap_vector_kernel(x_ptr, out_ptr, cap, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, _softcap(x, cap), mask=ok)


def kernel_softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _softcap_vector_kernel[(1,)](x, out, cap, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out


def exact_softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(x.double() / cap)


def test_elementwise_relative_error_is_a_few_ulp_at_every_ratio():
    """Scores spanning x / cap from 1e-9 to 1e3 on both sides of the series/closed-form switch."""
    for cap in CAPS:
        ratios = torch.tensor([1e-9, 1e-4, 0.01, 0.2, 0.2499, 0.25, 0.2501, 0.3, 0.5, 1.0, 3.0, 20.0, 1e3])
        x = torch.cat([ratios, -ratios]).mul(cap).float()
        got = kernel_softcap(x, cap).double()
        want = exact_softcap(x, cap)
        rel = ((got - want).abs() / want.abs()).max().item()
        assert rel < 4 * 2.0**-24, f"cap {cap}: relative error {rel:.3g}"


@settings(max_examples=30, deadline=None)
@given(x=st.floats(-1e9, 1e9, allow_nan=False, width=32), cap=st.floats(2.0**-10, 2.0**30, width=32))
def test_elementwise_error_bounded_by_the_score(x, cap):
    """|error| <= a few ulp of |x| (the scores' own rounding) for any score and cap."""
    t = torch.tensor([x], dtype=torch.float32)
    got = kernel_softcap(t, cap).double()
    want = exact_softcap(t, cap)
    assert (got - want).abs().item() <= 4 * 2.0**-24 * max(abs(want.item()), 1e-30) + 1e-44


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_attention_with_softcap_matches_float64(op, cap, device, gen):
    case = make_case([3, 40, 70], q_lens=None if op == "decode" else [3, 9, 70], block_size=16, group=2,
                     dtype=torch.float32, device=device, generator=gen)
    case.q.mul_(4.0)  # scores of a few units: softcap matters at the small caps
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    host = tuple(a.cpu() for a in args)
    if op == "decode":
        out = K.paged_decode(*args, softcap=cap, num_splits=1)
        ref = K.reference_decode(*host, softcap=cap, compute_dtype=torch.float64)
    else:
        out = K.paged_prefill(*args, case.query_start_loc, softcap=cap)
        ref = K.reference_prefill(*host, case.query_start_loc.cpu(), softcap=cap, compute_dtype=torch.float64)
    err = (out.cpu().double() - ref).abs().max().item()
    assert math.isfinite(err) and err <= 2e-5, f"cap {cap}: max error {err:.3g}"
