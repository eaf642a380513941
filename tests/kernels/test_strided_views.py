"""Every tensor argument of every launcher, given as a non-contiguous (or offset) view holding the
same values, is either read correctly (the same result as the contiguous call) or refused with
KernelArgumentError and nothing changed - never misread (#12.7: a strided seq_lens used to be read
as ptr + i, giving wrong rows or a SIGSEGV, and a strided query_start_loc wrote out of bounds).

The bytes the view skips are poisoned with plausible values (other indices of the same tensor,
NaN for floats), so a kernel that ignored the strides would produce a different, wrong result.
"""

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv.kernels as K
from kernel_launchers import CALLS, run, same, snapshot, unchanged

# Read by the kernels as ptr + i: a strided view cannot be passed through, so it must be refused.
INDEX_ARGS = {"seq_lens", "query_start_loc", "slot_mapping", "pairs"}

CASES = [(name, arg) for name, make in CALLS.items() for arg, v in make()[1].items() if isinstance(v, torch.Tensor)]


def poison_like(t: torch.Tensor, shape) -> torch.Tensor:
    if t.is_floating_point():
        return torch.full(shape, float("nan"), dtype=t.dtype, device=t.device)
    flat = t.flatten()
    if flat.numel() == 0:
        return torch.zeros(shape, dtype=t.dtype, device=t.device)
    n = torch.Size(shape).numel()
    reps = -(-n // flat.numel())
    return flat.roll(1).repeat(reps)[:n].reshape(shape).clone()


@st.composite
def views(draw, t: torch.Tensor):
    """A view with t's shape and values but another layout: every other element along a dim, a
    permuted storage order, or a storage offset."""
    kind = draw(st.sampled_from(["step", "permuted", "offset"] if t.dim() > 1 else ["step", "offset"]))
    if kind == "step":
        dim = draw(st.integers(0, t.dim() - 1))
        step = draw(st.integers(2, 3))
        shape = list(t.shape)
        shape[dim] *= step
        index = [slice(None)] * t.dim()
        index[dim] = slice(draw(st.integers(0, step - 1)), None, step)
        view = poison_like(t, shape)[tuple(index)]
    elif kind == "permuted":
        perm = draw(st.permutations(range(t.dim())))
        stored = poison_like(t, [t.shape[p] for p in perm])
        view = stored.permute([perm.index(d) for d in range(t.dim())])
    else:
        offset = draw(st.integers(1, 5))
        view = poison_like(t, [t.numel() + offset])[offset:].view(t.shape)
    view.copy_(t)
    return view


@functools.lru_cache(maxsize=None)
def expected(name: str) -> tuple:
    fn, kwargs = CALLS[name]()
    return run(fn, kwargs)


@pytest.mark.parametrize("name,arg", CASES, ids=[f"{n}-{a}" for n, a in CASES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_view_is_read_correctly_or_refused(name, arg, data):
    fn, kwargs = CALLS[name]()
    view = data.draw(views(kwargs[arg]), label=arg)
    kwargs[arg] = view
    before = snapshot(kwargs)
    try:
        got = run(fn, kwargs)
    except K.KernelArgumentError as exc:
        assert unchanged(kwargs, before), "a refused call changed a tensor"
        assert not view.is_contiguous(), f"a contiguous {arg} was refused: {exc}"
        assert arg in INDEX_ARGS or view.stride(-1) != 1, f"{arg} with a readable layout was refused: {exc}"
        return
    assert arg not in INDEX_ARGS or view.is_contiguous(), f"non-contiguous {arg} {view.stride()} was accepted"
    assert all(same(a, b) for a, b in zip(got, expected(name))), f"{arg} with strides {view.stride()} was misread"


@pytest.mark.parametrize("arg", ["seq_lens", "query_start_loc"])
def test_issue_reproducer_strided_index_tensors_refused(arg):
    """The two reproducers of #12.7: every other element of a longer tensor."""
    fn, kwargs = CALLS["paged_prefill"](host=False)
    t = kwargs[arg]
    longer = torch.stack([t, t + 1], dim=1).flatten()   # values at odd positions differ
    kwargs[arg] = longer[::2]
    assert torch.equal(kwargs[arg], t)
    with pytest.raises(K.KernelArgumentError, match=f"{arg} must be contiguous"):
        fn(**kwargs)
