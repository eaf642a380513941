"""Perform a BlockManager's drained `Copies` on real caches, phase by phase in call order.

One helper for every engine-side cache (the tiny engine's `PagedRunner`, the kernel state machine's
`PagedCache`), so the order the `Copies` contract prescribes is written once: copy-on-write with
the `copy_blocks` kernel, swaps as whole-block copies between the device and host pools.
"""

import numpy as np
import torch

from pagedkv.kernels import copy_blocks


def perform_copies(copies, kv_caches: list, cpu_kv_caches: list, shadows: list = ()) -> None:
    """Perform every phase of `copies`, in order, on each layer's caches.

    kv_caches: (k_cache, v_cache) per layer, [num_blocks, B, Hkv, D] on the device;
    cpu_kv_caches: the matching (k, v) swap pools on the host, [num_cpu_blocks, B, Hkv, D];
    shadows: (gpu, cpu) pairs of any other per-block arrays (numpy or torch, block first) that
    must move with the KV, such as a test's record of what each slot holds."""
    for kind, pairs in copies.phases:
        for (k, v), (cpu_k, cpu_v) in zip(kv_caches, cpu_kv_caches):
            if kind == "cow":
                copy_blocks(k, v, pairs.to(k.device))
            elif kind == "swap_out":
                _copy_blocks_across(k, cpu_k, pairs)
                _copy_blocks_across(v, cpu_v, pairs)
            else:
                _copy_blocks_across(cpu_k, k, pairs)
                _copy_blocks_across(cpu_v, v, pairs)
        for gpu, cpu in shadows:
            src, dst = {"cow": (gpu, gpu), "swap_out": (gpu, cpu), "swap_in": (cpu, gpu)}[kind]
            _copy_blocks_across(src, dst, pairs)


def _copy_blocks_across(src, dst, pairs: torch.Tensor) -> None:
    """dst[pairs[:, 1]] = src[pairs[:, 0]] between two pools (device <-> host, or numpy arrays);
    the pairs of one phase never write a block twice, so the copies are independent."""
    if not len(pairs):
        return
    if isinstance(dst, np.ndarray):
        host = pairs.cpu().numpy()
        dst[host[:, 1]] = src[host[:, 0]]
        return
    dst[pairs[:, 1].to(dst.device)] = src[pairs[:, 0].to(src.device)].to(dst.device)
