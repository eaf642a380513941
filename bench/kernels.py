"""Benchmark of the paged-attention kernels against what a user would pick instead (GPU; --smoke on CPU).

Rows (``--grid full``, the default on CUDA):

  * the target row: decode, 32 sequences x 4096 tokens, 32 query / 8 KV heads, head dim 128, block 16,
    bf16 (issue 17: >= 85% of the measured copy bandwidth on an H200);
  * decode, one factor at a time around it: batch 1..256, context 512..32k, block size 1..128,
    GQA group 1..8;
  * prefill (one full prompt, chunks over a cached prefix) and mixed batches (decode rows with
    prefill chunks in one ``paged_prefill`` call).

For each row: median time (``triton.testing.do_bench``), achieved bandwidth (K/V bytes the row must
read + q + out) and its fraction of the device's measured copy bandwidth (a large device-to-device
copy, counting bytes read and written), TFLOP/s (prefill and mixed: 4 * visible (query, key) pairs
* Hq * D), and the ratio of our time to

  * ``sdpa``: torch.nn.functional.scaled_dot_product_attention over a contiguous [B, H, L, D] copy of the
    same K/V (GQA via ``enable_gqa`` when torch has it, else expanded outside the timed region);
  * ``flex``: torch's FlexAttention (compiled) over the *paged* cache itself, the pool seen as one
    long KV sequence and a block mask that admits each query's own slots, when torch has it.

A ratio < 1 means the paged kernel is faster. ``--smoke`` runs two tiny rows anywhere (on a CPU under
Triton's interpreter, timings are interpreter timings: they prove the script runs, nothing more).

    python bench/kernels.py --json bench.json            # full grid, CUDA
    python bench/kernels.py --grid quick --json b.json   # the target row and a few others
    python bench/kernels.py --smoke                      # tiny, anywhere
"""

from __future__ import annotations

import argparse
import datetime as _dt
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
TARGET_FRACTION = 0.85


def bench_ms(fn, on_gpu: bool, reps: int = 3) -> float:
    if on_gpu:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbps(device, on_gpu: bool) -> float:
    """Device copy bandwidth, bytes read + written per second (GB/s)."""
    nbytes = (2 << 30) if on_gpu else (32 << 20)
    x = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x), on_gpu)
    return 2 * nbytes / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------ the data of one row

def build(cfg, device, gen):
    """A paged cache with shuffled blocks, the same K/V contiguous for SDPA, and the queries.
    Sequence i has ctx tokens and its last q_len (decode: 1; mixed: per row) are queries."""
    dtype = DTYPES[cfg["dtype"]]
    batch, ctx, hq, hkv, d, block = (cfg[k] for k in ("batch", "ctx", "hq", "hkv", "d", "block"))
    q_lens = cfg.get("q_lens") or [cfg.get("q_len", 1)] * batch
    nblk = -(-ctx // block)
    perm = torch.randperm(batch * nblk, generator=gen).to(device)
    tables = perm.view(batch, nblk).to(torch.int32)
    k_dense = torch.randn(batch, hkv, ctx, d, generator=gen).to(dtype=dtype, device=device)
    v_dense = torch.randn(batch, hkv, ctx, d, generator=gen).to(dtype=dtype, device=device)
    k_cache = torch.zeros(batch * nblk, block, hkv, d, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    pos = torch.arange(ctx, device=device)
    for i in range(batch):
        blocks = tables[i, pos // block].long()
        k_cache[blocks, pos % block] = k_dense[i].transpose(0, 1)
        v_cache[blocks, pos % block] = v_dense[i].transpose(0, 1)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype=dtype, device=device)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, tables=tables, seq_lens=seq_lens, qsl=qsl, q_lens=q_lens,
                k_dense=k_dense, v_dense=v_dense)


def visible_pairs(ctx: int, q_lens) -> int:
    """(query, key) pairs causal attention computes: query t of n sees ctx - n + t + 1 keys."""
    return sum(n * (ctx - n) + n * (n + 1) // 2 for n in q_lens)


# ------------------------------------------------------------------ what a user would pick instead

def sdpa_fn(data, cfg):
    """SDPA over the contiguous copy: one call per distinct q_len group (decode rows, each chunk size)."""
    F = torch.nn.functional.scaled_dot_product_attention
    hq, hkv, ctx = cfg["hq"], cfg["hkv"], cfg["ctx"]
    k, v = data["k_dense"], data["v_dense"]
    try:
        F(data["q"][:1].view(1, 1, hq, -1).transpose(1, 2), k[:1], v[:1], enable_gqa=True)
        gqa = {"enable_gqa": True}
    except (TypeError, RuntimeError):
        k, v, gqa = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1), {}
    calls, start = [], 0
    by_len = {}
    for i, n in enumerate(data["q_lens"]):
        by_len.setdefault(n, []).append((i, start))
        start += n
    for n, rows in by_len.items():
        idx = torch.tensor([i for i, _ in rows], device=k.device)
        q = torch.stack([data["q"][s:s + n] for _, s in rows]).transpose(1, 2).contiguous()
        kk, vv = k.index_select(0, idx), v.index_select(0, idx)
        if n == 1:
            calls.append(lambda q=q, kk=kk, vv=vv: F(q, kk, vv, **gqa))
        elif n == ctx:
            calls.append(lambda q=q, kk=kk, vv=vv: F(q, kk, vv, is_causal=True, **gqa))
        else:
            mask = torch.arange(ctx, device=k.device)[None, :] <= torch.arange(ctx - n, ctx, device=k.device)[:, None]
            calls.append(lambda q=q, kk=kk, vv=vv, mask=mask: F(q, kk, vv, attn_mask=mask, **gqa))
    return lambda: [call() for call in calls]


def flex_fn(data, cfg, on_gpu: bool):
    """FlexAttention over the paged pool seen as one KV sequence of N * B slots, with a block mask
    admitting query row r the slots of its own sequence at positions <= its own. None if unavailable."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None, "torch has no FlexAttention"
    device = data["q"].device
    block, ctx = cfg["block"], cfg["ctx"]
    num_blocks = data["k_cache"].shape[0]
    owner = torch.empty(num_blocks, dtype=torch.int64, device=device)
    logical = torch.empty(num_blocks, dtype=torch.int64, device=device)
    rows = torch.arange(data["tables"].shape[1], device=device)
    for i, table in enumerate(data["tables"].long()):
        owner[table] = i
        logical[table] = rows
    q_seq = torch.repeat_interleave(torch.arange(cfg["batch"], device=device),
                                    torch.tensor(data["q_lens"], device=device))
    q_pos = torch.cat([torch.arange(ctx - n, ctx, device=device) for n in data["q_lens"]])

    def mask_mod(b, h, q_idx, kv_idx):
        physical = kv_idx // block
        return (owner[physical] == q_seq[q_idx]) & (logical[physical] * block + kv_idx % block <= q_pos[q_idx])

    total_q, slots = data["q"].shape[0], num_blocks * block
    try:
        mask = create_block_mask(mask_mod, 1, 1, total_q, slots, device=device)
        q = data["q"].transpose(0, 1).unsqueeze(0)
        k = data["k_cache"].flatten(0, 1).transpose(0, 1).unsqueeze(0)
        v = data["v_cache"].flatten(0, 1).transpose(0, 1).unsqueeze(0)
        run = torch.compile(flex_attention) if on_gpu else flex_attention
        call = lambda: run(q, k, v, block_mask=mask, enable_gqa=cfg["hq"] != cfg["hkv"])  # noqa: E731
        call()
        return call, "paged block mask"
    except Exception as error:  # FlexAttention's limits differ across torch versions: record why
        return None, f"unavailable: {type(error).__name__}: {str(error).splitlines()[0][:120]}"


# ------------------------------------------------------------------ one row

def run_row(cfg, device, on_gpu: bool, copy_bw: float, gen) -> dict:
    data = build(cfg, device, gen)
    q, kc, vc, tables, lens, qsl = (data[k] for k in ("q", "k_cache", "v_cache", "tables", "seq_lens", "qsl"))
    if cfg["kind"] == "decode":
        ours = lambda: K.paged_decode(q, kc, vc, tables, lens, validate=False)  # noqa: E731
    else:
        ours = lambda: K.paged_prefill(q, kc, vc, tables, lens, qsl, validate=False)  # noqa: E731
    ms = bench_ms(ours, on_gpu)
    sdpa_ms = bench_ms(sdpa_fn(data, cfg), on_gpu)
    elt = q.element_size()
    io_bytes = 2 * cfg["batch"] * cfg["ctx"] * cfg["hkv"] * cfg["d"] * elt + 2 * q.numel() * elt
    gbps = io_bytes / (ms * 1e-3) / 1e9
    sig = lambda x: float(f"{x:.4g}")  # noqa: E731
    row = dict(cfg, ms=sig(ms), sdpa_ms=sig(sdpa_ms), gbps=sig(gbps), frac_copy_bw=sig(gbps / copy_bw),
               ratio_to_sdpa=sig(ms / sdpa_ms))
    row.pop("q_lens", None)
    if cfg["kind"] != "decode":
        pairs = visible_pairs(cfg["ctx"], data["q_lens"])
        row["tflops"] = sig(4 * pairs * cfg["hq"] * cfg["d"] / (ms * 1e-3) / 1e12)
    if all(cfg.get(k) == v for k, v in TARGET.items()):
        met = gbps / copy_bw >= TARGET_FRACTION
        row["target"] = f">= {TARGET_FRACTION:g} of copy bandwidth: {'MET' if met else 'NOT MET'}"
    return row


def add_flex(row: dict, cfg, device, on_gpu: bool, gen) -> None:
    """FlexAttention's time for a measured row (compiling it takes tens of seconds per shape, so these
    run after every other row)."""
    data = build(cfg, device, gen)
    flex, how = flex_fn(data, cfg, on_gpu)
    row["flex"] = how
    if flex is not None:
        flex_ms = bench_ms(flex, on_gpu)
        row.update(flex_ms=float(f"{flex_ms:.4g}"), ratio_to_flex=float(f"{row['ms'] / flex_ms:.4g}"))


def grid(name: str, on_gpu: bool) -> list[dict]:
    if name == "smoke":
        dtype = "float16" if on_gpu else "float32"
        return [dict(kind="decode", batch=2, ctx=40, hq=4, hkv=2, d=32, block=16, dtype=dtype, flex=True),
                dict(kind="prefill", batch=1, ctx=48, q_len=16, hq=4, hkv=2, d=32, block=8, dtype=dtype),
                dict(kind="mixed", batch=2, ctx=32, q_lens=[1, 8], hq=4, hkv=2, d=32, block=8, dtype=dtype)]
    rows = [dict(TARGET, flex=True)]
    around = lambda **change: dict(TARGET, **change)  # noqa: E731
    batches, ctxs = [1, 8, 64, 128, 256], [512, 1024, 16384, 32768]
    blocks, groups = [1, 8, 32, 64, 128], [(8, 8), (16, 8), (64, 8)]
    if name == "quick":
        batches, ctxs, blocks, groups = [8, 128], [32768], [1, 128], [(8, 8)]
    rows += [around(batch=b) for b in batches] + [around(ctx=c) for c in ctxs]
    rows += [around(block=b) for b in blocks] + [around(hq=hq, hkv=hkv) for hq, hkv in groups]
    prefill = dict(TARGET, kind="prefill", flex=True)
    rows += [dict(prefill, batch=1, ctx=4096, q_len=4096), dict(prefill, batch=4, ctx=2048, q_len=2048, flex=False),
             dict(prefill, batch=8, ctx=4096, q_len=512, flex=False)]
    rows += [dict(TARGET, kind="mixed", batch=32, ctx=4096, q_lens=[1] * 28 + [512] * 4)]
    return rows[:1] + rows[1:6] + rows[-4:] if name == "quick" else rows


def print_table(results, dev_name, copy_bw, on_gpu):
    print(f"device: {dev_name}   measured copy bandwidth: {copy_bw:.1f} GB/s (read + write)")
    if not on_gpu:
        print("NOTE: CPU interpreter timings; they prove the script runs and are NOT GPU results.")
    cols = ["kind", "dtype", "batch", "ctx", "q_len", "hq", "hkv", "d", "block", "ms", "gbps", "frac_copy_bw",
            "tflops", "sdpa_ms", "ratio_to_sdpa", "flex_ms", "ratio_to_flex", "target"]
    print(" ".join(f"{c:>12}" for c in cols))
    for r in results:
        extra = f"  {r['error']}" if "error" in r else (f"  flex: {r['flex']}" if r.get("flex", "").startswith("un")
                                                         else "")
        print(" ".join(f"{str(r.get(c, '')):>12}" for c in cols) + extra)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", choices=["full", "quick"], default="full")
    parser.add_argument("--smoke", action="store_true", help="three tiny rows; runs on CPU under the interpreter")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        print("bench/kernels.py needs a CUDA device (use --smoke to check the script on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if on_gpu else "cpu")
    dev_name = (torch.cuda.get_device_name(device) if on_gpu
                else f"cpu ({platform.processor() or 'unknown'}), Triton interpreter")
    gen = torch.Generator().manual_seed(0)
    copy_bw = copy_bandwidth_gbps(device, on_gpu)
    results = []
    record = dict(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), device=dev_name,
                  gpu_result=on_gpu, command=" ".join([os.path.basename(sys.executable), *sys.argv]),
                  torch=torch.__version__, triton=__import__("triton").__version__,
                  copy_bandwidth_gbps=round(copy_bw, 1), results=results)
    rows = grid("smoke" if args.smoke else args.grid, on_gpu)
    plain = [{k: v for k, v in cfg.items() if k != "flex"} for cfg in rows]
    steps = [(i, False) for i in range(len(rows))] + [(i, True) for i, cfg in enumerate(rows) if cfg.get("flex")]
    for i, flex in steps:
        try:
            if not flex:
                results.append(run_row(plain[i], device, on_gpu, copy_bw, gen))
            elif "error" not in results[i]:
                add_flex(results[i], plain[i], device, on_gpu, gen)
        except torch.cuda.OutOfMemoryError:
            if flex:
                results[i]["flex"] = "out of memory"
            else:
                results.append(dict(plain[i], error="out of memory"))
        if on_gpu:
            torch.cuda.empty_cache()
        if args.json:  # after every step: a run cut short by a time limit still leaves its rows
            with open(args.json, "w") as out:
                json.dump(record, out, indent=2)
    print_table(results, dev_name, copy_bw, on_gpu)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
