"""Argument checks at the Python boundary of the kernels.

A Triton kernel trusts every pointer, stride and index it is given: a block id out of range, a
``seq_len`` larger than the block table, or a strided index tensor that the kernel reads as
``ptr + i`` is an illegal memory access on a GPU and silent garbage under the interpreter. Every
public launcher therefore checks its arguments here first and raises :class:`KernelArgumentError`
(a ``ValueError``; the one error class of the kernels room) with a message that names the argument.
A refused call has launched nothing, so no output or cache has changed.

What is checked:

* tensors: type, layout, rank, dtype, device, strides (no negative strides; index tensors fully
  contiguous; float tensors contiguous in the head dim; written caches must not overlap
  themselves, each other, or any tensor read by the same call);
* scalar options: exact Python/numpy ints and reals only (never bool for a number nor int for a
  bool), finite, within the range the kernel can represent;
* index values (lengths, ``query_start_loc``, slots, copy pairs, block ids): read from *host*
  copies. A caller that already holds them on the host passes them in (``*_host`` arguments) and
  no device-to-host copy happens; otherwise the device tensor is copied to the host once.

All value checks are vectorised torch ops on the host copies: no Python loop over sequences.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import NamedTuple

import torch

__all__ = ["KernelArgumentError", "SUPPORTED_DTYPES", "MAX_HEAD_DIM"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
MAX_SPLITS = 256
# Rows of a tile are int32 in the kernel (token * group + head): keep every row index below 2**30.
MAX_QUERY_ROWS = 2**30
FP32_MAX = torch.finfo(torch.float32).max
FP32_TINY = torch.finfo(torch.float32).tiny
LOG2E = 1.4426950408889634
INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class KernelArgumentError(ValueError):
    """A kernel was called with arguments it cannot process correctly."""


def _fail(msg: str) -> None:
    raise KernelArgumentError(msg)


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ---- scalars ----------------------------------------------------------------------------------------

def as_int(name: str, value, *, lo: int, hi: int | None = None) -> int:
    """A Python int (numpy integers are accepted and converted) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        _fail(f"{name} must be an int {bound}, got {value}")
    return value


def as_real(name: str, value) -> float:
    """A finite real (int, float, numpy float), never a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:
        _fail(f"{name} = {value!r} is too large for a float")
    if not math.isfinite(value):
        _fail(f"{name} must be finite, got {value!r}")
    return value


def as_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        _fail(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_scale(scale, head_dim: int) -> float:
    """The softmax scale; any sign, but scale * log2(e) must be a finite float32 (the kernel's type)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = as_real("scale", scale)
    if abs(scale) * LOG2E > FP32_MAX:
        _fail(f"scale = {scale!r} overflows float32 once multiplied by log2(e)")
    return scale


def check_softcap(softcap) -> float | None:
    """softcap * tanh(s / softcap): the cap must be a normal positive float32."""
    if softcap is None:
        return None
    softcap = as_real("softcap", softcap)
    if not FP32_TINY <= softcap <= FP32_MAX:
        _fail(f"softcap must be None or a float32 in [{FP32_TINY:.3g}, {FP32_MAX:.3g}], got {softcap!r}")
    return softcap


def check_window(sliding_window, capacity: int) -> int | None:
    """An int >= 1. A window of at least the table capacity hides no key (j > p - window holds for
    every position p < capacity), so it is dropped: the kernel never sees a value it cannot hold."""
    if sliding_window is None:
        return None
    window = as_int("sliding_window", sliding_window, lo=1)
    return None if window >= capacity else window


def check_num_splits(num_splits) -> int | None:
    if num_splits is None:
        return None
    return as_int("num_splits", num_splits, lo=1, hi=MAX_SPLITS)


def check_tile_rows(tile_rows) -> int | None:
    if tile_rows is None:
        return None
    tile_rows = as_int("_tile_rows", tile_rows, lo=16, hi=256)
    if tile_rows & (tile_rows - 1):
        _fail(f"_tile_rows must be a power of two in [16, 256], got {tile_rows}")
    return tile_rows


# ---- tensors ----------------------------------------------------------------------------------------

def check_tensor(name: str, t, *, ndim: int | None = None, dtype=None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        _fail(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if ndim is not None and t.dim() != ndim:
        _fail(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            _fail(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if device is not None and t.device != device:
        _fail(f"{name} is on {t.device} but the other tensors are on {device}")
    if any(s < 0 for s in t.stride()):
        _fail(f"{name} has a negative stride {t.stride()}")


def check_index_tensor(name: str, t, *, ndim: int, dtype, device) -> None:
    """Index tensors are read by the kernels as ``ptr + i`` (``ptr + 2 * i + j`` for pairs): a
    strided view would be misread, so it is refused rather than silently reinterpreted."""
    check_tensor(name, t, ndim=ndim, dtype=dtype, device=device)
    if not t.is_contiguous():
        _fail(f"{name} must be contiguous (the kernel reads it element by element), got strides "
              f"{t.stride()} for shape {tuple(t.shape)}; pass {name}.contiguous()")


def check_float_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        _fail(f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
    if t.dtype == torch.bfloat16 and (t.device.type != "cuda" or is_interpreter()):
        _fail(f"{name} is bfloat16, which the Triton interpreter (CPU) cannot run; use float32/float16")


def check_device(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu":
        if not is_interpreter():
            _fail(
                "tensors are on the CPU but Triton is not in interpreter mode; set TRITON_INTERPRET=1 "
                "before importing pagedkv.kernels, or move the tensors to a CUDA device"
            )
        return
    _fail(f"unsupported device {t.device}; use cuda (or cpu under TRITON_INTERPRET=1)")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")


# ---- memory overlap ---------------------------------------------------------------------------------

def _dims(t: torch.Tensor) -> list[tuple[int, int]]:
    """(stride, size) of the dimensions that move through memory, smallest stride first."""
    return sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1)


def _is_nested(dims: list[tuple[int, int]]) -> bool:
    """Each stride steps past everything the smaller dimensions span: then distinct indices have
    distinct addresses (the layout does not overlap itself)."""
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return False
        extent += (size - 1) * stride
    return True


def check_not_self_overlapping(name: str, t: torch.Tensor) -> None:
    """A written tensor must give every element its own memory (no zero or interleaved strides,
    e.g. an expand()ed view or a block stride smaller than a block): otherwise two writes hit the
    same address and the result depends on thread order."""
    if not _is_nested(_dims(t)):
        _fail(f"{name} is written to but its layout overlaps itself (shape {tuple(t.shape)}, "
              f"strides {t.stride()}): distinct elements would share memory")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    last = sum((n - 1) * st for st, n in zip(t.stride(), t.shape))
    return start, start + (last + 1) * t.element_size()


def _offset_reachable(delta: int, dims: list[tuple[int, int]]) -> bool:
    """Is ``delta`` = sum_i d_i * stride_i for some d_i in [-(size_i - 1), size_i - 1]? For a nested
    layout, at most two d_i fit at each level, so this explores at most 2**ndim paths."""
    if not dims:
        return delta == 0
    (stride, size), rest = dims[-1], dims[:-1]
    reach = sum((n - 1) * st for st, n in rest)
    lo = max(-(size - 1), -((reach - delta) // stride))  # ceil((delta - reach) / stride)
    hi = min(size - 1, (delta + reach) // stride)
    return any(_offset_reachable(delta - d * stride, rest) for d in range(lo, hi + 1))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of ``a`` occupies a byte of some element of ``b``. Exact for two views
    of the same nested layout at different offsets (e.g. K and V as halves of a fused
    [N, 2, B, H, D] cache); otherwise two byte ranges that intersect count as shared."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    size = a.element_size()
    same_layout = a.stride() == b.stride() and a.shape == b.shape and b.element_size() == size
    dims = _dims(a)
    if not same_layout or not _is_nested(dims) or (b0 - a0) % size:
        return True
    return _offset_reachable((b0 - a0) // size, dims)


def check_disjoint(written: dict, read: dict) -> None:
    """Every written tensor is disjoint from every other tensor of the call (written or read)."""
    names = list(written)
    for i, name in enumerate(names):
        others = {**{n: written[n] for n in names[i + 1 :]}, **read}
        for other, t in others.items():
            if shares_memory(written[name], t):
                _fail(f"{name} and {other} share memory; the kernel writes {name}, so the result "
                      f"would depend on the order of its reads and writes")


# ---- caches and attention shapes --------------------------------------------------------------------

def check_cache_pair(k_cache, v_cache, device=None) -> tuple[int, int, int, int]:
    check_tensor("k_cache", k_cache, ndim=4, device=device)
    check_tensor("v_cache", v_cache, ndim=4, device=k_cache.device)
    if k_cache.shape != v_cache.shape:
        _fail(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the same shape")
    if k_cache.dtype != v_cache.dtype:
        _fail(f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) must have the same dtype")
    check_float_dtype("k_cache", k_cache)
    check_device(k_cache)
    check_last_dim_contiguous("k_cache", k_cache)
    check_last_dim_contiguous("v_cache", v_cache)
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    if block_size < 1:
        _fail(f"block_size (k_cache.shape[1]) must be >= 1, got {block_size}")
    if num_kv_heads < 1:
        _fail("num_kv_heads (k_cache.shape[2]) must be >= 1")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        _fail(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_written_caches(k_cache: torch.Tensor, v_cache: torch.Tensor, read: dict) -> None:
    check_not_self_overlapping("k_cache", k_cache)
    check_not_self_overlapping("v_cache", v_cache)
    check_disjoint({"k_cache": k_cache, "v_cache": v_cache}, read)


class AttentionShape(NamedTuple):
    """Sizes derived from an attention call's tensors."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    num_q_heads: int
    num_seqs: int
    capacity: int      # token slots a table row can name: columns x block size


def check_attention_shapes(q, k_cache, v_cache, block_tables, seq_lens) -> AttentionShape:
    """Shape, dtype, device and layout checks shared by decode and prefill (no tensor values are
    read). Returns the derived sizes."""
    check_tensor("q", q, ndim=3)
    num_blocks, block_size, num_kv_heads, head_dim = check_cache_pair(k_cache, v_cache, device=q.device)
    check_float_dtype("q", q)
    if q.dtype != k_cache.dtype:
        _fail(f"q ({q.dtype}) and the caches ({k_cache.dtype}) must have the same dtype")
    check_last_dim_contiguous("q", q)
    num_tokens, num_q_heads, q_head_dim = q.shape
    if q_head_dim != head_dim:
        _fail(f"q head_dim {q_head_dim} differs from the cache head_dim {head_dim}")
    if num_q_heads < 1 or num_q_heads % num_kv_heads != 0:
        _fail(f"num query heads ({num_q_heads}) must be a positive multiple of num kv heads ({num_kv_heads})")
    if num_tokens * num_q_heads >= MAX_QUERY_ROWS:
        _fail(f"q has {num_tokens} x {num_q_heads} (token, head) rows; at most {MAX_QUERY_ROWS - 1} per call")
    check_tensor("block_tables", block_tables, ndim=2, dtype=torch.int32, device=q.device)
    check_last_dim_contiguous("block_tables", block_tables)
    check_index_tensor("seq_lens", seq_lens, ndim=1, dtype=torch.int32, device=q.device)
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs:
        _fail(f"block_tables has {block_tables.shape[0]} rows but seq_lens has {num_seqs} entries")
    return AttentionShape(
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_q_heads=num_q_heads,
        num_seqs=num_seqs,
        capacity=block_tables.shape[1] * block_size,
    )


# ---- host copies of index tensors -------------------------------------------------------------------

def host_ints(name: str, value, shape: tuple[int, ...]) -> torch.Tensor:
    """A caller's host copy of an index tensor as a CPU integer tensor of ``shape`` (its own dtype:
    compare it only with bounds that dtype holds, or convert it): a CPU tensor of an integer
    dtype, or a (nested) sequence / numpy array of ints."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            _fail(f"{name} must be a host (CPU) copy, got a tensor on {value.device}")
        if value.layout != torch.strided:
            _fail(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
        t = value
    else:
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            _fail(f"{name} must be a CPU tensor or a sequence of ints: {exc}")
    if t.dtype not in INDEX_DTYPES:
        _fail(f"{name} must hold integers, got dtype {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        _fail(f"{name} has shape {tuple(t.shape)} but the device tensor has {tuple(shape)}")
    return t


def read_to_host(t: torch.Tensor) -> torch.Tensor:
    """The one place a device index tensor is copied to the host (a sync on a GPU)."""
    return t.cpu()


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def check_lengths(lens: torch.Tensor, capacity: int, block_size: int) -> None:
    """0 <= seq_lens[i] <= the table capacity (max_blocks x block_size)."""
    if lens.numel() == 0:
        return
    if bool((lens < 0).any()):
        (i,) = _first(lens < 0)
        _fail(f"seq_lens[{i}] = {int(lens[i])} is negative")
    if bool((lens > capacity).any()):
        (i,) = _first(lens > capacity)
        _fail(f"seq_lens[{i}] = {int(lens[i])} exceeds the block table capacity "
              f"{capacity // block_size} blocks x {block_size} slots = {capacity}")


def check_max_seq_len(max_seq_len, capacity: int, lens: torch.Tensor | None) -> int | None:
    if max_seq_len is None:
        return None
    max_seq_len = as_int("max_seq_len", max_seq_len, lo=0, hi=capacity)
    if lens is not None and lens.numel() and int(lens.max()) > max_seq_len:
        _fail(f"max_seq_len = {max_seq_len} but seq_lens holds {int(lens.max())}")
    return max_seq_len


def check_block_ids(table: torch.Tensor, lens: torch.Tensor, block_size: int, num_blocks: int) -> None:
    """Every block a sequence actually reads (the first ceil(len / B) of its row) is in range.
    ``lens`` int64; ``table`` in its own integer dtype (not widened: it is the large operand, so
    the check is one mask, one select and one min/max pass over it)."""
    if table.numel() == 0:
        return
    used = (lens + block_size - 1) // block_size
    in_use = torch.arange(table.shape[1], dtype=torch.int64)[None, :] < used[:, None]
    if num_blocks > 0:
        lo, hi = (int(x) for x in torch.aminmax(torch.where(in_use, table, 0)))  # 0: a valid stand-in
        if lo >= 0 and hi < num_blocks:
            return
    elif not bool(in_use.any()):
        return
    bad = in_use & ((table < 0) | (table.to(torch.int64) >= num_blocks))
    s, j = _first(bad)
    _fail(
        f"block_tables[{s}, {j}] = {int(table[s, j])} is out of range [0, {num_blocks}) "
        f"(sequence {s} has {int(lens[s])} tokens, so it reads {int(used[s])} blocks)"
    )


def check_query_start_loc(qsl: torch.Tensor, num_tokens: int, lens: torch.Tensor | None) -> None:
    """qsl (host int64 [S + 1]): starts at 0, non-decreasing, ends at the token count, and no
    sequence has more queries than tokens (the queries are its last positions)."""
    if int(qsl[0]) != 0:
        _fail(f"query_start_loc[0] must be 0, got {int(qsl[0])}")
    q_lens = qsl[1:] - qsl[:-1]
    if bool((q_lens < 0).any()):
        (i,) = _first(q_lens < 0)
        _fail(f"query_start_loc must be non-decreasing; entry {i + 1} ({int(qsl[i + 1])}) < entry {i} "
              f"({int(qsl[i])})")
    if int(qsl[-1]) != num_tokens:
        _fail(f"query_start_loc[-1] = {int(qsl[-1])} must equal the number of query tokens {num_tokens}")
    if lens is not None and bool((q_lens > lens).any()):
        (i,) = _first(q_lens > lens)
        _fail(f"sequence {i} has {int(q_lens[i])} queries but only {int(lens[i])} tokens; the queries are "
              f"the last positions of the sequence, so q_len <= seq_len")


# ---- host metadata of one attention call ------------------------------------------------------------

def reads_nothing(validate: bool, max_seq_len) -> bool:
    """The sync-free mode: without validation and with ``max_seq_len`` known, an index tensor that
    has no host copy is not read at all (the kernel clamps every length to the table capacity and
    every query row to q, so unchecked values cannot make it address memory outside them)."""
    return not validate and max_seq_len is not None


def host_lengths(shape: AttentionShape, seq_lens, block_tables, *, seq_lens_host, block_tables_host, max_seq_len,
                 validate: bool) -> tuple[torch.Tensor | None, int]:
    """Check the lengths (and with ``validate`` the block ids) from host copies; return the host
    lengths (None in the sync-free mode without a host copy) and the longest length."""
    validate = as_bool("validate", validate)
    capacity, block_size = shape.capacity, shape.block_size
    if seq_lens_host is not None:
        lens = host_ints("seq_lens_host", seq_lens_host, (shape.num_seqs,)).to(torch.int64)
    elif reads_nothing(validate, max_seq_len):
        lens = None
    else:
        lens = read_to_host(seq_lens).to(torch.int64)
    if lens is not None:
        check_lengths(lens, capacity, block_size)
    longest = check_max_seq_len(max_seq_len, capacity, lens)
    if longest is None:
        longest = int(lens.max()) if lens.numel() else 0
    if validate:
        if block_tables_host is not None:
            table = host_ints("block_tables_host", block_tables_host, tuple(block_tables.shape))
        else:
            table = read_to_host(block_tables)
        check_block_ids(table, lens, block_size, shape.num_blocks)
    return lens, longest


def host_query_starts(query_start_loc, query_start_loc_host, *, num_tokens: int, num_seqs: int, lens,
                      device, read: bool) -> None:
    """Check ``query_start_loc`` (int32 [S + 1]) from its host copy, read from the device if
    ``read`` and no copy was given (``lens``: host lengths, None if unknown)."""
    check_index_tensor("query_start_loc", query_start_loc, ndim=1, dtype=torch.int32, device=device)
    if query_start_loc.shape[0] != num_seqs + 1:
        _fail(f"query_start_loc must have num_seqs + 1 = {num_seqs + 1} entries, got {query_start_loc.shape[0]}")
    if query_start_loc_host is not None:
        qsl = host_ints("query_start_loc_host", query_start_loc_host, tuple(query_start_loc.shape))
    elif read:
        qsl = read_to_host(query_start_loc)
    else:
        return
    check_query_start_loc(qsl.to(torch.int64), num_tokens, lens)
