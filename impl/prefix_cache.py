"""Prefix cache: full blocks indexed by a chained hash, every hit confirmed by exact content.

A hash is only a hint. What a block really holds is its *content*: its tokens after one exact
prefix. Contents are interned as a trie, `(parent content, block tokens) -> Content`, so two blocks
hold the same KV exactly when they point at the same `Content` object. A 64-bit hash collision can
therefore cost a cache miss, never a wrong hit.

Every full block that holds computed KV (live, or released but still indexed) has a content; a
content lives while a block or a child content refers to it.
"""

from .hashing import ChainHash


class Content:
    """The tokens of one full block after one exact prefix (the parent content)."""

    __slots__ = ("parent", "tokens", "hash", "refs")

    def __init__(self, parent, tokens: tuple, hash_: int):
        self.parent, self.tokens, self.hash, self.refs = parent, tokens, hash_, 0

    @property
    def key(self) -> tuple:
        return (self.parent, self.tokens)


class PrefixCache:
    def __init__(self, chain_hash: ChainHash):
        self.chain_hash = chain_hash
        self.hash_to_block: dict = {}
        self.block_hash: dict = {}       # indexed block -> its hash
        self.content_of: dict = {}       # full block -> Content
        self.contents: dict = {}         # (parent Content | None, tokens) -> Content

    def is_indexed(self, block: int) -> bool:
        return block in self.block_hash

    def lookup(self, tokens: list, max_blocks: int, block_size: int) -> list:
        """Indexed blocks holding the leading full blocks of `tokens`, at most `max_blocks`."""
        hits, parent = [], None
        for j in range(max_blocks):
            block_tokens = tuple(tokens[j * block_size:(j + 1) * block_size])
            block = self.hash_to_block.get(self.chain_hash(parent and parent.hash, block_tokens))
            content = self.contents.get((parent, block_tokens))
            if block is None or content is None or self.content_of[block] is not content:
                break
            hits.append(block)
            parent = content
        return hits

    def fill(self, block: int, parent_block, block_tokens: tuple) -> None:
        """`block` just became full after `parent_block` (None for a sequence's first block):
        record its content and index it unless its hash is already indexed."""
        parent = None if parent_block is None else self.content_of[parent_block]
        content = self.contents.get((parent, block_tokens))
        if content is None:
            if parent is None:
                content = Content(None, block_tokens, self.chain_hash(None, block_tokens))
            else:
                content = Content(parent, block_tokens, self.chain_hash(parent.hash, block_tokens))
                parent.refs += 1
            self.contents[content.key] = content
        content.refs += 1
        self.content_of[block] = content
        if content.hash not in self.hash_to_block:
            self.hash_to_block[content.hash] = block
            self.block_hash[block] = content.hash

    def forget(self, block: int) -> None:
        """`block` is wiped (freed or evicted): drop it from the index and release its content."""
        if block in self.block_hash:
            del self.hash_to_block[self.block_hash.pop(block)]
        content = self.content_of.pop(block, None)
        while content is not None:
            content.refs -= 1
            if content.refs:
                break
            del self.contents[content.key]
            content = content.parent

    def problems(self, block_tokens) -> list:
        """Broken parts of the `cache_index` invariant (`block_tokens[b]`: what block b holds)."""
        problems = []
        if {b: h for h, b in self.hash_to_block.items()} != self.block_hash:
            problems.append("hash_to_block and block_hash are not inverse maps")
        for block, content in self.content_of.items():
            if tuple(block_tokens[block].tolist()) != content.tokens:
                problems.append(f"block {block} does not hold the tokens of its content")
            parent_hash = content.parent and content.parent.hash
            if content.hash != self.chain_hash(parent_hash, content.tokens):
                problems.append(f"block {block}'s content hash is not its chained hash")
        for block, h in self.block_hash.items():
            if block not in self.content_of or self.content_of[block].hash != h:
                problems.append(f"indexed block {block} does not hold content hashing to {h}")
        return problems
