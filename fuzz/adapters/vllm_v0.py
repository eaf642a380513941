"""Historical vLLM releases as conformance subjects: `pagedkv fuzz vllm@VERSION` (issue 19).

`release(version)` returns the factory of one pinned release, its wheel installed into pagedkv's
wheel cache on first use (`wheels.install`, never the user's environment) together with the three
packages its block-management imports need (msgspec, psutil, pyzmq: binary wheels for this platform,
pinned in `DEPENDENCIES`, loaded privately like the engine).

Adapted releases (`RELEASES`):
- 0.33.0: `vllm_v1` (the current manager).
- 0.6.4.post1, 0.6.6.post1, 0.7.0: the first v1 `KVCacheManager` (vllm/v1/core/kv_cache_manager.py),
  driven as each release's own `vllm/v1/core/scheduler.py` drives it: a waiting request gets
  `get_computed_blocks(request)`, the scheduler's full-hit rule (0.6.4.post1 recomputes one token and
  drops the last hit block; 0.6.6.post1 and 0.7.0 recompute the whole last block), then
  `allocate_slots(request, num_new_tokens, computed_blocks)`; a running request `append_slots(request,
  1)` after its sampled token is appended; `free(request)`. Preallocation is off
  (`num_preallocate_tokens=0`, a constructor parameter): with vLLM's default of 64 tokens a table holds
  blocks for tokens not yet written, which the protocol's block table cannot express. These releases
  have no null block: ids are vLLM's own.
- 0.4.2, 0.4.3, 0.5.0.post1, 0.5.4, 0.5.5: v0's block manager v2 (vllm/core/block_manager_v2.py) with
  fork and copy-on-write, and swap from 0.5.0.post1 on (`BlockManagerV2Subject`).

Known bugs of the v1 releases (issue 19): 0.6.4.post1 recomputes only the last token of a full
hit, leaving the re-allocated block's other slots unwritten (fixed by vLLM #11186); 0.6.6.post1 touches
the hit blocks before its free-block check, so a refused allocation leaks them (#11562, fixed by #11565).

Known bugs of the v0 releases: a block taken from the evictor stays in `_cached_blocks` (0.4.2, #4764);
a block re-allocated from the evictor is created `computed=True`, its stale KV reported as a prefix
hit (0.4.2 .. 0.5.0.post1, fixed by #5364); `get_num_blocks_touched` counts a cached block in the
evictor as free, so `can_swap_in` / `can_swap_out` admit and the swap raises NoFreeBlocksError
(0.5.0.post1 and 0.5.4, fixed by #6849). Never fixed in v0, from 0.5.1 on: `free()` of a swapped-out
sequence (the scheduler's abort of a swapped request) applies the scheduler's last-access stamp to its
CPU block ids through the GPU allocator (KeyError, prefix caching on), and returns its block objects,
which came from the GPU allocator's `BlockPool`, into the CPU allocator's smaller pool, so a later swap
draws a pool slot that does not exist (IndexError). Each has a directed program in
tests/fuzz/adapters/test_vllm_releases.py.
"""

import copy
import functools
import importlib

from pagedkv.spec import DuplicateSequence, InvalidState, OutOfBlocks, UnknownSequence

from . import vllm_v1, wheels
from .wheels import Stub, placeholders

#: Wheels of the packages the historical block-management imports need (0.7.0's `vllm.utils` imports
#: cloudpickle at the top; a fresh environment has none).
DEPENDENCIES = wheels.pinned("msgspec", "pyzmq", "psutil", "cloudpickle")
PACKAGES = vllm_v1.PACKAGES + ("psutil", "cloudpickle")
HISTORICAL_V1 = ("0.6.4.post1", "0.6.6.post1", "0.7.0")
MODULES = ("vllm.v1.core.kv_cache_manager", "vllm.v1.request", "vllm.sampling_params", "vllm.inputs.data")
MAX_MODEL_LEN = 1 << 20


def _unspecified_platform(module) -> None:
    """vLLM's own `UnspecifiedPlatform` (vllm/platforms/interface.py, real) as the current platform."""
    module.current_platform = importlib.import_module("vllm.platforms.interface").UnspecifiedPlatform()


def _input_records(module) -> None:
    """The prompt records of vllm/inputs/data.py (real), re-exported as the package does."""
    data = importlib.import_module("vllm.inputs.data")
    for name in (name for name in vars(data) if not name.startswith("_")):
        setattr(module, name, getattr(data, name))


def _config_names(module) -> None:
    placeholders("VllmConfig")(module)


#: Stubs of the historical v1 releases (module -> why), in addition to nothing else: the rest of the
#: import closure of their kv_cache_manager, request and sampling params loads from the wheel.
STUBS_V1 = {
    "vllm": Stub("package __init__ skipped: it imports the whole engine (LLM, AsyncLLMEngine, model "
                 "registry); submodules load from the wheel", hollow=True),
    "vllm.platforms": Stub("package __init__ skipped: it probes for CUDA, ROCm, TPU, XPU, HPU, Neuron; "
                           "current_platform is vLLM's UnspecifiedPlatform (its interface module is real)",
                           _unspecified_platform, hollow=True),
    "vllm.inputs": Stub("package __init__ skipped: its registry imports transformers (model input "
                        "processing); the prompt records of vllm.inputs.data are real", _input_records,
                        hollow=True),
    "vllm.multimodal": Stub("multimodal subsystem (PIL, media plugins); fuzzed requests are text-only",
                            placeholders("MultiModalKwargs", "MultiModalDataDict", "MultiModalPlaceholderDict")),
    "vllm.logits_process": Stub("logits processors import the tokenizers (huggingface_hub, transformers); "
                                "sampling params name their type only", any_name=True),
    "vllm.v1.engine": Stub("engine-core client/server messages (msgspec over ZMQ); Request names their "
                           "type only", any_name=True),
    "vllm.model_executor.models.utils": Stub("model code (transformers); 0.7.0's vllm.v1.utils names "
                                             "extract_layer_index, for binding KV caches to layers",
                                             any_name=True),
    "vllm._custom_ops": Stub("the compiled CUDA kernels (vllm._C); block management calls none", any_name=True),
    "vllm.spec_decode.metrics": Stub("speculative-decoding metrics (0.5.5's sequence names their type; "
                                     "importing them pulls the model executor, circularly)", any_name=True),
    "vllm.config": Stub("0.7.0's engine config module imports transformers; kv_cache_utils names "
                        "VllmConfig only to size a cache from a full engine config", _config_names),
}


def stubs_for(root, stubs: dict) -> dict:
    """The stub table for one release: a hollow stub only where that name is a package in it (in
    0.4.3 and 0.5.0.post1 `vllm.inputs` is a small module of prompt records, loaded as it is)."""
    return {name: stub for name, stub in stubs.items()
            if not stub.hollow or (root / name.replace(".", "/")).is_dir()}


@functools.cache
def _engine(version: str, modules: tuple = MODULES):
    root = wheels.install("vllm", version, keep=wheels.python_sources)
    roots = [root] + [wheels.install(name, pinned) for name, pinned in DEPENDENCIES]
    return wheels.load(roots, PACKAGES, modules, stubs_for(root, STUBS_V1))


class HistoricalV1Subject:
    """vLLM 0.6.4.post1 .. 0.7.0's v1 `KVCacheManager`, driven as that release's scheduler drives it."""

    capabilities = frozenset({"prefix_caching"})
    config_space = {"block_sizes": tuple(range(1, 17)), "prefix_caching": (True, False)}

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, version: str = "0.7.0"):
        engine = self._engine = _engine(version)
        self.version, self.B = version, block_size
        sizes = {} if version == "0.6.4.post1" else {"max_model_len": MAX_MODEL_LEN}  # 0.6.4 has no limit
        with engine.active():
            self.manager = engine["vllm.v1.core.kv_cache_manager"].KVCacheManager(
                block_size=block_size, num_gpu_blocks=num_blocks, sliding_window=None,
                enable_caching=prefix_caching, num_preallocate_tokens=0, **sizes)
        self._request_module = engine["vllm.v1.request"]
        self._params = engine["vllm.sampling_params"].SamplingParams
        self._inputs = engine["vllm.inputs.data"].token_inputs
        self.requests = {}

    def _new_request(self, seq_id, tokens):
        params = self._params(max_tokens=MAX_MODEL_LEN)
        Request = self._request_module.Request
        if self.version == "0.7.0":
            return Request(str(seq_id), None, list(tokens), None, None, None, params, None, 0.0)
        return Request(str(seq_id), self._inputs(prompt_token_ids=list(tokens)), params, None, 0.0)

    # ------------------------------------------------------------------ protocol

    def add(self, seq_id, tokens) -> int:
        if seq_id in self.requests:
            raise DuplicateSequence(seq_id)
        request = self._new_request(seq_id, tokens)
        with self._engine.active():
            found = self.manager.get_computed_blocks(request)
        computed_blocks = list(found[0] if isinstance(found, tuple) else found)  # 0.7.0: (blocks, tokens)
        num_computed = len(computed_blocks) * self.B
        num_new = request.num_tokens - num_computed
        if num_new == 0:  # every block hit: the scheduler's rule of this release
            if self.version == "0.6.4.post1":
                num_computed, num_new = num_computed - 1, 1
            else:
                num_computed, num_new = num_computed - self.B, self.B
            computed_blocks.pop()
        if self.manager.allocate_slots(request, num_new, computed_blocks) is None:
            raise OutOfBlocks(needed=-1, available=self.num_free_blocks())
        request.status = self._request_module.RequestStatus.RUNNING
        request.num_computed_tokens = num_computed + num_new
        self.requests[seq_id] = request
        return num_computed

    def append(self, seq_id, token) -> list:
        request = self._request(seq_id)
        request.append_output_token_ids(int(token))  # these releases hash blocks only when caching them
        if self.manager.append_slots(request, 1) is None:  # refused before any block is cached
            request._output_token_ids.pop()   # the scheduler would preempt; the protocol wants no change
            request._all_token_ids.pop()
            raise OutOfBlocks(needed=1, available=self.num_free_blocks())
        request.num_computed_tokens += 1
        return []

    def fork(self, parent_id, child_id):
        raise NotImplementedError("vLLM v1 has no fork")

    def free(self, seq_id) -> None:
        request = self._request(seq_id)
        request.status = self._request_module.RequestStatus.FINISHED_ABORTED
        self.manager.free(request)
        del self.requests[seq_id]

    def block_table(self, seq_id) -> list:
        return [block.block_id for block in self.manager.req_to_blocks[self._request(seq_id).request_id]]

    def num_free_blocks(self) -> int:
        return self.manager.free_block_queue.num_free_blocks

    def _request(self, seq_id):
        if seq_id not in self.requests:
            raise UnknownSequence(seq_id)
        return self.requests[seq_id]


V0_RELEASES = ("0.4.2", "0.4.3", "0.5.0.post1", "0.5.4", "0.5.5")
V0_MODULES = ("vllm.core.block_manager_v2", "vllm.core.interfaces", "vllm.sequence", "vllm.sampling_params",
              "vllm.utils")
SWAP_FROM = "0.5.0.post1"  # BMv2 swaps from this release on (earlier: can_swap_out() is False)


class BlockManagerV2Subject:
    """vLLM v0's block manager v2 (vllm/core/block_manager_v2.py), driven as v0's scheduler drives it.

    Each protocol sequence is one `Sequence` in its own `SequenceGroup` (a fork's child gets a group
    of its own: the block manager keys everything by sequence id, groups only batch its checks).
    - add: `can_allocate(group)` (OK, else `OutOfBlocks`: LATER and NEVER both leave the request
      waiting), `allocate(group)`, the sequence RUNNING, the cached count as the model runner
      derives it (`len(get_common_computed_block_ids([seq])) * block_size`), then
      `mark_blocks_as_computed(group)` and the prefill counted as computed, as after the step;
    - append: the sampled token appended (`Sequence.append_token_id`), `can_append_slots(group, 0)`
      (False: the scheduler preempts; here the sequence is restored from a copy taken before the
      append and `OutOfBlocks` raised), `append_slots(seq, 0)`: its copy-on-writes are returned;
    - fork: `Sequence.fork(child_id)`, `fork(parent, child)`;
    - swap_out / swap_in (0.5.0.post1 on): `can_swap_out` / `can_swap_in(group, 0)`, `swap_out` /
      `swap_in(group)`, the mapping returned in table order; free: `free(seq)`.
    After allocate, append_slots and swap_in the sequence's blocks get the scheduler's access stamp
    (`access_all_blocks_in_seq`, a step count for the time), as `Scheduler.schedule` does for every
    running sequence it schedules; `access_stamps=False` leaves them out (see `unstamped`).
    Declared `conservative_admission`: `can_allocate` counts every prompt block, cache hits ignored,
    and `can_append_slots` assumes every touched block needs a new one (vLLM's "worst-case heuristic");
    `dedup_on_fill`: a copied-on-write tail that fills to a cached block's content is replaced by that
    block (`PrefixCachingBlockAllocator.promote_to_immutable_block`), `append` returning the copy it
    asked for; `swap_sharing` (with swap): the CPU allocator caches by content too, so a swap-out maps
    a full block onto the CPU block of another swapped sequence holding that content, and a swap-in
    maps one onto the GPU block a running sequence holds it in.
    """

    config_space = {"block_sizes": tuple(range(1, 17)), "prefix_caching": (True, False)}

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, version: str = "0.5.5", access_stamps: bool = True):
        engine = self._engine = _engine(version, V0_MODULES)
        self.version, self.B, self.access_stamps = version, block_size, access_stamps
        self._sequence, self._interfaces = engine["vllm.sequence"], engine["vllm.core.interfaces"]
        self._params = engine["vllm.sampling_params"].SamplingParams
        with engine.active():
            self.manager = engine["vllm.core.block_manager_v2"].BlockSpaceManagerV2(
                block_size=block_size, num_gpu_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks,
                watermark=0.0, sliding_window=None, enable_caching=prefix_caching)
        self.groups = {}  # seq id -> its SequenceGroup of one Sequence
        self.steps = 0    # the scheduler's clock: a step number stands in for time.time()

    @property
    def capabilities(self):
        return _v0_capabilities(self.version)

    # ------------------------------------------------------------------ vLLM objects

    def _new_group(self, seq):
        if self.version == "0.4.2":
            return self._sequence.SequenceGroup(str(seq.seq_id), [seq], self._params(), 0.0)
        return self._sequence.SequenceGroup(str(seq.seq_id), [seq], 0.0, sampling_params=self._params())

    def _new_sequence(self, seq_id, tokens):
        if self.version == "0.4.2":
            return self._sequence.Sequence(seq_id, None, list(tokens), self.B)
        return self._sequence.Sequence(seq_id, {"prompt_token_ids": list(tokens), "prompt": None,
                                                "multi_modal_data": None}, self.B)

    def _seq(self, seq_id):
        if seq_id not in self.groups:
            raise UnknownSequence(seq_id)
        group = self.groups[seq_id]
        return group, group.seqs_dict[seq_id]

    def _scheduled(self, seq) -> None:
        """What the scheduler does for every running sequence of the step it schedules
        (`Scheduler.schedule`): stamp its blocks' last access (LRU eviction order; from 0.5.1 on the
        stamp is applied to the block ids when the sequence is freed)."""
        self.steps += 1
        if self.access_stamps:
            self.manager.access_all_blocks_in_seq(seq, float(self.steps))

    def _computed(self, seq) -> None:
        if hasattr(seq.data, "update_num_computed_tokens"):
            seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())

    # ------------------------------------------------------------------ protocol

    def add(self, seq_id, tokens) -> int:
        if seq_id in self.groups:
            raise DuplicateSequence(seq_id)
        seq = self._new_sequence(seq_id, tokens)
        group = self._new_group(seq)
        if self.manager.can_allocate(group) != self._interfaces.AllocStatus.OK:
            raise OutOfBlocks(needed=-1, available=self.num_free_blocks())
        self.manager.allocate(group)
        seq.status = self._sequence.SequenceStatus.RUNNING
        self._scheduled(seq)
        cached = len(self.manager.get_common_computed_block_ids([seq])) * self.B
        self.manager.mark_blocks_as_computed(group)
        self._computed(seq)
        self.groups[seq_id] = group
        return cached

    def append(self, seq_id, token) -> list:
        group, seq = self._seq(seq_id)
        if seq.status != self._sequence.SequenceStatus.RUNNING:
            raise InvalidState(f"sequence {seq_id!r} is swapped out")
        before = copy.deepcopy(seq)
        token = int(token)
        seq.append_token_id(token, {token: self._sequence.Logprob(0.0)})
        if not self.manager.can_append_slots(group, 0):
            self.groups[seq_id] = self._new_group(before)
            raise OutOfBlocks(needed=1, available=self.num_free_blocks())
        copies = self.manager.append_slots(seq, 0)
        self._scheduled(seq)
        self.manager.mark_blocks_as_computed(group)
        self._computed(seq)
        if isinstance(copies, dict):  # 0.4.2: {source: [destinations]}
            return [(src, dst) for src, dsts in copies.items() for dst in dsts]
        return [tuple(pair) for pair in copies]

    def fork(self, parent_id, child_id) -> None:
        _, parent = self._seq(parent_id)
        if child_id in self.groups:
            raise DuplicateSequence(child_id)
        if parent.status != self._sequence.SequenceStatus.RUNNING:
            raise InvalidState(f"cannot fork sequence {parent_id!r}: it is swapped out")
        child = parent.fork(child_id)
        self.manager.fork(parent, child)
        self.groups[child_id] = self._new_group(child)

    def free(self, seq_id) -> None:
        _, seq = self._seq(seq_id)
        self.manager.free(seq)
        del self.groups[seq_id]

    def block_table(self, seq_id) -> list:
        _, seq = self._seq(seq_id)
        return list(self.manager.get_block_table(seq))

    def num_free_blocks(self) -> int:
        return self.manager.get_num_free_gpu_blocks()

    def swap_out(self, seq_id) -> list:
        group, seq = self._seq(seq_id)
        if seq.status != self._sequence.SequenceStatus.RUNNING:
            raise InvalidState(f"sequence {seq_id!r} is already swapped out")
        if not self.manager.can_swap_out(group):
            raise OutOfBlocks(needed=-1, available=self.manager.get_num_free_cpu_blocks(), pool="cpu")
        table = list(self.manager.get_block_table(seq))
        mapping = dict(self.manager.swap_out(group))
        seq.status = self._sequence.SequenceStatus.SWAPPED
        return [(gpu, mapping[gpu]) for gpu in table]

    def swap_in(self, seq_id) -> list:
        group, seq = self._seq(seq_id)
        if seq.status != self._sequence.SequenceStatus.SWAPPED:
            raise InvalidState(f"sequence {seq_id!r} is not swapped out")
        if self.manager.can_swap_in(group, 0) != self._interfaces.AllocStatus.OK:
            raise OutOfBlocks(needed=-1, available=self.num_free_blocks())
        cpu = self._engine["vllm.utils"].Device.CPU  # a swapped table holds absolute ids, after the GPU's
        cpu_table = [self.manager.block_allocator.get_physical_block_id(cpu, block)
                     for block in self.manager.get_block_table(seq)]
        mapping = dict(self.manager.swap_in(group))
        seq.status = self._sequence.SequenceStatus.RUNNING
        self._scheduled(seq)
        return [(cpu, mapping[cpu]) for cpu in cpu_table]


def _v0_capabilities(version: str) -> frozenset:
    swap = V0_RELEASES.index(version) >= V0_RELEASES.index(SWAP_FROM)
    return frozenset({"fork", "prefix_caching", "conservative_admission", "dedup_on_fill"}
                     | ({"swap", "swap_sharing"} if swap else set()))


def _block_manager_v2(version: str, access_stamps: bool = True):
    _engine(version, V0_MODULES)

    def make(**config):
        return BlockManagerV2Subject(**config, version=version, access_stamps=access_stamps)
    make.capabilities = _v0_capabilities(version)
    make.config_space = BlockManagerV2Subject.config_space
    make.__name__ = make.__qualname__ = f"vllm_{version.replace('.', '_')}{'' if access_stamps else '_unstamped'}"
    return make


def unstamped(version: str):
    """The factory of v0 release `version` driven without the scheduler's access stamps
    (`access_all_blocks_in_seq`): LRU eviction then orders by allocation, a free choice under
    policy `any`, and 0.5.1+'s `free()` of a swapped-out sequence never reaches its KeyError (a
    stamped sequence's CPU block ids looked up in the GPU allocator's tracker), which otherwise ends
    most examples with prefix caching on: the regression suite's dev-profile run of 0.5.5 sees past it."""
    if version not in V0_RELEASES:
        raise ValueError(f"no v0 adapter for vllm {version}; v0 releases: {', '.join(V0_RELEASES)}")
    return _block_manager_v2(version, access_stamps=False)


def _historical_v1(version: str):
    def make(**config):
        return HistoricalV1Subject(**config, version=version)
    make.capabilities = HistoricalV1Subject.capabilities
    make.config_space = HistoricalV1Subject.config_space
    make.__name__ = make.__qualname__ = f"vllm_{version.replace('.', '_')}"
    return make


def _pinned():
    vllm_v1.engine()  # installed and loaded now, before any call deadline
    return vllm_v1.make


def _loaded_historical_v1(version: str):
    _engine(version)
    return _historical_v1(version)


#: release -> its factory maker (which installs and loads the release first).
RELEASES = {vllm_v1.VERSION: _pinned,
            **{version: functools.partial(_loaded_historical_v1, version) for version in HISTORICAL_V1},
            **{version: functools.partial(_block_manager_v2, version) for version in V0_RELEASES}}


def release(version: str = None):
    """The subject factory of vLLM `version` (None: the pinned release, vllm_v1.VERSION), its wheel
    installed and its modules loaded. Raises ValueError for a release with no adapter."""
    version = version or vllm_v1.VERSION
    if version not in RELEASES:
        raise ValueError(f"no adapter for vllm {version}; adapted releases: {', '.join(sorted(RELEASES))}")
    return RELEASES[version]()
