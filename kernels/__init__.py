"""pagedkv.kernels: Triton paged-attention kernels and their dense torch references.

On a machine without CUDA the same kernels run under Triton's interpreter. The interpreter must be
chosen before ``@triton.jit`` decorates anything, so it is switched on here, before the kernel
modules are imported (an explicit TRITON_INTERPRET in the environment wins).
"""

import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .cache_ops import copy_blocks, write_kv  # noqa: E402
from .decode import choose_num_splits, paged_decode  # noqa: E402
from .prefill import paged_prefill  # noqa: E402
from .reference import dense_attention, gather_kv, reference_decode, reference_prefill  # noqa: E402
from .validation import KernelArgumentError  # noqa: E402

__all__ = [
    "paged_decode",
    "paged_prefill",
    "write_kv",
    "copy_blocks",
    "choose_num_splits",
    "gather_kv",
    "dense_attention",
    "reference_decode",
    "reference_prefill",
    "KernelArgumentError",
]
