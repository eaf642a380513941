"""Every clause of every named invariant of the spec (`spec/invariants.py`) fires on a corruption it
names, and no other clause does: a check that lost a clause, or reports a corruption under the
wrong name, fails here (issue 18, gap 5: a `check()` that silently accepted a corrupted index).

Each corruption is planted into a valid state reached by a drawn program (`invariant_clauses.
valid_states`: anchor sequences that give every corruption a target, then random operations)."""

from collections import namedtuple

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from invariant_clauses import clauses_fired, message_templates, valid_states

from pagedkv.spec import INVARIANTS, KV, InvariantViolation, KVSpec, expected_slots, violations

#: clause -> (the invariant that states it, the regex its messages match)
CLAUSES = {
    "gpu homes": ("conservation", r"gpu block \d+ is in \d+ of free/evictable/live"),
    "evictable unindexed": ("conservation", r"evictable block \d+ is not in the prefix index"),
    "free indexed": ("conservation", r"free block \d+ is in the prefix index"),
    "free holds KV": ("conservation", r"free block \d+ still holds KV"),
    "cpu homes": ("conservation", r"cpu block \d+ is in \d+ of free/held"),
    "gpu id outside": ("conservation", r"gpu block id -?\d+ outside the pool is free or evictable"),
    "cpu id outside": ("conservation", r"cpu block id -?\d+ outside the pool is free or held"),
    "held twice": ("refcount", r"sequence \d+ holds a block twice: \[.*\]"),
    "table id outside": ("refcount", r"sequence \d+ holds block id -?\d+ outside the pool"),
    "ref count": ("refcount", r"block \d+: ref count -?\d+, held by \d+ tables"),
    "status": ("table_shape", r"sequence \d+ has status .*, not running, waiting or swapped"),
    "blocks held": ("table_shape", r"\w+ sequence \d+ of length \d+ holds \d+ gpu / \d+ cpu blocks, "
                                   r"expected \d+ / \d+"),
    "reads back": ("content", r"sequence \d+ position \d+ reads .*, wrote .*"),
    "index agrees": ("cache_index", r"holders and block_key do not describe the same index"),
    "index id outside": ("cache_index", r"indexed block id -?\d+ is outside the pool"),
    "whole blocks": ("cache_index", r"indexed block \d+ has a key of \d+ tokens, not whole blocks"),
    "holds its key": ("cache_index", r"indexed block \d+ does not hold the last block of its key"),
}

# ---------------------------------------------------------------------- valid states

SPECS = st.just(lambda num_blocks, block_size, num_cpu_blocks: KVSpec(
    num_blocks, block_size, num_cpu_blocks=num_cpu_blocks, prefix_caching=True))


# ---------------------------------------------------------------------- targets in a state
# The random part may (rarely) have evicted or preempted an anchor; a state without a target is
# skipped with `assume`.

def private_tail(kv: KVSpec):
    """A running sequence of >= 2 blocks whose partial tail only it holds and nobody indexes."""
    for seq in kv.seqs.values():
        table = seq.block_table
        if seq.status == "running" and len(table) >= 2 and kv.ref_count[table[-1]] == 1 \
                and table[-1] not in kv.block_key:
            return seq
    assume(False)


def evictable_block(kv: KVSpec) -> int:
    assume(kv.evictable)
    return next(iter(kv.evictable))


def sequence_in(kv: KVSpec, status: str):
    return next((seq for seq in kv.seqs.values() if seq.status == status), None) or assume(False)


def live_block(kv: KVSpec) -> int:
    return private_tail(kv).block_table[0]


def rekey(kv: KVSpec, block: int, key: tuple) -> None:
    """Index `block` under `key` instead of what it had, keeping holders and block_key agreed."""
    old = kv.block_key.get(block)
    if old is not None:
        kv.holders[old].discard(block)
        if not kv.holders[old]:
            del kv.holders[old]
    kv.block_key[block] = key
    kv.holders.setdefault(key, set()).add(block)


def release_to_free(kv: KVSpec, block: int) -> None:
    """An unindexed block nobody holds any more goes where release puts it: wiped, free."""
    kv.ref_count[block] = 0
    kv.slots[block] = [None] * kv.block_size
    kv.free_queue.append(block)


def unindex(kv: KVSpec, block: int) -> None:
    key = kv.block_key.pop(block)
    kv.holders[key].discard(block)
    if not kv.holders[key]:
        del kv.holders[key]


# ---------------------------------------------------------------------- corruptions

def lose_free_block(kv):
    kv.free_queue.popleft()


def unindex_evictable(kv):
    unindex(kv, evictable_block(kv))


def index_free_block(kv):
    """A free block indexed under a whole-block key whose KV it holds: only its being free is wrong."""
    block, key = kv.free_queue[0], tuple(range(1000, 1000 + kv.block_size))
    kv.slots[block] = expected_slots(key, 0, len(key))
    rekey(kv, block, key)


def leave_kv_in_a_free_block(kv):
    kv.slots[kv.free_queue[0]][0] = KV((), 0)


def free_a_held_cpu_block(kv):
    kv.cpu_free_queue.append(sequence_in(kv, "swapped").cpu_block_table[0])


def free_an_id_outside_the_gpu_pool(kv):
    kv.free_queue.append(kv.num_blocks)


def free_an_id_outside_the_cpu_pool(kv):
    kv.cpu_free_queue.append(kv.num_cpu_blocks)


def repeat_a_block_in_a_table(kv):
    """The private tail's slot in the table names the first block instead; the tail, now held by
    nobody, is freed, so ref counts and homes stay right."""
    seq = private_tail(kv)
    tail = seq.block_table[-1]
    seq.block_table[-1] = seq.block_table[0]
    release_to_free(kv, tail)


def table_names_an_id_outside_the_pool(kv):
    seq = private_tail(kv)
    tail = seq.block_table[-1]
    seq.block_table[-1] = kv.num_blocks
    release_to_free(kv, tail)


def overcount_a_live_block(kv):
    kv.ref_count[live_block(kv)] += 1


def unknown_status(kv):
    sequence_in(kv, "waiting").status = "paused"


def waiting_keeps_its_table(kv):
    private_tail(kv).status = "waiting"


def overwrite_a_private_slot(kv):
    kv.slots[private_tail(kv).block_table[-1]][0] = KV((), -1)


def empty_holders_entry(kv):
    kv.holders[(-1,) * kv.block_size] = set()


def holder_without_key(kv):
    key = kv.block_key[evictable_block(kv)]
    kv.holders[key].add(kv.free_queue[0])


def index_an_id_outside_the_pool(kv):
    rekey(kv, kv.num_blocks, tuple(range(1000, 1000 + kv.block_size)))


def key_of_partial_block(kv):
    block = evictable_block(kv)
    rekey(kv, block, kv.block_key[block] + (0,))   # B >= 2, so one token more is not whole blocks


def wipe_an_evictable_slot(kv):
    kv.slots[evictable_block(kv)][0] = None


Corruption = namedtuple("Corruption", "clause plant companions why", defaults=((), ""))
CORRUPTIONS = [
    Corruption("gpu homes", lose_free_block),
    Corruption("evictable unindexed", unindex_evictable),
    Corruption("free indexed", index_free_block),
    Corruption("free holds KV", leave_kv_in_a_free_block),
    Corruption("cpu homes", free_a_held_cpu_block),
    Corruption("gpu id outside", free_an_id_outside_the_gpu_pool),
    Corruption("cpu id outside", free_an_id_outside_the_cpu_pool),
    Corruption("held twice", repeat_a_block_in_a_table, ("reads back",),
               "a table naming one block twice reads one block's ghost KV at positions with other "
               "prefixes: `content` always fires with it"),
    Corruption("table id outside", table_names_an_id_outside_the_pool),
    Corruption("ref count", overcount_a_live_block),
    Corruption("status", unknown_status),
    Corruption("blocks held", waiting_keeps_its_table),
    Corruption("reads back", overwrite_a_private_slot),
    Corruption("index agrees", empty_holders_entry),
    Corruption("index agrees", holder_without_key),
    Corruption("index id outside", index_an_id_outside_the_pool),
    Corruption("whole blocks", key_of_partial_block),
    Corruption("holds its key", wipe_an_evictable_slot),
]


def fired(kv: KVSpec) -> set:
    """The clauses whose messages `violations` reports, each under its own invariant's name."""
    clauses = set()
    for invariant, messages in violations(kv).items():
        own = {clause: pattern for clause, (inv, pattern) in CLAUSES.items() if inv == invariant}
        clauses |= clauses_fired(messages, own)
    return clauses


@pytest.mark.parametrize("corruption", CORRUPTIONS, ids=lambda c: f"{c.clause}: {c.plant.__name__}")
@settings(max_examples=8, deadline=None)
@given(kv=valid_states(SPECS))
def test_a_planted_corruption_fires_its_clause_and_no_other(corruption, kv):
    assert violations(kv) == {}
    corruption.plant(kv)
    assert fired(kv) == {corruption.clause, *corruption.companions}
    with pytest.raises(InvariantViolation) as raised:
        kv.check()
    assert raised.value.invariant == CLAUSES[corruption.clause][0]


def test_every_clause_has_a_corruption_and_every_corruption_a_reason_for_its_companions():
    assert {c.clause for c in CORRUPTIONS} == set(CLAUSES)
    assert all(c.why for c in CORRUPTIONS if c.companions)


@pytest.mark.parametrize("invariant", list(INVARIANTS))
def test_the_table_lists_every_clause_the_invariant_states(invariant):
    stated = message_templates(INVARIANTS[invariant])
    assert stated == sum(1 for inv, _ in CLAUSES.values() if inv == invariant)

