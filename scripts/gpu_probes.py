"""Two GPU probes for scripts/gpu_check.sh (each also runs on a CPU under the interpreter, for testing).

``memcheck``: NaN-poisoned decode and prefill cases on caches sized *exactly* to the blocks in use
(no spare block, tables exactly as wide as the longest sequence needs, shorter rows padded with -1)
at block sizes that break tile maths, head dims with padded lanes, GQA, split-KV, window and softcap.
Run it under ``compute-sanitizer --tool memcheck`` with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every
tensor its own allocation): any read past a sequence's blocks or a table's used entries is then an
out-of-bounds access the sanitizer reports, and any read of a poisoned slot is NaN in the output.

``graph``: captures one paged_decode step in a CUDA graph (``validate=False`` and ``max_seq_len``:
the launch path that reads nothing back to the host), replays it after writing new queries and new
lengths into the captured tensors, and compares with the dense reference; reports eager and replay
times.

    python scripts/gpu_probes.py memcheck
    python scripts/gpu_probes.py graph
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import pagedkv.kernels as K
from pagedkv.kernels.testing import compare

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def exact_case(lengths, *, block_size, kv_heads, group, head_dim, dtype, q_lens=None, seed=0):
    """Caches of exactly sum(ceil(L / B)) blocks, NaN in every slot past a sequence's end."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = max(1, sum(need))
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(lengths), max(1, max(need))), -1, dtype=torch.int32)
    k = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v = k.clone()
    used = 0
    for i, (n, count) in enumerate(zip(lengths, need)):
        tables[i, :count] = perm[used:used + count].to(torch.int32)
        used += count
        pos = torch.arange(n)
        blocks = tables[i, pos // block_size].long()
        k[blocks, pos % block_size] = torch.randn(n, kv_heads, head_dim, generator=gen)
        v[blocks, pos % block_size] = torch.randn(n, kv_heads, head_dim, generator=gen)
    q_lens = q_lens or [1] * len(lengths)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), kv_heads * group, head_dim, generator=gen)
    to = lambda t: t.to(device=DEVICE, dtype=dtype) if t.is_floating_point() else t.to(DEVICE)  # noqa: E731
    return [to(t) for t in (q, k, v, tables, torch.tensor(lengths, dtype=torch.int32), qsl)]


MEMCHECK_CASES = [
    dict(kind="decode", lengths=[1, 17, 65, 139], block_size=3, kv_heads=1, group=3, head_dim=80),
    dict(kind="decode", lengths=[130, 7], block_size=128, kv_heads=2, group=4, head_dim=128, num_splits=4),
    dict(kind="decode", lengths=[0, 33, 300], block_size=16, kv_heads=1, group=5, head_dim=64, window=20,
         softcap=30.0),
    dict(kind="prefill", lengths=[70, 33, 5], q_lens=[21, 33, 1], block_size=6, kv_heads=2, group=2, head_dim=96),
    dict(kind="prefill", lengths=[90, 12], q_lens=[30, 0], block_size=48, kv_heads=1, group=8, head_dim=64, window=16),
]


def memcheck(dtype) -> int:
    bad = 0
    for i, c in enumerate(MEMCHECK_CASES):
        q, k, v, tables, lens, qsl = exact_case(c["lengths"], block_size=c["block_size"], kv_heads=c["kv_heads"],
                                                group=c["group"], head_dim=c["head_dim"], dtype=dtype,
                                                q_lens=c.get("q_lens"), seed=i)
        options = dict(sliding_window=c.get("window"), softcap=c.get("softcap"))
        cpu = [t.cpu() for t in (q, k, v, tables, lens)]
        if c["kind"] == "decode":
            out = K.paged_decode(q, k, v, tables, lens, num_splits=c.get("num_splits"), **options)
            ref = K.reference_decode(*cpu, **options)
            naive = K.reference_decode(*cpu, compute_dtype=dtype, **options)
        else:
            out = K.paged_prefill(q, k, v, tables, lens, qsl, **options)
            ref = K.reference_prefill(*cpu, qsl.cpu(), **options)
            naive = K.reference_prefill(*cpu, qsl.cpu(), compute_dtype=dtype, **options)
        if ON_GPU:
            torch.cuda.synchronize()
        ok, msg = compare(out.cpu(), ref, naive, dtype)
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} memcheck case {i} {c}: {msg}", flush=True)
    return bad


def graph(dtype) -> int:
    if not ON_GPU:
        print("graph: needs CUDA (capture is a CUDA feature); nothing to do on this machine")
        return 0
    batch, ctx, kv_heads, group, head_dim, block = 8, 1024, 8, 4, 128, 16
    q, k, v, tables, lens, _ = exact_case([ctx] * batch, block_size=block, kv_heads=kv_heads, group=group,
                                          head_dim=head_dim, dtype=dtype)
    step = lambda: K.paged_decode(q, k, v, tables, lens, validate=False, max_seq_len=ctx)  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                   # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        out = step()
    q.copy_(torch.randn_like(q))
    lens.copy_(torch.randint(1, ctx + 1, (batch,), dtype=torch.int32, device=DEVICE))   # new step's lengths
    captured.replay()
    torch.cuda.synchronize()
    cpu = [t.cpu() for t in (q, k, v, tables, lens)]
    ok, msg = compare(out.cpu(), K.reference_decode(*cpu), K.reference_decode(*cpu, compute_dtype=dtype), dtype)
    timings = {}
    for name, fn in (("eager", step), ("graph replay", captured.replay)):
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        timings[name] = (time.perf_counter() - start) / 50 * 1e6
    print(f"{'ok  ' if ok else 'FAIL'} CUDA graph decode step (batch {batch}, ctx {ctx}, lengths changed after "
          f"capture {lens.tolist()}): {msg}; eager {timings['eager']:.1f} us, replay {timings['graph replay']:.1f} us")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("probe", choices=["memcheck", "graph"])
    parser.add_argument("--dtype", default="bfloat16" if ON_GPU else "float32",
                        choices=["float32", "float16", "bfloat16"])
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    return min(1, memcheck(dtype)) if args.probe == "memcheck" else graph(dtype)


if __name__ == "__main__":
    sys.exit(main())
