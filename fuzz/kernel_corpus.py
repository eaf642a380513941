"""Kernel cases: their file format, their validation, their K/V, and their replay against a kernel.

A *case* is one batch for a paged-attention kernel: the pool geometry, the head configuration, each
sequence's length, block table and number of queries, the attention options, and where its K/V
comes from. K/V is never stored; it is a function of the case's seeds. Two kinds of content:

- **history** (cases taken from the kernel state machine, `kernel_machine`): each sequence gives its
  ``tokens``; the K and V of a position are a function of the K/V seed and the position's *content
  key*, a chained hash of the token and every token before it, so two sequences with the same prefix
  get the same K/V (prefix-cache hits are legitimate). ``blocks`` records which content key every
  slot of the blocks the tables name held (dropped copies and stale slots included); replay first
  checks that each sequence reads back its own history through its table (decode attention is blind
  to a permutation of whole blocks), then runs the kernel.
- **slots** (designed cases, `kernel_kit.grids`): each sequence gives only its ``length``; every slot
  some sequence reads below its length holds seeded random K/V, and a sequence's history is whatever
  its table reads, so repeated block ids (within a row or between rows) are consistent by
  construction. Tables may carry padding entries past the used blocks (a block nobody reads).

Every slot that holds no valid token is NaN. Queries come from their own seed.

A corpus file is JSON lines. The first line is the header, ``{"format": 2, "dtypes": [...], ...}``
(format 1 files, history cases without options, are read too); every other line is a case:

    {"id": str, "kernel": "decode" | "prefill", "block_size": B, "num_blocks": N,
     "heads": {"num_kv_heads": H, "group": G, "head_dim": D}, "kv_seed": int, "query_seed": int,
     "seqs": [{"tokens": [int] | "length": int, "table": [block], "queries": int}],
     "blocks": [[block, [content key or null for each of the B slots]]],      (history cases only)
     "options": {"scale": float, "causal": bool, "sliding_window": int, "softcap": float,
                 "num_splits": int},                                          (each optional)
     "source": str}                                                           (optional: where from)

A sequence's queries are its last ``queries`` positions (decode: exactly 1). Anything else is refused
with `CorpusFormatError` naming the file, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
from dataclasses import asdict, dataclass

import torch

from pagedkv.kernels import gather_kv

from .kernel_kit.conformance import Batch, Outcome, run_batch
from .kernel_kit.protocol import LoadedKernel, Requirement, load_kernel, skip_reason

FORMAT = 2
READABLE_FORMATS = (1, 2)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KINDS = ("decode", "prefill")
OPTIONS = ("scale", "causal", "sliding_window", "softcap", "num_splits")
FAILURES_ENV = "PAGEDKV_KERNEL_FAILURES"
FAILURE_DTYPES = ("float32", "bfloat16")
REPLAY_MODULE = "test_kernel_replay.py"
#: A case may not ask for caches larger than this many elements (a corpus is data, not a fork bomb).
MAX_CACHE_ELEMENTS = 1 << 27
_INT32 = (1 << 31) - 1
_MASK63 = (1 << 63) - 1


class CorpusFormatError(ValueError):
    """A corpus file or case this version of pagedkv cannot read; the message says where and why."""


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


# ------------------------------------------------------------------ validation

def _fail(where: str, message: str):
    raise CorpusFormatError(f"{where}: {message}")


def _int(where: str, name: str, value, lo: int, hi: int = _INT32) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        _fail(where, f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    return value


def _list(where: str, name: str, value) -> list:
    if not isinstance(value, list):
        _fail(where, f"{name} must be a list, got {type(value).__name__}")
    return value


def _options(where: str, kind: str, options) -> dict:
    if not isinstance(options, dict):
        _fail(where, f"options must be an object, got {type(options).__name__}")
    unknown = set(options) - set(OPTIONS)
    if unknown:
        _fail(where, f"unknown option(s) {sorted(unknown)}; known: {list(OPTIONS)}")
    scale = options.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
                              or scale <= 0):
        _fail(where, f"options.scale must be a finite number > 0, got {scale!r}")
    if not isinstance(options.get("causal", True), bool):
        _fail(where, f"options.causal must be true or false, got {options['causal']!r}")
    if kind == "decode" and options.get("causal", True) is not True:
        _fail(where, "a decode case is causal (its query is the last position)")
    if options.get("sliding_window") is not None:
        _int(where, "options.sliding_window", options["sliding_window"], 1)
    softcap = options.get("softcap")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        _fail(where, f"options.softcap must be a finite number > 0, got {softcap!r}")
    if options.get("num_splits") is not None:
        if kind != "decode":
            _fail(where, "options.num_splits applies to decode cases only")
        _int(where, "options.num_splits", options["num_splits"], 1, 256)
    return options


def _seqs(where: str, case: dict, heads: Heads) -> None:
    kind, block_size = case["kernel"], case["block_size"]
    seqs = _list(where, "seqs", case["seqs"])
    if not seqs:
        _fail(where, "seqs is empty")
    forms = set()
    for i, seq in enumerate(seqs):
        at = f"{where}, seqs[{i}]"
        if not isinstance(seq, dict):
            _fail(at, f"must be an object, got {type(seq).__name__}")
        form = "tokens" if "tokens" in seq else "length"
        forms.add(form)
        allowed = {form, "table", "queries"}
        if set(seq) != allowed:
            _fail(at, f"must have exactly the keys {sorted(allowed)}, got {sorted(seq)}")
        if form == "tokens":
            length = len(_list(at, "tokens", seq["tokens"]))
            for token in seq["tokens"]:
                _int(at, "each token", token, 0, _MASK63)
        else:
            length = _int(at, "length", seq["length"], 0)
        table = _list(at, "table", seq["table"])
        for block in table:
            _int(at, "each table entry", block, -_INT32 - 1)
        if form == "length":  # (a history case with a bad table is a finding, reported at replay)
            if length > len(table) * block_size:
                _fail(at, f"length {length} exceeds its table of {len(table)} blocks x {block_size} slots")
            if any(not 0 <= b < case["num_blocks"] for b in table):
                _fail(at, f"table {table} names a block outside [0, {case['num_blocks']})")
        queries_ = _int(at, "queries", seq["queries"], 0, length if kind == "prefill" else 1)
        if kind == "decode" and queries_ != 1:
            _fail(at, "a decode sequence has exactly 1 query")
    if len(forms) > 1:
        _fail(where, "every sequence gives 'tokens' (history content) or every one 'length' (slots), not both")
    if (forms == {"tokens"}) != ("blocks" in case):
        _fail(where, "'blocks' is given exactly when the sequences give 'tokens'")
    if "blocks" in case:
        for entry in _list(where, "blocks", case["blocks"]):
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
                _fail(where, f"each blocks entry is [block, [key or null, ...]], got {entry!r}")
            _int(where, "a block id in blocks", entry[0], 0, case["num_blocks"] - 1)
            if len(entry[1]) != block_size:
                _fail(where, f"block {entry[0]} lists {len(entry[1])} slot keys, not block_size = {block_size}")
            for key in entry[1]:
                if key is not None:
                    _int(where, "a slot key", key, 0, _MASK63)


REQUIRED = ("kernel", "block_size", "num_blocks", "heads", "kv_seed", "query_seed", "seqs")


def validate_case(case, where: str = "case") -> dict:
    """The case itself if it is well formed; otherwise CorpusFormatError saying what is wrong."""
    if not isinstance(case, dict):
        _fail(where, f"a case is a JSON object, got {type(case).__name__}")
    missing = [key for key in REQUIRED if key not in case]
    if missing:
        _fail(where, f"missing field(s) {missing}")
    unknown = set(case) - {*REQUIRED, "id", "blocks", "options", "source"}
    if unknown:
        _fail(where, f"unknown field(s) {sorted(unknown)}")
    if case["kernel"] not in KINDS:
        _fail(where, f"kernel must be one of {list(KINDS)}, got {case['kernel']!r}")
    block_size = _int(where, "block_size", case["block_size"], 1, 1 << 16)
    num_blocks = _int(where, "num_blocks", case["num_blocks"], 1)
    raw_heads = case["heads"]
    if not isinstance(raw_heads, dict) or set(raw_heads) != {"num_kv_heads", "group", "head_dim"}:
        _fail(where, f"heads must be {{num_kv_heads, group, head_dim}}, got {raw_heads!r}")
    heads = Heads(*(_int(where, f"heads.{name}", raw_heads[name], 1, 4096)
                    for name in ("num_kv_heads", "group", "head_dim")))
    if num_blocks * block_size * heads.num_kv_heads * heads.head_dim > MAX_CACHE_ELEMENTS:
        _fail(where, f"the cache would hold more than {MAX_CACHE_ELEMENTS} elements")
    _int(where, "kv_seed", case["kv_seed"], -_MASK63 - 1, _MASK63)
    _int(where, "query_seed", case["query_seed"], -_MASK63 - 1, _MASK63)
    _options(where, case["kernel"], case.get("options", {}))
    if "source" in case and not isinstance(case["source"], str):
        _fail(where, "source must be a string")
    if "id" in case and not isinstance(case["id"], str):
        _fail(where, "id must be a string")
    _seqs(where, case, heads)
    return case


# ------------------------------------------------------------------ cases

def make_case(*, kernel: str, block_size: int, num_blocks: int, heads: Heads, kv_seed: int,
              query_seed: int, seqs: list[dict], blocks: dict | None = None, options: dict | None = None,
              source: str | None = None) -> dict:
    """A case dict. History cases: `seqs` items are {"tokens", "table", "queries"} and `blocks` maps
    each block the tables name to the content key of each slot (None: nothing written). Slots cases:
    items are {"length", "table", "queries"} and `blocks` is None."""
    case = {"kernel": kernel, "block_size": block_size, "num_blocks": num_blocks, "heads": asdict(heads),
            "kv_seed": kv_seed, "query_seed": query_seed, "seqs": seqs}
    if blocks is not None:
        case["blocks"] = [[block, keys] for block, keys in sorted(blocks.items())]
    if options:
        case["options"] = {key: value for key, value in options.items() if value is not None}
    if source:
        case["source"] = source
    return validate_case(case)


def case_id(case: dict) -> str:
    """A short id that names the case's content."""
    body = json.dumps({k: v for k, v in case.items() if k != "id"}, sort_keys=True)
    return f"{case['kernel']}-{hashlib.blake2b(body.encode(), digest_size=6).hexdigest()}"


def seq_length(seq: dict) -> int:
    return len(seq["tokens"]) if "tokens" in seq else seq["length"]


def requirement(case: dict, dtype: torch.dtype) -> Requirement:
    """What the case needs from a kernel (see `protocol.skip_reason`)."""
    options = case.get("options", {})
    lengths = [seq_length(seq) for seq in case["seqs"]]
    needs = set()
    if options.get("sliding_window") is not None:
        needs.add("sliding_window")
    if options.get("softcap") is not None:
        needs.add("softcap")
    if options.get("causal", True) is False:
        needs.add("non_causal")
    if options.get("num_splits") is not None:
        needs.add("split_kv")
    if 0 in lengths or any(seq["queries"] == 0 for seq in case["seqs"]):
        needs.add("empty_rows")
    heads = case["heads"]
    return Requirement(kind=case["kernel"], block_size=case["block_size"], head_dim=heads["head_dim"],
                       dtype=dtype, group=heads["group"], capabilities=frozenset(needs))


def _history_cache(case: dict, heads: Heads, shape, dtype, device):
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = k_cache.clone()
    slots, keys = [], []
    for block, slot_keys in case["blocks"]:
        for offset, key in enumerate(slot_keys):
            if key is not None:
                slots.append((block, offset))
                keys.append(key)
    if slots:
        k, v = kv_values(case["kv_seed"], keys, heads)
        where = torch.tensor(slots, dtype=torch.int64, device=device)
        k_cache[where[:, 0], where[:, 1]] = k.to(dtype=dtype, device=device)
        v_cache[where[:, 0], where[:, 1]] = v.to(dtype=dtype, device=device)
    histories = [tuple(t.to(dtype=dtype, device=device) for t in kv_values(case["kv_seed"], prefix_keys(s["tokens"]),
                                                                           heads))
                 for s in case["seqs"]]
    return k_cache, v_cache, histories


def _slots_cache(case: dict, shape, dtype, device):
    """Seeded K/V in every slot some sequence reads below its length; NaN everywhere else."""
    block_size = case["block_size"]
    generator = torch.Generator().manual_seed(case["kv_seed"] & _MASK63)
    k_full = torch.randn(shape, generator=generator)
    v_full = torch.randn(shape, generator=generator)
    valid = torch.zeros(shape[:2], dtype=torch.bool)
    for seq in case["seqs"]:
        positions = torch.arange(seq["length"])
        table = torch.tensor(seq["table"], dtype=torch.int64)
        valid[table[positions // block_size], positions % block_size] = True
    k_full[~valid] = float("nan")
    v_full[~valid] = float("nan")
    return k_full.to(dtype=dtype, device=device), v_full.to(dtype=dtype, device=device)


def build_batch(case: dict, device, dtype: torch.dtype) -> tuple[Batch, str | None]:
    """The case as a canonical batch on `device` in `dtype`, and the read-back problem of a history case
    (a sequence that does not read its own K/V through its table), else None."""
    heads = Heads(**case["heads"])
    block_size = case["block_size"]
    shape = (case["num_blocks"], block_size, heads.num_kv_heads, heads.head_dim)
    seqs = case["seqs"]
    width = max([1, *(len(s["table"]) for s in seqs)])
    tables = torch.full((len(seqs), width), -1, dtype=torch.int32)
    for row, seq in zip(tables, seqs):
        row[:len(seq["table"])] = torch.tensor(seq["table"], dtype=torch.int32)
    tables = tables.to(device)
    lens = torch.tensor([seq_length(s) for s in seqs], dtype=torch.int32, device=device)
    problem = None
    if "blocks" in case:
        k_cache, v_cache, histories = _history_cache(case, heads, shape, dtype, device)
        problem = read_back_problem(k_cache, v_cache, tables, lens, histories)
    else:
        k_cache, v_cache = _slots_cache(case, shape, dtype, device)
        histories = [gather_kv(k_cache, v_cache, tables[i], seq_length(s)) for i, s in enumerate(seqs)]
    num_queries = [s["queries"] for s in seqs]
    starts = torch.tensor([0, *num_queries], dtype=torch.int64).cumsum(0).to(torch.int32)
    options = case.get("options", {})
    batch = Batch(
        kind=case["kernel"],
        q=queries(case["query_seed"], sum(num_queries), heads).to(dtype=dtype, device=device),
        k_cache=k_cache, v_cache=v_cache, block_tables=tables, seq_lens=lens, query_start_loc=starts.to(device),
        num_queries=num_queries, histories=histories,
        blocks_read=[s["table"][:-(-seq_length(s) // block_size)] if seq_length(s) else [] for s in seqs],
        scale=float(options.get("scale") or heads.head_dim ** -0.5), causal=options.get("causal", True),
        sliding_window=options.get("sliding_window"), softcap=options.get("softcap"),
        num_splits=options.get("num_splits"),
    )
    return batch, problem


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


def run_case(case: dict, loaded: LoadedKernel, device, dtype: torch.dtype) -> Outcome:
    """Replay one case against a kernel: skipped if it needs what the kernel does not declare, failed if
    the cache does not read back or the kernel's output is wrong (per-sequence reports), else passed."""
    validate_case(case, case.get("id", "case") if isinstance(case, dict) else "case")
    reason = skip_reason(loaded.declared, requirement(case, dtype))
    if reason is not None:
        return Outcome("skipped", reason)
    batch, problem = build_batch(case, device, dtype)
    if problem is not None:
        return Outcome("failed", problem)
    return run_batch(loaded, batch)


def replay_case(case: dict, device, dtype: torch.dtype, kernel: LoadedKernel | None = None) -> tuple[bool, str]:
    """(ok, detail) of `run_case` against `kernel` (default: pagedkv's own kernels); a skip is ok."""
    outcome = run_case(case, kernel or load_kernel("pagedkv"), device, dtype)
    return outcome.ok, outcome.detail


def check_attention(kernel: str, q, k_cache, v_cache, block_tables, seq_lens, num_queries: list[int],
                    histories: list, *, target: LoadedKernel | None = None) -> tuple[bool, str]:
    """Run decode or prefill (`kernel`) of `target` (default: pagedkv's) on the paged cache and compare
    with dense attention over each sequence's own (K, V) history (tensors in the cache's dtype and
    device). Returns (ok, summary)."""
    block_size = k_cache.shape[1]
    tables = block_tables.cpu().tolist()
    starts = torch.tensor([0, *num_queries], dtype=torch.int64).cumsum(0).to(torch.int32)
    batch = Batch(kind=kernel, q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                  query_start_loc=starts.to(q.device), num_queries=list(num_queries), histories=histories,
                  blocks_read=[row[:-(-n // block_size)] if n else [] for row, n in zip(tables, seq_lens.tolist())],
                  scale=q.shape[2] ** -0.5)
    outcome = run_batch(target or load_kernel("pagedkv"), batch)
    return outcome.ok, outcome.detail


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


def _header(path, first_line: str | None) -> dict:
    try:
        header = json.loads(first_line) if first_line is not None else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or "format" not in header:
        raise CorpusFormatError(f"{path}: not a pagedkv kernel corpus (its first line is no header with a 'format')")
    if header["format"] not in READABLE_FORMATS:
        raise CorpusFormatError(f"{path}: corpus format {header['format']!r} is not supported; this pagedkv "
                                f"reads formats {list(READABLE_FORMATS)}. Regenerate it with `pagedkv gen-kernel-tests`.")
    dtypes = header.get("dtypes", ["float32"])
    if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
        raise CorpusFormatError(f"{path}: the header's dtypes must be a list of names, got {dtypes!r}")
    unknown = set(dtypes) - set(DTYPES)
    if unknown:
        raise CorpusFormatError(f"{path}: unknown dtype(s) {sorted(unknown)} in the header")
    return header


def read_corpus(path) -> tuple[dict, list[dict]]:
    """(header, cases) of a corpus file; CorpusFormatError (with the line) for anything it cannot read."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CorpusFormatError(f"{path}: not a regular file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CorpusFormatError(f"{path}: cannot be read: {error}") from error
    header = _header(path, lines[0] if lines else None)
    cases = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            case = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            raise CorpusFormatError(f"{where}: not JSON ({error})") from None
        cases.append(validate_case(case, where))
    return header, cases


def save_failures(path, cases: list[dict]) -> None:
    """Append cases to a failure corpus (created with a header if missing), skipping known ids."""
    path = pathlib.Path(path)
    if path.exists():
        _, known = read_corpus(path)
        known_ids = {case_id(case) for case in known}
        with open(path, "a") as out:
            for case in cases:
                line = {"id": case_id(case), **case}
                if line["id"] not in known_ids:
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")
                    known_ids.add(line["id"])
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_corpus(path, cases, dtypes=FAILURE_DTYPES, source="saved kernel failures")


def replay_params(folder) -> list[tuple[str, dict, str]]:
    """(test id, case, dtype name) for every case of every corpus in `folder` and every dtype its
    header names (a kernel that does not declare a dtype skips it)."""
    params = []
    for path in sorted(pathlib.Path(folder).glob("*.jsonl")):
        header, cases = read_corpus(path)
        for case in cases:
            for dtype in header.get("dtypes", ["float32"]):
                params.append((f"{path.stem}:{case_id(case)}:{dtype}", case, dtype))
    return params


_REPLAY_SOURCE = '''\
"""Replays every kernel case of every *.jsonl in this folder against one kernel target, on the device
at hand (CUDA if present, else the Triton interpreter), and compares with dense attention.

Target: $PAGEDKV_KERNEL ("module:factory" or a built-in name), else the one `pagedkv gen-kernel-tests
--kernel` recorded in replay.json here, else pagedkv's own kernels. Cases the target does not declare
support for are skipped. A failing case is appended to $PAGEDKV_KERNEL_FAILURES, else to
failures/<target>.jsonl here. Written by `pagedkv gen-kernel-tests`."""
import pathlib

import pytest

from pagedkv.fuzz.kernel_corpus import replay_params
from pagedkv.fuzz.kernel_kit.replay import folder_target, replay_one

HERE = pathlib.Path(__file__).parent
TARGET = folder_target(HERE)
PARAMS = [pytest.param(case, dtype, id=name) for name, case, dtype in replay_params(HERE)]


@pytest.mark.parametrize("case, dtype", PARAMS)
def test_replay(case, dtype):
    outcome = replay_one(TARGET, case, dtype, HERE)
    if outcome.status == "skipped":
        pytest.skip(outcome.detail)
    assert outcome.ok, f"{TARGET.target}: {outcome.detail}"
'''


def write_replay_module(folder) -> pathlib.Path:
    """Write the pytest module that replays the folder's corpora; returns its path."""
    path = pathlib.Path(folder) / REPLAY_MODULE
    path.write_text(_REPLAY_SOURCE)
    return path
