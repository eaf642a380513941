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

    def fill(self, block: int, parent_block, block_bytes: bytes) -> None:
        """Index `block`, which just became full after `parent_block` (None for a sequence's first
        block); its tokens as int64 bytes. A block already indexed keeps its content."""
        if block in self.content_of:
            return
        journal = self.journal
        parent = self.root if parent_block is None else self.content_of[parent_block]
        node = parent.children.get(block_bytes)
        if node is None:
            node = Content(parent, block_bytes)
            journal.put(parent.children, block_bytes, node)
        journal.undo.append((node.holders.discard, (block,)))
        node.holders.add(block)
        journal.put(self.content_of, block, node)

    def forget(self, block: int) -> None:
        """`block` is wiped (freed or evicted): it no longer holds its prefix."""
        if block not in self.content_of:
            return
        journal = self.journal
        node = journal.pop(self.content_of, block)
        journal.undo.append((node.holders.add, (block,)))
        node.holders.discard(block)
        while node is not self.root and not node.holders and not node.children:
            journal.pop(node.parent.children, node.key)
            node = node.parent

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
