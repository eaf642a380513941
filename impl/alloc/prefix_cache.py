"""Prefix cache: full blocks indexed by their exact content, as the spec's.

What a full block holds is its *content*: its tokens after one exact prefix. Each distinct prefix
of full blocks is one *content node*, an id into a few numpy arrays (its parent node, its 64-bit
prefix key, its lowest holder, how many child nodes it has). The *holders* of a node are the
indexed blocks whose KV is that prefix, kept as a list sorted by block id and linked through a
per-block array, so the head serves a hit (the spec's lowest-numbered holder). `block_node[b]` is
the node block b is indexed under (-1: not indexed). Nothing is stored per node that the pool does
not hold already: a node's tokens are its holders' tokens (`block_tokens`); only a node nobody
holds any more but that still has children keeps a copy of its tokens, in `orphans`.

Nodes are found by key (`content_keys.py`): `by_key` files one node per key, `collided` any further
nodes whose key is taken (in practice never). A key only proposes a candidate; the index confirms
it by its parent node and its tokens, so it is exact (no hash can collide into a wrong hit) and it
is the spec's: every block is indexed when it fills, beside any equal block already indexed; a
hit takes the lowest-numbered holder; an evicted or wiped block leaves only its own node's
holders, so an equal block still serves. A node lives while it has holders or children.

The hot paths are batched. A chain linked in one pass has consecutive node ids where its ids
are fresh, so a lookup follows runs of ids from the node its first block's key names, confirmed
in a few array passes (a node is the only one with its parent and tokens), keying one block per
run; past a few runs it keys the rest of the prompt with one prefix sum and confirms every
candidate at once. A decode step's filled blocks (each after a block indexed before) and a
prompt's blocks (a chain) are keyed, checked against the key dict and linked in one pass, under
one undo record (node ids, fields, child counts, key dict); their preconditions are checked with
an argmin or a bytes comparison, not a reduction, as a decode step's few blocks make the fixed
cost of each array pass the cost. An eviction as the pool makes it (tables released tail first:
runs of blocks from a leaf up, each the sole holder of its content, every content dying) is
recognised by its child counts and removed in one pass; other evictions of sole holders count
the dying contents until that settles. Anything unusual (an equal block already indexed, a key
taken, a block already indexed, a shared content) takes the sequential path, which handles every
case.

Every change goes through the manager's journal (`journal.py`), so a failed operation is undone.
"""

from collections import deque
from itertools import chain, repeat
from operator import itemgetter

import numpy as np

from .content_keys import ROOT, ContentKeys, dict_key, dict_keys, step

NONE = -1       # no node / no holder / no block
FREED = -2      # `node_parent` of a node id that is not in use
RUNS = 8        # runs of consecutive node ids a lookup follows before it probes every key left


class PrefixCache:
    def __init__(self, journal, block_tokens: np.ndarray):
        self.journal = journal
        self.block_tokens = block_tokens                 # the pool's: the manager writes it
        self.block_words = block_tokens.view(np.uint64)  # the same as uint64, what the block hash reads
        num_blocks, block_size = block_tokens.shape
        self.keys = ContentKeys(block_size)
        # block_node with one more item, -1, after it: a parent -1 (a root) reads no node there.
        self.parent_node = np.full(num_blocks + 1, NONE, dtype=np.int64)
        self.block_node = self.parent_node[:num_blocks]
        self.next_holder = np.full(num_blocks, NONE, dtype=np.int64)   # holder lists, ascending
        # Node arrays start at one node per pool block (the most that can be held at once) and
        # double when nodes nobody holds pile up; unused ids are FREED and listed in `free_nodes`.
        self.node_parent = np.full(num_blocks, FREED, dtype=np.int64)
        self.node_key = np.zeros(num_blocks, dtype=np.uint64)
        self.node_holder = np.full(num_blocks, NONE, dtype=np.int64)
        self.node_children = np.zeros(num_blocks, dtype=np.int64)
        self.nodes_used = 0                              # ids below this were handed out once
        self.free_nodes: list = []
        self.by_key: dict = {}                           # dict key -> node
        self.collided: dict = {}                         # dict key -> further nodes (a tuple)
        self.orphans: dict = {}                          # node nobody holds -> a copy of its tokens

    # ---------------------------------------------------------------- queries

    def is_indexed(self, block: int) -> bool:
        return self.block_node[block] != NONE

    def indexed(self, blocks: np.ndarray) -> np.ndarray:
        """Which of these blocks are indexed (a bool array)."""
        return self.block_node[blocks] != NONE

    def lookup(self, tokens: np.ndarray, max_blocks: int) -> np.ndarray:
        """The lowest-numbered holder of each leading full block of an int64 prompt, at most
        `max_blocks` of them, up to the first prefix that nobody holds (an int64 array: the
        manager indexes its pool arrays with it)."""
        if max_blocks <= 0:
            return np.empty(0, dtype=np.int64)
        rows = tokens[:max_blocks * self.block_tokens.shape[1]].reshape(max_blocks, -1)
        candidate = self.by_key.get(self._name_after(ROOT, rows[0]), NONE)
        if candidate == NONE:   # a new prompt: not even its first block is indexed
            return np.empty(0, dtype=np.int64)
        runs, start, parent, parent_key = [], 0, NONE, ROOT
        for _ in range(RUNS):
            nodes, held = self._run(rows[start:], candidate, parent)
            if not len(nodes):   # the node filed first under the key is not this prefix's
                break
            runs.append(held)
            start += len(nodes)
            if start == max_blocks:
                return np.concatenate(runs)
            parent = int(nodes[-1])
            parent_key = int(self.node_key[parent])
            candidate = self.by_key.get(self._name_after(parent_key, rows[start]), NONE)
            if candidate == NONE:   # new text after a cached prefix (the common case)
                return np.concatenate(runs)
        served = np.concatenate(runs) if runs else np.empty(0, dtype=np.int64)
        rows = rows[start:]
        names = dict_keys(self.keys.chain(parent_key, self.keys.block_hashes(rows)))
        found = self._probe(names)
        previous = np.concatenate(([parent], found[:-1]))
        safe = np.maximum(found, 0)
        holders = self.node_holder[safe]
        confirmed = (found != NONE) & (self.node_parent[safe] == previous) & (holders != NONE)
        held = self.block_tokens[np.maximum(holders, 0)]
        if not np.array_equal(held, rows):   # one pass when every block hits (the common case)
            confirmed &= (held == rows).all(axis=1)
        hits = int(np.argmin(confirmed)) if not confirmed.all() else len(rows)
        served = np.concatenate((served, holders[:hits]))
        if hits < len(rows) and found[hits] != NONE and self.collided:
            more = self._lookup_sequentially(names, rows, hits, int(found[hits - 1]) if hits else parent)
            served = np.concatenate((served, np.array(more, dtype=np.int64)))
        return served

    def _name_after(self, parent_key: int, row) -> int:
        """The dict key of one block of tokens after the prefix keyed `parent_key`."""
        return dict_key(step(parent_key, self.keys.block_hash(row)))

    def _run(self, rows, first: int, parent: int) -> tuple:
        """The leading blocks of these rows, after the node `parent`, whose nodes are
        consecutive ids from `first` (the node filed first under the first block's key) on,
        confirmed by parent, holder and tokens, and their holders: a prefix linked in one pass
        (a prompt's chain, from fresh ids or recycled ones in order) is served without a key
        per block."""
        end = min(first + len(rows), len(self.node_parent))
        nodes = np.arange(first, end, dtype=np.int64)
        holders = self.node_holder[first:end]
        linked = (self.node_parent[first:end] == nodes - 1) & (holders != NONE)
        linked[0] = self.node_parent[first] == parent and holders[0] != NONE
        run = int(np.argmin(linked)) if not linked.all() else len(nodes)
        held = self.block_tokens[holders[:run]]
        if not np.array_equal(held, rows[:run]):
            same = (held == rows[:run]).all(axis=1)
            run = int(np.argmin(same))
        return nodes[:run], holders[:run].copy()   # a copy: the caller keeps it as the index changes

    def _probe(self, names: list) -> np.ndarray:
        """The node filed first under each key (-1: none): one C-level pass when all are there."""
        if len(names) > 1:
            try:
                return np.fromiter(itemgetter(*names)(self.by_key), np.int64, len(names))
            except KeyError:
                pass
        return np.fromiter(map(self.by_key.get, names, repeat(NONE)), np.int64, len(names))

    def _lookup_sequentially(self, names: list, rows, start: int, parent: int) -> list:
        """The hits from block `start` on, one candidate list at a time (a key is shared)."""
        served = []
        for name, row in zip(names[start:], rows[start:]):
            node = self._find(name, parent, row)
            if node == NONE or self.node_holder[node] == NONE:
                break
            served.append(int(self.node_holder[node]))
            parent = node
        return served

    # ---------------------------------------------------------------- fill

    def fill(self, blocks, parents) -> None:
        """Index each of `blocks`, in order, which just became full after the block `parents[i]`
        (-1: a sequence's first block; else a block indexed before, or an earlier one of these).
        A block already indexed keeps its content."""
        self.fill_arrays(np.asarray(blocks, dtype=np.int64), np.asarray(parents, dtype=np.int64))

    def fill_arrays(self, blocks: np.ndarray, parents: np.ndarray) -> None:
        """`fill` of int64 arrays, as a decode step has them (no conversion: each numpy call is
        the cost there)."""
        n = len(blocks)
        if not n:
            return
        hashes = self.keys.word_hashes(self.block_words.take(blocks, axis=0))   # (a fancy gather costs more)
        if not _all_none(self.block_node[blocks]):   # one already indexed
            self._fill_sequentially(blocks, parents, hashes)
        elif n > 1 and parents[1] == blocks[0] and parents[1:].tobytes() == blocks[:-1].tobytes():
            self._fill_chain(blocks, int(parents[0]), hashes)
        else:
            self._fill_each(blocks, parents, hashes)

    def _fill_each(self, blocks, parents, hashes) -> None:
        """Blocks that each follow a block indexed before (a decode step's): all new contents
        with distinct keys, in one pass; anything else sequentially. Few array passes, none a
        reduction where an argmin will do: this runs every decode step."""
        nodes = self.parent_node[parents]             # a root's -1 reads the -1 after the blocks
        if nodes[nodes.argmin()] == NONE:             # rare: a sequence's first block
            roots = parents == NONE
            if np.count_nonzero(nodes == NONE) != np.count_nonzero(roots):   # a parent is in the batch
                self._fill_sequentially(blocks, parents, hashes)
                return
            parent_keys = self.node_key[nodes]
            parent_keys[roots] = ROOT
        else:
            parent_keys = self.node_key[nodes]
        keys = self.keys.after(parent_keys, hashes)
        names = dict_keys(keys)
        if not self.by_key.keys().isdisjoint(names) or not self._link(blocks, keys, names, parent_nodes=nodes):
            self._fill_sequentially(blocks, parents, hashes)   # a key taken, or two of them one

    def _fill_chain(self, blocks, parent: int, hashes) -> None:
        """Consecutive blocks of one table after `parent` (a prompt's): the leading ones whose
        prefix exists join it, the rest are new contents, linked in one pass."""
        start_node = NONE if parent == NONE else int(self.block_node[parent])
        if parent != NONE and start_node == NONE:   # the parent is not indexed: the general path
            self._fill_sequentially(blocks, np.concatenate(([parent], blocks[:-1])), hashes)
            return
        start_key = ROOT if start_node == NONE else int(self.node_key[start_node])
        keys = self.keys.chain(start_key, hashes)
        names = dict_keys(keys)
        if names[0] in self.by_key:   # it may begin with a prefix indexed already
            found = self._probe(names)
            existing = self._existing_prefix(found, start_node, self.block_tokens[blocks])
            for block, node in zip(blocks[:existing].tolist(), found[:existing].tolist()):
                self._join(node, block)
            taken = (found[existing:] != NONE).any()
        else:   # a new first block: nothing after it can be indexed, only a key be taken
            existing, taken = 0, not self.by_key.keys().isdisjoint(names)
        rest = names[existing:]
        if not rest:
            return
        before = int(found[existing - 1]) if existing else start_node
        if taken or not self._link(blocks[existing:], keys[existing:], rest, after=before):   # or two keys one
            self._fill_sequentially(blocks[existing:], blocks[existing - 1:-1] if existing else
                                    np.concatenate(([parent], blocks[:-1])), hashes[existing:])

    def _existing_prefix(self, found, parent: int, rows) -> int:
        """How many leading candidates are confirmed: the right parent and the same tokens."""
        previous = np.concatenate(([parent], found[:-1]))
        safe = np.maximum(found, 0)
        holders = self.node_holder[safe]
        same = (found != NONE) & (self.node_parent[safe] == previous)
        same &= (self.block_tokens[np.maximum(holders, 0)] == rows).all(axis=1) | (holders == NONE)
        for i in np.flatnonzero(same & (holders == NONE)).tolist():   # nobody holds it: its copy
            same[i] = np.array_equal(self.orphans[int(found[i])], rows[i])
        return int(np.argmin(same)) if not same.all() else len(found)

    def _fill_sequentially(self, blocks, parents, hashes) -> None:
        """The general path: one block at a time, finding or filing its content."""
        for block, parent, block_hash, row in zip(blocks.tolist(), parents.tolist(), hashes.tolist(),
                                                  self.block_tokens[blocks]):
            if self.block_node[block] != NONE:
                continue
            parent_node = NONE if parent == NONE else int(self.block_node[parent])
            if parent != NONE and parent_node == NONE:
                raise RuntimeError(f"block {block} fills after block {parent}, which is not indexed")
            key = step(ROOT if parent_node == NONE else int(self.node_key[parent_node]), block_hash)
            node = self._find(dict_key(key), parent_node, row)
            if node == NONE:
                self._link(np.array([block]), np.array([key], dtype=np.uint64), [dict_key(key)],
                           parent_nodes=np.array([parent_node]), untaken=False)
            else:
                self._join(node, block)

    def _find(self, name: int, parent: int, row) -> int:
        """The node filed under `name` with this parent and these tokens, or -1."""
        first = self.by_key.get(name)
        if first is None:
            return NONE
        for node in (first, *self.collided.get(name, ())):
            if self.node_parent[node] == parent and np.array_equal(self._tokens(node), row):
                return node
        return NONE

    def _tokens(self, node: int) -> np.ndarray:
        holder = self.node_holder[node]
        return self.orphans[node] if holder == NONE else self.block_tokens[holder]

    def _link(self, blocks, keys, names: list, parent_nodes=None, after: int = NONE,
              untaken: bool = True) -> bool:
        """Make unused node ids the contents of `blocks` (not indexed), each its only holder, after
        the nodes `parent_nodes[i]` (-1: none; none of them new) or, without them, a chain: the
        first after node `after`, each later one after the one before; filed under `keys`
        (`names` in the dict). `untaken`: the caller knows no name is filed; if two of them are
        one, nothing is linked and the answer is False (the caller goes one block at a time).
        Node ids are recycled ones first (off the end of the free list), then fresh ones, the
        arrays doubled when those run out."""
        journal, free, n = self.journal, self.free_nodes, len(blocks)
        chained = parent_nodes is None
        reused = free[len(free) - min(n, len(free)):]
        start = self.nodes_used
        fresh = n - len(reused)
        if start + fresh > len(self.node_parent):
            if untaken and len(set(names)) < n:   # (rare) two names are one: no growing for nothing
                return False
            self._grow(start + fresh)
        if chained:   # ids with the one before each first, `after` before the first
            before = (np.fromiter(chain((after,), reused, range(start, start + fresh)), np.int64, n + 1) if reused
                      else np.arange(start - 1, start + n, dtype=np.int64))
            before[0] = after
            new, parent_nodes = before[1:], before[:-1]
            extended = after if after != NONE else None
        else:
            new = (np.fromiter(chain(reused, range(start, start + fresh)), np.int64, n) if reused
                   else np.arange(start, start + n, dtype=np.int64))
            listed = parent_nodes.tolist()
            extended = parent_nodes if NONE not in listed else parent_nodes[parent_nodes != NONE]
            # Distinct parents (a decode step's, as a rule) take one write, cheaper than `np.add.at`.
            distinct = len(set(listed)) == n
        # Fresh ids only (a decode step's, while no content has died): a slice, and nothing to save.
        at, saved = (new, (self.node_key[new], self.node_holder[new], self.node_children[new])) if reused else \
            (slice(start, start + n), None)
        counts = self.node_children[extended] if extended is not None else None
        ids = new.tolist()
        # One record undoes it all, newest first; each part is harmless where nothing happened yet.
        journal.undo.append((self._unlink, (new, at, saved, blocks, extended, counts, names, ids,
                                            reused, len(free), start)))
        if not self._file(names, ids, untaken):
            return False
        del free[len(free) - len(reused):]
        self.nodes_used = start + fresh
        self.node_parent[at] = parent_nodes
        self.node_key[at] = keys
        self.node_holder[at] = blocks
        self.block_node[blocks] = new
        if chained:   # each new content but the last has the next one as its child
            self.node_children[at] = 1
            self.node_children[new[-1]] = 0
            if extended is not None:
                self.node_children[extended] = counts + 1
        else:
            if reused:   # (a fresh id has no children)
                self.node_children[at] = 0
            if distinct:
                self.node_children[extended] = counts + 1
            elif extended is not None:
                np.add.at(self.node_children, extended, 1)   # (two new contents may follow one node)
        return True

    def _unlink(self, new, at, saved, blocks, extended, counts, names, ids, reused, free_length, used) -> None:
        """Undo of `_link`. An id handed out fresh had a parent FREED, key 0, no holder and no
        children; a recycled one gets its fields back (an id freed earlier in this transaction
        must); an unindexed block's node and next holder are -1 (`_link` leaves the latter)."""
        self._unfile_new(names, ids)
        if extended is not None:
            self.node_children[extended] = counts
        self.node_parent[at] = FREED
        if saved is None:
            self.node_key[at], self.node_holder[at], self.node_children[at] = 0, NONE, 0
        else:
            self.node_key[at], self.node_holder[at], self.node_children[at] = saved
        self.block_node[blocks] = NONE
        self.nodes_used = used
        _give_back(self.free_nodes, reused, free_length)

    def _join(self, node: int, block: int) -> None:
        """`block` becomes one more holder of `node`, in block order."""
        journal, nxt = self.journal, self.next_holder
        head = int(self.node_holder[node])
        if head == NONE or block < head:
            journal.assign(nxt, block, head)
            journal.assign(self.node_holder, node, block)
            if head == NONE:
                journal.pop(self.orphans, node)
        else:
            before = head
            while nxt[before] != NONE and nxt[before] < block:
                before = int(nxt[before])
            journal.assign(nxt, block, nxt[before])
            journal.assign(nxt, before, block)
        journal.assign(self.block_node, block, node)

    # ---------------------------------------------------------------- forget

    def forget(self, blocks) -> None:
        """These blocks are wiped (freed or evicted): each no longer holds its prefix, and a prefix
        nobody holds or extends leaves the index."""
        blocks = np.asarray(blocks, dtype=np.int64)
        if not len(blocks):
            return
        nodes = self.block_node[blocks]
        if nodes[nodes.argmin()] == NONE:   # some are not indexed
            blocks, nodes = blocks[nodes != NONE], nodes[nodes != NONE]
            if not len(blocks):
                return
        elif self._forget_chains(blocks, nodes):
            return
        sole = (self.node_holder[nodes] == blocks) & (self.next_holder[blocks] == NONE)
        order = np.argsort(nodes)
        ranked = nodes[order]
        if not sole.all() or (ranked[1:] == ranked[:-1]).any():   # shared contents, or a block twice
            for block in blocks.tolist():
                self._forget_one(block)
            return
        self.journal.assign(self.block_node, blocks, NONE)
        self.journal.assign(self.node_holder, nodes, NONE)
        self._remove(nodes[self._dying(nodes, order, ranked)])
        kept = self.node_parent[nodes] != FREED      # nobody holds them, but they have children
        for node, block in zip(nodes[kept].tolist(), blocks[kept].tolist()):
            self.journal.put(self.orphans, node, self.block_tokens[block].copy())

    def _forget_chains(self, blocks, nodes) -> bool:
        """The usual eviction, in a few passes: the blocks come in runs, each a chain from a leaf
        up (the next block holds the parent of this one's content), each block the sole holder of
        its content and each content's only children the one before it in its run, so every
        content dies. False, having changed nothing, for anything else."""
        parents = self.node_parent[nodes]
        children = self.node_children[nodes]
        ends = np.ones(len(nodes), dtype=bool)      # ends[i]: block i + 1 does not hold its parent
        np.not_equal(parents[:-1], nodes[1:], out=ends[:-1])
        sole = self.node_holder[nodes] == blocks
        # A block not its run's last holds the parent of the one before, so its content has a child
        # at least: with at most one child each, and as many as blocks that are not their runs'
        # last, each content's children are exactly the block before it.
        if (not sole[sole.argmin()] or children[children.argmax()] > 1
                or np.count_nonzero(children) != len(nodes) - np.count_nonzero(ends)
                or not _all_none(self.next_holder[blocks])):
            return False
        ends = np.flatnonzero(ends)
        ids, last = nodes.tolist(), ends.tolist()
        # A block named twice would be a leaf twice (above a leaf each content has one child).
        if len({ids[0], *(ids[end + 1] for end in last[:-1])}) < len(last):
            return False
        journal = self.journal
        names = dict_keys(self.node_key[nodes])
        journal.undo.append((self._unforget, (blocks, nodes, parents, len(self.free_nodes))))
        self.block_node[blocks] = NONE
        self.node_holder[nodes] = NONE
        self.node_parent[nodes] = FREED
        self.free_nodes.extend(ids)
        self._unfile(names, ids)
        outside = parents[ends]
        outside = outside[outside != NONE]
        if len(outside):
            self._remove(self._bereave(outside))
        return True

    def _unforget(self, blocks, nodes, parents, free_length: int) -> None:
        """Undo of `_forget_chains` (each part harmless where nothing happened yet)."""
        del self.free_nodes[free_length:]
        self.node_parent[nodes] = parents
        self.node_holder[nodes] = blocks
        self.block_node[blocks] = nodes

    def _dying(self, nodes: np.ndarray, order: np.ndarray, ranked: np.ndarray) -> np.ndarray:
        """Which of these distinct nodes (`ranked`: sorted, by `order`), nobody's holders now, go:
        those all of whose children go too (found by counting children among them until it
        settles; deeper cases `_remove` cascades)."""
        at = np.minimum(np.searchsorted(ranked, self.node_parent[nodes]), len(nodes) - 1)
        inside = ranked[at] == self.node_parent[nodes]        # the parent is one of `nodes`
        parent_index = order[at]
        dies = np.ones(len(nodes), dtype=bool)
        while True:
            counted = np.bincount(parent_index[inside & dies], minlength=len(nodes))
            settled = dies & (self.node_children[nodes] == counted)
            if (settled == dies).all():
                return dies
            dies = settled

    def _forget_one(self, block: int) -> None:
        journal, nxt = self.journal, self.next_holder
        node = int(self.block_node[block])
        if node == NONE:
            return
        head = int(self.node_holder[node])
        if head == block:
            journal.assign(self.node_holder, node, nxt[block])
        else:
            before = head
            while nxt[before] != block:
                before = int(nxt[before])
            journal.assign(nxt, before, nxt[block])
        journal.assign(nxt, block, NONE)
        journal.assign(self.block_node, block, NONE)
        if self.node_holder[node] == NONE:
            if self.node_children[node]:
                journal.put(self.orphans, node, self.block_tokens[block].copy())
            else:
                self._remove(np.array([node]))

    def _remove(self, dying: np.ndarray) -> None:
        """Drop these nodes (nobody holds them; their children are among them), then every
        ancestor left with neither holders nor children."""
        journal = self.journal
        while len(dying):
            parents = self.node_parent[dying]
            self._unfile(dict_keys(self.node_key[dying]), dying.tolist())
            journal.assign(self.node_parent, dying, FREED)
            for node in dying.tolist() if self.orphans else ():
                if node in self.orphans:
                    journal.pop(self.orphans, node)
            journal.will_append(self.free_nodes)
            self.free_nodes.extend(dying.tolist())
            outside = parents[parents != NONE]
            outside = outside[self.node_parent[outside] != FREED]
            if not len(outside):   # (a whole chain went) no ancestor is left to die
                return
            dying = self._bereave(outside)

    def _bereave(self, parents: np.ndarray) -> np.ndarray:
        """Each of these live nodes (repeats too) loses a child; those left with neither children
        nor holders, in id order."""
        children, holder = self.node_children, self.node_holder
        if len(parents) <= 4:   # (usual: a run's parent, if any) scalar steps cost less than array passes
            for node in parents.tolist():
                self.journal.assign(children, node, children[node] - 1)
            return np.array(sorted({node for node in parents.tolist() if children[node] == 0 and holder[node] == NONE}),
                            dtype=np.int64)
        self.journal.save(children, parents)
        np.subtract.at(children, parents, 1)
        bare = (children[parents] == 0) & (holder[parents] == NONE)
        return np.unique(parents[bare]) if np.count_nonzero(bare) else parents[:0]

    # ---------------------------------------------------------------- node ids and keys

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * len(self.node_parent))
        for name, fill in (("node_parent", FREED), ("node_key", 0), ("node_holder", NONE), ("node_children", 0)):
            old = getattr(self, name)
            grown = np.full(size, fill, dtype=old.dtype)
            grown[:len(old)] = old
            self.journal.set(self, name, grown)

    def _file(self, names: list, nodes: list, untaken: bool) -> bool:
        """File new nodes under their keys (undone by `_link`'s record). Untaken names go in one
        update, whose size tells whether they were distinct: if not, none stays filed and the
        answer is False. A taken key (the sequential path) lists the node among its collisions."""
        by_key = self.by_key
        if untaken:
            size = len(by_key)
            by_key.update(zip(names, nodes))
            if len(by_key) - size == len(names):
                return True
            for name in names:   # none was filed before
                by_key.pop(name, None)
            return False
        for name, node in zip(names, nodes):
            if name in by_key:
                self.collided[name] = (*self.collided.get(name, ()), node)
            else:
                by_key[name] = node
        return True

    def _unfile_new(self, names: list, nodes: list) -> None:
        """Undo of `_file` (harmless for keys it did not reach)."""
        for name, node in zip(names, nodes):
            if self.by_key.get(name) == node:
                del self.by_key[name]
            elif node in self.collided.get(name, ()):
                rest = tuple(n for n in self.collided[name] if n != node)
                if rest:
                    self.collided[name] = rest
                else:
                    del self.collided[name]

    def _unfile(self, names: list, nodes: list) -> None:
        """Take nodes out of the key index; a collided node moves up to a freed first place."""
        journal, by_key, collided = self.journal, self.by_key, self.collided
        if not collided:   # every key names one node: plain deletes (in C), one undo record
            journal.undo.append((by_key.update, (zip(names, nodes),)))   # (an undo runs once)
            deque(map(by_key.__delitem__, names), maxlen=0)
            return
        for name, node in zip(names, nodes):
            others = tuple(n for n in (by_key[name], *collided.get(name, ())) if n != node)
            if not others:
                journal.pop(by_key, name)
                continue
            journal.put(by_key, name, others[0])
            if len(others) > 1:
                journal.put(collided, name, others[1:])
            elif name in collided:
                journal.pop(collided, name)

    # ---------------------------------------------------------------- as plain data, and invariants

    def live_nodes(self) -> list:
        return sorted([*self.by_key.values(), *(n for more in self.collided.values() for n in more)])

    def prefix(self, node: int) -> tuple:
        """The content of `node` as plain data: its blocks' tokens, first block first."""
        chain = []
        while node != NONE:
            chain.append(tuple(self._tokens(node).tolist()))
            node = int(self.node_parent[node])
        return tuple(reversed(chain))

    def contents(self) -> dict:
        """Indexed block -> its prefix as plain data (the spec's `cached_blocks`, in blocks)."""
        return {block: self.prefix(int(self.block_node[block]))
                for block in np.flatnonzero(self.block_node != NONE).tolist()}

    def holder_lists(self) -> dict:
        """Every live content's prefix -> its holders, in list order."""
        return {self.prefix(node): self._holders(node) for node in self.live_nodes()}

    def _holders(self, node: int) -> list:
        holders, block = [], int(self.node_holder[node])
        while block != NONE and len(holders) <= len(self.block_node):
            holders.append(block)
            block = int(self.next_holder[block])
        return holders

    def problems(self, block_tokens) -> list:
        """Broken parts of the `cache_index` invariant (`block_tokens[b]`: what block b holds)."""
        problems, live = [], self.live_nodes()
        alive = set(live)
        if len(alive) < len(live):
            problems.append("a content is filed under more than one key")
        for block in np.flatnonzero(self.block_node != NONE).tolist():
            node = int(self.block_node[block])
            if node not in alive:
                problems.append(f"block {block} is indexed under content {node}, which is not live")
            elif block not in self._holders(node):
                problems.append(f"indexed block {block} is not among its content's holders")
        for node in live:
            problems += self._node_problems(node, alive, block_tokens)
        free = set(self.free_nodes)
        problems += [f"content id {n} is both live and free" for n in sorted(alive & free)]
        problems += [f"content id {n} is neither live nor free" for n in range(self.nodes_used)
                     if n not in alive and n not in free]
        return problems + self._sibling_problems(sorted(alive), block_tokens)   # a node filed twice counts once

    def _node_problems(self, node: int, alive: set, block_tokens) -> list:
        problems, holders = [], self._holders(node)
        parent = int(self.node_parent[node])
        tokens = block_tokens[holders[0]] if holders else self.orphans.get(node)
        if parent != NONE and parent not in alive:
            problems.append(f"content {node} follows content {parent}, which is not live")
        problems += [f"block {b} is a holder of a content it is not indexed under"
                     for b in holders if self.block_node[b] != node]
        if holders != sorted(set(holders)):
            problems.append(f"the holders of content {node} are not in increasing block order")
        problems += [f"block {b} does not hold the tokens of its content"
                     for b in holders[1:] if not np.array_equal(block_tokens[b], tokens)]
        if not holders and not self.node_children[node]:
            problems.append("a content no block holds is kept")
        if not holders and tokens is None:
            problems.append(f"content {node} nobody holds keeps no copy of its tokens")
        if holders and node in self.orphans:
            problems.append(f"content {node} is held and also keeps a copy of its tokens")
        if tokens is not None:
            parent_key = ROOT if parent == NONE else int(self.node_key[parent])
            key = step(parent_key, self.keys.block_hash(np.asarray(tokens)))
            if key != int(self.node_key[node]) or node not in (self.by_key.get(dict_key(key)),
                                                                *self.collided.get(dict_key(key), ())):
                problems.append(f"content {node} is filed under a key its parent and tokens do not give")
        return problems

    def _sibling_problems(self, live: list, block_tokens) -> list:
        """Child counts, and no two contents with one parent and the same tokens."""
        problems, children, seen = [], {}, set()
        for node in live:
            parent = int(self.node_parent[node])
            children[parent] = children.get(parent, 0) + 1
            holders = self._holders(node)
            tokens = block_tokens[holders[0]] if holders else self.orphans.get(node)
            if tokens is not None:
                if (parent, tokens.tobytes()) in seen:
                    problems.append("two contents have one parent and the same tokens")
                seen.add((parent, tokens.tobytes()))
        problems += [f"content {n} counts {self.node_children[n]} children, has {children.get(n, 0)}"
                     for n in live if self.node_children[n] != children.get(n, 0)]
        return problems


def _all_none(values: np.ndarray) -> bool:
    """Whether every item of an int64 array is -1 (all bits set): one bytes comparison, cheaper
    than any reduction for the few items of a decode step."""
    return values.tobytes() == b"\xff" * values.nbytes


def _give_back(free: list, taken: list, length: int) -> None:
    """Undo of taking `taken` off the end of the free node list (harmless if it was not)."""
    if len(free) < length:
        free.extend(taken)
