"""Ahead-of-time compile every kernel for a CUDA target (default sm_90) without a GPU.

The interpreter runs the kernels' Python semantics but not the GPU compiler; this lowers each
kernel through TTIR -> TTGIR -> LLVM -> PTX -> cubin for the variants the wrappers launch, so
shape/dtype errors that only the real compiler sees (tl.dot constraints, bf16, int64 pointers)
show up on a CPU machine too. Run in a process where TRITON_INTERPRET=0:

    TRITON_INTERPRET=0 python -m pagedkv.kernels.aot_check [arch] [--quick]
"""

from __future__ import annotations

import os
import sys


def _sig(fn, dtype: str, consts: dict, ptr_types: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptr_types:
            sig[name] = ptr_types[name]
        elif name.endswith("_ptr"):
            sig[name] = "*i32"
        elif name in ("scale", "softcap"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def main(arch: int = 90, quick: bool = False) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("run with TRITON_INTERPRET=0", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import attention as A
    from . import cache_ops as C
    from . import decode as D

    target = GPUTarget("cuda", arch, 32)
    done = 0

    def compile_(fn, dtype, consts, ptr_types, num_warps=4):
        nonlocal done
        src = ASTSource(fn=fn, signature=_sig(fn, dtype, consts, ptr_types), constexprs=consts)
        triton.compile(src, target=target, options={"num_warps": num_warps})
        done += 1

    dtypes = ("bf16",) if quick else ("fp32", "fp16", "bf16")
    shapes = ((80, 5, 4),) if quick else ((128, 4, 1), (80, 5, 4), (256, 32, 1), (64, 1, 2))
    for dt in dtypes:
        for head_dim, group, splits in shapes:
            block_m, block_n, block_d = A.tile_sizes(head_dim, group, decode=splits > 1 or group < 8,
                                                     tile_rows=None, on_gpu=True)
            consts = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16 if splits > 1 else 3,
                          BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                          CAUSAL=True, USE_WINDOW=splits == 4, USE_SOFTCAP=group == 5, NUM_SPLITS=splits,
                          IEEE_DOT=dt == "fp32", DECODE_TILES=splits > 1 or group < 8)
            ptrs = {"q_ptr": "*" + dt, "k_ptr": "*" + dt, "v_ptr": "*" + dt, "lse_ptr": "*fp32",
                    "out_ptr": "*fp32" if splits > 1 else "*" + dt}
            compile_(A._paged_attention_kernel, dt, consts, ptrs, num_warps=4 if block_d <= 128 else 8)
        compile_(D._combine_splits_kernel, dt,
                 dict(NUM_SPLITS=3, SPLITS_P2=4, HEAD_DIM=80, BLOCK_D=128),
                 {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": "*" + dt})
        compile_(C._write_kv_kernel, dt, dict(BLOCK_SIZE=16, HEAD_DIM=96, BLOCK_T=16, BLOCK_D=128),
                 {"key_ptr": "*" + dt, "value_ptr": "*" + dt, "k_ptr": "*" + dt, "v_ptr": "*" + dt,
                  "slots_ptr": "*i64"})
        compile_(C._copy_blocks_kernel, dt, dict(BLOCK_SIZE=5, HEAD_DIM=256, BLOCK_S=16, BLOCK_D=256),
                 {"k_ptr": "*" + dt, "v_ptr": "*" + dt, "pairs_ptr": "*i64"})
    print(f"compiled {done} kernel variants for sm_{arch}")
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--quick"]
    sys.exit(main(int(args[0]) if args else 90, quick="--quick" in sys.argv[1:]))
