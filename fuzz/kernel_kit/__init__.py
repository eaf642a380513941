"""pagedkv.fuzz.kernel_kit: pagedkv's differential kernel tests for anyone's paged-attention kernel.

``protocol`` states what a kernel under test is (factory, decode/prefill, declarations) and resolves
``module:factory`` targets; ``layouts`` converts pagedkv's canonical paged batch into other engines'
layouts; ``pagedkv_target`` is the built-in target for pagedkv's own kernels.
"""

from .protocol import (CAPABILITIES, KERNEL_ENV, NAMED, Declaration, KernelTargetError, LoadedKernel,
                       PagedAttentionKernel, Requirement, declaration_of, load_kernel, skip_reason)

__all__ = ["CAPABILITIES", "KERNEL_ENV", "NAMED", "Declaration", "KernelTargetError", "LoadedKernel",
           "PagedAttentionKernel", "Requirement", "declaration_of", "load_kernel", "skip_reason"]
