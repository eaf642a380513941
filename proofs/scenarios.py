"""Scenarios: small driven `KVSpec` runs whose PEP 316 contracts CrossHair can check non-vacuously.

`crosshair check` of `spec/kvspec.py` builds `self` through `KVSpec.__init__`, so every method that
needs an existing sequence is vacuous there ("unable to meet precondition"). Each scenario here
builds a concrete small spec (N=4 GPU blocks, B=2, C=2 CPU blocks, prefix caching on), drives it to a
state chosen by SYMBOLIC arguments (prompts of at most 5 tokens in {0,1,2}, a token, booleans that
pick fork / preempt mode), calls one operation, and its `post:` lines state that operation's
contract, that every named invariant holds (`violations(kv)` is empty), and that a failed call left
`kv.snapshot()` unchanged. The called KVSpec methods' own `pre:`/`post:` are enforced by CrossHair
during the run too (a callee precondition failure is reported; a callee postcondition failure only
drops that path, which is why the scenarios restate the contract).

Each scenario returns a plain tuple of observations; the first element is always the spec.
Only the standard library and the spec are imported.
"""
from typing import List

if __package__ == "proofs":
    # Loaded by `crosshair check proofs/scenarios.py` from the checkout (as `proofs.scenarios`, the
    # checkout root on sys.path): import the spec the same way. Through the editable `pagedkv`
    # package, CrossHair 0.0.113 crashes reading options of the callee's package
    # (importlib.resources.files on the editable namespace: "MultiplexedPath only supports
    # directories"), on every path.
    from spec.blocks import blocks_needed
    from spec.errors import DuplicateSequence, OutOfBlocks
    from spec.invariants import violations
    from spec.kvspec import RUNNING, SWAPPED, WAITING, KVSpec
else:
    from pagedkv.spec.blocks import blocks_needed
    from pagedkv.spec.errors import DuplicateSequence, OutOfBlocks
    from pagedkv.spec.invariants import violations
    from pagedkv.spec.kvspec import RUNNING, SWAPPED, WAITING, KVSpec

N, B, C = 4, 2, 2



def _kv() -> KVSpec:
    return KVSpec(N, B, num_cpu_blocks=C, prefix_caching=True)


def _attempt(kv: KVSpec, op, *args):
    """Run kv.op(*args): (True, result) or (False, error name); a failure must not change kv."""
    before = kv.snapshot()
    try:
        return True, getattr(kv, op)(*args)
    except (OutOfBlocks, DuplicateSequence) as error:
        assert kv.snapshot() == before, f"failed {op}{args} changed the state"
        return False, type(error).__name__


def _cached_prefix(first: List[int], second: List[int]) -> int:
    """Tokens of `second` that running `first`'s full blocks can serve: the longest common prefix,
    in whole blocks, never the whole of `second`."""
    m = 0
    while m + B <= min(len(first), len(second) - 1) and second[:m + B] == first[:m + B]:
        m += B
    return m


def add_scenario(first: List[int], second: List[int]) -> tuple:
    """Add `first` (seq 1), then `second` (seq 2): cache hits are exactly the common full blocks.

    pre: 1 <= len(first) <= 5 and all(0 <= t < 3 for t in first)
    pre: 1 <= len(second) <= 5 and all(0 <= t < 3 for t in second)
    post: not violations(__return__[0])
    post: __return__[1] == (blocks_needed(len(second), 2) - _cached_prefix(first, second) // 2 <= N - blocks_needed(len(first), 2))
    post: not __return__[1] or __return__[2] == _cached_prefix(first, second)
    post: not __return__[1] or __return__[0].block_table(2)[:__return__[2] // 2] == __return__[0].block_table(1)[:__return__[2] // 2]
    post: not __return__[1] or __return__[0].num_free_blocks() == N - blocks_needed(len(first), 2) - blocks_needed(len(second), 2) + __return__[2] // 2
    """
    kv = _kv()
    kv.add(1, first)
    ok, cached = _attempt(kv, "add", 2, second)
    return kv, ok, cached


def append_scenario(prompt: List[int], token: int, fork: bool, filler: bool) -> tuple:
    """Add `prompt` (seq 1), maybe fork it (seq 2), maybe fill the pool (seq 3, one block), append.
    A new block iff the tail is full; copy-on-write exactly when the tail is shared and partial.

    pre: 1 <= len(prompt) <= 5 and all(0 <= t < 3 for t in prompt)
    pre: 0 <= token < 3
    post: not violations(__return__[0])
    post: __return__[1] == (not (len(prompt) % 2 == 0 or fork) or __return__[2] >= 1)
    post: not __return__[1] or len(__return__[3]) == (1 if fork and len(prompt) % 2 == 1 else 0)
    post: not __return__[1] or __return__[2] - __return__[0].num_free_blocks() == (1 if len(prompt) % 2 == 0 or fork else 0)
    post: not __return__[1] or __return__[0].tokens(1) == prompt + [token]
    post: not (__return__[1] and fork) or __return__[0].tokens(2) == prompt
    """
    kv = _kv()
    kv.add(1, prompt)
    if fork:
        kv.fork(1, 2)
    if filler:
        kv.add(3, [0])
    free_before = kv.num_free_blocks()
    ok, copies = _attempt(kv, "append", 1, token)
    return kv, ok, free_before, copies if ok else []


def fork_scenario(prompt: List[int], twice: bool) -> tuple:
    """Fork seq 1 into seq 2 (and, if `twice`, seq 2 into seq 3): every block shared, none taken.

    pre: 1 <= len(prompt) <= 5 and all(0 <= t < 3 for t in prompt)
    post: not violations(__return__[0])
    post: __return__[0].block_table(2) == __return__[0].block_table(1)
    post: not twice or __return__[0].block_table(3) == __return__[0].block_table(1)
    post: all(__return__[0].refcount(b) == (3 if twice else 2) for b in __return__[0].block_table(1))
    post: __return__[0].num_free_blocks() == __return__[1] == N - blocks_needed(len(prompt), 2)
    """
    kv = _kv()
    kv.add(1, prompt)
    free_before = kv.num_free_blocks()
    kv.fork(1, 2)
    if twice:
        kv.fork(2, 3)
    return kv, free_before


def free_scenario(prompt: List[int], fork: bool) -> tuple:
    """Free seq 1: with nothing shared the pool is back to full; a fork keeps its blocks.

    pre: 1 <= len(prompt) <= 5 and all(0 <= t < 3 for t in prompt)
    post: not violations(__return__[0])
    post: __return__[0].seq_ids() == ([2] if fork else [])
    post: __return__[0].num_free_blocks() == (N - blocks_needed(len(prompt), 2) if fork else N)
    post: not fork or __return__[0].read(2) == __return__[1]
    """
    kv = _kv()
    kv.add(1, prompt)
    if fork:
        kv.fork(1, 2)
    reads = kv.read(1)
    kv.free(1)
    return kv, reads


def preempt_scenario(prompt: List[int], swap: bool, fork: bool) -> tuple:
    """Preempt seq 1 by recompute or swap (a swap needs a CPU block per GPU block, else it fails).

    pre: 1 <= len(prompt) <= 5 and all(0 <= t < 3 for t in prompt)
    post: not violations(__return__[0])
    post: __return__[1] == (not swap or blocks_needed(len(prompt), 2) <= C)
    post: not __return__[1] or __return__[0].status(1) == (SWAPPED if swap else WAITING)
    post: not __return__[1] or __return__[0].block_table(1) == []
    post: not __return__[1] or len(__return__[0].cpu_block_table(1)) == (blocks_needed(len(prompt), 2) if swap else 0)
    post: not __return__[1] or __return__[0].num_free_blocks() == (N - blocks_needed(len(prompt), 2) if fork else N)
    post: not __return__[1] or len(__return__[2]) == (blocks_needed(len(prompt), 2) if swap else 0)
    """
    kv = _kv()
    kv.add(1, prompt)
    if fork:
        kv.fork(1, 2)
    ok, copies = _attempt(kv, "preempt", 1, "swap" if swap else "recompute")
    return kv, ok, copies if ok else []


def resume_scenario(prompt: List[int], other: List[int], swap: bool) -> tuple:
    """Preempt seq 1 (recompute or swap), admit seq 2, resume seq 1: it runs again with a full
    table iff the free blocks allow (recompute may share cached blocks of seq 2 or its own past).

    pre: 1 <= len(prompt) <= 4 and all(0 <= t < 3 for t in prompt)
    pre: 1 <= len(other) <= 5 and all(0 <= t < 3 for t in other)
    post: not violations(__return__[0])
    post: not __return__[1] or __return__[0].status(1) == RUNNING
    post: not __return__[1] or __return__[0].cpu_block_table(1) == []
    post: not __return__[1] or __return__[0].tokens(1) == prompt
    post: not (__return__[1] and swap) or len(__return__[2]) == blocks_needed(len(prompt), 2)
    post: __return__[1] or __return__[0].status(1) == (SWAPPED if swap else WAITING)
    post: __return__[1] or not swap or __return__[3] < blocks_needed(len(prompt), 2)
    """
    kv = _kv()
    kv.add(1, prompt)
    kv.preempt(1, "swap" if swap else "recompute")
    _attempt(kv, "add", 2, other)
    free_before = kv.num_free_blocks()
    ok, copies = _attempt(kv, "resume", 1)
    return kv, ok, copies if ok else [], free_before


def step_scenario(p1: List[int], p2: List[int], t1: int, t2: int, fork: bool) -> tuple:
    """Seq 1 and seq 2 (a fork of 1, or a second prompt), one step of both: each either gets its
    token or is preempted (latest admitted first), never both.

    pre: 1 <= len(p1) <= 4 and all(0 <= t < 3 for t in p1)
    pre: 1 <= len(p2) <= 4 and all(0 <= t < 3 for t in p2)
    pre: 0 <= t1 < 3 and 0 <= t2 < 3
    post: not violations(__return__[0])
    post: set(__return__[1].appended) | set(__return__[1].preempted) == {1, 2}
    post: not set(__return__[1].appended) & set(__return__[1].preempted)
    post: __return__[1].preempted in ([], [2], [2, 1])
    post: all(__return__[0].status(s) == WAITING for s in __return__[1].preempted)
    post: 1 not in __return__[1].appended or __return__[0].tokens(1) == p1 + [t1]
    post: len(__return__[1].copies) <= 1
    """
    kv = _kv()
    kv.add(1, p1)
    if fork:
        kv.fork(1, 2)
    else:
        kv.add(2, p2)
    return kv, kv.step({1: t1, 2: t2})
