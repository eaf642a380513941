"""The named invariants of a paged KV-cache block manager, stated over a `KVSpec`'s state.

Each function returns the list of ways its invariant is broken (empty when it holds). The same
names are used by `KVSpec.check()`, the Z3 proofs and the fuzz reports.
"""

from collections import Counter

from .blocks import blocks_needed, expected_slots
from .errors import InvariantViolation


def conservation(kv) -> list:
    """Every GPU block is exactly one of free, evictable, live (ref count > 0); evictable blocks are
    in the prefix index and free ones are not, and hold no KV; every CPU block is exactly one of free or held by one
    swapped sequence; no free, evictable or held id lies outside its pool."""
    problems = []
    free, evictable = list(kv.free_queue), list(kv.evictable)
    live = [b for b in range(kv.num_blocks) if kv.ref_count[b] > 0]
    homes = Counter(free + evictable + live)
    for block in range(kv.num_blocks):
        if homes[block] != 1:
            problems.append(f"gpu block {block} is in {homes[block]} of free/evictable/live")
    for block in evictable:
        if block not in kv.block_key:
            problems.append(f"evictable block {block} is not in the prefix index")
    # A free block is handed out and overwritten next: an index entry would serve its old prefix,
    # and KV left in it would be read as the new sequence's wherever it has not written yet.
    for block in free:
        if block in kv.block_key:
            problems.append(f"free block {block} is in the prefix index")
        elif 0 <= block < kv.num_blocks and kv.slots[block] != kv._empty_block():
            problems.append(f"free block {block} still holds KV")
    cpu_held = [b for seq in kv.seqs.values() for b in seq.cpu_block_table]
    cpu_homes = Counter(list(kv.cpu_free_queue) + cpu_held)
    for block in range(kv.num_cpu_blocks):
        if cpu_homes[block] != 1:
            problems.append(f"cpu block {block} is in {cpu_homes[block]} of free/held")
    problems += [f"gpu block id {b!r} outside the pool is free or evictable"
                 for b in sorted(set(homes) - set(range(kv.num_blocks)), key=repr)]
    problems += [f"cpu block id {b!r} outside the pool is free or held"
                 for b in sorted(set(cpu_homes) - set(range(kv.num_cpu_blocks)), key=repr)]
    return problems


def refcount(kv) -> list:
    """A block's ref count equals the number of live tables holding it; no table holds a block twice
    or an id outside the pool."""
    problems = []
    holders = Counter()
    for seq_id, seq in kv.seqs.items():
        table = seq.block_table
        if len(set(table)) != len(table):
            problems.append(f"sequence {seq_id} holds a block twice: {table}")
        problems += [f"sequence {seq_id} holds block id {b!r} outside the pool"
                     for b in table if not _in_pool(b, kv.num_blocks)]
        holders.update(set(table))
    for block in range(kv.num_blocks):
        if kv.ref_count[block] != holders[block]:
            problems.append(f"block {block}: ref count {kv.ref_count[block]}, held by {holders[block]} tables")
    return problems


def table_shape(kv) -> list:
    """A running sequence holds ceil(len/B) GPU blocks, a swapped one as many CPU blocks, a waiting
    one none; nobody holds blocks in both pools; every sequence has one of the three statuses."""
    problems = []
    for seq_id, seq in kv.seqs.items():
        want = blocks_needed(len(seq.tokens), kv.block_size)
        gpu, cpu = len(seq.block_table), len(seq.cpu_block_table)
        expected = {"running": (want, 0), "swapped": (0, want), "waiting": (0, 0)}.get(seq.status)
        if expected is None:
            problems.append(f"sequence {seq_id} has status {seq.status!r}, not running, waiting or swapped")
        elif (gpu, cpu) != expected:
            problems.append(f"{seq.status} sequence {seq_id} of length {len(seq.tokens)} holds "
                            f"{gpu} gpu / {cpu} cpu blocks, expected {expected[0]} / {expected[1]}")
    return problems


def content(kv) -> list:
    """Every running and swapped sequence reads back each of its tokens after its own prefix.
    A table of the wrong shape or with ids outside the pool cannot be read; `table_shape`,
    `refcount` and `conservation` report those."""
    problems = []
    for seq_id, seq in kv.seqs.items():
        table, pool_size = ((seq.block_table, kv.num_blocks) if seq.status == "running" else
                            (seq.cpu_block_table, kv.num_cpu_blocks) if seq.status == "swapped" else (None, 0))
        if table is None or len(table) != blocks_needed(len(seq.tokens), kv.block_size) or \
                not all(_in_pool(b, pool_size) for b in table):
            continue
        got, want = kv.read(seq_id), expected_slots(seq.tokens, 0, len(seq.tokens))
        for position, (g, w) in enumerate(zip(got, want)):
            if g != w:
                problems.append(f"sequence {seq_id} position {position} reads {g}, wrote {w}")
                break
    return problems


def cache_index(kv) -> list:
    """The holders of each content and the blocks' keys agree; every indexed block is in the pool,
    full, and holds exactly the tokens (and prefix) its key names."""
    problems = []
    if {b: key for key, blocks in kv.holders.items() for b in blocks} != kv.block_key or not all(kv.holders.values()):
        problems.append("holders and block_key do not describe the same index")
    for block, key in kv.block_key.items():
        if not _in_pool(block, kv.num_blocks):
            problems.append(f"indexed block id {block!r} is outside the pool")
        elif len(key) % kv.block_size or not key:
            problems.append(f"indexed block {block} has a key of {len(key)} tokens, not whole blocks")
        elif kv.slots[block] != expected_slots(key, len(key) - kv.block_size, len(key)):
            problems.append(f"indexed block {block} does not hold the last block of its key")
    return problems


def _in_pool(block, size: int) -> bool:
    return type(block) is int and 0 <= block < size


INVARIANTS = {
    "conservation": conservation,
    "refcount": refcount,
    "table_shape": table_shape,
    "content": content,
    "cache_index": cache_index,
}


def violations(kv) -> dict:
    """Map each broken invariant's name to its problems."""
    found = {name: inv(kv) for name, inv in INVARIANTS.items()}
    return {name: problems for name, problems in found.items() if problems}


def check_all(kv) -> None:
    for name, problems in violations(kv).items():
        raise InvariantViolation(name, "; ".join(problems[:3]))
