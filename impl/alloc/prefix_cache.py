"""Prefix cache: full blocks indexed by a chained hash, every hit confirmed by exact content.

A hash is only a name. What a block really holds is its *content*: its tokens after one exact
prefix. Contents are interned as a trie, `(parent content, block tokens) -> Content`, so two blocks
hold the same KV exactly when they point at the same `Content` object.

The hash index decides, as in the spec, which block is *the* cached one: a block that fills is
indexed under its content's chained hash unless that hash is already taken. A lookup walks the trie
with the prompt's blocks and takes, for each content, the block indexed under its hash — the hit the
spec's "look up the hash, confirm the content" finds, without hashing the prompt again. A hash
collision can therefore cost a cache miss (the second content is never indexed), never a wrong hit.

Every full block that holds computed KV (live, or released but still indexed) has a content; a
content lives while a block or a child content refers to it. Every change goes through the
manager's journal (`journal.py`), so a failed operation (a `chain_hash` that raises, say) is undone.
"""

from .chain_hash import ChainHash


class Content:
    """The tokens of one full block after one exact prefix (the parent content)."""

    __slots__ = ("parent", "tokens", "hash", "refs")

    def __init__(self, parent, tokens: tuple, hash_: int):
        self.parent, self.tokens, self.hash, self.refs = parent, tokens, hash_, 0

    @property
    def key(self) -> tuple:
        return (self.parent, self.tokens)


class PrefixCache:
    def __init__(self, chain_hash: ChainHash, journal):
        self.chain_hash = chain_hash
        self.journal = journal
        self.hash_to_block: dict = {}    # the index: chained hash -> the block cached under it
        self.content_of: dict = {}       # full block -> Content
        self.contents: dict = {}         # (parent Content | None, tokens) -> Content

    def is_indexed(self, block: int) -> bool:
        content = self.content_of.get(block)
        return content is not None and self.hash_to_block.get(content.hash) == block

    def indexed_block(self, content: Content):
        """The block cached under `content`'s hash if it holds that content (a hit), else None."""
        block = self.hash_to_block.get(content.hash)
        return block if block is not None and self.content_of[block] is content else None

    def lookup(self, tokens: list, max_blocks: int, block_size: int) -> list:
        """Indexed blocks holding the leading full blocks of `tokens`, at most `max_blocks`."""
        hits, parent = [], None
        for j in range(max_blocks):
            parent = self.contents.get((parent, tuple(tokens[j * block_size:(j + 1) * block_size])))
            block = None if parent is None else self.indexed_block(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def fill(self, block: int, parent_block, block_tokens: tuple) -> None:
        """`block` just became full after `parent_block` (None for a sequence's first block):
        record its content and index it unless its hash is already indexed."""
        journal = self.journal
        parent = None if parent_block is None else self.content_of[parent_block]
        content = self.contents.get((parent, block_tokens))
        if content is None:
            content = Content(parent, block_tokens, self.chain_hash(parent and parent.hash, block_tokens))
            if parent is not None:
                journal.set(parent, "refs", parent.refs + 1)
            journal.put(self.contents, content.key, content)
        journal.set(content, "refs", content.refs + 1)
        journal.put(self.content_of, block, content)
        if content.hash not in self.hash_to_block:
            journal.put(self.hash_to_block, content.hash, block)

    def forget(self, block: int) -> None:
        """`block` is wiped (freed or evicted): drop it from the index and release its content."""
        journal = self.journal
        if self.is_indexed(block):
            journal.pop(self.hash_to_block, self.content_of[block].hash)
        if block not in self.content_of:
            return
        content = journal.pop(self.content_of, block)
        while content is not None:
            journal.set(content, "refs", content.refs - 1)
            if content.refs:
                break
            journal.pop(self.contents, content.key)
            content = content.parent

    def problems(self, block_tokens) -> list:
        """Broken parts of the `cache_index` invariant (`block_tokens[b]`: what block b holds)."""
        problems = []
        for block, content in self.content_of.items():
            if tuple(block_tokens[block].tolist()) != content.tokens:
                problems.append(f"block {block} does not hold the tokens of its content")
            parent_hash = content.parent and content.parent.hash
            if content.hash != self.chain_hash(parent_hash, content.tokens):
                problems.append(f"block {block}'s content hash is not its chained hash")
        for h, block in self.hash_to_block.items():
            if block not in self.content_of or self.content_of[block].hash != h:
                problems.append(f"indexed block {block} does not hold content hashing to {h}")
        return problems
