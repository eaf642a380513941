"""vLLM v1's real `KVCacheManager` behind pagedkv's conformance protocol (`pagedkv fuzz vllm`).

The subject drives vLLM's own manager (vllm/v1/core/kv_cache_manager.py of the pinned release, with
its coordinator, block pool, free-block queue and request block hasher) the way vLLM's scheduler
drives it:

- `add(seq, tokens)`: a `vllm.v1.request.Request` with vLLM's own block hasher (sha256, vLLM's
  default `prefix_caching_hash_algo`), then `get_computed_blocks(request)` and `allocate_slots(request,
  num_new_tokens, num_new_computed_tokens, new_computed_blocks, full_sequence_must_fit=True)` for the
  whole prompt in one chunk; `None` is vLLM's "cannot schedule" and becomes `OutOfBlocks`. On success
  the prompt counts as computed (`num_computed_tokens`), as the scheduler does after the step.
- `append(seq, token)`: the sampled token is appended to the request (`append_output_token_ids`, which
  hashes newly full blocks), then `allocate_slots(request, 1)` for its slot. When vLLM refuses, the
  scheduler would preempt; the protocol wants a refused call to change nothing, so the token is taken
  back off the request (its token lists and any block hash it completed) before `OutOfBlocks`.
- `free(seq)`: `KVCacheManager.free(request)` (tail blocks released first, as in vLLM). For an id the
  scheduler does not hold, vLLM's abort of a request it never scheduled (the manager must hold
  nothing for it), then the protocol's `UnknownSequence`.
- `block_table(seq)`: `get_block_ids(request_id)` of the one KV-cache group.
- `kv_events()` / `cache_index()` (capability `kv_events`, fuzz/events.py): the block pool's own
  events (`KVCacheManager.take_events`, the manager made with `enable_kv_cache_events` when caching is
  on) and its hash index, keyed as the events key it.

vLLM reserves block 0 as its null block, so the pool is made with `num_blocks + 1` blocks and every id
is shifted down by one: the protocol sees `0..num_blocks-1`. Sequence ids and their errors
(`UnknownSequence`, `DuplicateSequence`) are the scheduler's bookkeeping, kept here. vLLM has no
fork or swap (v1 preempts by recompute), so `capabilities` declares `prefix_caching`, on or off as
drawn (`enable_caching`), `complete_cache` (released blocks serve until handed out again) and
`kv_events`.

vLLM is imported normally when it is installed at the pinned version; otherwise its wheel is
installed into pagedkv's wheel cache (`wheels.install`) and only the modules under test are loaded,
with the stubs of `STUBS` (module -> why; docs/conformance.md, "Real-engine adapters").
"""

import functools

from pagedkv.spec import DuplicateSequence, OutOfBlocks, UnknownSequence

from .. import events
from . import wheels
from .wheels import Stub, placeholders

VERSION = "0.33.0"
MODULES = ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_utils", "vllm.v1.kv_cache_interface",
           "vllm.v1.request", "vllm.utils.hashing", "vllm.distributed.kv_events")
#: Binary wheels the real KV-event module imports (its events are msgspec structs; it imports zmq for
#: its publisher, which the manager never starts), pinned and loaded privately like the engine.
DEPENDENCIES = wheels.pinned("msgspec", "pyzmq")
PACKAGES = ("vllm", "msgspec", "zmq")
#: Block sizes the kit draws: vLLM's CacheConfig takes any block_size > 0 (`Field(gt=0)`) and the
#: manager has no size-specific path; 1..16 keeps programs short enough to reach evictions.
CONFIG_SPACE = {"block_sizes": tuple(range(1, 17)), "prefix_caching": (True, False)}
NULL_BLOCK = 0          # vLLM's placeholder block, never handed to a request
MAX_MODEL_LEN = 1 << 20  # far above any fuzzed sequence: vLLM caps slots at max_model_len


def _no_platform(module) -> None:
    """vLLM's own `UnspecifiedPlatform` (vllm/platforms/interface.py, loaded from the wheel) as the
    current platform: what vLLM detects on a machine with no accelerator plugin. The manager asks it
    only to register platform-specific KV-cache specs, which the base platform does not."""
    import importlib
    module.current_platform = importlib.import_module("vllm.platforms.interface").UnspecifiedPlatform()


def _config_names(module) -> None:
    """`VllmConfig` unavailable; `get_current_vllm_config_or_none` answers None, as vLLM's does
    outside an engine (no config is set current), so spec registration uses its defaults."""
    placeholders("VllmConfig")(module)
    module.get_current_vllm_config_or_none = lambda: None


def _sampling_params(module) -> None:
    """`SamplingParams` as a record of the four fields `Request.__init__` and its structured-output
    check read: a generative request with no grammar, no extra args, reading the prefix cache."""
    class SamplingParams:
        def __init__(self, max_tokens: int):
            self.max_tokens = max_tokens
            self.extra_args = None
            self.skip_reading_prefix_cache = None
            self.structured_outputs = None
    module.SamplingParams = SamplingParams
    placeholders("StructuredOutputsParams", "RequestOutputKind")(module)


#: Every import replaced while loading vLLM 0.33.0's v1/core path from the wheel (none when vLLM is
#: installed normally). Module name -> Stub(why). Hollow stubs keep the package's submodules real.
STUBS = {
    "vllm": Stub("package __init__ skipped: it applies GPU-runtime environment overrides and torch "
                 "patches (vllm.env_override); submodules load from the wheel", hollow=True),
    "vllm.distributed": Stub("package __init__ skipped: it builds torch.distributed process groups "
                             "(parallel_state); submodules load from the wheel", hollow=True),
    "vllm.config": Stub("package __init__ skipped: it imports every engine config (model config pulls "
                        "transformers, device config the GPU platform); the v1/core path names "
                        "VllmConfig only in helpers that size a cache from a full engine config",
                        _config_names, hollow=True),
    "vllm.platforms": Stub("package __init__ skipped: it probes for CUDA, ROCm, TPU and XPU plugins; "
                           "current_platform is vLLM's UnspecifiedPlatform (its interface module is real)",
                           _no_platform, hollow=True),
    "vllm.multimodal": Stub("multimodal subsystem (PIL, media loaders); fuzzed requests are text-only"),
    "vllm.multimodal.utils": Stub("multimodal feature windows, read only for requests with mm_features",
                                  placeholders("get_mm_features_in_window")),
    "vllm.multimodal.inputs": Stub("multimodal feature specs (a type annotation of Request)",
                                   placeholders("MultiModalFeatureSpec")),
    "cbor2": Stub("CBOR serializer of the *_cbor prefix-hash algorithms; the adapter hashes with vLLM's "
                  "default sha256 (pickle), so cbor2 is never called", placeholders("dumps")),
    "vllm.compilation": Stub("torch.compile / CUDA-graph capture (GPU)"),
    "vllm.compilation.cuda_graph": Stub("CUDA-graph statistics type of the metrics module (GPU)",
                                        placeholders("CUDAGraphStat")),
    "vllm.v1.metrics.perf": Stub("performance metrics exporter (prometheus, model FLOP counters)",
                                 placeholders("PerfStats")),
    "vllm.v1.spec_decode": Stub("speculative decoding (GPU drafter models)"),
    "vllm.v1.spec_decode.metrics": Stub("speculative-decoding metrics (prometheus); log_stats=False",
                                        placeholders("SpecDecodingStats")),
    "vllm.sampling_params": Stub("request frontend: SamplingParams pulls the tokenizers, model config and "
                                 "msgspec; a record of the fields Request reads stands in",
                                 _sampling_params),
    "vllm.pooling_params": Stub("pooling-model frontend (msgspec); fuzzed requests are generative",
                                placeholders("PoolingParams")),
    "vllm.v1.engine": Stub("engine-core client/server messages (msgspec, ZMQ); Request names their "
                           "types only", placeholders("EngineCoreEvent", "EngineCoreEventType",
                                                      "EngineCoreRequest", "FinishReason")),
    "vllm.v1.structured_output": Stub("package __init__ skipped: it loads grammar backends (xgrammar, "
                                      "outlines); its request module loads from the wheel", hollow=True),
    "vllm.v1.kv_hints": Stub("client KV-cache hints over the msgspec wire protocol; requests carry none",
                             placeholders("KvHintsEnvelope")),
    "uvloop": Stub("asyncio event loop of the engine's process utilities (compiled, not installed)"),
    "vllm.usage.usage_lib": Stub("usage telemetry (sends reports over the network)",
                                 placeholders("UsageContext", "is_usage_stats_enabled", "usage_message")),
    "vllm.utils.network_utils": Stub("ZMQ sockets and TCP addresses of the distributed engine (and of the "
                                     "KV-event publisher, never started)",
                                     placeholders("ZmqListener", "get_open_zmq_ipc_path", "get_tcp_uri", "get_ip",
                                                  "is_valid_ipv6_address", "split_zmq_path")),
    "vllm.utils.system_utils": Stub("process management (psutil, signals, the GPU platform)",
                                    placeholders("decorate_logs", "kill_process_tree", "set_process_title")),
    "vllm.utils.torch_utils": Stub("torch custom-op registration and pinned memory of the GPU platform; "
                                   "the manager's specs read get_dtype_size only to size a page in bytes",
                                   placeholders("PIN_MEMORY", "get_dtype_size")),
    "vllm.v1.core.sched.output": Stub("scheduler output for the GPU workers (a type of vllm.v1.utils)",
                                      placeholders("SchedulerOutput")),
}


@functools.cache
def engine(version: str = VERSION):
    """vLLM's modules: imported normally if vLLM `version` is installed, else loaded from the wheel
    cache (installing the wheel on first use). `engine()[name]` is a module; code that vLLM runs
    with lazy imports (building a manager) runs inside `engine().active()`."""
    if wheels.importable("vllm", version):
        return wheels.installed(MODULES)
    root = wheels.install("vllm", version, keep=wheels.python_sources)
    roots = [root] + [wheels.install(name, pinned) for name, pinned in DEPENDENCIES]
    return wheels.load(roots, PACKAGES, MODULES, STUBS)


class VllmV1Subject:
    """One vLLM v1 `KVCacheManager` and the requests a scheduler would hold, as a protocol subject."""

    #: complete_cache: vLLM evicts lazily (a released cached block keeps its index entry until the
    #: free queue hands it out), so a released block's content serves its prefix until then.
    #: kv_events: the block pool publishes BlockStored / BlockRemoved as the engine does with
    #: `--kv-events-config '{"enable_kv_cache_events": true}'`; the harness replays them.
    capabilities = frozenset({"prefix_caching", "complete_cache", "kv_events"})
    config_space = CONFIG_SPACE

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, version: str = VERSION):
        modules = self._engine = engine(version)
        utils, spec, request = (modules["vllm.v1.core.kv_cache_utils"], modules["vllm.v1.kv_cache_interface"],
                                modules["vllm.v1.request"])
        self._Request, self._status = request.Request, request.RequestStatus
        self._sampling = modules["vllm.v1.request"].SamplingParams
        hash_fn = modules["vllm.utils.hashing"].get_hash_fn_by_name("sha256")
        utils.init_none_hash(hash_fn)  # vLLM's engine core does this once per process, before hashing
        # vLLM's engine core gives requests a block hasher only when prefix caching is on.
        self._hasher = utils.get_request_block_hasher(block_size, hash_fn) if prefix_caching else None
        attention = spec.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=_float32())
        config = spec.KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],  # + vLLM's null block
                                    kv_cache_groups=[spec.KVCacheGroupSpec(["layer.0"], attention)])
        with modules.active():  # the manager registers its spec types with lazy imports
            self.manager = modules["vllm.v1.core.kv_cache_manager"].KVCacheManager(
                config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=block_size,
                hash_block_size=block_size, enable_caching=prefix_caching,
                enable_kv_cache_events=prefix_caching)
        self.requests = {}  # seq id -> vLLM Request, as the scheduler's `requests` dict

    # ------------------------------------------------------------------ protocol

    def add(self, seq_id, tokens) -> int:
        if seq_id in self.requests:
            raise DuplicateSequence(seq_id)
        request = self._Request(request_id=str(seq_id), prompt_token_ids=list(tokens),
                                sampling_params=self._sampling(max_tokens=MAX_MODEL_LEN), pooling_params=None,
                                block_hasher=self._hasher)
        computed_blocks, num_computed = self.manager.get_computed_blocks(request)[:2]
        blocks = self.manager.allocate_slots(request, request.num_tokens - num_computed,
                                             num_new_computed_tokens=num_computed,
                                             new_computed_blocks=computed_blocks, full_sequence_must_fit=True,
                                             has_scheduled_reqs=bool(self.requests))
        if blocks is None:
            raise OutOfBlocks(needed=-1, available=self.num_free_blocks())
        request.status = self._status.RUNNING
        request.num_computed_tokens = request.num_tokens
        self.requests[seq_id] = request
        return num_computed

    def append(self, seq_id, token) -> list:
        request = self._request(seq_id)
        hashes = len(request.block_hashes)
        request.append_output_token_ids(int(token))
        if self.manager.allocate_slots(request, 1) is None:
            self._take_back_token(request, hashes)
            raise OutOfBlocks(needed=1, available=self.num_free_blocks())
        request.num_computed_tokens += 1
        return []  # vLLM v1 never shares a partly filled block, so it never copies on write

    def fork(self, parent_id, child_id):
        raise NotImplementedError("vLLM v1 has no fork: parallel sampling re-prefills through the prefix cache")

    def free(self, seq_id) -> None:
        if seq_id not in self.requests:
            self._abort_unscheduled(seq_id)
            raise UnknownSequence(seq_id)
        request = self.requests[seq_id]
        request.status = self._status.FINISHED_ABORTED
        self.manager.free(request)
        del self.requests[seq_id]

    def block_table(self, seq_id) -> list:
        (ids,) = self.manager.get_block_ids(self._request(seq_id).request_id)
        return [block_id - 1 for block_id in ids]  # null block 0 mapped away

    def num_free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    def kv_events(self) -> list:
        """The block pool's events since the last call (`KVCacheManager.take_events`), as the kit's records."""
        return [kit_event(self._engine, event) for event in self.manager.take_events()]

    def cache_index(self) -> dict:
        """vLLM's hash index, keyed as its events key it, in the protocol's block ids."""
        return {key: [block - 1 for block in blocks]
                for key, blocks in hash_index(self._engine, self.manager.block_pool).items()}

    # ------------------------------------------------------------------ helpers

    def _request(self, seq_id):
        if seq_id not in self.requests:
            raise UnknownSequence(seq_id)
        return self.requests[seq_id]

    def _abort_unscheduled(self, seq_id) -> None:
        """An id the protocol does not know is, to vLLM, a request that was never scheduled: one whose
        `add` was refused stays in vLLM's waiting queue, and aborting it (`Scheduler.finish_requests`
        -> `_free_request`) still reaches the manager: `KVCacheManager.free`, and with a KV connector
        `get_block_ids` of its blocks (vLLM #18829 asserted the request had blocks there). The manager
        must find none and change nothing, which the harness checks (atomic_failure, kv_events) when
        the protocol's UnknownSequence follows. A freed id is aborted the same way: the manager holds
        nothing for it either."""
        request = self._Request(request_id=str(seq_id), prompt_token_ids=[0],
                                sampling_params=self._sampling(max_tokens=MAX_MODEL_LEN), pooling_params=None,
                                block_hasher=self._hasher)
        request.status = self._status.FINISHED_ABORTED
        if any(self.manager.get_block_ids(request.request_id)):
            raise AssertionError(f"vLLM holds blocks for request {seq_id}, which was never scheduled")
        self.manager.free(request)

    @staticmethod
    def _take_back_token(request, hashes: int) -> None:
        """Undo `append_output_token_ids` of one token (vLLM's scheduler would preempt instead)."""
        request._output_token_ids.pop()
        request._all_token_ids.pop()
        del request.block_hashes[hashes:]


def kit_event(modules, event):
    """One of vLLM's KV-cache events (`vllm.distributed.kv_events`) as the kit's record (fuzz/events.py)."""
    kinds = modules["vllm.distributed.kv_events"]
    if isinstance(event, kinds.BlockStored):
        return events.BlockStored(tuple(event.block_hashes), event.parent_block_hash, tuple(event.token_ids),
                                  event.block_size)
    if isinstance(event, kinds.BlockRemoved):
        return events.BlockRemoved(tuple(event.block_hashes))
    if isinstance(event, kinds.AllBlocksCleared):
        return events.AllBlocksCleared()
    raise TypeError(f"vLLM published an event the kit does not know: {event!r}")


def hash_index(modules, pool, group: int = None) -> dict:
    """vLLM's hash index (`BlockPool.cached_block_hash_to_block`; its map has no public iteration) as
    key -> vLLM block ids, keyed as its events key it (the block hash without the group id, the
    engine's external form); only KV-cache group `group`'s entries when given."""
    utils = modules["vllm.v1.core.kv_cache_utils"]
    index = {}
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        if group is not None and utils.get_group_id(key) != group:
            continue
        blocks = blocks.values() if isinstance(blocks, dict) else [blocks]
        external = utils.maybe_convert_block_hash(utils.get_block_hash(key))
        index.setdefault(external, []).extend(block.block_id for block in blocks)
    return index


def _float32():
    import torch  # the KV-cache spec names a dtype; the manager never allocates tensors
    return torch.float32


def make(**config) -> VllmV1Subject:
    """The factory of `pagedkv fuzz vllm`: vLLM 0.33.0's manager."""
    return VllmV1Subject(**config)


make.config_space = CONFIG_SPACE
make.capabilities = VllmV1Subject.capabilities
