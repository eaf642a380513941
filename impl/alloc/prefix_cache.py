"""Prefix cache: full blocks indexed by their exact content, as the spec's.

What a full block holds is its *content*: its tokens after one exact prefix. Contents are interned
as a trie, one `Content` node per distinct prefix of full blocks, each node keyed in its parent by
its block's tokens as raw int64 bytes. A node knows its *holders*: the indexed blocks whose KV is
that prefix. So the index is exact by construction (Python's dict confirms every key by equality;
no hash of ours can collide), and it is the spec's: every block is indexed when it fills, beside any
equal block already indexed; a hit takes the lowest-numbered holder; an evicted or wiped block
leaves only its own node's holders, so an equal block still serves.

A lookup walks the trie with the prompt's blocks, one dict probe per block on bytes sliced from one
buffer, and stops at the first prefix nobody holds. A node lives while it has holders or children.

Every change goes through the manager's journal (`journal.py`), so a failed operation is undone.
"""


class Content:
    """One prefix of full blocks: the last block's tokens (bytes) after the parent prefix."""

    __slots__ = ("parent", "key", "children", "holders")

    def __init__(self, parent, key: bytes):
        self.parent, self.key = parent, key
        self.children: dict = {}   # block tokens (int64 bytes) -> Content
        self.holders: set = set()  # indexed blocks holding exactly this prefix


class PrefixCache:
    def __init__(self, journal):
        self.journal = journal
        self.root = Content(None, b"")
        self.content_of: dict = {}   # indexed block -> its Content

    def is_indexed(self, block: int) -> bool:
        return block in self.content_of

    def lookup(self, token_bytes: bytes, max_blocks: int, block_size: int) -> list:
        """The lowest-numbered holder of each leading full block of a prompt given as int64 bytes,
        at most `max_blocks` of them, up to the first prefix that nobody holds."""
        step, node, hits = 8 * block_size, self.root, []
        for start in range(0, max_blocks * step, step):
            node = node.children.get(token_bytes[start:start + step])
            if node is None or not node.holders:
                break
            hits.append(min(node.holders))
        return hits

    def fill(self, blocks: list, parents: list, block_bytes: bytes) -> None:
        """Index each of `blocks`, in order, which just became full after the block `parents[i]`
        (-1: a sequence's first block); `block_bytes` holds their tokens, as int64, one block after
        another. A block already indexed keeps its content. One undo record for the whole batch."""
        log = []   # what was done, in order: (node, block) holder added, (node, None) node created
        self.journal.undo.append((self._undo_fill, (log,)))
        content_of, root = self.content_of, self.root
        step = len(block_bytes) // max(len(blocks), 1)
        for i, (block, parent_block) in enumerate(zip(blocks, parents)):
            if block in content_of:
                continue
            parent = root if parent_block < 0 else content_of[parent_block]
            key = block_bytes[i * step:(i + 1) * step]
            node = parent.children.get(key)
            if node is None:
                node = Content(parent, key)
                log.append((node, None))
                parent.children[key] = node
            log.append((node, block))
            node.holders.add(block)
            content_of[block] = node

    def forget(self, blocks) -> None:
        """These blocks are wiped (freed or evicted): each no longer holds its prefix, and a prefix
        nobody holds or extends leaves the trie. One undo record for the whole batch."""
        log = []   # (node, block) holder removed, (node, None) node unlinked from its parent
        self.journal.undo.append((self._undo_forget, (log,)))
        content_of, root = self.content_of, self.root
        for block in blocks:
            node = content_of.get(block)
            if node is None:
                continue
            log.append((node, block))
            del content_of[block]
            node.holders.discard(block)
            while node is not root and not node.holders and not node.children:
                log.append((node, None))
                del node.parent.children[node.key]
                node = node.parent

    # Undo steps: each is harmless for a logged step that did not happen (the fault-injection
    # test raises between a log entry and its mutation too).

    def _undo_fill(self, log: list) -> None:
        for node, block in reversed(log):
            if block is None:
                node.parent.children.pop(node.key, None)
            else:
                node.holders.discard(block)
                self.content_of.pop(block, None)

    def _undo_forget(self, log: list) -> None:
        for node, block in reversed(log):
            if block is None:
                node.parent.children[node.key] = node
            else:
                node.holders.add(block)
                self.content_of[block] = node

    def problems(self, block_tokens) -> list:
        """Broken parts of the `cache_index` invariant (`block_tokens[b]`: what block b holds)."""
        problems = []
        for block, node in self.content_of.items():
            if block_tokens[block].tobytes() != node.key:
                problems.append(f"block {block} does not hold the tokens of its content")
            if block not in node.holders:
                problems.append(f"indexed block {block} is not among its content's holders")
        stack = [self.root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                if child.parent is not node or child.key != key:
                    problems.append("a content is filed under the wrong parent or key")
                if not child.holders and not child.children:
                    problems.append("a content no block holds is kept")
                problems += [f"block {b} is a holder of a content it is not indexed under"
                             for b in child.holders if self.content_of.get(b) is not child]
                stack.append(child)
        return problems
