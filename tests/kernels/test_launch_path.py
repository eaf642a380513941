"""The host side of a kernel launch (#15 "kernel launch path").

* With host metadata (host copies of the index tensors, or ``max_seq_len`` without validation)
  no launcher reads a device tensor back: a tensor subclass counts every host read (``.cpu()``,
  ``.item()``, ``.tolist()``, ``.numpy()``, ``bool()``, ``int()``, ``float()``, ``.to("cpu")``)
  and every op that synchronises a GPU to size its output (``nonzero``, ``unique``, boolean-mask
  indexing, ...) on the device tensors, and the count must be zero.
* The host work does not grow with the batch: the number of torch calls per launch is the same
  for 4 and 64 sequences (no per-sequence Python loop).
* Host metadata gives the same results as the default path, and the device-built prefill tiles
  are exactly the row tiles of the definition.
* On CUDA (gpu-marked): a decode step is captured in a CUDA graph and replayed with new lengths.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import pagedkv.kernels as K
from kernel_launchers import CALLS
from pagedkv.kernels import attention, decode
from pagedkv.kernels.testing import compare, make_case

HOST_READS = {"cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__index__", "__float__", "__array__"}
SYNCING_OPS = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "repeat_interleave",
               "bincount", "histc"}


class DeviceTensor(torch.Tensor):
    """Marks a tensor as device memory; records every call that would read it back to the host."""

    reads: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_READS or name in SYNCING_OPS or _to_host(name, args, kwargs) or _mask_index(name, args):
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs)


def _to_host(name, args, kwargs) -> bool:
    if name not in ("to", "copy_"):
        return False
    targets = list(args[1:]) + list(kwargs.values())
    if name == "copy_":  # host.copy_(device) reads the device tensor
        return not isinstance(args[0], DeviceTensor)
    return any(str(t).startswith("cpu") for t in targets if isinstance(t, (str, torch.device)))


def _mask_index(name, args) -> bool:
    if name != "__getitem__" or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


class Launches:
    """Stands in for a @triton.jit kernel: records each launch's grid instead of running it."""

    def __init__(self):
        self.grids = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.grids.append(tuple(grid))


@pytest.fixture
def stubbed(monkeypatch):
    """Kernels replaced by recorders (the subclass must not reach Triton); the read log cleared."""
    launches = {}
    for module, name in ((attention, "_paged_attention_kernel"), (decode, "_combine_splits_kernel")):
        launches[name] = Launches()
        monkeypatch.setattr(module, name, launches[name])
    from pagedkv.kernels import cache_ops

    for name in ("_write_kv_kernel", "_copy_blocks_kernel"):
        launches[name] = Launches()
        monkeypatch.setattr(cache_ops, name, launches[name])
    DeviceTensor.reads = []
    return launches


HOST_COPIES = {"seq_lens_host", "block_tables_host", "query_start_loc_host", "slot_mapping_host", "pairs_host"}


def on_device(kwargs: dict) -> dict:
    return {k: (v.as_subclass(DeviceTensor) if isinstance(v, torch.Tensor) and k not in HOST_COPIES else v)
            for k, v in kwargs.items()}


PRODUCTION = [
    ("paged_decode", {}),                                   # host copies, validate=True, auto split
    ("paged_decode", {"num_splits": 3}),
    ("paged_prefill", {}),
    ("write_kv", {}),
    ("copy_blocks", {}),
]


@pytest.mark.parametrize("name,extra", PRODUCTION, ids=[f"{n}{sorted(e)}" for n, e in PRODUCTION])
def test_production_path_reads_no_device_tensor(name, extra, stubbed):
    fn, kwargs = CALLS[name](host=True)
    fn(**on_device(kwargs), **extra)
    assert DeviceTensor.reads == []
    assert sum(len(r.grids) for r in stubbed.values()) >= 1, "nothing was launched"


@pytest.mark.parametrize("name", ["paged_decode", "paged_prefill"])
def test_graph_mode_reads_nothing_without_host_copies(name, stubbed):
    """validate=False with max_seq_len: no host copy at all, still no read."""
    fn, kwargs = CALLS[name](host=False)
    capacity = kwargs["block_tables"].shape[1] * kwargs["k_cache"].shape[1]
    fn(**on_device(kwargs), validate=False, max_seq_len=capacity)
    assert DeviceTensor.reads == []


@pytest.mark.parametrize("name", list(CALLS))
def test_default_path_is_seen_reading(name, stubbed):
    """The counter works: without host copies the launchers do read the device tensors."""
    fn, kwargs = CALLS[name](host=False)
    fn(**on_device(kwargs))
    assert "cpu" in DeviceTensor.reads


class CountTorchCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _decode_batch(num_seqs: int, gen):
    lens = torch.randint(1, 40, (num_seqs,), generator=gen).tolist()
    return make_case(lens, block_size=4, num_kv_heads=2, group=4, head_dim=16, generator=gen)


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_host_work_does_not_grow_with_the_batch(op, validate, stubbed, gen):
    counts = []
    for num_seqs in (4, 64):
        case = _decode_batch(num_seqs, gen)
        kw = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_tables=case.block_tables,
                  seq_lens=case.seq_lens, seq_lens_host=case.seq_lens.clone(),
                  block_tables_host=case.block_tables.clone(), validate=validate)
        fn = K.paged_decode if op == "decode" else K.paged_prefill
        if op == "prefill":
            kw.update(query_start_loc=case.query_start_loc, query_start_loc_host=case.query_start_loc.clone())
        with CountTorchCalls() as mode:
            fn(**kw)
        counts.append(mode.calls)
    assert counts[0] == counts[1], f"torch calls per launch: {counts[0]} for 4 sequences, {counts[1]} for 64"


def test_decode_grid_covers_every_sequence_without_a_tile_list(stubbed, gen):
    case = make_case([3, 0, 9, 30, 1], block_size=4, num_kv_heads=2, group=20, head_dim=16, generator=gen)
    K.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, num_splits=2,
                   _tile_rows=16, seq_lens_host=case.seq_lens)
    # group 20 in 16-row tiles: 2 tiles per sequence
    assert stubbed["_paged_attention_kernel"].grids == [(5 * 2, 2, 2)]


def _definition_tiles(q_lens, group, block_m):
    return [(i, r) for i, n in enumerate(q_lens) for r in range(0, n * group, block_m)]


@settings(max_examples=40, deadline=None)
@given(q_lens=st.lists(st.integers(0, 40), min_size=1, max_size=8), group=st.integers(1, 9),
       block_m=st.sampled_from([16, 32, 64]))
def test_device_prefill_tiles_are_the_definition(q_lens, group, block_m):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq, row = attention.build_prefill_tiles(qsl, sum(q_lens), group, block_m)
    real = row != attention.PADDING_ROW
    assert list(zip(seq[real].tolist(), row[real].tolist())) == _definition_tiles(q_lens, group, block_m)
    assert bool(((seq >= 0) & (seq < len(q_lens))).all())


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_host_metadata_gives_the_default_result(op, device, gen):
    lens = [0, 1, 9, 70, 33]
    case = make_case(lens, q_lens=None if op == "decode" else [0, 1, 4, 70, 2], block_size=8, group=3,
                     device=device, generator=gen)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    capacity = case.block_tables.shape[1] * 8
    if op == "decode":
        variants = [dict(seq_lens_host=lens, block_tables_host=case.block_tables.cpu()),
                    dict(validate=False, max_seq_len=capacity),
                    dict(max_seq_len=70)]
        base = K.paged_decode(*args, num_splits=2)
        outs = [K.paged_decode(*args, num_splits=2, **v) for v in variants]
    else:
        variants = [dict(seq_lens_host=lens, block_tables_host=case.block_tables.cpu(),
                         query_start_loc_host=case.query_start_loc.cpu()),
                    dict(validate=False, max_seq_len=capacity)]
        base = K.paged_prefill(*args, case.query_start_loc)
        outs = [K.paged_prefill(*args, case.query_start_loc, **v) for v in variants]
    for variant, out in zip(variants, outs):
        assert torch.equal(out, base), f"{sorted(variant)} differs from the default path"


def test_host_copies_are_checked(decode_args_small):
    """Host copies are the source of truth for the checks: their own errors are typed too."""
    case = decode_args_small
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    bad = [
        (dict(seq_lens_host=[5]), "shape"),
        (dict(seq_lens_host=[5, -1]), "negative"),
        (dict(seq_lens_host=[5.0, 9.0]), "integers"),
        (dict(seq_lens_host=["5", "9"]), "sequence of ints"),
        (dict(seq_lens_host=[5, 2**70]), "sequence of ints"),
        (dict(seq_lens_host=[True, False]), "integers"),
        (dict(seq_lens_host=[5, 10**3]), "capacity"),
        (dict(seq_lens_host=torch.tensor([5, 9]).to("meta")), "host"),
        (dict(block_tables_host=case.block_tables.cpu()[:1]), "shape"),
        (dict(block_tables_host=torch.full_like(case.block_tables.cpu(), 999)), "out of range"),
        (dict(seq_lens_host=[5, 9], max_seq_len=8), "max_seq_len"),
    ]
    for kw, match in bad:
        with pytest.raises(K.KernelArgumentError, match=match):
            K.paged_decode(*args, **kw)


@pytest.fixture
def decode_args_small(device, gen):
    return make_case([5, 9], block_size=4, num_kv_heads=2, group=2, head_dim=16, device=device, generator=gen)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")
def test_cuda_graph_replays_decode_with_new_lengths(gen):
    """Capture one decode step (sync-free mode: validate=False, max_seq_len = table capacity, fixed
    split), then change the lengths in place and replay: each replay matches the reference for the
    new lengths. Any host read inside the capture would make torch.cuda.graph raise."""
    full = [300, 40, 129, 1]
    case = make_case(full, block_size=16, num_kv_heads=2, group=4, head_dim=128, dtype=torch.float16,
                     device="cuda", generator=gen)
    seq_lens = torch.ones_like(case.seq_lens)
    capacity = case.block_tables.shape[1] * 16
    kw = dict(validate=False, max_seq_len=capacity, num_splits=2)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, seq_lens)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        K.paged_decode(*args, **kw)  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = K.paged_decode(*args, **kw)
    host = (case.q.cpu(), case.k_cache.cpu(), case.v_cache.cpu(), case.block_tables.cpu())
    for lens in (full, [17, 0, 128, 1], [1, 40, 2, 0]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = K.reference_decode(*host, torch.tensor(lens, dtype=torch.int32))
        naive = K.reference_decode(*host, torch.tensor(lens, dtype=torch.int32), compute_dtype=torch.float16)
        ok, msg = compare(out.cpu(), ref, naive, torch.float16)
        assert ok, f"replay with lengths {lens}: {msg}"
