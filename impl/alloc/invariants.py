"""The spec's named invariants, checked on the production allocator's own state.

`check()` covers those that need no ghost content (conservation, refcount, table_shape,
cache_index); reading back every sequence's own KV is the differential test's job.
"""

import numpy as np

from pagedkv.spec import RUNNING, SWAPPED, WAITING
from pagedkv.spec.blocks import blocks_needed

from .rows import STATUSES


def invariant_problems(bm) -> dict:
    """Invariant name -> the ways `bm` breaks it (empty when it holds)."""
    tables = {seq_id: bm.rows.table(row) for seq_id, row in bm.row_of.items()}
    cpu_held = [b for row in bm.row_of.values() for b in bm.rows.seq[row].cpu_block_table]
    return {
        "conservation": bm.pool.problems() + bm.cpu_pool.problems(cpu_held),
        "refcount": _refcount_problems(bm, tables),
        "table_shape": _shape_problems(bm, tables),
        "cache_index": bm.cache.problems(bm.block_tokens) if bm.cache else [],
    }


def _refcount_problems(bm, tables: dict) -> list:
    problems = [f"sequence {s} holds a block twice: {t}" for s, t in tables.items() if len(set(t)) != len(t)]
    holders = np.zeros(bm.num_blocks, dtype=np.int64)
    for table in tables.values():
        holders[list(set(table))] += 1
    problems += [f"block {b}: ref count {bm.pool.ref_count[b]}, held by {holders[b]} tables"
                 for b in np.flatnonzero(holders != bm.pool.ref_count).tolist()]
    return problems


def _shape_problems(bm, tables: dict) -> list:
    problems = []
    rows = bm.rows
    for seq_id, row in bm.row_of.items():
        status = STATUSES[rows.row_status[row]]
        want = blocks_needed(int(rows.seq_len[row]), bm.block_size)
        held = (len(tables[seq_id]), len(rows.seq[row].cpu_block_table))
        expected = {RUNNING: (want, 0), SWAPPED: (0, want), WAITING: (0, 0)}[status]
        if held != expected:
            problems.append(f"{status} sequence {seq_id} of length {rows.seq_len[row]} holds "
                            f"{held[0]} gpu / {held[1]} cpu blocks, expected {expected}")
    return problems + rows.problems()
