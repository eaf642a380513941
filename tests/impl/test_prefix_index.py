"""The prefix index against a plain model: indexed block -> its prefix (every token up to the
block's end), a hit being the lowest-numbered indexed block with the prompt's prefix.

Random fills (a prompt's chain, or a decode step's blocks each after a block indexed before),
forgets (any indexed blocks, in any order, so contents nobody holds but that still have children
arise) and lookups, on two-token blocks over a two-letter alphabet (equal contents are common),
with the real keys and with keys squeezed into 3 values (every lookup and fill meets collisions,
which only content and parent may resolve). After every step the index states exactly the model
and its invariant holds; a rolled-back step leaves it as it was.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv.impl.alloc.prefix_cache as prefix_cache
from pagedkv.impl import BlockManager
from pagedkv.impl.alloc.journal import Journal
from pagedkv.impl.alloc.content_keys import ROOT, step
from pagedkv.impl.alloc.prefix_cache import PrefixCache

B, NUM_BLOCKS = 2, 12
block_tokens = st.tuples(st.integers(0, 1), st.integers(0, 1))


@pytest.fixture(params=["real keys", "3 keys"])
def keys(request, monkeypatch):
    if request.param == "3 keys":
        monkeypatch.setattr(prefix_cache, "dict_keys", lambda keys: (keys % np.uint64(3)).tolist())
        monkeypatch.setattr(prefix_cache, "dict_key", lambda key: key % 3)
    return request.param


class Subject:
    """A PrefixCache over its own pool, with the model beside it."""

    def __init__(self, num_blocks: int = NUM_BLOCKS):
        self.tokens = np.zeros((num_blocks, B), dtype=np.int64)
        self.journal = Journal()
        self.cache = PrefixCache(self.journal, self.tokens)
        self.model = {}   # indexed block -> prefix (a tuple of token pairs)

    def unindexed(self) -> list:
        return [b for b in range(len(self.tokens)) if b not in self.model]

    def fill(self, blocks: list, parents: list, contents: list) -> None:
        for block, content in zip(blocks, contents):   # written through the journal, as the manager does
            self.journal.assign(self.tokens, block, content)
        self.cache.fill(blocks, parents)
        for block, parent, content in zip(blocks, parents, contents):
            if block not in self.model:
                self.model[block] = (self.model[parent] if parent >= 0 else ()) + (content,)

    def forget(self, blocks: list) -> None:
        self.cache.forget(blocks)
        for block in blocks:
            self.model.pop(block, None)

    def expected_hits(self, prompt: tuple) -> list:
        hits = []
        for depth in range(1, len(prompt) + 1):
            holders = [b for b, prefix in self.model.items() if prefix == prompt[:depth]]
            if not holders:
                break
            hits.append(min(holders))
        return hits

    def agrees(self) -> None:
        assert self.cache.problems(self.tokens) == []
        assert self.cache.contents() == self.model


@st.composite
def steps(draw):
    """A list of (kind, choices) the test resolves against the state it has reached."""
    kinds = st.sampled_from(["chain", "each", "forget", "lookup", "rollback"])
    return draw(st.lists(st.tuples(kinds, st.randoms(use_true_random=False)), min_size=1, max_size=40))


def run_step(subject: Subject, kind: str, rng) -> None:
    indexed = sorted(subject.model)
    free = subject.unindexed()
    if kind == "chain" and free:
        blocks = rng.sample(free, rng.randint(1, min(4, len(free))))
        parent = rng.choice([-1, *indexed])
        subject.fill(blocks, [parent, *blocks[:-1]], [(rng.randint(0, 1), rng.randint(0, 1)) for _ in blocks])
    elif kind == "each" and free:
        blocks = rng.sample(free, rng.randint(1, min(4, len(free))))
        if indexed and rng.random() < 0.2:
            blocks.append(rng.choice(indexed))   # an indexed block keeps its content
        parents = [rng.choice([-1, *indexed]) for _ in blocks]
        contents = [tuple(subject.tokens[b]) if b in subject.model else (rng.randint(0, 1), rng.randint(0, 1))
                    for b in blocks]
        subject.fill(blocks, parents, contents)
    elif kind == "forget" and indexed:
        blocks = rng.sample(indexed, rng.randint(1, len(indexed)))
        if rng.random() < 0.2:   # a block named twice, and one not indexed: each is wiped once
            blocks += [rng.choice(blocks), *free[:1]]
        subject.forget(blocks)
    elif kind == "lookup":
        base = subject.model[rng.choice(indexed)] if indexed else ()
        prompt = base + tuple((rng.randint(0, 1), rng.randint(0, 1)) for _ in range(rng.randint(0, 2)))
        flat = np.array([t for pair in prompt for t in pair] + [0], dtype=np.int64)
        assert subject.cache.lookup(flat, len(prompt)).tolist() == subject.expected_hits(prompt)
    elif kind == "rollback":   # forget, fill (reusing the ids just freed), forget; then undo it all
        before, model = (subject.cache.contents(), subject.cache.holder_lists()), dict(subject.model)
        for part in ("forget", "chain", "forget"):
            if part == "forget" and subject.model:
                subject.forget(rng.sample(sorted(subject.model), rng.randint(1, len(subject.model))))
            elif part == "chain" and subject.unindexed():
                blocks = rng.sample(subject.unindexed(), rng.randint(1, min(3, len(subject.unindexed()))))
                subject.fill(blocks, [-1, *blocks[:-1]], [(rng.randint(0, 1), rng.randint(0, 1)) for _ in blocks])
        subject.journal.rollback()
        subject.model = model
        assert (subject.cache.contents(), subject.cache.holder_lists()) == before
    subject.journal.undo.clear()


# The `keys` fixture only patches module functions, the same for every example: sharing it is intended.
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=steps())
def test_the_index_states_the_model(keys, plan):
    subject = Subject()
    for kind, rng in plan:
        run_step(subject, kind, rng)
        subject.agrees()


def test_a_content_nobody_holds_keeps_its_children_findable(keys):
    subject = Subject()
    subject.fill([3, 5], [-1, 3], [(1, 0), (0, 1)])
    subject.forget([3])                                   # (1, 0) is held by nobody, (0, 1) after it by 5
    subject.agrees()
    prompt = np.array([1, 0, 0, 1, 7], dtype=np.int64)
    assert subject.cache.lookup(prompt, 2).tolist() == []          # a lookup stops where nobody holds the prefix
    subject.fill([8], [-1], [(1, 0)])                     # an equal block fills: the prefix is held again
    assert subject.cache.lookup(prompt, 2).tolist() == [8, 5]
    subject.agrees()


def test_one_python_hash_two_contents_through_the_manager():
    """`t` and `t + 2**61 - 1` share Python's int hash; the index tells them apart by content."""
    big = 2 ** 61 - 1
    bm = BlockManager(8, 2, prefix_caching=True)
    bm.add(1, [1, 2, 9])
    bm.add(2, [1, 2 + big, 9])
    assert bm.cached_tokens(2) == 0 and bm.cached_prefix_tokens([1, 2 + big, 5]) == 2
    assert bm.cache.contents() == {0: ((1, 2),), 2: ((1, 2 + big),)}
    bm.check()


@pytest.mark.parametrize("blocks, parents", [([4, 6], [9, 4]), ([4, 6], [9, 2]), ([4], [9])],
                         ids=["a chain", "two blocks", "one block"])
def test_a_fill_after_a_block_not_indexed_is_refused_and_undone(blocks, parents):
    """The manager never fills after an unindexed block; if it did, the index refuses it and the
    journal undoes what it did so far."""
    subject = Subject()
    subject.fill([2], [-1], [(1, 1)])
    subject.journal.undo.clear()
    before = (subject.cache.contents(), subject.cache.holder_lists())
    for block in blocks:
        subject.tokens[block] = (0, 1)
    with pytest.raises(RuntimeError, match="not indexed"):
        subject.cache.fill(blocks, parents)
    subject.journal.rollback()
    assert (subject.cache.contents(), subject.cache.holder_lists()) == before
    assert subject.cache.problems(subject.tokens) == []


def test_empty_batches_change_nothing():
    subject = Subject()
    subject.cache.fill([], [])
    subject.cache.forget([])
    assert subject.journal.undo == [] and subject.cache.contents() == {}


def test_the_common_cases_take_the_batched_paths(monkeypatch):
    """A new prompt's chain, one that begins with a cached prefix, a decode step's blocks and the
    eviction of sole holders are each one batched pass: the one-block-at-a-time paths, correct
    but slow, are not reached; only a chain that begins with a cached block probes its keys one
    by one, and a lookup follows runs of consecutive node ids instead (real keys: no
    collisions)."""
    reached = []
    for name in ("_fill_sequentially", "_forget_one", "_probe"):
        original = getattr(PrefixCache, name)
        monkeypatch.setattr(PrefixCache, name, lambda self, *args, _o=original, _n=name: (reached.append(_n), _o(self, *args))[1])
    subject = Subject()
    subject.fill([0, 1, 2], [-1, 0, 1], [(1, 0), (0, 1), (1, 1)])     # a new prompt
    subject.fill([3, 4], [2, 3], [(0, 0), (1, 0)])                    # its continuation
    subject.fill([5, 6, 7], [-1, 5, 6], [(1, 0), (0, 1), (0, 0)])     # cached (1, 0), (0, 1), then new
    subject.fill([8, 9], [4, 7], [(1, 1), (1, 1)])                    # a decode step
    subject.agrees()
    assert reached == ["_probe"]
    reached.clear()
    first_prompt = np.array([1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 5], dtype=np.int64)
    assert subject.cache.lookup(first_prompt, 5).tolist() == [0, 1, 2, 3, 4]   # two fills, one run of ids
    assert subject.cache.lookup(first_prompt[:7], 3).tolist() == [0, 1, 2]
    assert reached == []
    assert subject.cache.lookup(np.array([1, 0, 0, 1, 0, 0, 1, 1, 5], dtype=np.int64), 4).tolist() == [0, 1, 7, 9]
    assert reached == []                                              # three runs: nodes 0-1, 5, 7
    subject.forget([9, 8, 4])                                         # sole holders, two of one chain
    subject.agrees()
    assert reached == []
    subject.forget([6])                                               # one of two holders: one at a time
    subject.agrees()
    assert reached == ["_forget_one"]


def test_a_deeper_content_filed_under_a_first_blocks_key_is_no_first_block(monkeypatch):
    """Under squeezed keys a non-first content can be the one filed first under the key a
    prompt's first block gives, with the same tokens: it serves no hit (only a content after
    nothing is a prompt's first block)."""
    monkeypatch.setattr(prefix_cache, "dict_keys", lambda keys: (keys % np.uint64(3)).tolist())
    monkeypatch.setattr(prefix_cache, "dict_key", lambda key: key % 3)
    subject = Subject()
    keys = subject.cache.keys

    def key(parent_key: int, content: tuple) -> int:
        return step(parent_key, int(keys.block_hashes(np.array([content], dtype=np.int64))[0]))

    contents = [(0, 0), (0, 1), (1, 0), (1, 1)]
    a, t = next((a, t) for a in contents for t in contents
                if key(ROOT, a) % 3 != key(key(ROOT, a), t) % 3 == key(ROOT, t) % 3)
    subject.fill([0, 1], [-1, 0], [a, t])                # (a, t) is the first content under root t's key
    assert subject.cache.lookup(np.array([*t, 0], dtype=np.int64), 1).tolist() == []
    subject.fill([2], [-1], [t])
    assert subject.cache.lookup(np.array([*t, 0], dtype=np.int64), 1).tolist() == [2]
    subject.agrees()


def test_a_lookup_past_its_runs_probes_the_rest(monkeypatch):
    """Two prompts filled a block each in turn get every other node id: each block is a run of
    its own. A lookup follows up to RUNS of them, then probes every key left; the hits are the
    same either way."""
    reached = []
    original = PrefixCache._probe
    monkeypatch.setattr(PrefixCache, "_probe", lambda self, names: (reached.append(len(names)), original(self, names))[1])
    subject = Subject()
    ours, theirs = [(1, 0), (0, 1), (1, 1), (0, 0), (1, 0)], [(0, 0), (1, 1), (0, 1), (1, 0), (1, 1)]
    for i, (mine, other) in enumerate(zip(ours, theirs)):
        subject.fill([2 * i], [2 * i - 2 if i else -1], [mine])
        subject.fill([2 * i + 1], [2 * i - 1 if i else -1], [other])
    prompt = np.array([t for pair in ours for t in pair] + [0], dtype=np.int64)
    expected = subject.expected_hits(tuple(ours))
    assert expected == [0, 2, 4, 6, 8]
    assert subject.cache.lookup(prompt, 5).tolist() == expected and reached == []   # five runs
    monkeypatch.setattr(prefix_cache, "RUNS", 2)
    assert subject.cache.lookup(prompt, 5).tolist() == expected and reached == [3]  # two, then 3 keys
    subject.agrees()


def test_a_chain_is_not_joined_to_a_content_nobody_holds_under_its_squeezed_key(monkeypatch):
    """A chain's leading block whose key (squeezed) names a content nobody holds, with the same
    parent but other tokens, is a new content: the kept copy of the tokens tells them apart."""
    monkeypatch.setattr(prefix_cache, "dict_keys", lambda keys: (keys % np.uint64(3)).tolist())
    monkeypatch.setattr(prefix_cache, "dict_key", lambda key: key % 3)
    subject = Subject()

    def key(parent_key: int, content: tuple) -> int:
        return step(parent_key, int(subject.cache.keys.block_hashes(np.array([content], dtype=np.int64))[0]))

    contents = [(0, 0), (0, 1), (1, 0), (1, 1)]
    p, a, b = next((p, a, b) for p in contents for a in contents for b in contents
                   if a != b and key(ROOT, p) % 3 != key(key(ROOT, p), a) % 3 == key(key(ROOT, p), b) % 3)
    subject.fill([0, 1, 2], [-1, 0, 1], [p, a, (0, 0)])
    subject.forget([1])                                   # (p, a) is held by nobody; (p, a, (0, 0)) by 2
    subject.fill([3, 4], [0, 3], [b, (1, 1)])             # (p, b) files under (p, a)'s key
    subject.agrees()
    assert subject.cache.contents()[3] == (p, b)


def test_forgetting_one_of_several_holders_leaves_the_others_serving(keys):
    """Three blocks hold one content (filed without sharing, as a decode step's equal blocks are):
    forgetting the middle holder, then the lowest, leaves the last one serving the prefix, and
    forgetting it too leaves nothing served."""
    subject = Subject()
    subject.fill([1, 2, 3], [-1, -1, -1], [(1, 0)] * 3)
    prompt = np.array([1, 0, 7], dtype=np.int64)
    assert subject.cache.lookup(prompt, 1).tolist() == [1]
    for forgotten, served in (([2], [1]), ([1], [3]), ([3], [])):
        subject.forget(forgotten)
        subject.agrees()
        assert subject.cache.lookup(prompt, 1).tolist() == subject.expected_hits(((1, 0),)) == served


def test_a_chain_nobody_holds_above_a_held_block_stays_findable(keys):
    """Forgetting a chain's first two blocks in one batch, while the third still holds its
    content: both prefixes stay indexed (nobody holds them, but a held block follows them), and an
    equal prompt filed again finds the third block after its own two."""
    subject = Subject()
    subject.fill([1, 2, 3], [-1, 1, 2], [(1, 0), (0, 1), (1, 1)])
    subject.forget([1, 2])
    subject.agrees()
    prompt = np.array([1, 0, 0, 1, 1, 1, 7], dtype=np.int64)
    assert subject.cache.lookup(prompt, 3).tolist() == []          # nobody holds the first prefix
    subject.fill([5, 6], [-1, 5], [(1, 0), (0, 1)])
    subject.agrees()
    assert subject.cache.lookup(prompt, 3).tolist() == [5, 6, 3]


def test_a_holder_filed_between_two_others_keeps_the_later_one_listed(keys):
    """Holders of one content are kept in block order: block 2 filed after 1 and 3 goes between
    them, and once 1 and 2 are forgotten, 3 still serves the prefix."""
    subject = Subject()
    subject.fill([1, 3], [-1, -1], [(1, 0)] * 2)
    subject.fill([2], [-1], [(1, 0)])
    prompt = np.array([1, 0, 7], dtype=np.int64)
    for forgotten, served in (([], [1]), ([1], [2]), ([2], [3])):
        subject.forget(forgotten)
        subject.agrees()
        assert subject.cache.lookup(prompt, 1).tolist() == subject.expected_hits(((1, 0),)) == served
