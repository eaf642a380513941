"""KV-cache events: the prefix index an outside consumer rebuilds from a subject's events, checked.

Engines publish what their prefix cache holds as a stream of events (vLLM's `BlockStored` /
`BlockRemoved` / `AllBlocksCleared`, SGLang's store/remove records) so that KV-aware routers and
gateways can mirror it without asking the engine. A subject that declares the `kv_events`
capability gives the harness two more methods:

    subject.kv_events() -> [BlockStored | BlockRemoved | AllBlocksCleared]   # since the last call
    subject.cache_index() -> {key: [block, ...]}                            # its index, now

Keys are the subject's own (opaque, hashable: vLLM's block hashes). A `BlockStored(keys, parent,
tokens, block_size)` announces `len(keys)` consecutive cached blocks: key i stands for the prefix
`prefix(parent) + tokens[:(i + 1) * block_size]`, where `prefix(None)` is empty. Nothing in an event
names a block, so a consumer knows keys and prefixes only; the oracles tie the two to blocks:

- `kv_events`: the stream, replayed into a mirror (a count of indexed blocks per key, and the
  prefix each key was announced with), equals the subject's index after every step (same keys,
  as many blocks under each); a stored block's parent is a key the stream announced; a key is
  never announced with two different prefixes; a removed key was announced and is still counted.
  When a key is stored is not checked: engines may publish later than they write (vLLM caches a
  hybrid model's blocks at the scheduler's block alignment, SGLang a decoded page at release).
- `index_content`: every entry of the subject's index names a block whose KV (the harness's ghost
  memory) is the last block of the prefix the stream announced for its key: a stale entry is caught
  the step its block is rewritten, not only when a later prompt happens to hit it.

A prefix need not be whole blocks (a hash granularity finer than the block size: vLLM's key for a
prompt that ends inside a block names that block, of which only the first `len % B` slots count).
Such a *partial* key stands for a block still being filled: when the block fills, its full-block key
replaces it (vLLM's promotion, `BlockPool.cache_full_blocks`), so `index_content` also demands that
no block is named by a full-block key and a partial key at once. vLLM #49125 breaks exactly that: a
superseded partial key re-registered on a later step, beside the full key of the same block.
"""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Hashable, Optional

from pagedkv.spec import KV


@dataclass(frozen=True)
class BlockStored:
    """Blocks cached under `keys`, in order; `tokens` are theirs (`block_size` each, the protocol's
    block size when None), following the prefix of `parent` (None: the sequence start)."""
    keys: tuple
    parent: Optional[Hashable]
    tokens: tuple
    block_size: Optional[int] = None


@dataclass(frozen=True)
class BlockRemoved:
    """One indexed block under each of `keys` left the index."""
    keys: tuple


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole index was dropped."""


EVENT_TYPES = (BlockStored, BlockRemoved, AllBlocksCleared)


class IndexMirror:
    """What a consumer of the stream knows: indexed blocks per key and each key's prefix. `apply`
    replays one event; a stream that breaks a rule calls `expect(False, message)` (the harness's
    `kv_events` oracle, or any checker of a recorded stream)."""

    def __init__(self, block_size: int, expect):
        self.block_size, self.expect = block_size, expect
        self.count = Counter()   # key -> blocks indexed under it, as the stream says
        self.prefix = {}         # key -> the token prefix it stands for (while counted)

    def counted(self) -> dict:
        return {key: n for key, n in self.count.items() if n}

    def apply(self, event) -> None:
        if isinstance(event, AllBlocksCleared):
            self.count, self.prefix = Counter(), {}
        elif isinstance(event, BlockRemoved):
            for key in event.keys:
                self.expect(self.count[key] > 0, f"BlockRemoved for key {_short(key)}, which no "
                            f"counted BlockStored announced ({event!r})")
                self.count[key] -= 1
                if not self.count[key]:
                    del self.count[key], self.prefix[key]
        else:
            self.store(event)

    def store(self, event: BlockStored) -> None:
        size = event.block_size or self.block_size
        self.expect(len(event.tokens) == size * len(event.keys),
                    f"BlockStored of {len(event.keys)} blocks of {size} carries {len(event.tokens)} tokens")
        if event.parent is None:
            start = ()
        else:
            self.expect(event.parent in self.prefix, f"BlockStored names parent {_short(event.parent)}, "
                        f"a key the stream never announced or already removed ({event!r})")
            start = self.prefix[event.parent]
        for i, key in enumerate(event.keys):
            prefix = start + tuple(event.tokens[:(i + 1) * size])
            known = self.prefix.get(key, prefix)
            self.expect(known == prefix, f"key {_short(key)} announced for prefix {list(prefix)}, but the stream "
                        f"announced it before for {list(known)}")
            self.count[key] += 1
            self.prefix[key] = prefix


def promotion_conflicts(index: dict, prefix: dict, block_size: int) -> list:
    """(block, full key, partial key) for each block that `index` (key -> blocks) names by a key whose
    prefix (`prefix[key]`) is whole blocks and by one whose prefix ends inside the block: a block
    that filled is named by its full key only (vLLM #49125 leaves the superseded partial key)."""
    names = {}
    for key, blocks in index.items():
        for block in blocks:
            names.setdefault(block, []).append(key)
    conflicts = []
    for block, keys in names.items():
        full = [key for key in keys if len(prefix[key]) % block_size == 0]
        partial = [key for key in keys if len(prefix[key]) % block_size]
        if full and partial:
            conflicts.append((block, full[0], partial[0]))
    return conflicts


class EventCheck:
    """Replays one subject's events step by step and checks them (and its index) against the
    harness's ghost memory. `kv` is the `harness.Conformance` that owns the subject."""

    def __init__(self, kv):
        self.kv = kv
        self.mirror = IndexMirror(kv.B, self.expect)

    # -------------------------------------------------------------- the stream

    def settle(self) -> None:
        events = self.kv._guarded(lambda: list(self.kv.subject.kv_events()), "kv_events")
        for event in events:
            self.kv.expect(isinstance(event, EVENT_TYPES), "protocol",
                           f"kv_events() returned {event!r}: not a BlockStored, BlockRemoved or AllBlocksCleared")
            self.mirror.apply(event)

    # -------------------------------------------------------------- the index

    def check(self) -> None:
        """After a rule: the stream so far agrees with the subject's index, and every entry's block holds
        its key's prefix."""
        self.settle()
        index = self.kv._guarded(self.kv.subject.cache_index, "cache_index")
        self.kv.expect(isinstance(index, Mapping), "protocol",
                       f"cache_index() returned {type(index).__name__}, not a mapping of key -> blocks")
        index = {key: list(blocks) for key, blocks in index.items()}
        index = {key: blocks for key, blocks in index.items() if blocks}
        counts = {key: len(blocks) for key, blocks in index.items()}
        mirrored = self.mirror.counted()
        if counts != mirrored:
            self.expect(False, "the index replayed from the events is not the subject's: "
                        + _difference(mirrored, counts))
        for key, blocks in index.items():
            prefix = self.mirror.prefix[key]
            for block in blocks:
                self.kv.expect(isinstance(block, int) and 0 <= block < self.kv.config["num_blocks"], "index_content",
                               f"index key {_short(key)} names block {block!r}, outside 0..{self.kv.config['num_blocks'] - 1}")
                self.kv.expect(self.holds_prefix(block, prefix), "index_content",
                               lambda: f"index key {_short(key)} (prefix {list(prefix)}) names block {block}, which "
                                       f"holds {self.kv.block_content(block)}")
        conflicts = promotion_conflicts(index, self.mirror.prefix, self.kv.B)
        if conflicts:
            block, full, partial = conflicts[0]
            self.kv.expect(False, "index_content",
                           f"block {block} is named by the full-block key {_short(full)} (prefix "
                           f"{list(self.mirror.prefix[full])}) and by the partial key {_short(partial)} (prefix "
                           f"{list(self.mirror.prefix[partial])}): a block that filled is named by its full key "
                           f"only; the partial key is stale")

    def holds_prefix(self, block: int, prefix: tuple) -> bool:
        """The block's first `(len - 1) % B + 1` slots hold the prefix's tokens from its last block
        boundary on, each after its own prefix."""
        B = self.kv.B
        start = (len(prefix) - 1) // B * B
        return all(self.kv.gpu.get(block * B + offset) == KV(prefix[:start + offset], prefix[start + offset])
                   for offset in range(len(prefix) - start))

    def expect(self, ok: bool, message) -> None:
        self.kv.expect(ok, "kv_events", message)


def _short(key) -> str:
    text = key.hex() if isinstance(key, bytes) else repr(key)
    return text[:12] + ("..." if len(text) > 12 else "")


def _difference(mirrored: dict, counts: dict) -> str:
    parts = []
    for key in sorted(set(mirrored) | set(counts), key=repr):
        if mirrored.get(key, 0) != counts.get(key, 0):
            parts.append(f"key {_short(key)}: {mirrored.get(key, 0)} block(s) by the events, "
                         f"{counts.get(key, 0)} in the index")
    return "; ".join(parts)
