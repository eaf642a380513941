"""One canonical batch through one kernel under test, compared row by row with dense attention.

``run_batch`` calls the kernel (``decode`` or ``prefill`` with the batch's options), computes the
float32 dense reference and the naive low-precision one over each sequence's own K/V history, and
applies pagedkv's FlashAttention-style tolerance (``pagedkv.kernels.testing.compare``: max error at
most RTOL_FACTOR x the naive computation's error + ATOL[dtype]) to the whole output. A failure
names, for every sequence whose rows are wrong: its index, length, number of queries, the block ids
it reads, the block size, the kernel's key-tile width (if it declares one), its max error and the
query positions and heads where NaN/inf appeared. A kernel that writes into any of its inputs fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedkv.kernels import dense_attention
from pagedkv.kernels.testing import ATOL, RTOL_FACTOR

from .protocol import LoadedKernel


@dataclass
class Batch:
    """A canonical paged batch (protocol layout) and what the dense reference needs to judge it."""

    kind: str                          # "decode" or "prefill"
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    num_queries: list[int]
    histories: list                    # per sequence (K, V), each [L, Hkv, D]: what it must attend to
    blocks_read: list[list[int]]       # per sequence, the block ids its tokens live in
    scale: float
    causal: bool = True
    sliding_window: int | None = None
    softcap: float | None = None
    num_splits: int | None = None

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


@dataclass
class Outcome:
    status: str                        # "passed", "skipped" or "failed"
    detail: str
    rows: list[str] = field(default_factory=list)   # one line per wrong sequence

    @property
    def ok(self) -> bool:
        return self.status != "failed"


def call_kernel(loaded: LoadedKernel, batch: Batch) -> torch.Tensor:
    kernel = loaded.kernel
    options = dict(scale=batch.scale, sliding_window=batch.sliding_window, softcap=batch.softcap)
    if batch.kind == "decode":
        if batch.num_splits is not None:
            options["num_splits"] = batch.num_splits
        return kernel.decode(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, **options)
    return kernel.prefill(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                          batch.query_start_loc, causal=batch.causal, **options)


def references(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 dense reference, the same computed naively in the batch's dtype), [T, Hq, D]."""
    ref = torch.zeros(batch.q.shape, dtype=torch.float32, device=batch.q.device)
    naive = ref.clone()
    start = 0
    for n, (k, v) in zip(batch.num_queries, batch.histories):
        rows = slice(start, start + n)
        positions = torch.arange(len(k) - n, len(k), device=batch.q.device)
        options = dict(scale=batch.scale, causal=batch.causal, sliding_window=batch.sliding_window,
                       softcap=batch.softcap)
        ref[rows] = dense_attention(batch.q[rows], k, v, positions, **options)
        naive[rows] = dense_attention(batch.q[rows], k, v, positions, compute_dtype=batch.q.dtype, **options)
        start += n
    return ref, naive


def _inputs(batch: Batch) -> dict:
    return {"q": batch.q, "k_cache": batch.k_cache, "v_cache": batch.v_cache, "block_tables": batch.block_tables,
            "seq_lens": batch.seq_lens, "query_start_loc": batch.query_start_loc}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality, NaN included (a NaN-poisoned cache never equals itself under ==)."""
    if a.is_floating_point():
        as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(as_int), b.view(as_int))
    return torch.equal(a, b)


def run_batch(loaded: LoadedKernel, batch: Batch) -> Outcome:
    """Run the kernel on the batch and judge its output: a crash, a wrong shape or a write into any of
    its inputs is a failure too (the reference is computed first, from untouched inputs)."""
    ref, naive = references(batch)
    before = {name: tensor.clone() for name, tensor in _inputs(batch).items()}
    try:
        out = call_kernel(loaded, batch)
    except Exception as error:  # the kernel under test crashed on a case it declared: a finding
        return Outcome("failed", f"{batch.kind} raised {type(error).__name__}: {error}")
    written = [name for name, tensor in _inputs(batch).items() if not _same_bits(tensor, before[name])]
    if written:
        return Outcome("failed", f"{batch.kind} wrote into its input(s) {', '.join(written)}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(batch.q.shape):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return Outcome("failed", f"{batch.kind} returned {shape}, expected {tuple(batch.q.shape)}")
    return judge(out.detach().float().to(ref.device), ref, naive, batch, loaded.declared.tile_for(batch.q.shape[2]))


def judge(out: torch.Tensor, ref: torch.Tensor, naive: torch.Tensor, batch: Batch, tile: int | None) -> Outcome:
    """The tolerance rule over the whole output; the wrong sequences, each in one line."""
    base = (naive - ref).abs().max().item() if ref.numel() else 0.0
    bound = RTOL_FACTOR * base + ATOL[batch.q.dtype]
    finite = torch.isfinite(out)
    err = torch.where(finite, (out - ref).abs(), torch.zeros_like(out))
    rows, start, worst = [], 0, 0.0
    for i, n in enumerate(batch.num_queries):
        part = slice(start, start + n)
        start += n
        row_err = err[part].max().item() if n else 0.0
        worst = max(worst, row_err)
        bad = ~finite[part]
        if row_err > bound or bool(bad.any()):
            rows.append(_row_report(batch, i, n, row_err, bound, bad, tile))
    summary = f"max err {worst:.3g} <= {RTOL_FACTOR:g} x naive {base:.3g} + {ATOL[batch.q.dtype]:g} = {bound:.3g}"
    if not rows:
        return Outcome("passed", summary)
    return Outcome("failed", f"{len(rows)} of {len(batch.num_queries)} sequences wrong: " + "; ".join(rows[:4]), rows)


def _row_report(batch: Batch, i: int, n: int, row_err: float, bound: float, bad: torch.Tensor, tile) -> str:
    length = int(batch.seq_lens[i])
    blocks = batch.blocks_read[i]
    shown = blocks if len(blocks) <= 12 else [*blocks[:12], "..."]
    where = (f"sequence {i} (length {length}, {n} quer{'y' if n == 1 else 'ies'}, blocks {shown} of "
             f"{batch.block_size} slots, key tile {tile if tile is not None else 'undeclared'})")
    what = [f"max err {row_err:.3g} > bound {bound:.3g}"] if row_err > bound else []
    if bool(bad.any()):
        tokens, heads = bad.any(dim=2).nonzero(as_tuple=True)
        positions = sorted({length - n + t for t in tokens.tolist()})
        what.append(f"NaN/inf at query positions {positions[:8]}{'...' if len(positions) > 8 else ''}, "
                    f"heads {sorted(set(heads.tolist()))[:8]}")
    return f"{where}: {', '.join(what)}"
