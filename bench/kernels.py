"""Benchmark of the paged-attention kernels (GPU).

For decode and prefill over a grid of batch sizes, context lengths, head configurations and block
sizes, reports

  * time per call (median, triton.testing.do_bench on CUDA),
  * achieved bandwidth = bytes of K/V read (+ q and out) / time, and that as a fraction of the
    device's measured copy bandwidth (a torch copy of a large tensor: 2 x bytes / time),
  * the ratio of our time to dense SDPA (torch.nn.functional.scaled_dot_product_attention) on a
    contiguous cache holding the same data (ratio < 1: the paged kernel is faster).

Target (issue 5): decode, 32 sequences x 4096 tokens, 8 KV heads, head size 128, bf16 on an H200
reaches >= 85% of the measured copy bandwidth; the table marks that row.

    python bench/kernels.py                      # full grid, needs CUDA
    python bench/kernels.py --quick --json r.json
    python bench/kernels.py --smoke              # tiny shapes; runs anywhere (CPU: Triton interpreter)

Numbers from ``--smoke`` on a CPU are interpreter timings that only prove the script runs; they are
labelled as such and are not GPU results. vLLM / FlashInfer comparisons are not implemented; the
script only records whether those packages are importable.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pagedkv.kernels as K  # noqa: E402

TARGET = dict(kind="decode", batch=32, ctx=4096, hq=32, hkv=8, d=128, block=16, dtype="bfloat16")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def bench_ms(fn, on_gpu: bool, reps: int) -> float:
    if on_gpu:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbps(device, on_gpu: bool) -> float:
    nbytes = (1 << 30) if on_gpu else (64 << 20)
    x = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x), on_gpu, reps=5)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def build(batch, ctx, q_len, hq, hkv, d, block, dtype, device, gen):
    """A paged cache with shuffled blocks and the same K/V laid out contiguously for SDPA."""
    nblk = -(-ctx // block)
    num_blocks = batch * nblk
    k_dense = torch.randn(batch, hkv, ctx, d, generator=gen).to(dtype=dtype, device=device)
    v_dense = torch.randn(batch, hkv, ctx, d, generator=gen).to(dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, generator=gen).to(device)
    tables = perm.view(batch, nblk).to(torch.int32)
    k_cache = torch.zeros(num_blocks, block, hkv, d, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    pos = torch.arange(ctx, device=device)
    for i in range(batch):
        blocks = tables[i, pos // block].long()
        k_cache[blocks, pos % block] = k_dense[i].transpose(0, 1)
        v_cache[blocks, pos % block] = v_dense[i].transpose(0, 1)
    q = torch.randn(batch * q_len, hq, d, generator=gen).to(dtype=dtype, device=device)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    qsl = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, seq_lens, qsl, k_dense, v_dense


def sdpa_fn(q, k_dense, v_dense, batch, q_len, ctx, hq, hkv):
    qd = q.view(batch, q_len, hq, -1).transpose(1, 2)
    if hq != hkv:  # expand once, outside the timed region, so SDPA sees a dense contiguous cache
        k_dense = k_dense.repeat_interleave(hq // hkv, dim=1)
        v_dense = v_dense.repeat_interleave(hq // hkv, dim=1)
    F = torch.nn.functional.scaled_dot_product_attention
    if q_len == 1:
        return lambda: F(qd, k_dense, v_dense)
    if q_len == ctx:
        return lambda: F(qd, k_dense, v_dense, is_causal=True)
    mask = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
    return lambda: F(qd, k_dense, v_dense, attn_mask=mask)


def run_one(cfg, device, on_gpu, copy_bw, reps, gen):
    dtype = DTYPES[cfg["dtype"]]
    batch, ctx, hq, hkv, d, block = (cfg[k] for k in ("batch", "ctx", "hq", "hkv", "d", "block"))
    q_len = 1 if cfg["kind"] == "decode" else cfg["q_len"]
    q, kc, vc, tables, seq_lens, qsl, kd, vd = build(batch, ctx, q_len, hq, hkv, d, block, dtype, device, gen)
    if cfg["kind"] == "decode":
        fn = lambda: K.paged_decode(q, kc, vc, tables, seq_lens, validate=False)  # noqa: E731
    else:
        fn = lambda: K.paged_prefill(q, kc, vc, tables, seq_lens, qsl, validate=False)  # noqa: E731
    ms = bench_ms(fn, on_gpu, reps)
    sdpa_ms = bench_ms(sdpa_fn(q, kd, vd, batch, q_len, ctx, hq, hkv), on_gpu, reps)
    elt = torch.tensor([], dtype=dtype).element_size()
    kv_bytes = 2 * batch * ctx * hkv * d * elt
    io_bytes = kv_bytes + 2 * q.numel() * elt
    gbps = io_bytes / (ms * 1e-3) / 1e9
    sig = lambda x: float(f"{x:.4g}")  # noqa: E731
    row = dict(cfg, q_len=q_len, ms=sig(ms), sdpa_ms=sig(sdpa_ms), gbps=sig(gbps),
               frac_copy_bw=sig(gbps / copy_bw), ratio_to_sdpa=sig(ms / sdpa_ms))
    is_target = all(cfg.get(k) == v for k, v in TARGET.items())
    if is_target:
        row["target"] = ">=0.85 of copy bandwidth: " + ("MET" if gbps / copy_bw >= 0.85 else "NOT MET")
    del q, kc, vc, kd, vd
    return row


def grid(args, on_gpu):
    if args.smoke:
        dtype = "float16" if on_gpu else "float32"
        return [dict(kind="decode", batch=2, ctx=64, hq=4, hkv=2, d=64, block=16, dtype=dtype),
                dict(kind="prefill", batch=1, ctx=48, q_len=16, hq=4, hkv=2, d=64, block=8, dtype=dtype)]
    dtypes = [args.dtype]
    rows = [dict(TARGET)]
    batches = [1, 8, 32, 128] if not args.quick else [1, 32]
    ctxs = [1024, 4096, 16384] if not args.quick else [4096]
    heads = [(32, 8, 128), (64, 8, 128), (32, 32, 128), (16, 2, 256)] if not args.quick else [(32, 8, 128)]
    blocks = [16, 32] if not args.quick else [16]
    for dt in dtypes:
        for b in batches:
            for ctx in ctxs:
                if b * ctx > 32 * 16384:
                    continue
                for hq, hkv, d in heads:
                    for blk in blocks:
                        rows.append(dict(kind="decode", batch=b, ctx=ctx, hq=hq, hkv=hkv, d=d, block=blk, dtype=dt))
        for b, ctx, q_len in ([(1, 4096, 4096), (4, 2048, 2048), (8, 4096, 512)] if not args.quick else [(4, 2048, 2048)]):
            rows.append(dict(kind="prefill", batch=b, ctx=ctx, q_len=q_len, hq=32, hkv=8, d=128, block=16, dtype=dt))
    seen, out = set(), []
    for r in rows:
        key = tuple(sorted(r.items()))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU under the interpreter")
    p.add_argument("--quick", action="store_true", help="a small GPU grid")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        print("bench/kernels.py needs a CUDA device (use --smoke to check the script on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if on_gpu else "cpu")
    dev_name = torch.cuda.get_device_name(device) if on_gpu else f"cpu ({platform.processor() or 'unknown'}), Triton interpreter"
    gen = torch.Generator().manual_seed(0)
    copy_bw = copy_bandwidth_gbps(device, on_gpu)
    results = []
    for cfg in grid(args, on_gpu):
        try:
            results.append(run_one(cfg, device, on_gpu, copy_bw, reps=3 if on_gpu else 2, gen=gen))
        except torch.cuda.OutOfMemoryError:
            results.append(dict(cfg, error="out of memory"))
        if on_gpu:
            torch.cuda.empty_cache()

    print(f"device: {dev_name}   measured copy bandwidth: {copy_bw:.1f} GB/s")
    if not on_gpu:
        print("NOTE: CPU interpreter timings; they prove the script runs and are NOT GPU results.")
    cols = ["kind", "dtype", "batch", "ctx", "q_len", "hq", "hkv", "d", "block", "ms", "sdpa_ms", "gbps",
            "frac_copy_bw", "ratio_to_sdpa", "target"]
    print(" ".join(f"{c:>13}" for c in cols))
    for r in results:
        print(" ".join(f"{str(r.get(c, '')):>13}" for c in cols) + (f"  {r['error']}" if "error" in r else ""))

    record = dict(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=dev_name,
        gpu_result=on_gpu,
        command=" ".join([os.path.basename(sys.executable), *sys.argv]),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        copy_bandwidth_gbps=round(copy_bw, 1),
        others={name: ("installed; comparison not implemented" if importlib.util.find_spec(name) else "not installed")
                for name in ("vllm", "flashinfer")},
        results=results,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
