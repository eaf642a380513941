"""The spec's named invariants, checked on the production allocator's own state.

`check()` covers those that need no ghost content (conservation, refcount, table_shape,
cache_index); reading back every sequence's own KV is the differential test's job.
"""

import numpy as np

from pagedkv.spec import RUNNING, SWAPPED, WAITING
from pagedkv.spec.blocks import blocks_needed

from .prefix_cache import NONE
from .rows import STATUSES


def invariant_problems(bm) -> dict:
    """Invariant name -> the ways `bm` breaks it (empty when it holds)."""
    tables = {seq_id: bm.rows.table(row) for seq_id, row in bm.row_of.items()}
    cpu_held = [b for row in bm.row_of.values() if bm.rows.seq[row] is not None
                for b in bm.rows.seq[row].cpu_block_table]
    return {
        "conservation": bm.pool.problems() + bm.cpu_pool.problems(cpu_held),
        "refcount": _refcount_problems(bm, tables),
        "table_shape": _shape_problems(bm, tables),
        "cache_index": bm.cache.problems(bm.block_tokens) + _chain_problems(bm, tables) if bm.cache else [],
    }


def _chain_problems(bm, tables: dict) -> list:
    """Each indexed block of a table is filed after the content of the block before it (a first block
    after none), so a hit through it serves this very prefix (the spec's keys name whole prefixes)."""
    cache, problems = bm.cache, []
    for seq_id, table in tables.items():
        nodes = [int(cache.block_node[b]) if 0 <= b < bm.num_blocks else NONE for b in table]
        for j, node in enumerate(nodes):
            if node != NONE and 0 <= node < len(cache.node_parent) and \
                    int(cache.node_parent[node]) != (nodes[j - 1] if j else NONE):
                problems.append(f"sequence {seq_id}'s block {j} is indexed after another prefix than its own")
    return problems


def _refcount_problems(bm, tables: dict) -> list:
    problems = [f"sequence {s} holds a block twice: {t}" for s, t in tables.items() if len(set(t)) != len(t)]
    problems += [f"sequence {s} holds block id {b} outside the pool" for s, t in tables.items()
                 for b in t if not 0 <= b < bm.num_blocks]
    holders = np.zeros(bm.num_blocks, dtype=np.int64)
    for table in tables.values():
        holders[[b for b in set(table) if 0 <= b < bm.num_blocks]] += 1
    problems += [f"block {b}: ref count {bm.pool.ref_count[b]}, held by {holders[b]} tables"
                 for b in np.flatnonzero(holders != bm.pool.ref_count).tolist()]
    return problems


def _shape_problems(bm, tables: dict) -> list:
    problems = []
    rows = bm.rows
    for seq_id, row in bm.row_of.items():
        record = rows.seq[row]
        if record is None or record.seq_id != seq_id:
            problems.append(f"sequence {seq_id} maps to row {row}, which holds "
                            f"{'nothing' if record is None else f'sequence {record.seq_id}'}")
            continue
        if not 0 <= rows.row_status[row] < len(STATUSES):
            problems.append(f"sequence {seq_id} has status code {rows.row_status[row]}, not running, waiting or swapped")
            continue
        status = STATUSES[rows.row_status[row]]
        want = blocks_needed(int(rows.seq_len[row]), bm.block_size)
        held = (len(tables[seq_id]), len(record.cpu_block_table))
        expected = {RUNNING: (want, 0), SWAPPED: (0, want), WAITING: (0, 0)}[status]
        if held != expected:
            problems.append(f"{status} sequence {seq_id} of length {rows.seq_len[row]} holds "
                            f"{held[0]} gpu / {held[1]} cpu blocks, expected {expected}")
    # A live row nobody maps to still runs (running order reads the rows): `step` could preempt it.
    problems += [f"row {row} holds sequence {record.seq_id}, which does not map to it"
                 for row, record in enumerate(rows.seq) if record is not None and bm.row_of.get(record.seq_id) != row]
    return problems + rows.problems()
