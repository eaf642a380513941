"""The seed's teaching lab, run on the spec: block arithmetic, then five scenarios on a small pool.

Each scenario returns (name, passed, what it saw) so the CLI can print PASS/FAIL lines.
"""

from .blocks import blocks_needed
from .errors import OutOfBlocks
from .kvspec import KVSpec

DEFAULT_LENGTHS = (17, 32, 63)


def block_arithmetic(lengths, block_size: int) -> tuple:
    """Per length: blocks, slots, useful tokens, tail waste; then the totals."""
    rows = []
    for length in lengths:
        blocks = blocks_needed(length, block_size)
        rows.append({"length": length, "blocks": blocks, "slots": blocks * block_size,
                     "useful": length, "tail_waste": blocks * block_size - length})
    totals = {key: sum(row[key] for row in rows) for key in ("blocks", "slots", "useful", "tail_waste")}
    return rows, totals


def _fill(kv: KVSpec, seq_id: int, length: int, first_token: int = 1) -> None:
    kv.add(seq_id, list(range(first_token, first_token + length)))


def scenario_cow_isolates_writers(block_size: int):
    kv = KVSpec(8, block_size)
    _fill(kv, 1, block_size + 1)          # a partly filled tail, so the fork shares it
    kv.fork(1, 2)
    copies_a = kv.append(1, 1001)
    copies_b = kv.append(2, 2002)
    kv.check()
    expected_copies = 1 if block_size > 1 else 0   # with B = 1 every tail is full: no partial block to copy
    ok = (kv.read(1)[-1].token == 1001 and kv.read(2)[-1].token == 2002 and len(copies_a) == expected_copies
          and not copies_b and kv.block_table(1)[-1] != kv.block_table(2)[-1])
    return "writes after sharing do not pollute each other", ok, f"copies {copies_a} then {copies_b}"


def scenario_last_reference_returns_block(block_size: int):
    kv = KVSpec(8, block_size)
    _fill(kv, 1, block_size)
    kv.fork(1, 2)
    shared = kv.block_table(1)[0]
    kv.free(1)
    still_held = kv.refcount(shared) == 1 and kv.num_free_blocks() == 7
    kv.free(2)
    ok = still_held and kv.refcount(shared) == 0 and kv.num_free_blocks() == 8
    return "the last reference returns a block", ok, f"block {shared} free after the second free"


def scenario_failed_cow_keeps_mapping(block_size: int):
    if block_size == 1:
        return "a copy-on-write that cannot allocate leaves the old mapping intact", True, "B=1 has no partial tails"
    kv = KVSpec(2, block_size)
    _fill(kv, 1, 1)
    kv.fork(1, 2)
    _fill(kv, 3, 1, first_token=50)       # the pool is now empty
    before = (kv.block_table(1), kv.block_table(2), kv.refcount(kv.block_table(1)[0]))
    try:
        kv.append(2, 7)
        raised = False
    except OutOfBlocks:
        raised = True
    after = (kv.block_table(1), kv.block_table(2), kv.refcount(kv.block_table(1)[0]))
    kv.check()
    return ("a copy-on-write that cannot allocate leaves the old mapping intact", raised and before == after,
            f"tables and refcount {before} -> {after}")


def scenario_cancel_returns_everything(block_size: int):
    kv = KVSpec(8, block_size)
    _fill(kv, 1, 2 * block_size + 1)
    for token in range(block_size):
        kv.append(1, token)
    kv.free(1)
    kv.check()
    return "a cancelled request returns all its blocks", kv.num_free_blocks() == 8, f"{kv.num_free_blocks()}/8 free"


def scenario_pool_runs_out(block_size: int):
    kv = KVSpec(4, block_size)
    admitted = 0
    try:
        while True:
            _fill(kv, admitted, block_size + 1)
            admitted += 1
    except OutOfBlocks as error:
        kv.check()
        ok = admitted == 2 and error.needed == 2 and error.available == 0
        return "a pool runs out with a clear OutOfBlocks", ok, f"after {admitted} requests: {error}"


SCENARIOS = (scenario_cow_isolates_writers, scenario_last_reference_returns_block,
             scenario_failed_cow_keeps_mapping, scenario_cancel_returns_everything, scenario_pool_runs_out)


def run_scenarios(block_size: int) -> list:
    return [scenario(block_size) for scenario in SCENARIOS]
