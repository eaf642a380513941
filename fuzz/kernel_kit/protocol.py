"""The kernel-under-test protocol: how anyone's paged-attention kernel plugs into pagedkv's tests.

It is the kernel twin of ``module:factory`` for block managers. A *target* is ``"module:factory"``
(or a built-in name of :data:`NAMED`, e.g. ``"pagedkv"``); ``factory()`` is called with no arguments
and returns a kernel object with

    decode(q, k_cache, v_cache, block_tables, seq_lens, *, scale, sliding_window, softcap) -> out

and, if it declares ``"prefill"``,

    prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *, scale, causal,
            sliding_window, softcap) -> out

Canonical layout (pagedkv's own; see ``layouts`` for converting it into other engines' layouts):

    q               [T, Hq, D]      decode: T = S, one query per sequence; prefill: the queries of
                                    all sequences packed, sequence i owning rows
                                    query_start_loc[i] : query_start_loc[i + 1]
    k_cache/v_cache [N, B, Hkv, D]  N physical blocks of B slots; token j of sequence i is slot
                                    j % B of block block_tables[i, j // B]
    block_tables    int32 [S, M]    entries past a sequence's last block are padding: never read them
    seq_lens        int32 [S]       L_i, every token of the sequence, the queries' own included (their
                                    K/V is already in the cache)
    query_start_loc int32 [S + 1]   prefill only; the q_len_i queries are positions L_i - q_len_i ..
                                    L_i - 1 (a cached prefix, then the new tokens)
    out             [T, Hq, D]      any floating dtype; compared in float32

Query head h reads KV head h // (Hq / Hkv). Decode's query is position L_i - 1. The keywords are
always passed: ``scale`` a float; ``sliding_window`` None or an int W >= 1 (a query at position p
sees keys p - W < j <= p, so W counts the query itself); ``softcap`` None or a float c > 0 (scores
become c * tanh(s / c)); ``causal`` a bool (False: every query sees all L_i keys, still bounded by
the window). A row with no visible key must be 0 (only asked of kernels that declare "empty_rows").
Every cache slot that holds no valid token is NaN, and unused blocks of the pool are NaN, so any
read past a sequence's end shows up in the output.

Declarations (attributes of the kernel object; a missing one means the default):

    capabilities  subset of CAPABILITIES (default: empty, i.e. causal decode only)
        "prefill"         has ``prefill`` (chunked prefill over a cached prefix, decode rows mixed in)
        "sliding_window"  honours ``sliding_window``
        "softcap"         honours ``softcap``
        "non_causal"      prefill honours ``causal=False``
        "empty_rows"      sequences of length 0 (decode) or with no queries (prefill) give zero rows
        "split_kv"        decode also takes ``num_splits=k`` (k >= 1) and splits the key range k ways
    block_sizes   collection of ints B the kernel supports (default None: any B >= 1)
    head_dims     collection of ints D (default None: any)
    dtypes        collection of torch dtypes or their names it runs in on this machine (default:
                  float32 and float16, plus bfloat16 where CUDA is present: the interpreter has none)
    max_group     largest Hq / Hkv (default None: any)
    tile_size     optional, only for reports: the key-tile width, an int or a function of head_dim

A case that needs something the kernel does not declare is *skipped* and counted as skipped, never
failed. Everything the kernel declares is tested: claim only what you support.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import torch

from ..targets import factory_in, split_target

__all__ = [
    "CAPABILITIES", "NAMED", "KernelTargetError", "PagedAttentionKernel", "Declaration", "Requirement",
    "LoadedKernel", "declaration_of", "load_kernel", "skip_reason",
]

CAPABILITIES = frozenset({"prefill", "sliding_window", "softcap", "non_causal", "empty_rows", "split_kv"})
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: Built-in target names. Shipped targets for other engines add their entry here.
NAMED = {
    "pagedkv": "pagedkv.fuzz.kernel_kit.pagedkv_target:factory",
    "vllm": "pagedkv.fuzz.adapters.vllm_kernel:factory",      # vLLM 0.33.0's Triton unified attention
    "sglang": "pagedkv.fuzz.adapters.sglang_kernels:factory",   # SGLang 0.5.23's Triton decode + extend
}
#: The environment variable that names the target of a replay (`pagedkv ... --kernel` wins).
KERNEL_ENV = "PAGEDKV_KERNEL"


class KernelTargetError(Exception):
    """The target cannot be tested; the message says why (a usage error: the CLI exits 2)."""


@runtime_checkable
class PagedAttentionKernel(Protocol):
    """What a factory returns (``prefill`` only if it declares "prefill"); see the module docstring."""

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor, *, scale: float, sliding_window: int | None,
               softcap: float | None) -> torch.Tensor: ...


@dataclass(frozen=True)
class Declaration:
    """What a kernel says it supports, normalised (None: no restriction)."""

    capabilities: frozenset
    block_sizes: frozenset | None = None
    head_dims: frozenset | None = None
    dtypes: frozenset = frozenset((torch.float32, torch.float16))
    max_group: int | None = None
    tile_size: int | Callable[[int], int] | None = None

    def tile_for(self, head_dim: int) -> int | None:
        return self.tile_size(head_dim) if callable(self.tile_size) else self.tile_size


@dataclass(frozen=True)
class Requirement:
    """What one case needs from a kernel."""

    kind: str                 # "decode" or "prefill"
    block_size: int
    head_dim: int
    dtype: torch.dtype
    group: int
    capabilities: frozenset   # the optional features the case uses


def skip_reason(declared: Declaration, need: Requirement) -> str | None:
    """Why a kernel with `declared` support cannot be given a case that needs `need` (None: it can)."""
    missing = set(need.capabilities) | ({"prefill"} if need.kind == "prefill" else set())
    missing -= declared.capabilities
    if missing:
        return f"needs {', '.join(sorted(missing))}"
    if need.dtype not in declared.dtypes:
        return f"dtype {str(need.dtype).removeprefix('torch.')} not declared"
    if declared.block_sizes is not None and need.block_size not in declared.block_sizes:
        return f"block size {need.block_size} not declared"
    if declared.head_dims is not None and need.head_dim not in declared.head_dims:
        return f"head dim {need.head_dim} not declared"
    if declared.max_group is not None and need.group > declared.max_group:
        return f"group {need.group} > max_group {declared.max_group}"
    return None


def _int_set(target: str, name: str, value) -> frozenset | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise KernelTargetError(f"target {target!r}: {name} must be a collection of ints or None, got {value!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise KernelTargetError(f"target {target!r}: {name} must hold positive ints, got {sorted(value)!r}")
    return frozenset(value)


def _dtype_set(target: str, value) -> frozenset:
    if value is None:
        return frozenset(DTYPES.values()) if torch.cuda.is_available() else frozenset((torch.float32, torch.float16))
    if isinstance(value, (str, torch.dtype)) or not isinstance(value, Collection):
        raise KernelTargetError(f"target {target!r}: dtypes must be a collection, got {value!r}")
    out = set()
    for item in value:
        dtype = DTYPES.get(item) if isinstance(item, str) else item
        if dtype not in DTYPES.values():
            raise KernelTargetError(f"target {target!r}: dtype {item!r} is not one of {list(DTYPES)}")
        out.add(dtype)
    return frozenset(out)


def declaration_of(kernel, target: str = "kernel") -> Declaration:
    """The normalised declaration of a kernel object; KernelTargetError if it breaks the protocol."""
    if not callable(getattr(kernel, "decode", None)):
        raise KernelTargetError(f"target {target!r}: the kernel object has no callable decode()")
    capabilities = getattr(kernel, "capabilities", frozenset())
    if isinstance(capabilities, str) or not isinstance(capabilities, Collection):
        raise KernelTargetError(f"target {target!r}: capabilities must be a set of names, got {capabilities!r}")
    capabilities = frozenset(capabilities)
    if not capabilities <= CAPABILITIES:
        raise KernelTargetError(f"target {target!r}: unknown capabilities {sorted(capabilities - CAPABILITIES)}; "
                                f"known: {sorted(CAPABILITIES)}")
    if "prefill" in capabilities and not callable(getattr(kernel, "prefill", None)):
        raise KernelTargetError(f"target {target!r}: declares 'prefill' but has no callable prefill()")
    max_group = getattr(kernel, "max_group", None)
    if max_group is not None and (isinstance(max_group, bool) or not isinstance(max_group, int) or max_group < 1):
        raise KernelTargetError(f"target {target!r}: max_group must be None or an int >= 1, got {max_group!r}")
    tile_size = getattr(kernel, "tile_size", None)
    if tile_size is not None and not callable(tile_size) and (not isinstance(tile_size, int) or tile_size < 1):
        raise KernelTargetError(f"target {target!r}: tile_size must be an int >= 1 or a function, got {tile_size!r}")
    return Declaration(
        capabilities=capabilities,
        block_sizes=_int_set(target, "block_sizes", getattr(kernel, "block_sizes", None)),
        head_dims=_int_set(target, "head_dims", getattr(kernel, "head_dims", None)),
        dtypes=_dtype_set(target, getattr(kernel, "dtypes", None)),
        max_group=max_group,
        tile_size=tile_size,
    )


@dataclass(frozen=True)
class LoadedKernel:
    """A resolved target: its name as given, the kernel object and its declaration."""

    target: str
    kernel: object
    declared: Declaration


def load_kernel(target: str | None = None) -> LoadedKernel:
    """Resolve `target` ("module:factory", a name of NAMED; None: $PAGEDKV_KERNEL, else "pagedkv"),
    call the factory once and check the object it returns. Raises KernelTargetError with the reason."""
    target = target or os.environ.get(KERNEL_ENV) or "pagedkv"
    spec = NAMED.get(target, target)
    module_name, attr = split_target(target, spec, KernelTargetError, f"'module:factory' or one of {sorted(NAMED)}",
                                     kind="kernel target")
    factory = factory_in(_import(target, module_name), target, module_name, attr, KernelTargetError, noun="factory")
    try:
        kernel = factory()
    except Exception as error:  # the user's factory: report why it failed, do not crash the run
        raise KernelTargetError(f"target {target!r}: factory() raised {type(error).__name__}: {error}") from error
    return LoadedKernel(target, kernel, declaration_of(kernel, target))


def _import(target: str, module_name: str):
    """Import the target's module. A module next to the caller (a user's `mykernel.py`) must import
    too, as with `python -m`, so the current directory is searched, but LAST: it never shadows an
    installed module, and only kernel module targets, never built-in names, look there."""
    try:
        if target not in NAMED and os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        return importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's to fix: say which and why
        raise KernelTargetError(f"target {target!r}: cannot import {module_name!r}: "
                                f"{type(error).__name__}: {error}") from error
