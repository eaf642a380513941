"""The `kv_events` and `index_content` oracles (fuzz/events.py), on a subject whose events are known.

`PublishingSpec` is the executable spec plus an event stream derived from its own index: after each
operation the entries that left `cached_blocks()` are published as `BlockRemoved`, the new ones as
`BlockStored` (key = the content the block completes, parent = that content less one block). It is
a correct publisher by construction, so it must pass; each planted publisher bug below must be caught
by the oracle named for it, and only with the capability declared.
"""

import pytest
from hypothesis import Phase, given, settings, strategies as st

from pagedkv.fuzz.events import AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.fuzz.harness import Conformance, replay
from pagedkv.fuzz.oracles import ORACLES, OracleFailure
from pagedkv.fuzz.testing import ConformanceFailure, run_conformance
from pagedkv.spec import KVSpec

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
CAPABILITIES = frozenset({"fork", "prefix_caching", "kv_events"})


class PublishingSpec(KVSpec):
    """KVSpec publishing its index changes as events, keyed by content."""

    capabilities = CAPABILITIES

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending, self.seen = [], {}

    def add(self, seq_id, tokens):
        try:
            return super().add(seq_id, tokens)
        finally:
            self.publish()

    def append(self, seq_id, token):
        try:
            return super().append(seq_id, token)
        finally:
            self.publish()

    def fork(self, parent_id, child_id):
        try:
            return super().fork(parent_id, child_id)
        finally:
            self.publish()

    def free(self, seq_id):
        try:
            return super().free(seq_id)
        finally:
            self.publish()

    def publish(self) -> None:
        now = self.cached_blocks()
        gone = [key for block, key in self.seen.items() if now.get(block) != key]
        new = [key for block, key in now.items() if self.seen.get(block) != key]
        self.pending += [BlockRemoved((key,)) for key in gone]
        self.pending += [self.stored(key) for key in sorted(new, key=len)]  # parents before children
        self.seen = now

    def stored(self, key: tuple) -> BlockStored:
        B = self.block_size
        return BlockStored((key,), key[:-B] or None, key[-B:])

    def kv_events(self) -> list:
        events, self.pending = self.pending, []
        return events

    def cache_index(self) -> dict:
        index = {}
        for block, key in self.cached_blocks().items():
            index.setdefault(key, []).append(block)
        return index


class LosesRemovals(PublishingSpec):
    """Evictions are not published: a router keeps sending requests to blocks that are gone."""

    def publish(self):
        super().publish()
        self.pending = [event for event in self.pending if not isinstance(event, BlockRemoved)]


class ReannouncesEveryStep(PublishingSpec):
    """The newest stored key is announced again on every later step, its index entry unchanged:
    consumers count blocks the index does not have."""

    def publish(self):
        super().publish()
        stores = [event for event in self.pending if isinstance(event, BlockStored)]
        if stores:
            self.last = stores[-1]
        elif getattr(self, "last", None) and self.last.keys[0] in self.cache_index():
            self.pending.append(self.last)


class UnchainedParent(PublishingSpec):
    """Every block is published as a first block (parent None): consumers learn wrong prefixes."""

    def stored(self, key):
        return BlockStored((key,), None, key[-self.block_size:])


class StaleEntry(PublishingSpec):
    """The index never drops an entry (nor publishes a removal): a key still names its block after
    the block was handed out again and rewritten."""

    def publish(self):
        now = self.cached_blocks()
        self.ever = getattr(self, "ever", {})
        for block, key in now.items():
            if self.seen.get(block) != key:
                self.ever.setdefault(key, []).append(block)
        super().publish()
        self.pending = [event for event in self.pending if not isinstance(event, BlockRemoved)]

    def cache_index(self):
        return {key: list(blocks) for key, blocks in getattr(self, "ever", {}).items()}


class FineGrained(PublishingSpec):
    """Keys at token granularity inside a block, as vLLM's partial keys (hash_block_size below the
    block size): a prompt's last hit boundary (len - 1) that ends inside a block is indexed under a
    partial key naming that block; the key is dropped when the block fills (promotion: its full key
    replaces it) or stops holding the prefix (released, handed out again)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.partial, self.arrived = {}, None   # partial prefix -> its block; the prompt just added

    def add(self, seq_id, tokens):
        self.arrived = None if seq_id in self.seqs else (seq_id, tuple(tokens))   # a duplicate adds nothing
        return super().add(seq_id, tokens)

    def publish(self):
        B, gone = self.block_size, []
        for prefix, block in list(self.partial.items()):
            if not self.partial_holds(block, prefix):
                gone.append(prefix)
                del self.partial[prefix]
        new = self.register(*self.arrived) if self.arrived and self.arrived[0] in self.seqs else []
        self.arrived = None
        self.pending += [BlockRemoved((prefix,)) for prefix in gone]
        super().publish()
        self.pending += [BlockStored((prefix,), prefix[:len(prefix) // B * B] or None,
                                     prefix[len(prefix) // B * B:], len(prefix) % B) for prefix in new]

    def register(self, seq_id, tokens) -> list:
        end, B = len(tokens) - 1, self.block_size
        if not self.prefix_caching or end % B == 0 or len(tokens) % B == 0 or tokens[:end] in self.partial:
            return []
        self.partial[tokens[:end]] = self.block_table(seq_id)[end // B]
        return [tokens[:end]]

    def partial_holds(self, block, prefix) -> bool:
        """The block holds the prefix's tail and is not full yet."""
        B, start = self.block_size, len(prefix) // self.block_size * self.block_size
        slots = self.slots[block]
        return slots[B - 1] is None and all(slots[i - start] == (prefix[:i], prefix[i])
                                            for i in range(start, len(prefix)))

    def cache_index(self):
        index = super().cache_index()
        for prefix, block in self.partial.items():
            index.setdefault(prefix, []).append(block)
        return index


class ResurrectsPartialKey(FineGrained):
    """vLLM #49125: after its block filled and the full key replaced it, the partial key of the
    prompt's last boundary is registered again (and published) on the next step."""

    def publish(self):
        dropped = [prefix for prefix, block in self.partial.items()
                   if self.slots[block][self.block_size - 1] is not None]
        blocks = {prefix: self.partial[prefix] for prefix in dropped}
        super().publish()
        self.later = getattr(self, "later", {})
        for prefix, block in self.later.items():
            if self.slots[block][(len(prefix) - 1) % self.block_size] == (prefix[:-1], prefix[-1]):
                self.partial[prefix] = block
                self.pending.append(BlockStored((prefix,), prefix[:len(prefix) // self.block_size
                                                                  * self.block_size] or None,
                                                prefix[len(prefix) // self.block_size * self.block_size:],
                                                len(prefix) % self.block_size))
        self.later = blocks


def run(factory, **options):
    try:
        return run_conformance(factory, policy="any", capabilities=CAPABILITIES, phases=NO_SHRINK,
                               report_multiple_bugs=False, name=factory.__name__, **options), None
    except ConformanceFailure as caught:
        return None, caught.failures[0]


def test_the_oracles_are_named():
    assert {"kv_events", "index_content"} <= set(ORACLES)


@pytest.mark.parametrize("publisher", [PublishingSpec, FineGrained], ids=lambda value: value.__name__)
def test_a_correct_publisher_passes_the_ci_profile(publisher):
    tally, failure = run(publisher)
    assert failure is None, failure
    assert tally["cache_hit"] and tally["eviction"]


def test_a_resurrected_partial_key_is_named_beside_the_full_key():
    """B=3: add(1, [1, 2, 3, 4, 5]) indexes [1, 2, 3] and the partial key [1, 2, 3, 4] (the last hit
    boundary, inside the second block, which holds 4 and 5); append(1, 6) fills that block, so its
    full key [1 .. 6] replaces the partial one; the buggy publisher registers [1, 2, 3, 4] again with
    append(1, 7), beside the full key of the same block."""
    config = {"num_blocks": 4, "block_size": 3, "prefix_caching": True, "num_cpu_blocks": 0}
    program = [["add", [1, [1, 2, 3, 4, 5]]], ["append", [1, 6]], ["append", [1, 7]]]
    replay(FineGrained, config, program, policy="any", capabilities=CAPABILITIES)
    with pytest.raises(OracleFailure, match=r"\[index_content\] block \d+ is named by the full-block key .* "
                                            r"\[1, 2, 3, 4, 5, 6\]\) and by the partial key .*\[1, 2, 3, 4\]\)"):
        replay(ResurrectsPartialKey, config, program, policy="any", capabilities=CAPABILITIES)


#: planted publisher bug -> the oracles that are its symptoms. An unchained parent gives consumers wrong
#: prefixes: a wrong one the stream announced twice (kv_events), or one its block does not hold
#: (index_content), whichever the first program shows.
PLANTED = {LosesRemovals: ("kv_events",), ReannouncesEveryStep: ("kv_events",),
           UnchainedParent: ("kv_events", "index_content"), StaleEntry: ("index_content",),
           ResurrectsPartialKey: ("index_content",)}


@pytest.mark.parametrize("bug", PLANTED, ids=lambda bug: bug.__name__)
def test_ci_profile_catches_each_publisher_bug(bug):
    _, failure = run(bug)
    assert failure is not None and failure["oracle"] in PLANTED[bug], failure


def test_without_the_capability_events_are_not_checked():
    """The publisher bug the declared run catches (above) passes undeclared: run_conformance raises
    ConformanceFailure on any finding."""
    tally = run_conformance(LosesRemovals, policy="any", capabilities=frozenset({"fork", "prefix_caching"}),
                            phases=NO_SHRINK, name="LosesRemovals-undeclared")
    assert tally["examples"] and tally["eviction"]


# ---------------------------------------------------------------------- the stream rules, one by one


def checker(block_size=2):
    kv = Conformance(PublishingSpec, {"num_blocks": 16, "block_size": block_size, "prefix_caching": True,
                                      "num_cpu_blocks": 0}, policy="any", capabilities=CAPABILITIES)
    return kv, kv.events


def test_a_removal_of_an_unannounced_key_fires():
    kv, check = checker()
    with pytest.raises(OracleFailure, match="BlockRemoved for key"):
        check.mirror.apply(BlockRemoved(("k",)))


def test_an_unannounced_parent_fires():
    kv, check = checker()
    kv.add(1, [1, 2, 3, 4, 5])
    with pytest.raises(OracleFailure, match="names parent"):
        check.mirror.apply(BlockStored(("b",), "a", (3, 4)))


def test_a_key_announced_for_two_prefixes_fires():
    kv, check = checker()
    kv.add(1, [1, 2, 3, 4, 5])
    check.settle()
    key = next(iter(check.mirror.prefix))
    with pytest.raises(OracleFailure, match="announced it before"):
        check.mirror.apply(BlockStored((key,), None, (9, 9)))


def test_tokens_must_cover_the_announced_blocks():
    kv, check = checker()
    with pytest.raises(OracleFailure, match="carries 3 tokens"):
        check.mirror.apply(BlockStored(("a", "b"), None, (1, 2, 3)))


def test_cleared_forgets_everything():
    kv, check = checker()
    kv.add(1, [1, 2, 3])
    check.settle()
    assert check.mirror.counted()
    check.mirror.apply(AllBlocksCleared())
    assert not check.mirror.counted() and not check.mirror.prefix


@settings(max_examples=60, deadline=None)
@given(block_size=st.integers(1, 4), length=st.integers(1, 12), cut=st.integers(1, 12))
def test_a_prefix_inside_a_block_counts_only_its_own_slots(block_size, length, cut):
    """A key finer than the block (a partial prefix) names the block that holds its last token; only
    the slots up to that token are compared, and a prefix the sequence does not have never matches."""
    kv, check = checker(block_size)
    tokens = [(i * 7) % 5 for i in range(length)]
    kv.add(1, tokens)
    table = kv.table(1)
    cut = min(cut, length)
    assert check.holds_prefix(table[(cut - 1) // block_size], tuple(tokens[:cut]))
    wrong = tuple(tokens[:cut - 1]) + (tokens[cut - 1] + 1,)
    assert not check.holds_prefix(table[(cut - 1) // block_size], wrong)


class SaysTuples(PublishingSpec):
    def kv_events(self):
        return [("stored", event) for event in super().kv_events()]


class IndexAsList(PublishingSpec):
    def cache_index(self):
        return list(super().cache_index().items())


@pytest.mark.parametrize("subject, what", [(SaysTuples, r"kv_events\(\) returned \('stored'"),
                                           (IndexAsList, r"cache_index\(\) returned list")],
                         ids=lambda value: getattr(value, "__name__", "message"))
def test_events_and_index_of_the_wrong_type_are_protocol_findings(subject, what):
    with pytest.raises(OracleFailure, match=r"\[protocol\] " + what):
        replay(subject, {"num_blocks": 4, "block_size": 2, "prefix_caching": True, "num_cpu_blocks": 0},
               [["add", [1, [1, 2, 3]]]], policy="any", capabilities=CAPABILITIES)
