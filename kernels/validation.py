"""Argument checks at the Python boundary of the kernels.

A Triton kernel trusts every pointer and index it is given: a block id out of range or a
``seq_len`` larger than the block table is an illegal memory access on a GPU and silent garbage
under the interpreter. Every public wrapper therefore validates its arguments here first and raises
:class:`KernelArgumentError` (a ``ValueError``) with a message that names the argument.

Checks that need the *values* of index tensors (``seq_lens``, ``query_start_loc``, slot mappings,
copy pairs) read them to the host once; the per-block-id range check of the block tables is the
expensive one and runs only when ``validate=True``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["KernelArgumentError", "SUPPORTED_DTYPES", "MAX_HEAD_DIM"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


class KernelArgumentError(ValueError):
    """A kernel was called with arguments it cannot process correctly."""


def _fail(msg: str) -> None:
    raise KernelArgumentError(msg)


def is_interpreter() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_tensor(name: str, t, *, ndim: int | None = None, dtype=None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        _fail(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            _fail(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if device is not None and t.device != device:
        _fail(f"{name} is on {t.device} but the other tensors are on {device}")
    if t.dim() > 0 and any(s < 0 for s in t.stride()):
        _fail(f"{name} has a negative stride {t.stride()}")


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
        _fail(f"{name} must be contiguous in its last (head) dimension, got strides {t.stride()}")


def check_not_overlapping(name: str, t: torch.Tensor) -> None:
    """Written tensors must not alias themselves (e.g. an expand()ed view with stride 0)."""
    for size, stride in zip(t.shape, t.stride()):
        if size > 1 and stride == 0:
            _fail(f"{name} is written to but has a zero stride (an expanded view), strides {t.stride()}")


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


def check_attention_args(
    q, k_cache, v_cache, block_tables, seq_lens, *, num_tokens_name: str = "q.shape[0]"
) -> dict:
    """Common checks of paged_decode and paged_prefill; returns the derived sizes."""
    check_tensor("q", q, ndim=3)
    num_blocks, block_size, num_kv_heads, head_dim = check_cache_pair(k_cache, v_cache, device=q.device)
    check_float_dtype("q", q)
    if q.dtype != k_cache.dtype:
        _fail(f"q ({q.dtype}) and the caches ({k_cache.dtype}) must have the same dtype")
    check_last_dim_contiguous("q", q)
    _, num_q_heads, q_head_dim = q.shape
    if q_head_dim != head_dim:
        _fail(f"q head_dim {q_head_dim} differs from the cache head_dim {head_dim}")
    if num_q_heads < 1 or num_q_heads % num_kv_heads != 0:
        _fail(f"num query heads ({num_q_heads}) must be a positive multiple of num kv heads ({num_kv_heads})")
    check_tensor("block_tables", block_tables, ndim=2, dtype=torch.int32, device=q.device)
    check_tensor("seq_lens", seq_lens, ndim=1, dtype=torch.int32, device=q.device)
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs:
        _fail(f"block_tables has {block_tables.shape[0]} rows but seq_lens has {num_seqs} entries")
    max_blocks = block_tables.shape[1]
    lens = seq_lens.cpu().tolist()
    capacity = max_blocks * block_size
    for i, n in enumerate(lens):
        if n < 0:
            _fail(f"seq_lens[{i}] = {n} is negative")
        if n > capacity:
            _fail(
                f"seq_lens[{i}] = {n} exceeds the block table capacity {max_blocks} blocks x "
                f"{block_size} slots = {capacity}"
            )
    return dict(
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_q_heads=num_q_heads,
        num_seqs=num_seqs,
        seq_lens=lens,
    )


def check_attention_options(info: dict, block_tables, scale, sliding_window, softcap, tile_rows, validate) -> float:
    """The checks decode and prefill share after their own: table layout, options, tile override, and
    (with ``validate``) block ids in range. Returns the softmax scale."""
    check_last_dim_contiguous("block_tables", block_tables)
    scale = check_options(scale, sliding_window, softcap, info["head_dim"])
    if tile_rows is not None and (tile_rows < 16 or tile_rows & (tile_rows - 1)):
        _fail("_tile_rows must be a power of two >= 16")
    if validate:
        check_block_ids(block_tables, info["seq_lens"], info["block_size"], info["num_blocks"])
    return scale


def check_block_ids(block_tables: torch.Tensor, seq_lens: list[int], block_size: int, num_blocks: int) -> None:
    """Every block a sequence actually reads (the first ceil(len/B) of its row) is in range."""
    if not seq_lens:
        return
    used = torch.tensor([-(-n // block_size) for n in seq_lens], dtype=torch.int64)
    table = block_tables.cpu().to(torch.int64)
    cols = torch.arange(table.shape[1], dtype=torch.int64)
    in_use = cols[None, :] < used[:, None]
    bad = in_use & ((table < 0) | (table >= num_blocks))
    if bool(bad.any()):
        s, j = (int(x) for x in bad.nonzero()[0])
        _fail(
            f"block_tables[{s}, {j}] = {int(table[s, j])} is out of range [0, {num_blocks}) "
            f"(sequence {s} has {seq_lens[s]} tokens, so it reads {int(used[s])} blocks)"
        )


def check_options(scale, sliding_window, softcap, head_dim: int) -> float:
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        _fail(f"scale must be a finite number, got {scale!r}")
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
            _fail(f"sliding_window must be None or an int >= 1, got {sliding_window!r}")
    if softcap is not None:
        if (
            isinstance(softcap, bool)
            or not isinstance(softcap, (int, float))
            or not math.isfinite(softcap)
            or softcap <= 0
        ):
            _fail(f"softcap must be None or a finite number > 0, got {softcap!r}")
    return float(scale)


def check_query_start_loc(query_start_loc, num_tokens: int, seq_lens: list[int], device) -> list[int]:
    check_tensor("query_start_loc", query_start_loc, ndim=1, dtype=torch.int32, device=device)
    if query_start_loc.shape[0] != len(seq_lens) + 1:
        _fail(
            f"query_start_loc must have num_seqs + 1 = {len(seq_lens) + 1} entries, "
            f"got {query_start_loc.shape[0]}"
        )
    qsl = query_start_loc.cpu().tolist()
    if qsl[0] != 0:
        _fail(f"query_start_loc[0] must be 0, got {qsl[0]}")
    for i in range(len(seq_lens)):
        if qsl[i + 1] < qsl[i]:
            _fail(f"query_start_loc must be non-decreasing; entry {i + 1} ({qsl[i + 1]}) < entry {i} ({qsl[i]})")
    if qsl[-1] != num_tokens:
        _fail(f"query_start_loc[-1] = {qsl[-1]} must equal the number of query tokens {num_tokens}")
    for i in range(len(seq_lens)):
        q_len = qsl[i + 1] - qsl[i]
        if q_len > seq_lens[i]:
            _fail(
                f"sequence {i} has {q_len} queries but only {seq_lens[i]} tokens; the queries are the "
                f"last positions of the sequence, so q_len <= seq_len"
            )
    return qsl


def check_num_splits(num_splits) -> None:
    if num_splits is None:
        return
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= 256:
        _fail(f"num_splits must be None or an int in [1, 256], got {num_splits!r}")
