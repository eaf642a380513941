"""The BlockManager is shared between threads under one lock: a stress test with threads forking,
appending, preempting and freeing (and one checking invariants meanwhile) ends with conservation
and ref counts holding and, once everything is freed, no block leaked."""

import random
import sys
import threading

import pytest

from pagedkv.impl import BlockManager
from pagedkv.spec import OutOfBlocks

THREADS, OPERATIONS = 4, 400


def worker(bm: BlockManager, thread: int, errors: list) -> None:
    rng = random.Random(thread)
    mine, next_id = [], thread * 100_000
    try:
        for _ in range(OPERATIONS):
            op = rng.choice(["add", "add", "fork", "append", "append", "append", "free", "preempt"])
            try:
                if op == "add" or not mine:
                    next_id += 1
                    bm.add(next_id, [1, 2, 3, 4] + [rng.randrange(5) for _ in range(rng.randrange(1, 8))])
                    mine.append(next_id)
                elif op == "fork":
                    next_id += 1
                    bm.fork(rng.choice(mine), next_id)
                    mine.append(next_id)
                elif op == "append":
                    seq_ids = rng.sample(mine, k=min(len(mine), 3))
                    bm.append_batch(seq_ids, [rng.randrange(5) for _ in seq_ids])
                elif op == "free":
                    bm.free(mine.pop(rng.randrange(len(mine))))
                else:
                    seq_id = rng.choice(mine)
                    bm.preempt(seq_id, rng.choice(["recompute", "swap"]))
                    try:
                        bm.resume(seq_id)
                    except OutOfBlocks:   # all of this thread's sequences stay running
                        bm.free(seq_id)
                        mine.remove(seq_id)
            except OutOfBlocks:
                if mine and rng.random() < 0.5:
                    bm.free(mine.pop(0))
        for seq_id in mine:
            bm.free(seq_id)
    except Exception as error:   # noqa: BLE001 -- reported to the main thread
        errors.append(error)


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every few microseconds so calls interleave (without the lock this test
    fails every time)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


def test_threads_share_a_block_manager_without_leaks(frequent_thread_switches):
    bm = BlockManager(64, 2, num_cpu_blocks=16, prefix_caching=True, max_seqs=4)
    errors, done = [], threading.Event()

    def checker():
        while not done.is_set():
            bm.check()

    threads = [threading.Thread(target=worker, args=(bm, t, errors)) for t in range(THREADS)]
    watcher = threading.Thread(target=checker)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    assert not errors, errors
    bm.check()
    assert bm.seq_ids() == []
    assert bm.num_free_blocks() == bm.num_blocks and bm.num_free_cpu_blocks() == 16
    assert all(bm.refcount(b) == 0 for b in range(bm.num_blocks))
