"""Kernel cases taken from real allocation histories: their K/V, their file format, their replay.

A *case* is one batch as the kernels saw it in the kernel state machine (`kernel_machine`): the
pool geometry, the head configuration, each sequence's tokens, block table and number of queries,
and which content every slot of the blocks it reads held (dropped copies and stale slots included).
K/V is never stored. The K and V of a position are a function of the K/V seed and the position's
*content key*, a chained hash of the token and every token before it, so two sequences with the
same prefix get the same K/V (prefix-cache hits are legitimate) and a slot holding the wrong
content is caught. Queries come from their own seed.

A corpus file is JSON lines. The first line is the header, ``{"format": 1, "dtypes": [...], ...}``;
every other line is a case:

    {"id": str, "kernel": "decode" | "prefill", "block_size": B, "num_blocks": N,
     "heads": {"num_kv_heads": H, "group": G, "head_dim": D}, "kv_seed": int, "query_seed": int,
     "seqs": [{"tokens": [int], "table": [block], "queries": int}],
     "blocks": [[block, [content key or null for each of the B slots]]]}

A sequence's length is its number of tokens and its queries are its last ``queries`` positions
(decode: exactly 1). ``replay_case`` rebuilds the cache (NaN where a slot held nothing), checks that
each sequence reads back its own K/V through its table (decode attention is blind to a permutation of
whole blocks), runs the kernel on the device at hand and compares with dense attention over it.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from dataclasses import asdict, dataclass

import torch

from pagedkv.kernels import dense_attention, gather_kv, paged_decode, paged_prefill, write_kv
from pagedkv.kernels.testing import compare

FORMAT = 1
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KERNELS = ("decode", "prefill")
FAILURES_ENV = "PAGEDKV_KERNEL_FAILURES"
FAILURE_DTYPES = ("float32", "bfloat16")
REPLAY_MODULE = "test_kernel_replay.py"
_MASK63 = (1 << 63) - 1


class CorpusFormatError(ValueError):
    """A corpus file this version of pagedkv cannot read."""


@dataclass(frozen=True)
class Heads:
    num_kv_heads: int
    group: int
    head_dim: int

    @property
    def num_q_heads(self) -> int:
        return self.num_kv_heads * self.group


# ------------------------------------------------------------------ deterministic content

def prefix_keys(tokens) -> list[int]:
    """The content key of every position: a 56-bit chained hash of its token and all before it."""
    keys, key = [], 0
    for token in tokens:
        key = int.from_bytes(hashlib.blake2b(f"{key}:{token}".encode(), digest_size=7).digest(), "little")
        keys.append(key)
    return keys


def kv_values(kv_seed: int, keys, heads: Heads) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V, float32 [len(keys), Hkv, D] on the CPU, each row a function of (kv_seed, key) alone."""
    out = torch.empty(len(keys), 2, heads.num_kv_heads, heads.head_dim)
    for i, key in enumerate(keys):
        generator = torch.Generator().manual_seed((kv_seed * 0x9E3779B97F4A7C15 ^ key) & _MASK63)
        out[i] = torch.randn(2, heads.num_kv_heads, heads.head_dim, generator=generator)
    return out[:, 0], out[:, 1]


def queries(query_seed: int, num_tokens: int, heads: Heads) -> torch.Tensor:
    """Float32 [num_tokens, Hq, D] queries drawn from `query_seed`."""
    generator = torch.Generator().manual_seed(query_seed & _MASK63)
    return torch.randn(num_tokens, heads.num_q_heads, heads.head_dim, generator=generator)


# ------------------------------------------------------------------ the comparisons

def read_back_problem(k_cache, v_cache, block_tables, seq_lens, histories) -> str | None:
    """What each sequence reads through its table, compared bit for bit with its own (K, V)
    history; None if all agree. Decode attention cannot see a permutation of whole blocks, this can."""
    num_blocks, block_size = k_cache.shape[:2]
    for i, (table, length, (k, v)) in enumerate(zip(block_tables.cpu(), seq_lens.tolist(), histories)):
        used = table[:-(-length // block_size)]
        if len(used) * block_size < length or ((used < 0) | (used >= num_blocks)).any():
            return f"sequence {i} of length {length} has block table {table.tolist()}"
        got_k, got_v = gather_kv(k_cache, v_cache, used.to(k_cache.device), length)
        if not (torch.equal(got_k, k) and torch.equal(got_v, v)):
            bad = ((got_k != k) | (got_v != v)).flatten(1).any(1).nonzero().flatten().tolist()
            return f"sequence {i} reads wrong K/V at positions {bad} through table {used.tolist()}"
    return None


def check_attention(kernel: str, q, k_cache, v_cache, block_tables, seq_lens, num_queries: list[int],
                    histories: list) -> tuple[bool, str]:
    """Run `kernel` on the paged cache and compare with dense attention over each sequence's own
    (K, V) history (tensors in the cache's dtype and device). Returns (ok, summary)."""
    if kernel == "decode":
        out = paged_decode(q, k_cache, v_cache, block_tables, seq_lens)
    else:
        starts = torch.tensor([0, *num_queries], dtype=torch.int64).cumsum(0)
        out = paged_prefill(q, k_cache, v_cache, block_tables, seq_lens,
                            starts.to(torch.int32).to(q.device))
    ref = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    naive = ref.clone()
    scale = q.shape[2] ** -0.5
    start = 0
    for n, (k, v) in zip(num_queries, histories):
        rows = slice(start, start + n)
        positions = torch.arange(len(k) - n, len(k), device=q.device)
        ref[rows] = dense_attention(q[rows], k, v, positions, scale=scale)
        naive[rows] = dense_attention(q[rows], k, v, positions, scale=scale, compute_dtype=q.dtype)
        start += n
    return compare(out, ref, naive, q.dtype)


# ------------------------------------------------------------------ cases

def make_case(*, kernel: str, block_size: int, num_blocks: int, heads: Heads, kv_seed: int,
              query_seed: int, seqs: list[dict], blocks: dict) -> dict:
    """A case dict; `seqs` items are {"tokens", "table", "queries"}, `blocks` maps each block the
    tables name to the content key of each slot (None: nothing written)."""
    return {
        "kernel": kernel, "block_size": block_size, "num_blocks": num_blocks, "heads": asdict(heads),
        "kv_seed": kv_seed, "query_seed": query_seed, "seqs": seqs,
        "blocks": [[block, keys] for block, keys in sorted(blocks.items())],
    }


def case_id(case: dict) -> str:
    """A short id that names the case's content."""
    body = json.dumps({k: v for k, v in case.items() if k != "id"}, sort_keys=True)
    return f"{case['kernel']}-{hashlib.blake2b(body.encode(), digest_size=6).hexdigest()}"


def replay_case(case: dict, device, dtype: torch.dtype) -> tuple[bool, str]:
    """Rebuild the case's cache on `device` in `dtype`, run its kernel, compare with dense attention."""
    heads = Heads(**case["heads"])
    block_size = case["block_size"]
    shape = (case["num_blocks"], block_size, heads.num_kv_heads, heads.head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = k_cache.clone()
    slots, keys = [], []
    for block, slot_keys in case["blocks"]:
        for offset, key in enumerate(slot_keys):
            if key is not None:
                slots.append(block * block_size + offset)
                keys.append(key)
    k, v = kv_values(case["kv_seed"], keys, heads)
    write_kv(k.to(dtype=dtype, device=device), v.to(dtype=dtype, device=device), k_cache, v_cache,
             torch.tensor(slots, dtype=torch.int64, device=device))

    seqs = case["seqs"]
    width = max([1, *(len(s["table"]) for s in seqs)])
    tables = torch.full((len(seqs), width), -1, dtype=torch.int32)
    for row, seq in zip(tables, seqs):
        row[:len(seq["table"])] = torch.tensor(seq["table"], dtype=torch.int32)
    num_queries = [s["queries"] for s in seqs]
    q = queries(case["query_seed"], sum(num_queries), heads).to(dtype=dtype, device=device)
    histories = [tuple(t.to(dtype=dtype, device=device) for t in kv_values(case["kv_seed"], prefix_keys(s["tokens"]), heads))
                 for s in seqs]
    lens = torch.tensor([len(s["tokens"]) for s in seqs], dtype=torch.int32, device=device)
    tables = tables.to(device)
    problem = read_back_problem(k_cache, v_cache, tables, lens, histories)
    if problem is not None:
        return False, problem
    return check_attention(case["kernel"], q, k_cache, v_cache, tables, lens, num_queries, histories)


# ------------------------------------------------------------------ files

def write_corpus(path, cases: list[dict], *, dtypes, **meta) -> None:
    """Write a corpus file: the header (format, dtypes to replay in, `meta`), then one case a line."""
    unknown = set(dtypes) - set(DTYPES)
    if unknown:
        raise ValueError(f"unknown dtype(s) {sorted(unknown)}; choose from {list(DTYPES)}")
    with open(path, "w") as out:
        out.write(json.dumps({"format": FORMAT, "dtypes": list(dtypes), **meta}) + "\n")
        for case in cases:
            out.write(json.dumps({"id": case_id(case), **case}, separators=(",", ":")) + "\n")


def read_corpus(path) -> tuple[dict, list[dict]]:
    """(header, cases) of a corpus file; CorpusFormatError unless it is a format this code reads."""
    lines = pathlib.Path(path).read_text().splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or "format" not in header:
        raise CorpusFormatError(f"{path}: not a pagedkv kernel corpus (its first line is no header with a 'format')")
    if header["format"] != FORMAT:
        raise CorpusFormatError(f"{path}: corpus format {header['format']!r} is not supported; this pagedkv "
                                f"reads format {FORMAT}. Regenerate it with `pagedkv gen-kernel-tests`.")
    unknown = set(header.get("dtypes", [])) - set(DTYPES)
    if unknown:
        raise CorpusFormatError(f"{path}: unknown dtype(s) {sorted(unknown)} in the header")
    return header, [json.loads(line) for line in lines[1:] if line.strip()]


def save_failures(path, cases: list[dict]) -> None:
    """Append cases to a failure corpus (created with a header if missing), skipping known ids."""
    path = pathlib.Path(path)
    if path.exists():
        _, known = read_corpus(path)
        known_ids = {case["id"] for case in known}
        with open(path, "a") as out:
            for case in cases:
                line = {"id": case_id(case), **case}
                if line["id"] not in known_ids:
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")
                    known_ids.add(line["id"])
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_corpus(path, cases, dtypes=FAILURE_DTYPES, source="kernel state machine failures")


def replay_params(folder, device: str) -> list[tuple[str, dict, str, str | None]]:
    """(test id, case, dtype name, skip reason or None) for every case of every corpus in `folder`
    and every dtype its header names; bfloat16 is skipped off CUDA (the interpreter has none)."""
    params = []
    for path in sorted(pathlib.Path(folder).glob("*.jsonl")):
        header, cases = read_corpus(path)
        for case in cases:
            for dtype in header.get("dtypes", ["float32"]):
                skip = "bfloat16 needs a CUDA device" if dtype == "bfloat16" and device != "cuda" else None
                params.append((f"{path.stem}:{case['id']}:{dtype}", case, dtype, skip))
    return params


_REPLAY_SOURCE = '''\
"""Replays every kernel case in this folder on the device at hand (CUDA if present, else the Triton
interpreter) and compares with dense attention. Written by `pagedkv gen-kernel-tests`."""
import pathlib

import pytest
import torch

from pagedkv.fuzz.kernel_corpus import DTYPES, replay_case, replay_params

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PARAMS = [pytest.param(case, dtype, id=name, marks=[pytest.mark.skip(reason=skip)] if skip else [])
          for name, case, dtype, skip in replay_params(pathlib.Path(__file__).parent, DEVICE)]


@pytest.mark.parametrize("case, dtype", PARAMS)
def test_replay(case, dtype):
    ok, detail = replay_case(case, DEVICE, DTYPES[dtype])
    assert ok, f"{case['id']} ({case['kernel']}, {len(case['seqs'])} sequences): {detail}"
'''


def write_replay_module(folder) -> pathlib.Path:
    """Write the pytest module that replays the folder's corpora; returns its path."""
    path = pathlib.Path(folder) / REPLAY_MODULE
    path.write_text(_REPLAY_SOURCE)
    return path
