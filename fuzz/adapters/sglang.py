"""SGLang 0.5.23's radix cache and paged token allocator behind the conformance protocol.

`pagedkv fuzz sglang` (factory `make`) builds SGLang's own objects, unchanged: `RadixCache`
(`sglang/srt/mem_cache/radix_cache.py`), `TokenToKVPoolAllocator` (page size 1) or
`PagedTokenToKVPoolAllocator` (page size > 1) and `ReqToTokenPool`, and drives them through SGLang's
own scheduler-side functions, in the order the scheduler calls them:

| protocol     | SGLang                                                                                  |
|--------------|-----------------------------------------------------------------------------------------|
| `add`        | `match_kv_cache` (key capped at len-1 tokens, as `Req._compute_max_prefix_len` does),  |
|              | `tree_cache.lock(last_node)`, `PrefillBudget.can_allocate_prefill` (refused: OutOfBlocks),|
|              | `alloc_req_slots`, `alloc_token_slots` / `alloc_paged_token_slots_extend` (evicts),     |
|              | the row written as `write_cache_indices` does, then `checkpoint_kv_cache` (the insert    |
|              | after a prefill, which re-locks the request on its own tree path)                       |
| `append`     | `alloc_token_slots` / `alloc_paged_token_slots_decode` (evicts; out of memory: OutOfBlocks,|
|              | where the scheduler would retract a request), the slot written into the request's row    |
| `free`       | `release_kv_cache(req, tree_cache, checkpoint=True)`: insert, free the partial tail, unlock|
| `block_table`| the request's `req_to_token` row read page by page (page p -> block p - 1: SGLang keeps  |
|              | page 0 as its padding page)                                                               |
| `num_free_blocks` | `(allocator.available_size() + tree_cache.evictable_size()) // page_size`            |

What SGLang has no counterpart for is not declared: `fork` (SGLang runs parallel samples as separate
requests that share a prefix through the tree, never by sharing a writable page, so it never
copies on write) and `swap` (a retracted request is recomputed, or backed up by the unified cache's
host pool, not swapped block by block). `prefix_caching=False` builds the same `RadixCache` with
`disable=True`, the flag `--disable-radix-cache` sets on the scheduler's cache (0.5.23 has no
`ChunkCache` any more). See docs/conformance.md ("SGLang") for the oracles this fires on correct SGLang
behaviour and why.

The request record: SGLang's `Req` lives in `managers/schedule_batch.py`, which imports the grammar
backends, the OpenAI protocol models and the multimodal stack. The cache functions read a few fields
of it (`req.kv`, the token ids, the lock, the last node); `_Request` and `_KvRecord` hold those
fields with the meaning `Req` and `ReqKvInfo` give them, and nothing else.

Loading: on a machine where sglang 0.5.23 is installed normally it is imported normally. Elsewhere the
wheel and the pure-Python (or plain binary) packages the loaded modules import are unpacked into
pagedkv's wheel cache (`fuzz/adapters/wheels.py`) and loaded privately, with the stubs of `STUBS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import logging
import os
from array import array
from dataclasses import dataclass, field

import torch

if not torch.cuda.is_available():
    # SGLang's modules define @triton.jit functions when they load, and Triton decides at each
    # definition whether it is interpreted: choose interpreter mode first, as pagedkv.kernels does (a
    # pytest run that loaded this target before the kernel target failed every SGLang kernel case with
    # "Cannot call @triton.jit'd outside of the scope of a kernel").
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pagedkv.spec import DuplicateSequence, OutOfBlocks, UnknownSequence  # noqa: E402
from pagedkv.spec.arguments import check_prompt, check_seq_id, check_token  # noqa: E402

from . import wheels  # noqa: E402
from .wheels import Stub, placeholders  # noqa: E402

VERSION = "0.5.23"
#: What the loaded modules import beyond torch, numpy and triton.
DEPENDENCIES = wheels.pinned("msgspec", "psutil", "pybase64", "pyzmq", "starlette", "anyio", "sniffio", "idna")
#: Top-level import names those distributions provide (resolved from the cache folders only).
PACKAGES = ("sglang", "msgspec", "psutil", "pybase64", "zmq", "starlette", "anyio", "sniffio", "idna")
MODULES = (
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.common",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.prefill_budget",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
)
#: module -> why it is stubbed. Each pulls a GPU, distributed or multimodal subsystem that the
#: modules above import at module level but never call on the paths the adapter drives.
STUBS = {
    "sglang": Stub("its __init__ starts SGLang's frontend language and server API (HTTP client, model "
                   "configs, tokenizers); the cache modules import only submodules", hollow=True),
    "sglang.srt.configs": Stub("its __init__ imports every model's config, with the vision and audio towers "
                               "of the multimodal models (transformers)", hollow=True),
    "sglang.srt.layers.quantization": Stub("its __init__ registers every quantization method's GPU kernels "
                                           "(AWQ, GPTQ, FP8, MoE)", hollow=True),
    "sglang.srt.layers.quantization.fp4_kv_cache_quant_method": Stub(
        "FP4 KV-cache quantization (GPU); memory_pool names UnquantizedKVCacheMethod in the device KV "
        "pools, which the adapter does not build", placeholders("UnquantizedKVCacheMethod")),
    "sglang.srt.layers.radix_attention": Stub(
        "the attention layer (GPU model code); memory_pool names RadixAttention in device KV-pool code",
        placeholders("RadixAttention")),
    "sglang.srt.disaggregation.utils": Stub(
        "prefill/decode disaggregation (distributed serving); the metrics collector names "
        "DisaggregationMode (metrics are off here)", placeholders("DisaggregationMode")),
    "sglang.srt.model_executor.forward_batch_info": Stub(
        "the GPU forward batch; the metrics collector names ForwardMode (metrics are off here)",
        placeholders("ForwardMode")),
    "sglang.kernels.ops.communication.all_reduce": Stub(
        "the custom all-reduce GPU kernels of tensor parallelism (distributed; TVM FFI objects), imported "
        "by dp_attention's communicators", placeholders(
            "AllReduceAlgo", "Communicator", "IPCManager", "PullPlane", "PushPlane",
            "custom_all_reduce", "get_all_reduce_module")),
}
#: Page sizes drawn: SGLang's allocators and radix cache take any page size >= 1 (`--page-size`; some
#: attention backends restrict it, none of which is under test here), and the factory accepts any;
#: the kit's usual range is declared to keep campaigns short (`--block-sizes` draws others).
PAGE_SIZES = tuple(range(1, 17))
#: Request rows of the `ReqToTokenPool`: more than a program ever holds live (SGLang sizes it from
#: --max-running-requests; running out is an admission matter, not a block-manager one).
REQUEST_ROWS = 512
OUT_OF_MEMORY = ("Out of memory", "Prefill out of memory", "Decode out of memory")


@functools.lru_cache(maxsize=None)
def engine(modules: tuple = MODULES):
    """SGLang's `modules`: the normal install if it is 0.5.23, else the private load (module docstring)."""
    # The allocation functions log an error and print the whole tree before raising out of memory;
    # the adapter reports that as OutOfBlocks, so the log line is noise in a fuzz run.
    logging.getLogger("sglang.srt.mem_cache.allocation").setLevel(logging.CRITICAL)
    if wheels.importable("sglang", VERSION):
        return wheels.installed(modules)
    with _install_lock():
        roots = [wheels.install("sglang", VERSION, keep=_sources)]
        roots += [wheels.install(name, version) for name, version in DEPENDENCIES]
    return wheels.load(roots, PACKAGES, modules, STUBS)


@contextlib.contextmanager
def _install_lock():
    """One installer at a time: pytest-xdist workers and campaign workers load the target at once, and
    an install that finds another's half-made folder replaces it (wheels.unpack)."""
    root = wheels.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".sglang-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sources(member: str) -> bool:
    """Python sources and metadata, plus the JIT kernels' source folders: `kernels/jit/utils/compile/
    paths.py` checks at import time that they exist (nothing is compiled here)."""
    return wheels.python_sources(member) or member.startswith(("sglang/kernels/jit/include/",
                                                               "sglang/kernels/jit/csrc/"))


class _Engine:
    """SGLang's modules for one subject, and its runtime context: the server arguments a scheduler
    process publishes (`ServerArgs` defaults with this page size), which the cache functions read
    (`get_spec().speculative_algorithm`, `get_serving().strip_thinking_cache`). They are projected
    into a context of the subject's own (`RuntimeContext.set_server_args`), not through `publish`:
    its resolution pipeline loads the served model's Hugging Face config, and there is no model."""

    def __init__(self, page_size: int, radix_disabled: bool):
        self.loaded = engine()
        m = self.loaded
        self.radix = m["sglang.srt.mem_cache.radix_cache"]
        self.allocator = m["sglang.srt.mem_cache.allocator"]
        self.memory_pool = m["sglang.srt.mem_cache.memory_pool"]
        self.params = m["sglang.srt.mem_cache.cache_init_params"]
        self.common = m["sglang.srt.mem_cache.common"]
        self.allocation = m["sglang.srt.mem_cache.allocation"]
        self.runtime = m["sglang.srt.runtime_context"]
        with self.loaded.active():
            args = m["sglang.srt.server_args"].ServerArgs(
                model_path="pagedkv-conformance", page_size=page_size, disable_radix_cache=radix_disabled)
            self.context = self.runtime.RuntimeContext(parallel=self.runtime.ParallelContext())
            self.context.set_server_args(args)

    @contextlib.contextmanager
    def active(self):
        """Around every call into SGLang: its modules import lazily inside functions, and read the
        runtime context."""
        with self.loaded.active(), self.runtime.use_context(self.context):
            yield


# ---------------------------------------------------------------------- the request record


@dataclass
class _KvRecord:
    """The fields of SGLang's `ReqKvInfo` that the cache functions read, with its meaning."""

    req_pool_idx: int = None          # the request's row of req_to_token
    cache_protected_len: int = 0      # [0, here) is owned by the tree (matched or inserted)
    cache_inserted_len: int = 0       # this request already inserted [0, here)
    kv_committed_len: int = 0         # KV written up to here
    kv_allocated_len: int = 0         # slots allocated up to here
    swa_evict_floor: int = 0          # no sliding-window model here: nothing window-evicted
    component_evicted_seqlens: dict = field(default_factory=dict)

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    holds_mamba = False

    @property
    def is_kv_released(self) -> bool:
        return self.kv_allocated_len == 0 and not any(self.component_evicted_seqlens.values())

    def get_evicted_seqlen(self, component_type) -> int:
        return self.component_evicted_seqlens.get(component_type, 0)

    def swa_dead_lo(self, page_size: int) -> int:
        return self.cache_protected_len  # swa_evict_floor is 0: the floor is the tree-owned prefix

    def mark_kv_released(self) -> None:
        self.kv_allocated_len = 0
        self.component_evicted_seqlens.clear()


@dataclass
class _Request:
    """The fields of SGLang's `Req` that matching, checkpointing and releasing read."""

    rid: int
    origin_input_ids: array
    output_ids: list = field(default_factory=list)
    kv: _KvRecord = field(default_factory=_KvRecord)
    prefix_len: int = 0
    extend_end: int = 0
    lock: object = None
    last_node: object = None
    finished_reason: str = None
    finished_len: int = None
    extra_key = None                   # no LoRA adapter, no cache salt: one namespace
    cache_salt = None
    priority = None
    skip_radix_cache_insert = False
    return_logprob = False

    def __post_init__(self):
        self.full_untruncated_fill_ids = array("q", self.origin_input_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def refresh_fill_ids(self) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + array("q", self.output_ids)

    def owned_kv_len(self) -> int:
        return self.kv.kv_committed_len

    def _compute_max_prefix_len(self, input_len: int) -> int:
        return max(input_len - 1, 0)  # Req's rule: at least one token is computed


# ---------------------------------------------------------------------- the subject


class SGLangRadixSubject:
    """One SGLang radix cache, its allocator and its request-to-token pool, driven as the scheduler
    drives them. `cache`, `allocator` and `req_to_token_pool` are the real SGLang objects."""

    capabilities = frozenset({"prefix_caching"})
    config_space = {"block_sizes": PAGE_SIZES, "prefix_caching": (True, False)}

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True, num_cpu_blocks: int = 0):
        if not (isinstance(block_size, int) and block_size >= 1 and isinstance(num_blocks, int) and num_blocks >= 1):
            raise ValueError(f"SGLang adapter: page size and page count are ints >= 1, got {block_size!r}, "
                             f"{num_blocks!r}")
        self.sg = _Engine(block_size, radix_disabled=not prefix_caching)
        self.B, self.num_blocks = block_size, num_blocks
        with self.sg.active():
            self.req_to_token_pool = self.sg.memory_pool.ReqToTokenPool(
                size=REQUEST_ROWS, max_context_len=num_blocks * block_size + 1, device="cpu",
                enable_memory_saver=False)
            self.allocator = self._allocator(num_blocks * block_size)
            self.cache = self.sg.radix.RadixCache(self.sg.params.CacheInitParams(
                disable=not prefix_caching, req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.allocator, page_size=block_size))
        self.requests = {}

    def _allocator(self, tokens: int):
        kinds = self.sg.allocator
        if self.B == 1:
            return kinds.TokenToKVPoolAllocator(tokens, torch.float16, "cpu", None, need_sort=False)
        return kinds.PagedTokenToKVPoolAllocator(tokens, self.B, torch.float16, "cpu", None, need_sort=False)

    def _request(self, seq_id) -> _Request:
        seq_id = check_seq_id(seq_id)
        if seq_id not in self.requests:
            raise UnknownSequence(seq_id)
        return self.requests[seq_id]

    # ------------------------------------------------------------------ protocol

    def add(self, seq_id: int, tokens: list) -> int:
        seq_id, tokens = check_seq_id(seq_id), check_prompt(tokens)
        if seq_id in self.requests:
            raise DuplicateSequence(seq_id)
        req = _Request(rid=seq_id, origin_input_ids=array("q", tokens))
        with self.sg.active():
            self.sg.common.match_kv_cache(req, self.cache, req.full_untruncated_fill_ids,
                                          max_prefix_len=req._compute_max_prefix_len(len(tokens)))
            req.kv.cache_protected_len = req.prefix_len   # as init_next_round_input: the tree owns the hit
            cached = req.prefix_len
            req.lock = self.cache.lock(req.last_node)
            if not self._admissible(len(tokens) - cached):
                self.cache.unlock(req.lock)
                raise OutOfBlocks(needed=-(-(len(tokens) - cached) // self.B), available=self.num_free_blocks())
            req.extend_end = len(tokens)
            self.sg.allocation.alloc_req_slots(self.req_to_token_pool, [req], self.cache)
            self._write_row(req, self._prefix_indices(req), self._alloc_extend(req, cached, len(tokens)), cached)
            req.kv.kv_allocated_len = req.kv.kv_committed_len = len(tokens)
            self.sg.common.checkpoint_kv_cache(req, self.cache)   # the prefill ran: publish the prompt
        self.requests[seq_id] = req
        return cached

    def append(self, seq_id: int, token: int) -> list:
        req = self._request(seq_id)
        token = check_token(token)
        position = req.kv.kv_committed_len
        with self.sg.active():
            loc = self._alloc_decode(req, position)
            self.req_to_token_pool.write((req.kv.req_pool_idx, position), loc.to(self.req_to_token_pool.req_to_token.dtype))
        req.output_ids.append(token)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = position + 1
        return []  # SGLang never shares a page a request writes into: no copy-on-write

    def fork(self, parent_id: int, child_id: int) -> None:
        raise NotImplementedError("SGLang has no fork: parallel samples are separate requests sharing "
                                  "a prefix through the radix tree (capability not declared)")

    def free(self, seq_id: int) -> None:
        req = self._request(seq_id)
        req.finished_reason = "stop"
        with self.sg.active():
            self.sg.common.release_kv_cache(req, self.cache, checkpoint=True)
        del self.requests[req.rid]

    def block_table(self, seq_id: int) -> list:
        req = self._request(seq_id)
        slots = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_committed_len].tolist()
        pages = [slots[i] // self.B for i in range(0, len(slots), self.B)]
        misplaced = [(i, slot) for i, slot in enumerate(slots) if slot != pages[i // self.B] * self.B + i % self.B]
        if misplaced:  # the protocol's table says token i is at offset i % B of its block
            raise AssertionError(f"SGLang placed tokens off their page offset (position, slot): {misplaced[:4]}")
        return [page - 1 for page in pages]  # page 0 is SGLang's padding page, never handed out

    def num_free_blocks(self) -> int:
        return (self.allocator.available_size() + self.cache.evictable_size()) // self.B

    # ------------------------------------------------------------------ scheduler steps

    def _admissible(self, extend_len: int) -> bool:
        """The scheduler's admission test (PrefillAdder): the new tokens, page-rounded, fit in what is
        free plus what the tree can evict, with the matched prefix locked. No headroom is reserved
        for future decode tokens: the protocol admits exactly what fits."""
        budget = self.allocator.create_prefill_budget(self.cache)
        return budget.can_allocate_prefill(paged_input=budget.ceil_paged_tokens(extend_len),
                                           extend_input_len=extend_len, max_new_tokens=0, chunk_limit=None)

    def _prefix_indices(self, req: _Request):
        if req.prefix_len == 0:
            return torch.empty((0,), dtype=torch.int64)
        return self.cache.prefix_device_indices(req)

    def _alloc_extend(self, req: _Request, prefix_len: int, seq_len: int):
        """The prompt's new slots. Admission said they fit, so out of memory here would be SGLang's own
        inconsistency: it propagates (a `crash` finding)."""
        if self.B == 1:
            return self.sg.allocation.alloc_token_slots(self.cache, seq_len - prefix_len)
        prefix = self._prefix_indices(req)
        last_loc = prefix[-1:] if len(prefix) else torch.full((1,), -1, dtype=torch.int64)
        prefix_lens, seq_lens = torch.tensor([prefix_len]), torch.tensor([seq_len])
        return self.sg.allocation.alloc_paged_token_slots_extend(
            tree_cache=self.cache, prefix_lens=prefix_lens, prefix_lens_cpu=prefix_lens, seq_lens=seq_lens,
            seq_lens_cpu=seq_lens, last_loc=last_loc.to(torch.int64), extend_num_tokens=seq_len - prefix_len)

    def _alloc_decode(self, req: _Request, position: int):
        """One decode slot. Out of memory is OutOfBlocks: the scheduler would retract a request (its
        policy, which the protocol leaves to the caller)."""
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the tree dump printed before raising
                if self.B == 1:
                    return self.sg.allocation.alloc_token_slots(self.cache, 1)
                row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
                seq_lens = torch.tensor([position + 1])
                return self.sg.allocation.alloc_paged_token_slots_decode(
                    tree_cache=self.cache, seq_lens=seq_lens, seq_lens_cpu=seq_lens,
                    last_loc=row[position - 1:position].to(torch.int64))
        except RuntimeError as error:
            if not str(error).startswith(OUT_OF_MEMORY):
                raise
            raise OutOfBlocks(needed=1, available=self.num_free_blocks()) from None

    def _write_row(self, req: _Request, prefix, new, prefix_len: int) -> None:
        """What `write_cache_indices` does on its non-Triton path: prefix, then the new slots."""
        row = req.kv.req_pool_idx
        self.req_to_token_pool.write((row, slice(0, prefix_len)), prefix)
        self.req_to_token_pool.write((row, slice(prefix_len, prefix_len + len(new))), new)


def make(num_blocks: int, block_size: int, *, prefix_caching: bool = True, num_cpu_blocks: int = 0) -> SGLangRadixSubject:
    """The `sglang` target's factory."""
    return SGLangRadixSubject(num_blocks, block_size, prefix_caching=prefix_caching, num_cpu_blocks=num_cpu_blocks)


engine()  # loaded on import: resolving the target pays for it, not the first (timed) factory call
