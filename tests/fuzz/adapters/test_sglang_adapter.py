"""The `sglang` target: SGLang 0.5.23's real radix cache and allocators behind the conformance protocol.

The first run installs the pinned wheel (and the few pure-Python packages its cache modules import)
into pagedkv's wheel cache; nothing here is skipped when that fails: the test fails, saying why.

- SGLang's own behaviour, seen through the protocol (tables, hit counts, free counts), on programs
  small enough to work out by hand;
- the two places where correct SGLang and the spec's deterministic choices part (the oracles they fire
  under the spec's exact policy; docs/conformance.md, "SGLang");
- planted bugs, each an instance-level patch of one real SGLang method, caught by the harness.
"""

import pytest
from hypothesis import Phase

from pagedkv.fuzz.adapters import sglang
from hypothesis import Verbosity
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.fuzz.harness import machine_for, replay
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.fuzz.profiles import settings_for
from pagedkv.fuzz.subjects import resolve
from pagedkv.spec import KVSpec, OutOfBlocks, UnknownSequence, DuplicateSequence

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]


def make(num_blocks, block_size, prefix_caching=True):
    return sglang.make(num_blocks=num_blocks, block_size=block_size, prefix_caching=prefix_caching)


# ---------------------------------------------------------------------- SGLang through the protocol


def test_the_real_engine_objects_are_driven():
    subject = make(4, 2)
    assert type(subject.cache).__module__ == "sglang.srt.mem_cache.radix_cache"
    assert type(subject.cache).__name__ == "RadixCache"
    assert type(subject.allocator).__name__ == "PagedTokenToKVPoolAllocator"
    assert type(make(4, 1).allocator).__name__ == "TokenToKVPoolAllocator"


def test_target_resolves_with_its_declarations():
    subject = resolve("sglang")
    assert subject.capabilities == frozenset({"prefix_caching"})
    probe = subject.factory(num_blocks=2, block_size=2, prefix_caching=False, num_cpu_blocks=0)
    assert probe.config_space["prefix_caching"] == (True, False)
    assert set(probe.config_space["block_sizes"]) == set(range(1, 17))


def test_prompt_published_after_prefill_and_the_last_token_computed():
    subject = make(8, 2)
    assert subject.add(1, [5, 6, 7, 8, 9]) == 0
    assert subject.block_table(1) == [0, 1, 2]          # SGLang's pages 1, 2, 3; page 0 is padding
    assert subject.num_free_blocks() == 5
    # The two full prompt pages are in the tree after the prefill: a second request hits them while
    # the first still runs. Its own prompt is 4 tokens: the hit stops at 3, page-aligned 2.
    assert subject.add(2, [5, 6, 7, 8]) == 2
    assert subject.block_table(2) == [0, 1]             # page [7, 8] recomputed, then shared (below)
    assert subject.num_free_blocks() == 5


def test_recomputed_full_page_is_deduplicated_into_the_tree_copy():
    """After the prefill, `checkpoint` inserts the prompt; a page it recomputed that the tree already
    holds is freed and the request's row repointed to the tree's copy: both tables share it."""
    subject = make(4, 2)
    subject.add(1, [0, 1, 2, 3])
    assert subject.add(2, [0, 1, 2, 3]) == 2            # at most len - 1 = 3 tokens, page-aligned: 2
    assert subject.block_table(2) == subject.block_table(1) == [0, 1]
    assert subject.num_free_blocks() == 2
    spec = KVSpec(num_blocks=4, block_size=2, prefix_caching=True)
    spec.add(1, [0, 1, 2, 3])
    spec.add(2, [0, 1, 2, 3])
    assert spec.num_free_blocks() == 1                   # the spec keeps the fresh copy


def test_decode_pages_are_published_only_when_the_request_ends():
    subject = make(8, 2)
    subject.add(1, [0, 1])
    subject.append(1, 2)
    subject.append(1, 3)                                 # page [2, 3] is full, but not in the tree
    assert subject.add(2, [0, 1, 2, 3, 0]) == 2
    subject.free(1)
    subject.free(2)
    assert subject.add(3, [0, 1, 2, 3, 0]) == 4          # released: the whole sequence was inserted


def test_radix_disabled_serves_nothing_and_frees_everything():
    subject = make(4, 2, prefix_caching=False)
    subject.add(1, [0, 1, 2, 3])
    subject.free(1)
    assert subject.add(2, [0, 1, 2, 3]) == 0
    subject.free(2)
    assert subject.num_free_blocks() == 4 and subject.cache.evictable_size() == 0


def test_eviction_reclaims_released_pages():
    subject = make(3, 2)
    subject.add(1, [0, 1, 2, 3, 4])
    subject.free(1)                                      # [0,1] [2,3] cached, [4] freed
    assert subject.num_free_blocks() == 3
    assert subject.add(2, [7, 7, 7, 7, 7]) == 0          # needs all three: both cached pages evicted
    assert subject.cache.evictable_size() == 0
    subject.free(2)
    assert subject.add(3, [0, 1, 2]) == 0                # the evicted prefix is gone


def test_eviction_takes_a_whole_tree_node():
    """The tree keeps [0, 1, 2, 3] as one node of two pages, and evicts by node: a request short of
    one token's worth of room loses both pages."""
    subject = make(4, 2)
    subject.add(1, [0, 1, 2, 3, 9])
    subject.free(1)
    subject.add(2, [5])
    assert subject.cache.evictable_size() == 4
    subject.add(3, [6])                                  # one page free, the extend path asks for two
    assert subject.cache.evictable_size() == 0
    subject.free(2)
    subject.free(3)
    assert subject.add(4, [0, 1, 2, 3, 8]) == 0


def test_refusals_change_nothing():
    subject = make(2, 2)
    subject.add(1, [0, 1, 2])
    before = (subject.block_table(1), subject.num_free_blocks())
    with pytest.raises(OutOfBlocks):
        subject.add(2, [3, 3, 3])
    subject.append(1, 3)
    with pytest.raises(OutOfBlocks):
        subject.append(1, 4)                             # a third page: there is none
    assert subject.block_table(1) == before[0] and subject.num_free_blocks() == 0
    with pytest.raises(DuplicateSequence):
        subject.add(1, [0])
    with pytest.raises(UnknownSequence):
        subject.free(9)
    subject.free(1)
    assert subject.num_free_blocks() == 2
    with pytest.raises(ValueError):
        make(0, 2)


def test_page_sizes_beyond_the_declared_range_work():
    subject = make(4, 32)
    assert subject.add(1, list(range(40))) == 0 and subject.block_table(1) == [0, 1]
    subject.free(1)
    assert subject.add(2, list(range(70))) == 32       # the one full page of seq 1's 40 tokens


# ---------------------------------------------------------------------- where correct SGLang and the spec part

#: (oracle, config, program): correct SGLang behaviour that the spec's exact policy reports. Each is a
#: legal choice, which policy `any` accepts (docs/conformance.md, "SGLang").
DIVERGENCES = {
    # checkpoint() shares the recomputed last page with the tree: one block more stays free.
    "recomputed page shared": ("oom_exact", {"num_blocks": 4, "block_size": 1},
                               [["add", [2, [0, 0, 0]]], ["add", [3, [0, 0, 0]]], ["add", [4, [0, 0, 0]]]]),
    # the paged extend path evicts for one page more than the prompt needs (its conservative estimate),
    # so the released [0, 1] is evicted although two pages were free; its page is reused at once.
    "extend evicts a page it does not need": ("cache_hit", {"num_blocks": 3, "block_size": 2},
                                              [["add", [1, [0, 1, 9]]], ["free", [1]], ["add", [2, [2, 3, 9]]],
                                               ["free", [2]], ["add", [3, [0, 1, 5]]]]),
    # eviction takes a whole tree node: [0, 1, 2, 3] is one node of two pages, both evicted for add(3).
    "eviction takes a whole node": ("cache_hit", {"num_blocks": 4, "block_size": 2},
                                    [["add", [1, [0, 1, 2, 3, 9]]], ["free", [1]], ["add", [2, [5]]],
                                     ["add", [3, [6]]], ["free", [2]], ["free", [3]], ["add", [4, [0, 1, 2, 3, 8]]]]),
    # a full decode page is published when the request ends, not when it fills.
    "decode page unpublished": ("cache_hit", {"num_blocks": 8, "block_size": 2},
                                [["add", [1, [0, 1]]], ["append", [1, 2]], ["append", [1, 3]],
                                 ["add", [2, [0, 1, 2, 3, 0]]]]),
}


def sglang_config(config):
    return {**config, "prefix_caching": True, "num_cpu_blocks": 0}


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_spec_policy_reports_these_legal_choices_and_policy_any_accepts_them(name):
    oracle, config, program = DIVERGENCES[name]
    with pytest.raises(OracleFailure) as failure:
        replay(sglang.make, sglang_config(config), program, policy="spec")
    assert failure.value.oracle == oracle
    replay(sglang.make, sglang_config(config), program, policy="any")


#: Why the target does not declare `complete_cache`: a decode step that needs no new page still evicts
#: one when no page is free (`alloc_paged_token_slots_decode` evicts page_size tokens per request), so
#: the released [0, 1] is dropped although its page is never handed out again.
DECODE_EVICTS_UNNEEDED = ({"num_blocks": 3, "block_size": 2},
                          [["add", [1, [0, 1]]], ["add", [2, [7]]], ["add", [3, [8]]], ["free", [1]],
                           ["append", [2, 9]], ["free", [2]], ["free", [3]], ["add", [4, [0, 1, 5]]]])


def test_sglang_is_not_a_complete_cache():
    config, program = DECODE_EVICTS_UNNEEDED
    replay(sglang.make, sglang_config(config), program, policy="any")
    with pytest.raises(OracleFailure) as failure:
        replay(sglang.make, sglang_config(config), program, policy="any",
               capabilities=sglang.SGLangRadixSubject.capabilities | {"complete_cache"})
    assert failure.value.oracle == "completeness"
    assert "add(4) serves 0 cached tokens" in failure.value.message


def campaign(factory, max_examples=None):
    """One derandomized CI-profile run under policy `any` (the default for engine targets), stopping at
    the first finding: the OracleFailure, or None."""
    machine = machine_for(factory, sglang.SGLangRadixSubject.capabilities, policy="any",
                          config_space=sglang.SGLangRadixSubject.config_space)
    overrides = {"max_examples": max_examples} if max_examples else {}
    try:
        run_state_machine_as_test(machine, settings=settings_for(
            "ci", phases=NO_SHRINK, verbosity=Verbosity.quiet, report_multiple_bugs=False, **overrides))
    except OracleFailure as failure:
        return failure
    return None


def test_ci_campaign_under_policy_any_finds_nothing():
    failure = campaign(sglang.make, max_examples=60)
    assert failure is None, f"{failure.oracle}: {failure.message}\n" + "\n".join(failure.report["trace"])


# ---------------------------------------------------------------------- planted bugs: instance-level patches


def unlocked_hit(subject):
    """The admission lock of a cache hit is not taken (`RadixCache.lock` returns no lock for the node
    an admission match returned): the hit can be evicted by the request's own allocation."""
    cache, real_match, real_lock = subject.cache, subject.cache.match_prefix, subject.cache.lock
    hit = []

    def match_prefix(params):
        result = real_match(params)
        admission = params.key.limit is not None          # checkpoint's own re-match has no limit
        hit[:] = [result.last_device_node] if admission and result.device_prefix_len else []
        return result

    def lock(node):
        if hit and node is hit[0]:
            hit.clear()
            return None
        return real_lock(node)

    cache.match_prefix, cache.lock = match_prefix, lock
    return subject


def stale_after_eviction(subject):
    """`RadixCache._delete_leaf` does its bookkeeping but leaves the evicted node in its parent."""
    cache = subject.cache

    def _delete_leaf(node):
        cache.evictable_size_ -= len(node.key)
        cache.evictable_leaves.discard(node)

    cache._delete_leaf = _delete_leaf
    return subject


def leaked_page_on_free(subject):
    """`free_segments` (the release path's free of the pages the tree does not keep) drops the last page."""
    allocator, real = subject.allocator, subject.allocator.free_segments

    def free_segments(segments):
        segments = [segment for segment in segments if segment[0].numel()]
        if segments:
            index, start = segments[-1]
            segments[-1] = (index[:(index.numel() - 1) // allocator.page_size * allocator.page_size], start)
        real(segments)

    allocator.free_segments = free_segments
    return subject


def whole_prompt_hit(subject):
    """`match_prefix` ignores the key's limit (len - 1): a fully cached prompt is served whole."""
    cache, real = subject.cache, subject.cache.match_prefix

    def match_prefix(params):
        params.key.limit = None
        return real(params)

    cache.match_prefix = match_prefix
    return subject


#: planted bug -> (config, a program that reaches it, the oracles that are its symptoms: which one a
#: campaign meets first varies, since SGLang evicts by wall-clock access time). Correct SGLang passes
#: each program, and under policy `any` fires none of these oracles in a campaign.
PLANTED = {
    # add(2)'s own allocation evicts the unlocked hit [0, 1] and hands its page out again
    unlocked_hit: ({"num_blocks": 3, "block_size": 2},
                   [["add", [1, [0, 1, 2]]], ["free", [1]], ["add", [2, [0, 1, 5, 5, 5]]]],
                   ("block_range", "readback", "free_count", "oom_exact")),
    # [0, 1] is evicted for add(2) but still matched by add(3), over seq 2's KV
    stale_after_eviction: ({"num_blocks": 2, "block_size": 2},
                           [["add", [1, [0, 1, 2]]], ["free", [1]], ["add", [2, [3, 3, 3, 3]]], ["free", [2]],
                            ["add", [3, [0, 1, 2]]]],
                           ("block_range", "readback", "free_count", "oom_exact", "cache_hit")),
    # the partial page [2] is never given back
    leaked_page_on_free: ({"num_blocks": 2, "block_size": 2}, [["add", [1, [0, 1, 2]]], ["free", [1]]],
                          ("free_count",)),
    # the whole prompt [0, 1, 2, 3] is served from the cache: no token is computed
    whole_prompt_hit: ({"num_blocks": 4, "block_size": 2},
                       [["add", [1, [0, 1, 2, 3]]], ["free", [1]], ["add", [2, [0, 1, 2, 3]]]],
                       ("cache_hit",)),
}


def planted(plant):
    return lambda **config: plant(sglang.make(**config))


@pytest.mark.parametrize("plant", list(PLANTED), ids=lambda plant: plant.__name__)
def test_planted_bug_is_caught_and_correct_sglang_passes(plant):
    config, program, symptoms = PLANTED[plant]
    replay(sglang.make, sglang_config(config), program, policy="any")    # correct SGLang: nothing fires
    with pytest.raises(OracleFailure) as failure:
        replay(planted(plant), sglang_config(config), program, policy="any")
    assert failure.value.oracle in symptoms, failure.value.message


def test_whole_prompt_hit_is_reported_as_such():
    config, program, _ = PLANTED[whole_prompt_hit]
    with pytest.raises(OracleFailure) as failure:
        replay(planted(whole_prompt_hit), sglang_config(config), program, policy="any")
    assert "of 4 tokens reports 4 cached tokens" in failure.value.message


@pytest.mark.parametrize("plant", list(PLANTED), ids=lambda plant: plant.__name__)
def test_ci_campaign_finds_planted_bug(plant):
    failure = campaign(planted(plant))
    assert failure is not None, f"{plant.__name__} escaped the CI profile"
    assert failure.oracle in PLANTED[plant][2] + ("crash",), f"{failure.oracle}: {failure.message}"
