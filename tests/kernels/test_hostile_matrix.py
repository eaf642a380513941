"""Hostile-value matrix (#12 "done when"): every launcher x every argument x {type, dtype, rank,
shape, device, layout, contiguity, range, aliasing, scalar options} -> KernelArgumentError (the
kernels' one error class) and every tensor of the call unchanged.

Each launcher is called both with host copies of its index tensors (their values are what gets
checked) and without (the device tensors are read and checked): a range mutation is applied to
the device tensor and to its host copy alike, as a caller with consistent metadata would pass.
"""

import numpy as np
import pytest
import torch

import pagedkv.kernels as K
from kernel_launchers import CALLS, snapshot, unchanged

HOST_OF = {"seq_lens": "seq_lens_host", "block_tables": "block_tables_host",
           "query_start_loc": "query_start_loc_host", "slot_mapping": "slot_mapping_host", "pairs": "pairs_host"}
HOST_ARGS = set(HOST_OF.values())
INDEX_ARGS = set(HOST_OF)


def _set(index_arg: str, where, value):
    """A range mutation: the same wrong value in the device tensor and in its host copy."""
    def mutate(kw):
        for name in (index_arg, HOST_OF[index_arg]):
            if name in kw:
                kw[name] = kw[name].clone()
                kw[name][where] = value
    return mutate


def _replace(arg: str, make):
    def mutate(kw):
        kw[arg] = make(kw[arg], kw)
    return mutate


def generic_cases(tensors: dict) -> list:
    """Type, dtype, rank, shape, device, layout and contiguity mutations of each tensor argument."""
    cases = []
    for arg, t in tensors.items():
        host = arg in HOST_ARGS
        floating = t.is_floating_point()
        cases += [
            (arg, "str", _replace(arg, lambda t, kw: "0 1 2")),
            (arg, "object", _replace(arg, lambda t, kw: object())),
            (arg, "float values", _replace(arg, lambda t, kw: t.double().add(0.5) if not floating else t.int())),
            (arg, "bool dtype", _replace(arg, lambda t, kw: t.bool())),
            (arg, "extra dim", _replace(arg, lambda t, kw: t[None])),
            (arg, "meta device", _replace(arg, lambda t, kw: t.to("meta"))),
            (arg, "sparse", _replace(arg, lambda t, kw: t.to_sparse())),
        ]
        if not host:
            cases += [(arg, "nested list", _replace(arg, lambda t, kw: t.tolist())),
                      (arg, "numpy array", _replace(arg, lambda t, kw: t.cpu().numpy()))]
        if floating:
            cases.append((arg, "float64", _replace(arg, lambda t, kw: t.double())))
        elif not host:
            cases.append((arg, "int16", _replace(arg, lambda t, kw: t.to(torch.int16))))
        if arg in INDEX_ARGS and t.numel() > 1:
            cases.append((arg, "strided view", _replace(arg, lambda t, kw: torch.stack([t, t]).flatten()
                                                        .as_strided(t.shape, [2 * s for s in t.stride()]))))
        if t.shape[0] > 1 and arg not in ("pairs", "pairs_host"):  # fewer pairs is a valid call
            cases.append((arg, "one row short", _replace(arg, lambda t, kw: t[:-1])))
    return cases


def _capacity(kw):
    return kw["block_tables"].shape[1] * kw["k_cache"].shape[1]


ATTENTION_RANGE = [
    ("seq_lens", "negative length", _set("seq_lens", 0, -1)),
    ("seq_lens", "over capacity", lambda kw: _set("seq_lens", 1, _capacity(kw) + 1)(kw)),
    ("block_tables", "block id = num_blocks", lambda kw: _set("block_tables", (1, 0), kw["k_cache"].shape[0])(kw)),
    ("block_tables", "negative block id", _set("block_tables", (0, 1), -1)),
    ("block_tables", "block id 2**31 - 1", _set("block_tables", (0, 0), 2**31 - 1)),
]
PREFILL_RANGE = [
    ("query_start_loc", "first not 0", _set("query_start_loc", 0, 1)),
    ("query_start_loc", "decreasing", _set("query_start_loc", 1, 7)),
    ("query_start_loc", "last != tokens", _set("query_start_loc", -1, 10)),
    ("query_start_loc", "more queries than tokens", _set("query_start_loc", 1, 6)),
]
SCALARS = [
    ("scale", "nan", {"scale": float("nan")}), ("scale", "bool", {"scale": True}),
    ("softcap", "negative", {"softcap": -3.0}), ("sliding_window", "numpy bool", {"sliding_window": np.bool_(True)}),
    ("sliding_window", "2**63 as float", {"sliding_window": 2.0**63}), ("validate", "int", {"validate": 1}),
]
DECODE_SCALARS = [("num_splits", "bool", {"num_splits": True}), ("num_splits", "2**64", {"num_splits": 2**64}),
                  ("max_seq_len", "over capacity", {"max_seq_len": 10**9})]


def _scalar(options):
    def mutate(kw):
        kw.update(options)
    return mutate


def _overlapping_windows(kw):
    """K and V caches as two windows of one pool, three blocks apart: blocks 3..5 are in both."""
    pool = torch.cat([kw["k_cache"], kw["v_cache"]])
    return {"k_cache": pool[:6], "v_cache": pool[3:9]}


def _alias(make):
    def mutate(kw):
        kw.update(make(kw))
    return mutate


WRITE_RANGE = [
    ("slot_mapping", "slot -2", _set("slot_mapping", 2, -2)),
    ("slot_mapping", "slot = capacity", _set("slot_mapping", 0, 6 * 4)),
    ("slot_mapping", "slot twice", _set("slot_mapping", 1, 0)),
    ("k_cache", "v_cache is k_cache", _alias(lambda kw: {"v_cache": kw["k_cache"]})),
    ("k_cache", "v_cache half over k_cache", _alias(lambda kw: _overlapping_windows(kw))),
    ("key", "key inside k_cache", _alias(lambda kw: {"key": kw["k_cache"].flatten()[:160].view(5, 2, 16)})),
    ("value", "value inside v_cache", _alias(lambda kw: {"value": kw["v_cache"][2:4].flatten()[:160].view(5, 2, 16)})),
    ("k_cache", "expanded cache", _alias(lambda kw: {"k_cache": kw["k_cache"][:1].expand(6, -1, -1, -1)})),
]
COPY_RANGE = [
    ("pairs", "id = num_blocks", _set("pairs", (0, 1), 6)),
    ("pairs", "negative id", _set("pairs", (1, 0), -1)),
    ("pairs", "destination twice", _set("pairs", (1, 1), 3)),
    ("pairs", "source is a destination", _set("pairs", (2, 0), 4)),
    ("pairs", "copy onto itself", _set("pairs", (2, 1), 2)),
    ("k_cache", "v_cache is k_cache", _alias(lambda kw: {"v_cache": kw["k_cache"]})),
    ("k_cache", "block stride of half a block", _alias(lambda kw: {
        "k_cache": kw["k_cache"].flatten().as_strided((6, 4, 2, 16), (64, 32, 16, 1))})),
]


def matrix():
    rows = []
    for name, make in CALLS.items():
        for host in (True, False):
            _, kw = make(host=host)
            tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
            cases = generic_cases(tensors)
            if name in ("paged_decode", "paged_prefill"):
                cases += ATTENTION_RANGE + [(a, c, _scalar(o)) for a, c, o in SCALARS]
            if name == "paged_prefill":
                cases += PREFILL_RANGE
            if name == "paged_decode":
                cases += [(a, c, _scalar(o)) for a, c, o in DECODE_SCALARS]
            if name == "write_kv":
                cases += WRITE_RANGE
            if name == "copy_blocks":
                cases += COPY_RANGE
            rows += [pytest.param(name, host, mutate, id=f"{name}-{'host' if host else 'device'}-{arg}-{what}")
                     for arg, what, mutate in cases]
    return rows


@pytest.mark.parametrize("name,host,mutate", matrix())
def test_hostile_value_is_a_typed_error_and_changes_nothing(name, host, mutate):
    fn, kwargs = CALLS[name](host=host)
    mutate(kwargs)
    before = snapshot(kwargs)
    with pytest.raises(K.KernelArgumentError):
        fn(**kwargs)
    assert unchanged(kwargs, before), "a refused call wrote to one of its tensors"


def test_the_one_error_class():
    """Every refusal above is this class; it is a ValueError, so `except ValueError` callers keep working."""
    assert issubclass(K.KernelArgumentError, ValueError)
    from pagedkv.kernels import validation

    assert validation.KernelArgumentError is K.KernelArgumentError
