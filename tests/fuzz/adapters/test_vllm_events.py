"""vLLM 0.33.0's KV-cache events and hash index under the `kv_events` / `index_content` oracles, and
the abort of a request vLLM never scheduled (issue 19, "protocol gaps").

- vLLM's own events, through the protocol, on programs worked out by hand from block_pool.py;
- planted bugs, each an instance-level patch of one real vLLM method: a lost `BlockRemoved`, an
  evicted block left in the hash index, and vLLM #18829's assertion that an aborted request has
  blocks; the ci profile catches each (correct vLLM, kv_events declared, passes the same run in
  test_vllm_v1.py);
- vLLM #49125 in the real 0.33.0 code: reachable only with two KV-cache groups, outside the
  protocol, so the same rule is applied to vLLM's own index directly.
"""

import pytest

from pagedkv.fuzz import events
from pagedkv.fuzz.adapters import vllm_v1
from pagedkv.fuzz.adapters.vllm_v1 import MAX_MODEL_LEN
from pagedkv.fuzz.harness import replay
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.spec import OutOfBlocks, UnknownSequence

from test_vllm_v1 import assert_ci_profile_catches, hash_kept_after_eviction   # the stale index entry: vLLM's other planted bugs


@pytest.fixture(scope="module", autouse=True)
def engine_loaded():
    """Load vLLM before any timed factory call (a first run downloads the wheel)."""
    vllm_v1.engine()


def make(num_blocks, block_size, prefix_caching=True):
    return vllm_v1.make(num_blocks=num_blocks, block_size=block_size, prefix_caching=prefix_caching)


# ---------------------------------------------------------------------- vLLM's events through the protocol


def test_a_prefill_stores_its_full_blocks_in_one_chained_event():
    """add(1, [1, 2, 3, 4, 5]) at B=2 fills two blocks: one BlockStored of two keys, no parent (the
    prompt's start), the four tokens they hold; the index names them by seq 1's first two blocks."""
    subject = make(3, 2)
    subject.add(1, [1, 2, 3, 4, 5])
    (stored,) = subject.kv_events()
    assert isinstance(stored, events.BlockStored)
    assert len(stored.keys) == 2 and stored.parent is None and stored.tokens == (1, 2, 3, 4)
    assert stored.block_size == 2
    assert subject.cache_index() == {stored.keys[0]: [subject.block_table(1)[0]],
                                     stored.keys[1]: [subject.block_table(1)[1]]}
    assert subject.kv_events() == []                       # taken once


def test_a_decoded_block_chains_from_the_prompts_last_key():
    subject = make(4, 2)
    subject.add(1, [1, 2, 3])
    (prompt,) = subject.kv_events()
    subject.append(1, 4)
    (decoded,) = subject.kv_events()
    assert decoded.parent == prompt.keys[-1] and decoded.tokens == (3, 4)


def test_eviction_publishes_the_removal():
    """N=2, B=2: seq 1's cached [1, 2] is released; seq 2 needs both blocks, so vLLM hands out the
    cached one (evicting it) and says so before storing seq 2's own."""
    subject = make(2, 2)
    subject.add(1, [1, 2, 3])
    (first,) = subject.kv_events()
    subject.free(1)
    subject.add(2, [7, 8, 9])
    removed, stored = subject.kv_events()
    assert removed == events.BlockRemoved((first.keys[0],)) and stored.tokens == (7, 8)
    assert list(subject.cache_index()) == [stored.keys[0]]


def test_caching_off_publishes_nothing():
    subject = make(4, 2, prefix_caching=False)
    subject.add(1, [1, 2, 3, 4, 5])
    assert subject.kv_events() == [] and subject.cache_index() == {}


# ---------------------------------------------------------------------- abort of a request never scheduled


def test_abort_of_a_refused_request_reaches_the_manager_and_changes_nothing():
    """vLLM keeps a request it cannot schedule waiting; aborting it frees it through the manager,
    which holds nothing for it. The protocol answers UnknownSequence; tables, free count, index and
    events are as before."""
    subject = make(2, 2)
    subject.add(1, [1, 2, 3])
    subject.kv_events()
    with pytest.raises(OutOfBlocks):
        subject.add(2, [4, 5, 6, 7, 8])
    index, table = subject.cache_index(), subject.block_table(1)
    calls = []
    free = subject.manager.free
    subject.manager.free = lambda request: calls.append(request.request_id) or free(request)
    with pytest.raises(UnknownSequence):
        subject.free(2)
    assert calls == ["2"]
    assert subject.block_table(1) == table and subject.num_free_blocks() == 0
    assert subject.cache_index() == index and subject.kv_events() == []


def asserts_aborted_request_has_blocks(**config):
    """vLLM #18829: `get_block_ids` asserted the request had blocks (`assert request_id in
    req_to_blocks`), so aborting a waiting request that was never scheduled crashed the engine core."""
    subject = vllm_v1.make(**config)
    manager, get_block_ids = subject.manager, subject.manager.get_block_ids

    def get_asserting(request_id):
        assert request_id in manager.coordinator.single_type_managers[0].req_to_blocks
        return get_block_ids(request_id)
    manager.get_block_ids = get_asserting
    return subject


# ---------------------------------------------------------------------- planted event and index bugs


def removal_not_published(**config):
    """An evicted block leaves the hash index, but no BlockRemoved is published
    (`BlockPool._emit_block_removed_events`): routers keep a key vLLM has dropped."""
    subject = vllm_v1.make(**config)
    subject.manager.block_pool._emit_block_removed_events = lambda hashes: None
    return subject


#: planted bug -> the oracles that are its symptoms. `hash_kept_after_eviction` (an evicted block
#: keeps its hash-index entry and no removal is published: the index and its mirror agree, on a block
#: that now holds other KV) is test_vllm_v1's planted bug, which that file's ci run cannot reach without
#: these oracles. The kept entry names a rewritten block
#: (index_content), or, when the block is filled again with the same content, vLLM finds the stale
#: entry already there and indexes nothing while its event announces one more block (kv_events).
PLANTED = {removal_not_published: ("kv_events",),
           hash_kept_after_eviction: ("index_content", "kv_events"),
           asserts_aborted_request_has_blocks: ("crash",)}
for _bug in PLANTED:
    _bug.capabilities = vllm_v1.make.capabilities
    _bug.config_space = vllm_v1.make.config_space


@pytest.mark.parametrize("bug", PLANTED, ids=lambda bug: bug.__name__)
def test_ci_profile_catches_planted_bug(bug):
    assert_ci_profile_catches(bug, PLANTED[bug])


def test_the_stale_entry_is_named_the_step_its_block_is_rewritten():
    """N=2, B=1: seq 1's blocks [5] and [5, 5] are cached and released (tail first, so [5, 5] is at
    the free queue's head); add(2, [6]) takes that block again. Correct vLLM drops its key; the
    planted pool keeps it on a block that now holds 6: caught at once, no later hit needed."""
    config = {"num_blocks": 2, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 0}
    program = [["add", [1, [5, 5]]], ["free", [1]], ["add", [2, [6]]]]
    replay(vllm_v1.make, config, program, policy="any")
    with pytest.raises(OracleFailure, match=r"\[index_content\] index key .* \(prefix \[5, 5\]\) names block \d, "
                                            r"which holds \[KV\(prefix=\(\), token=6\)\]"):
        replay(hash_kept_after_eviction, config, program, policy="any", capabilities=vllm_v1.make.capabilities)


# ---------------------------------------------------------------------- vLLM #49125 in 0.33.0's own code


def two_group_manager():
    """vLLM 0.33.0's own KVCacheManager for a model with two full-attention KV-cache groups, block
    sizes 4 and 2 (two page sizes), hashed every 2 tokens: the one configuration family in which its
    keys are finer than a block (the single-group coordinator asserts hash_block_size == block_size,
    so the protocol's one-table subject never meets partial keys). Events on, caching on."""
    modules = vllm_v1.engine()
    spec, utils = modules["vllm.v1.kv_cache_interface"], modules["vllm.v1.core.kv_cache_utils"]
    dtype = vllm_v1._float32()
    groups = [spec.KVCacheGroupSpec(["big"], spec.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1,
                                                                    dtype=dtype)),
              spec.KVCacheGroupSpec(["small"], spec.FullAttentionSpec(block_size=2, num_kv_heads=2, head_size=1,
                                                                      dtype=dtype))]
    config = spec.KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=groups)
    hash_fn = modules["vllm.utils.hashing"].get_hash_fn_by_name("sha256")
    utils.init_none_hash(hash_fn)
    with modules.active():
        manager = modules["vllm.v1.core.kv_cache_manager"].KVCacheManager(
            config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=4, hash_block_size=2,
            enable_caching=True, enable_kv_cache_events=True)
    return modules, manager, utils.get_request_block_hasher(2, hash_fn)


def refuse_covered_partial_keys(pool):
    """The fix proposed for #49125 (vLLM PRs 52972, 53158, not merged in 0.33.0), written here: a
    partial key is not registered on a block whose own key already covers as many tokens."""
    register = pool.cache_partial_block

    def guarded(request, block, num_tokens, kv_cache_group_id, block_size, replace_existing_hashes=False):
        if not replace_existing_hashes and block.block_hash is not None and \
                (block.block_hash_num_tokens or 0) >= num_tokens:
            return None
        return register(request=request, block=block, num_tokens=num_tokens, kv_cache_group_id=kv_cache_group_id,
                        block_size=block_size, replace_existing_hashes=replace_existing_hashes)
    pool.cache_partial_block = guarded


def big_group_after_decode(fixed: bool):
    """Prompt [1..7], then tokens 8 and 9, run as vLLM's scheduler runs them; the big group's events
    replayed into the kit's mirror and its own index. Returns (mirror, index)."""
    modules, manager, hasher = two_group_manager()
    if fixed:
        refuse_covered_partial_keys(manager.block_pool)
    request_module = modules["vllm.v1.request"]
    request = request_module.Request(request_id="1", prompt_token_ids=[1, 2, 3, 4, 5, 6, 7],
                                     sampling_params=request_module.SamplingParams(max_tokens=8),
                                     pooling_params=None, block_hasher=hasher)

    def fail(ok, message):
        assert ok, message
    mirror = events.IndexMirror(4, fail)
    blocks, hit = manager.get_computed_blocks(request)[:2]
    with modules.active():
        assert manager.allocate_slots(request, 7 - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                                      full_sequence_must_fit=True) is not None
        request.num_computed_tokens = 7
        for token in (8, 9):
            request.append_output_token_ids(token)
            assert manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
    for event in manager.take_events():
        if getattr(event, "group_idx", 0) == 0:   # the adapter's translation, for the big group's events
            mirror.apply(vllm_v1.kit_event(modules, event))
    return mirror, vllm_v1.hash_index(modules, manager.block_pool, group=0)


def test_vllm_0_33_names_a_filled_block_by_a_stale_partial_key():
    """vLLM #49125, in 0.33.0: the prompt's last hit boundary (6 tokens) ends inside the big group's
    second block [5, 6, 7, 8]. Once token 8 fills that block and its full key [1 .. 8] is stored,
    `_cache_partial_tail_block` still registers the 6-token boundary on it (`cache_partial_block`
    sees the block's key cover 8 tokens and adds the partial one beside it). The stream and the index
    agree (kv_events has nothing to say); the rule of index_content names the block."""
    mirror, index = big_group_after_decode(fixed=False)
    assert mirror.counted() == {key: len(blocks) for key, blocks in index.items()}
    (conflict,) = events.promotion_conflicts(index, mirror.prefix, 4)
    block, full, partial = conflict
    assert mirror.prefix[full] == (1, 2, 3, 4, 5, 6, 7, 8) and mirror.prefix[partial] == (1, 2, 3, 4, 5, 6)


def test_the_proposed_fix_passes_the_same_rule():
    mirror, index = big_group_after_decode(fixed=True)
    assert mirror.counted() == {key: len(blocks) for key, blocks in index.items()}
    assert events.promotion_conflicts(index, mirror.prefix, 4) == []
    assert sorted(len(prefix) for prefix in mirror.prefix.values()) == [4, 8]
