"""pagedkv.kernels: Triton paged-attention kernels and their dense torch references.

On a machine without CUDA the same kernels run under Triton's interpreter. The interpreter must be
chosen before ``@triton.jit`` decorates anything, so it is switched on here, before the kernel
modules are imported (an explicit TRITON_INTERPRET in the environment wins).

Triton versions: the kernels use only triton.language features that Triton 3.6 has as well as
3.9 (program_id, arange, load/store with mask and other, full/zeros, dot with input_precision,
trans, exp/exp2/log2/abs, where/maximum/minimum/max/sum/cdiv, casts, constexpr globals and
branches, loops with runtime bounds). Checked by running, with the Triton 3.6.0 wheel on the
path: ``python -m pagedkv.kernels.aot_check 90`` (TRITON_INTERPRET=0; all 21 variants lower to
sm_90 cubins) and the kernel test suite under the 3.6 interpreter. One limit: Triton 3.6's
*interpreter* converts scalar loads to ints in a way NumPy >= 2.4 refuses (`range` over a loaded
bound raises "only 0-dimensional arrays can be converted"), so CPU runs with Triton 3.6 need
NumPy < 2.4; compiled GPU runs are unaffected, and Triton 3.9's interpreter works with both.
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
