"""The prefix index's batched paths against a plain model, on the shapes a serving run gives them:
prompts (chains of up to a dozen blocks, after nothing or after a cached block), decode steps
(blocks each after a table's tail, tails shared by forks, some a sequence's first, now and
then one after an earlier block of the step or one indexed already) and evictions
the way the pool makes them (tables released tail first, so runs of blocks from a leaf up, whole
or cut short, several tables at once), with the irregular cases mixed in (a block named twice,
one not indexed, a run given root first, shared contents, contents that keep children).

Two-token blocks over a small alphabet make equal contents, and so shared nodes, common; keys
are real or squeezed into 3 values. After every step the index states exactly the model and its
invariant holds; a rolled-back mix of evictions and fills leaves it as it was; the batched paths
are taken where the shapes are the usual ones.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv.impl.alloc.content_keys import ContentKeys
from pagedkv.impl.alloc.prefix_cache import PrefixCache
from test_prefix_index import Subject, keys  # noqa: F401  (a fixture, used by name)

B, NUM_BLOCKS = 2, 40


class Pool(Subject):
    """A PrefixCache over its own blocks, the model beside it, and each filled block's parent
    block (how a table runs), from which evictions are drawn."""

    def __init__(self, alphabet: int = 2, num_blocks: int = NUM_BLOCKS):
        super().__init__(num_blocks)
        self.parent = {}   # filled block -> the block it was filled after (-1: none)
        self.alphabet = alphabet

    def content(self, rng) -> tuple:
        return tuple(rng.randrange(self.alphabet) for _ in range(B))

    def fill(self, blocks: list, parents: list, contents: list) -> None:
        fresh = {}   # the blocks the model indexes now: each at its first mention, as Subject.fill
        for block, parent in zip(blocks, parents):
            if block not in self.model:
                fresh.setdefault(block, parent)
        super().fill(blocks, parents, contents)
        self.parent.update(fresh)

    def run_up(self, leaf: int) -> list:
        """`leaf` and the blocks its table was filled after, while each still holds the prefix."""
        run = [leaf]
        while (up := self.parent[run[-1]]) >= 0 and self.model.get(up) == self.model[run[-1]][:-1] \
                and up not in run:
            run.append(up)
        return run

    def state(self) -> tuple:
        return self.cache.contents(), self.cache.holder_lists()


def prompt(pool: Pool, rng) -> None:
    free, indexed = pool.unindexed(), sorted(pool.model)
    if free:
        blocks = rng.sample(free, rng.randint(1, min(12, len(free))))
        after = rng.choice(indexed) if indexed and rng.random() < 0.4 else -1
        pool.fill(blocks, [after, *blocks[:-1]], [pool.content(rng) for _ in blocks])


def decode(pool: Pool, rng) -> None:
    free, indexed = pool.unindexed(), sorted(pool.model)
    if free and indexed:
        blocks = rng.sample(free, rng.randint(1, min(8, len(free))))
        tails = rng.sample(indexed, min(len(indexed), len(blocks)))
        parents = [rng.choice(tails) if rng.random() < 0.9 else -1 for _ in blocks]   # forks share a tail
        if len(blocks) > 2 and rng.random() < 0.1:
            parents[1] = blocks[0]                       # filled after an earlier one of the batch
        if rng.random() < 0.1:
            blocks.append(rng.choice(indexed))           # an indexed block keeps its content
            parents.append(rng.choice([-1, *indexed]))
        pool.fill(blocks, parents, [tuple(pool.tokens[b]) if b in pool.model else pool.content(rng) for b in blocks])


def evict(pool: Pool, rng) -> None:
    """Tables released tail first, evicted least recently released first: runs from leaves up."""
    indexed = sorted(pool.model)
    if not indexed:
        return
    leaves = [b for b in indexed if not any(pool.parent.get(c) == b for c in indexed)] or indexed
    blocks = []
    for leaf in rng.sample(leaves, rng.randint(1, min(5, len(leaves)))):
        run = [b for b in pool.run_up(leaf) if b not in blocks]
        if run:
            blocks += run[:rng.randint(1, len(run))] if rng.random() < 0.4 else run
    irregular = rng.random()
    if irregular < 0.05:
        blocks.append(rng.choice(blocks))                # a block named twice
    elif irregular < 0.1 and pool.unindexed():
        blocks.insert(rng.randrange(len(blocks) + 1), pool.unindexed()[0])   # one not indexed
    elif irregular < 0.15:
        blocks.reverse()                                 # root first
    pool.forget(blocks)


def lookup(pool: Pool, rng) -> None:
    indexed = sorted(pool.model)
    base = pool.model[rng.choice(indexed)] if indexed else ()
    text = base + tuple(pool.content(rng) for _ in range(rng.randint(0, 2)))
    flat = np.array([t for pair in text for t in pair] + [0], dtype=np.int64)
    assert pool.cache.lookup(flat, len(text)).tolist() == pool.expected_hits(text)


def rolled_back(pool: Pool, rng) -> None:
    """Evict, fill a prompt (on the ids just freed), decode, evict: then undo it all."""
    before, model, parent = pool.state(), dict(pool.model), dict(pool.parent)
    for part in (evict, prompt, decode, evict):
        part(pool, rng)
    pool.journal.rollback()
    pool.model, pool.parent = model, parent
    assert pool.state() == before


STEPS = {"prompt": prompt, "decode": decode, "evict": evict, "lookup": lookup, "rollback": rolled_back}


# The `keys` fixture only patches module functions, the same for every example: sharing it is intended.
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(alphabet=st.sampled_from([2, 50]),
       plan=st.lists(st.tuples(st.sampled_from(sorted(STEPS)), st.randoms(use_true_random=False)),
                     min_size=1, max_size=40))
def test_serving_shaped_batches_state_the_model(keys, alphabet, plan):
    pool = Pool(alphabet)
    for kind, rng in plan:
        STEPS[kind](pool, rng)
        pool.journal.undo.clear()
        pool.agrees()


def test_whole_tables_evicted_tail_first_take_the_batched_path(monkeypatch):
    """Two prompts sharing their first block (one content, two holders) and a third after the
    first prompt's second block: evicting the third's table and then the second's, tail first,
    is one pass each, without the general paths (one block at a time, or dying contents counted
    until they settle), and nothing is left of them; the shared first block's content keeps its
    other holder. Root first, the same blocks take a general path."""
    reached = []
    for name in ("_forget_one", "_dying"):
        original = getattr(PrefixCache, name)
        monkeypatch.setattr(PrefixCache, name, lambda self, *args, _o=original, _n=name: (reached.append(_n), _o(self, *args))[1])
    pool = Pool()
    pool.fill([0, 1, 2], [-1, 0, 1], [(1, 0), (0, 1), (1, 1)])
    pool.fill([3, 4], [1, 3], [(0, 0), (0, 0)])            # after (1, 0), (0, 1)
    pool.fill([5, 6, 7], [-1, 5, 6], [(0, 1), (1, 1), (1, 0)])
    pool.forget([4, 3])                                    # a run whose parent survives (it holds 1)
    pool.agrees()
    pool.forget([7, 6, 5, 2])                              # a whole table, and a leaf whose parent keeps its holder
    pool.agrees()
    assert reached == []
    assert sorted(pool.cache.live_nodes()) == sorted(int(pool.cache.block_node[b]) for b in (0, 1))
    pool.forget([0, 1])                                    # root first
    pool.agrees()
    assert reached == ["_dying"] and pool.cache.live_nodes() == []


def test_first_blocks_are_nobodys_children(keys):
    """A step of sequences' first blocks (after no block) counts no child anywhere: the last node
    id, handed out after them, starts with none (the node arrays hold one id per block here)."""
    pool = Pool(num_blocks=4)
    pool.fill([0, 1, 2], [-1, -1, -1], [(0, 0), (0, 1), (1, 0)])
    pool.fill([3], [-1], [(1, 1)])
    pool.agrees()


def test_evicting_the_lowest_of_two_holders_leaves_the_content_to_the_other(keys):
    """Two forks fill equal blocks after one tail (one content, two holders): a run from the
    lower one up evicts only that block's hold; the higher one still serves the prefix."""
    pool = Pool()
    pool.fill([0, 1], [-1, 0], [(1, 0), (0, 1)])
    pool.fill([2, 3], [1, 1], [(1, 1), (1, 1)])
    pool.forget([2])
    pool.agrees()
    prompt_tokens = np.array([1, 0, 0, 1, 1, 1, 9], dtype=np.int64)
    assert pool.cache.lookup(prompt_tokens, 3).tolist() == [0, 1, 3]
    pool.forget([3, 1])
    pool.agrees()
    assert pool.cache.lookup(prompt_tokens, 3).tolist() == [0]


def test_a_run_that_leaves_its_parent_bare_removes_it(keys):
    """A run whose parent content nobody holds any more (its holder was evicted before, it kept
    its child): the run's eviction leaves that parent with neither, and it goes too, with its
    own bare ancestors, while an ancestor with another child stays."""
    pool = Pool()
    pool.fill([0, 1, 2, 3], [-1, 0, 1, 2], [(1, 0), (0, 1), (1, 1), (0, 0)])
    pool.fill([4], [0], [(1, 1)])                          # (1, 0) has a second child
    pool.forget([1, 2])                                    # (0, 1) and (1, 1) are nobody's now
    pool.agrees()
    pool.forget([3])                                       # the leaf: its two bare ancestors go
    pool.agrees()
    assert len(pool.cache.live_nodes()) == 2               # (1, 0) held by 0, and 4's content
    prompt_tokens = np.array([1, 0, 0, 1, 1, 1, 0, 0, 9], dtype=np.int64)
    assert pool.cache.lookup(prompt_tokens, 4).tolist() == [0]


def test_many_runs_below_shared_parents(keys):
    """Six one-block runs, each a leaf after one of two held blocks (a decode step's forks): the
    parents lose six children in one eviction (more than the few counted one at a time) and stay,
    as they still hold their contents."""
    pool = Pool()
    pool.fill([0, 1], [-1, -1], [(1, 0), (0, 1)])
    leaves = list(range(2, 8))
    pool.fill(leaves, [0, 1, 0, 1, 0, 1], [(0, 0), (0, 1), (1, 0), (1, 1), (0, 1), (0, 0)])
    pool.agrees()
    pool.forget(leaves[::-1])
    pool.agrees()
    assert sorted(pool.model) == [0, 1]


def test_ids_freed_by_an_eviction_serve_a_decode_step_and_a_rollback(keys):
    """A whole table's eviction frees its node ids with their child counts; a decode step then
    takes them (each new content has no children yet), and undoing the step and the eviction
    gives the table back exactly; a chain filled on fresh ids and undone leaves them as new for
    the decode step that takes them next."""
    pool = Pool()
    pool.fill([0, 1, 2, 3], [-1, 0, 1, 2], [(1, 0), (0, 1), (1, 1), (0, 0)])
    pool.fill([4], [-1], [(0, 0)])
    pool.journal.undo.clear()
    before, model = pool.state(), dict(pool.model)
    pool.forget([3, 2, 1, 0])
    pool.fill([5, 6, 7], [4, 4, 4], [(1, 0), (0, 1), (1, 1)])   # three children of one node
    pool.agrees()
    pool.journal.rollback()
    pool.model = dict(model)
    assert pool.state() == before
    pool.agrees()
    pool.fill([5, 6], [-1, 5], [(1, 1), (1, 1)])             # a chain on fresh ids, undone
    pool.journal.rollback()
    pool.model = dict(model)
    pool.fill([5, 6, 7], [4, 4, 0], [(1, 0), (0, 1), (1, 1)])   # a decode step on the same fresh ids
    pool.agrees()


@settings(max_examples=100, deadline=None)
@given(block_size=st.integers(1, 16), data=st.data())
def test_one_rows_hash_is_the_batchs(block_size, data):
    """A lookup's first block is hashed alone, in Python ints: the same hash as in a batch, for
    any int64 tokens (negative and huge ones too)."""
    keys = ContentKeys(block_size)
    rows = np.array(data.draw(st.lists(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), min_size=block_size,
                                                max_size=block_size), min_size=1, max_size=5)), dtype=np.int64)
    assert [keys.block_hash(row) for row in rows] == keys.block_hashes(rows).tolist()
