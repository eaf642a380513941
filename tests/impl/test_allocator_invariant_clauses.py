"""Every clause of the allocator's invariant check (`BlockManager.check()`: impl/alloc/invariants.py,
the pools', the rows' and the prefix cache's `problems()`) fires on a corruption it names, and no
other clause does (issue 18, gap 5: `PrefixCache.problems` once lost a clause and `check()` then
accepted a cached block linked to a block that had left the index).

Corruptions are planted into valid states drawn as in tests/spec/test_invariant_clauses.py
(`invariant_clauses.valid_states`: anchor sequences, then a random program). The allocator's
layout is being reworked for speed: every write into its internals goes through the few helpers
under "layout", so a layout change is mended there."""

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from invariant_clauses import clauses_fired, message_templates, valid_states

from pagedkv.impl import BlockManager
from pagedkv.impl.alloc import invariants
from pagedkv.impl.alloc.block_pool import BlockPool
from pagedkv.impl.alloc.content_keys import dict_key
from pagedkv.impl.alloc.cpu_pool import CpuPool
from pagedkv.impl.alloc.prefix_cache import NONE, PrefixCache
from pagedkv.impl.alloc.rows import RUNNING_CODE, SWAPPED_CODE, UNUSED_CODE, WAITING_CODE, RowTables
from pagedkv.spec import InvariantViolation

#: clause -> (the invariant that reports it, the regex its messages match)
CLAUSES = {
    # conservation: BlockPool.problems, CpuPool.problems
    "gpu id outside": ("conservation", r"gpu block id -?\d+ outside the pool is free or evictable"),
    "gpu homes": ("conservation", r"gpu block \d+ is in \d+ of free/evictable/live"),
    "evictable unindexed": ("conservation", r"evictable block \d+ is not in the prefix index"),
    "free indexed": ("conservation", r"free block \d+ is in the prefix index"),
    "lru order": ("conservation", r"the evictable LRU is out of release order"),
    "evictable count": ("conservation", r"the pool counts \d+ evictable blocks, its LRU holds \d+"),
    "release count": ("conservation", r"a release stamp \(\d+\) is past the release count \(-?\d+\)"),
    "ring copies": ("conservation", r"the free queue's two copies differ"),
    "cpu homes": ("conservation", r"cpu block \d+ is in \d+ of free/held"),
    "cpu id outside": ("conservation", r"cpu block id -?\d+ outside the pool is free or held"),
    # refcount: invariants._refcount_problems
    "held twice": ("refcount", r"sequence \d+ holds a block twice: \[.*\]"),
    "table id outside": ("refcount", r"sequence \d+ holds block id -?\d+ outside the pool"),
    "ref count": ("refcount", r"block \d+: ref count -?\d+, held by \d+ tables"),
    # table_shape: invariants._shape_problems, RowTables.problems
    "row mapping": ("table_shape", r"sequence \d+ maps to row \d+, which holds (nothing|sequence \d+)"),
    "unmapped row": ("table_shape", r"row \d+ holds sequence \d+, which does not map to it"),
    "status code": ("table_shape", r"sequence \d+ has status code -?\d+, not running, waiting or swapped"),
    "blocks held": ("table_shape", r"\w+ sequence \d+ of length \d+ holds \d+ gpu / \d+ cpu blocks, "
                                   r"expected \(\d+, \d+\)"),
    "segment": ("table_shape", r"row \d+ holds \d+ blocks in a segment of \d+ at \d+ \(used \d+\)"),
    "past the table": ("table_shape", r"row \d+ has blocks past its \d+ in its segment"),
    "segments overlap": ("table_shape", r"arena slot \d+ is in \d+ segments"),
    "live count": ("table_shape", r"\d+ live arena slots counted, the live rows' segments hold another number"),
    "past used": ("table_shape", r"the arena past its used end holds blocks"),
    "free and live": ("table_shape", r"row \d+ is free and live"),
    "row partition": ("table_shape", r"the free rows and the live rows do not partition the rows"),
    "free row fields": ("table_shape", r"free row \d+ has fields \([-\d, ]+\), not \([-\d, ]+\)"),
    # cache_index: PrefixCache.problems (+ _node_problems, _sibling_problems), invariants._chain_problems
    "filed twice": ("cache_index", r"a content is filed under more than one key"),
    "indexed under dead": ("cache_index", r"block \d+ is indexed under content -?\d+, which is not live"),
    "not a holder": ("cache_index", r"indexed block \d+ is not among its content's holders"),
    "dead parent": ("cache_index", r"content \d+ follows content -?\d+, which is not live"),
    "stray holder": ("cache_index", r"block \d+ is a holder of a content it is not indexed under"),
    "holder order": ("cache_index", r"the holders of content \d+ are not in increasing block order"),
    "holder tokens": ("cache_index", r"block \d+ does not hold the tokens of its content"),
    "kept unheld": ("cache_index", r"a content no block holds is kept"),
    "no orphan copy": ("cache_index", r"content \d+ nobody holds keeps no copy of its tokens"),
    "needless copy": ("cache_index", r"content \d+ is held and also keeps a copy of its tokens"),
    "wrong key": ("cache_index", r"content \d+ is filed under a key its parent and tokens do not give"),
    "live and free": ("cache_index", r"content id \d+ is both live and free"),
    "neither live nor free": ("cache_index", r"content id \d+ is neither live nor free"),
    "twin contents": ("cache_index", r"two contents have one parent and the same tokens"),
    "child count": ("cache_index", r"content \d+ counts \d+ children, has \d+"),
    "chain": ("cache_index", r"sequence \d+'s block \d+ is indexed after another prefix than its own"),
}
#: Every function that states clauses, with the clauses it states (counted in its source).
STATED_BY = {
    BlockPool.problems: ("gpu id outside", "gpu homes", "evictable unindexed", "free indexed", "lru order",
                         "evictable count", "release count", "ring copies"),
    CpuPool.problems: ("cpu homes", "cpu id outside"),
    invariants._refcount_problems: ("held twice", "table id outside", "ref count"),
    invariants._shape_problems: ("row mapping", "status code", "blocks held", "unmapped row"),
    RowTables.problems: ("segment", "past the table", "segments overlap", "live count", "past used",
                         "free and live", "row partition", "free row fields"),
    PrefixCache.problems: ("filed twice", "indexed under dead", "not a holder", "live and free",
                           "neither live nor free"),
    PrefixCache._node_problems: ("dead parent", "stray holder", "holder order", "holder tokens", "kept unheld",
                                 "no orphan copy", "needless copy", "wrong key"),
    PrefixCache._sibling_problems: ("twin contents", "child count"),
    invariants._chain_problems: ("chain",),
}

MANAGERS = st.builds(lambda max_seqs, width: lambda num_blocks, block_size, num_cpu_blocks: BlockManager(
    num_blocks, block_size, num_cpu_blocks=num_cpu_blocks, prefix_caching=True, max_seqs=max_seqs,
    max_blocks_per_seq=width), st.integers(1, 8), st.integers(1, 4))

# ---------------------------------------------------------------------- layout
# The only functions that know how the pools, rows and prefix cache store their state.

def push_free(bm, block: int) -> None:
    """Put `block` at the back of the free queue (a ring), nothing else changed."""
    pool = bm.pool
    assume(pool.queued < pool.num_blocks)
    pool._ring_write((pool.head + pool.queued) % pool.num_blocks, np.array([block]))
    pool.queued += 1


def drop_newest_free(bm) -> None:
    assume(bm.pool.queued)
    bm.pool.queued -= 1


def file_evictable(bm, block: int, stamp: int) -> None:
    """Append `block` to the evictable LRU with this release stamp, nothing else changed."""
    pool = bm.pool
    if pool.lru_tail == len(pool.lru_block):
        pool.lru_block, pool.lru_stamp = (np.concatenate([a, np.zeros(len(a), dtype=np.int64)])
                                          for a in (pool.lru_block, pool.lru_stamp))
    pool.lru_block[pool.lru_tail], pool.lru_stamp[pool.lru_tail] = block, stamp
    pool.lru_tail += 1
    pool.stamp[block] = stamp
    pool.num_evictable += 1


def unfile_evictable(bm, block: int) -> None:
    """Take `block` out of the evictable LRU, nothing else changed (its log entry goes stale)."""
    bm.pool.stamp[block] = 0
    bm.pool.num_evictable -= 1


def set_table_block(bm, row: int, j: int, block: int) -> None:
    bm.rows.arena[bm.rows.start[row] + j] = block


def holders(bm, node: int) -> list:
    return bm.cache._holders(node)


def set_holders(bm, node: int, blocks: list) -> None:
    """Make `blocks`, in this order, the holder list of `node` (their own `block_node` untouched)."""
    cache = bm.cache
    cache.node_holder[node] = blocks[0] if blocks else NONE
    for block, after in zip(blocks, [*blocks[1:], NONE]):
        cache.next_holder[block] = after


def node_of(bm, block: int) -> int:
    return int(bm.cache.block_node[block])


def unused_node(bm) -> int:
    """A node id nobody uses, below `nodes_used` (so the cache counts it) and off the free list."""
    cache = bm.cache
    if cache.free_nodes:
        return cache.free_nodes.pop()
    assume(cache.nodes_used < len(cache.node_parent))
    cache.nodes_used += 1
    return cache.nodes_used - 1


# ---------------------------------------------------------------------- targets in a state
# The random part may (rarely) have evicted or preempted an anchor; a state without a target is
# skipped with `assume`.

def rows_with(bm, code: int) -> list:
    return [row for row in bm.row_of.values() if bm.rows.row_status[row] == code]


def private_tail(bm) -> int:
    """The row of a running sequence of >= 2 blocks whose partial tail only it holds (not indexed)."""
    for row in rows_with(bm, RUNNING_CODE):
        table = bm.rows.table(row)
        if len(table) >= 2 and bm.pool.ref_count[table[-1]] == 1 and node_of(bm, table[-1]) == NONE:
            return row
    assume(False)


def evictable(bm, index: int = 0) -> int:
    assume(len(bm.pool.evictable) > index)
    return list(bm.pool.evictable)[index]


def leaf_evictable(bm) -> int:
    """An evictable block whose content has a parent, one holder and no children (anchor 3's
    second block)."""
    for block in bm.pool.evictable:
        node = node_of(bm, block)
        if bm.cache.node_parent[node] != NONE and holders(bm, node) == [block] and not bm.cache.node_children[node]:
            return block
    assume(False)


def head_evictable(bm) -> int:
    """An evictable block that is its content's only holder, with a child content (anchor 3's first)."""
    for block in bm.pool.evictable:
        node = node_of(bm, block)
        if holders(bm, node) == [block] and bm.cache.node_children[node]:
            return block
    assume(False)


def shared_content(bm) -> int:
    """A first-block content with two or more holders and no child content (anchors 6 and 7)."""
    for node in bm.cache.live_nodes():
        if bm.cache.node_parent[node] == NONE and len(holders(bm, node)) >= 2 and not bm.cache.node_children[node]:
            return node
    assume(False)


def twin_rows(bm) -> tuple:
    """Two live rows with one table (a fork that has not written: anchors 4 and 5)."""
    live = [row for row in bm.row_of.values() if bm.rows.num_held[row]]
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            if bm.rows.table(a) == bm.rows.table(b) and bm.rows.capacity[a] == bm.rows.capacity[b]:
                return a, b
    assume(False)


# ---------------------------------------------------------------------- corruptions: conservation

def free_an_id_outside_the_pool(bm):
    push_free(bm, bm.num_blocks)


def change_one_copy_of_a_ring_slot(bm):
    """The slot just past the free queue's end, in one copy only (the queue itself reads the same)."""
    pool = bm.pool
    pool.ring[pool.head + pool.queued] += 1


def lose_a_free_block(bm):
    drop_newest_free(bm)


def unindex_an_evictable_block(bm):
    bm.cache.forget([evictable(bm)])


def index_a_free_block(bm):
    """A free block gets a first-block content of its own tokens: the index is sound, the pool not."""
    assume(bm.pool.free_queue)
    bm.cache.fill([bm.pool.free_queue[0]], [NONE])


def reorder_the_lru(bm):
    """The least recently released block moves to the LRU's end, keeping its release stamp."""
    evictable(bm, 1)   # two of them
    pool, block = bm.pool, evictable(bm, 0)
    stamp = int(pool.stamp[block])
    unfile_evictable(bm, block)
    pool.lru_stamp[pool.lru_head + np.flatnonzero(pool.lru_block[pool.lru_head:pool.lru_tail] == block)] = 0   # stale for good
    file_evictable(bm, block, stamp)


def miscount_the_evictable(bm):
    """The pool counts one evictable block more than its LRU holds (an allocation would then look
    for a victim that is not there)."""
    bm.pool.num_evictable += 1


def set_the_release_count_back(bm):
    """The release count falls below an evictable block's stamp (the next release would give an
    old, stale log entry that stamp again and make it current)."""
    bm.pool.releases = int(bm.pool.stamp[evictable(bm)]) - 1


def free_a_held_cpu_block(bm):
    [row, *_] = rows_with(bm, SWAPPED_CODE) or [assume(False)]
    bm.cpu_pool.free_queue.append(bm.rows.seq[row].cpu_block_table[0])


def free_a_cpu_id_outside_the_pool(bm):
    bm.cpu_pool.free_queue.append(bm.num_cpu_blocks)


# ---------------------------------------------------------------------- corruptions: refcount

def drop_a_reference(bm, block: int) -> None:
    """One table fewer holds `block`: a block nobody holds goes where release puts it."""
    pool = bm.pool
    pool.ref_count[block] -= 1
    if pool.ref_count[block] == 0 and node_of(bm, block) != NONE:
        pool.releases += 1
        file_evictable(bm, block, pool.releases)
    elif pool.ref_count[block] == 0:
        push_free(bm, block)


def repeat_a_block_in_a_table(bm):
    """The private tail's block also stands in for the second block (an unindexed block, so that
    no index chain runs through it), which is released."""
    row = private_tail(bm)
    table = bm.rows.table(row)
    set_table_block(bm, row, 1, table[-1])
    drop_a_reference(bm, table[1])


def table_names_an_id_outside_the_pool(bm):
    row = private_tail(bm)
    table = bm.rows.table(row)
    set_table_block(bm, row, len(table) - 1, bm.num_blocks)
    drop_a_reference(bm, table[-1])


def overcount_a_live_block(bm):
    bm.pool.ref_count[bm.rows.table(private_tail(bm))[0]] += 1


# ---------------------------------------------------------------------- corruptions: table_shape

def waiting_row(bm) -> int:
    return (rows_with(bm, WAITING_CODE) or [assume(False)])[0]


def map_a_sequence_to_a_free_row(bm):
    """A waiting sequence (no blocks) moves to a free row, its own row freed: the rows stay
    consistent, only the sequence's mapping names an empty row."""
    rows, row = bm.rows, waiting_row(bm)
    assume(rows.free_rows)
    seq_id = rows.seq[row].seq_id
    bm.row_of[seq_id] = rows.free_rows[-1]
    rows.seq[row], rows.row_status[row] = None, UNUSED_CODE
    rows.seq_len[row] = rows.admitted[row] = 0   # the rest of a free row's fields, as `recycle` leaves them
    rows.free_rows.insert(0, row)


def unknown_status_code(bm):
    bm.rows.row_status[waiting_row(bm)] = UNUSED_CODE


def waiting_keeps_its_table(bm):
    bm.rows.row_status[private_tail(bm)] = WAITING_CODE


def segment_without_blocks(bm):
    """A waiting row (no table) claims a segment; the live count follows, so only the shape is wrong."""
    rows, row = bm.rows, waiting_row(bm)
    rows.capacity[row], rows.start[row] = 4, 0
    rows.live += 4


def block_past_the_table(bm):
    row = private_tail(bm)
    assume(bm.rows.num_held[row] < bm.rows.capacity[row])
    set_table_block(bm, row, int(bm.rows.num_held[row]), bm.rows.table(row)[0])


def overlap_two_segments(bm):
    """A fork's row reads its parent's segment, which holds the same table: no table changes, two
    segments share their slots (the fork's own segment is left as garbage, the live count kept)."""
    a, b = twin_rows(bm)
    bm.rows.start[b] = bm.rows.start[a]


def miscount_live_slots(bm):
    bm.rows.live += 1


def write_past_the_used_end(bm):
    rows = bm.rows
    assume(rows.used < len(rows.arena))
    rows.arena[rows.used] = 0


def duplicate_a_row(bm):
    """A free row gets a copy of a waiting sequence's record (a row leaked by a free, say): the
    sequence still maps to its own row, the copy to nobody."""
    rows, row = bm.rows, waiting_row(bm)
    assume(rows.free_rows)
    copy = rows.free_rows.pop()
    rows.seq[copy], rows.row_status[copy] = rows.seq[row], WAITING_CODE


def free_a_live_row(bm):
    bm.rows.free_rows.insert(0, waiting_row(bm))


def lose_a_free_row(bm):
    assume(bm.rows.free_rows)
    bm.rows.free_rows.pop(0)


def keep_a_length_on_a_free_row(bm):
    """A free row keeps a length (a recycle that missed a field): `take` would restore a row
    it hands out to other fields than it had."""
    assume(bm.rows.free_rows)
    bm.rows.seq_len[bm.rows.free_rows[-1]] = 1


# ---------------------------------------------------------------------- corruptions: cache_index

def file_a_content_twice(bm):
    node = shared_content(bm)
    bm.cache.by_key[-1] = node


def index_under_a_dead_content(bm):
    block = evictable(bm)
    bm.cache.forget([block])
    bm.cache.block_node[block] = unused_node(bm)
    bm.cache.free_nodes.append(int(bm.cache.block_node[block]))   # the id stays free: only the block is wrong


def index_under_a_content_that_does_not_list_it(bm):
    block, other = evictable(bm), shared_content(bm)
    bm.cache.forget([block])
    bm.cache.block_node[block] = other


def follow_a_dead_content(bm):
    """Anchor 3's second content follows an unused id that has its parent's key (so its own key
    is still right), and its parent counts one child fewer."""
    cache, node = bm.cache, node_of(bm, leaf_evictable(bm))
    parent, fake = int(cache.node_parent[node]), unused_node(bm)
    cache.free_nodes.append(fake)
    cache.node_key[fake] = cache.node_key[parent]
    cache.node_parent[node] = fake
    cache.node_children[parent] -= 1
    assume(holders(bm, parent))   # else the parent would be a kept unheld content


def unindex_a_holder(bm):
    """A live block (anchor 7's, a first and last full block: no index chain runs through it)
    drops its `block_node` but stays on its content's holder list."""
    bm.cache.block_node[holders(bm, shared_content(bm))[1]] = NONE


def reverse_a_holder_list(bm):
    node = shared_content(bm)
    set_holders(bm, node, holders(bm, node)[::-1])


def change_a_later_holders_tokens(bm):
    later = holders(bm, shared_content(bm))[1]
    bm.block_tokens[later, 0] += 1


def unhold_a_leaf(bm, leaf: int, keep_copy: bool) -> None:
    """`leaf`, an evictable block and its content's only holder, leaves the index and the LRU for
    the free queue; its content stays live with no holder (with a copy of its tokens if asked)."""
    cache, node = bm.cache, node_of(bm, leaf)
    if keep_copy:
        cache.orphans[node] = bm.block_tokens[leaf].copy()
    set_holders(bm, node, [])
    cache.block_node[leaf] = NONE
    unfile_evictable(bm, leaf)
    push_free(bm, leaf)


def keep_a_content_nobody_holds(bm):
    unhold_a_leaf(bm, leaf_evictable(bm), keep_copy=True)


def orphan_without_a_copy(bm):
    unhold_a_leaf(bm, head_evictable(bm), keep_copy=False)


def copy_a_held_content(bm):
    node = shared_content(bm)
    bm.cache.orphans[node] = bm.block_tokens[holders(bm, node)[0]].copy()


def file_under_a_wrong_key(bm):
    cache, node = bm.cache, node_of(bm, leaf_evictable(bm))
    del cache.by_key[dict_key(int(cache.node_key[node]))]
    cache.node_key[node] ^= np.uint64(1 << 40)
    cache.by_key[dict_key(int(cache.node_key[node]))] = node


def free_a_live_content(bm):
    bm.cache.free_nodes.append(shared_content(bm))


def lose_a_content_id(bm):
    cache = bm.cache
    if cache.free_nodes:
        cache.free_nodes.pop()
    else:
        assume(cache.nodes_used < len(cache.node_parent))
        cache.nodes_used += 1


def split_a_content_in_twins(bm):
    """The later holder of a shared first-block content gets a content of its own, equal to the
    first, filed beside it under the same key (a collision)."""
    cache, node = bm.cache, shared_content(bm)
    first, later, *rest = holders(bm, node)
    twin = unused_node(bm)
    cache.node_parent[twin], cache.node_key[twin], cache.node_children[twin] = NONE, cache.node_key[node], 0
    set_holders(bm, node, [first, *rest])
    set_holders(bm, twin, [later])
    cache.block_node[later] = twin
    name = dict_key(int(cache.node_key[node]))
    cache.collided[name] = (*cache.collided.get(name, ()), twin)


def overcount_children(bm):
    bm.cache.node_children[shared_content(bm)] += 1


def index_a_block_after_another_prefix(bm):
    """A running sequence's second block is swapped for anchor 3's evictable second block (filed
    after anchor 3's first): ref counts and the pool follow, only the chain is wrong."""
    row, stranger = private_tail(bm), leaf_evictable(bm)
    second = bm.rows.table(row)[1]
    assume(node_of(bm, second) != NONE)
    set_table_block(bm, row, 1, stranger)
    unfile_evictable(bm, stranger)
    bm.pool.ref_count[stranger] = 1
    drop_a_reference(bm, second)


Corruption = namedtuple("Corruption", "clause plant companions why", defaults=((), ""))
CORRUPTIONS = [
    Corruption("gpu id outside", free_an_id_outside_the_pool),
    Corruption("gpu homes", lose_a_free_block),
    Corruption("evictable unindexed", unindex_an_evictable_block),
    Corruption("free indexed", index_a_free_block),
    Corruption("lru order", reorder_the_lru),
    Corruption("evictable count", miscount_the_evictable),
    Corruption("release count", set_the_release_count_back),
    Corruption("ring copies", change_one_copy_of_a_ring_slot),
    Corruption("cpu homes", free_a_held_cpu_block),
    Corruption("cpu id outside", free_a_cpu_id_outside_the_pool),
    Corruption("held twice", repeat_a_block_in_a_table),
    Corruption("table id outside", table_names_an_id_outside_the_pool),
    Corruption("ref count", overcount_a_live_block),
    Corruption("row mapping", map_a_sequence_to_a_free_row),
    Corruption("unmapped row", duplicate_a_row),
    Corruption("status code", unknown_status_code),
    Corruption("blocks held", waiting_keeps_its_table),
    Corruption("segment", segment_without_blocks),
    Corruption("past the table", block_past_the_table),
    Corruption("segments overlap", overlap_two_segments),
    Corruption("live count", miscount_live_slots),
    Corruption("past used", write_past_the_used_end),
    Corruption("free and live", free_a_live_row),
    Corruption("row partition", lose_a_free_row),
    Corruption("free row fields", keep_a_length_on_a_free_row),
    Corruption("filed twice", file_a_content_twice),
    Corruption("indexed under dead", index_under_a_dead_content),
    Corruption("not a holder", index_under_a_content_that_does_not_list_it),
    Corruption("dead parent", follow_a_dead_content),
    Corruption("stray holder", unindex_a_holder),
    Corruption("holder order", reverse_a_holder_list),
    Corruption("holder tokens", change_a_later_holders_tokens),
    Corruption("kept unheld", keep_a_content_nobody_holds),
    Corruption("no orphan copy", orphan_without_a_copy),
    Corruption("needless copy", copy_a_held_content),
    Corruption("wrong key", file_under_a_wrong_key),
    Corruption("live and free", free_a_live_content),
    Corruption("neither live nor free", lose_a_content_id),
    Corruption("twin contents", split_a_content_in_twins),
    Corruption("child count", overcount_children),
    Corruption("chain", index_a_block_after_another_prefix),
]


def fired(bm) -> set:
    """The clauses whose messages the check reports, each under its own invariant's name."""
    clauses = set()
    for invariant, messages in invariants.invariant_problems(bm).items():
        own = {clause: pattern for clause, (inv, pattern) in CLAUSES.items() if inv == invariant}
        clauses |= clauses_fired(messages, own)
    return clauses


@pytest.mark.parametrize("corruption", CORRUPTIONS, ids=lambda c: f"{c.clause}: {c.plant.__name__}")
@settings(max_examples=6, deadline=None)
@given(bm=valid_states(MANAGERS))
def test_a_planted_corruption_fires_its_clause_and_no_other(corruption, bm):
    assert fired(bm) == set()
    corruption.plant(bm)
    assert fired(bm) == {corruption.clause, *corruption.companions}
    with pytest.raises(InvariantViolation) as raised:
        bm.check()
    assert raised.value.invariant == CLAUSES[corruption.clause][0]


def test_every_clause_has_a_corruption_and_every_corruption_a_reason_for_its_companions():
    assert {c.clause for c in CORRUPTIONS} == set(CLAUSES)
    assert all(c.why for c in CORRUPTIONS if c.companions)


@pytest.mark.parametrize("function", list(STATED_BY), ids=lambda f: f.__qualname__)
def test_the_table_lists_every_clause_a_function_states(function):
    assert message_templates(function) == len(STATED_BY[function])


def test_the_functions_listed_state_every_clause_of_the_table():
    assert sorted(c for clauses in STATED_BY.values() for c in clauses) == sorted(CLAUSES)
