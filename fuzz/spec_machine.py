"""The spec's stateful check: random programs over `KVSpec`, every named invariant after every step.

Pools and blocks are drawn small so exhaustion, eviction, copy-on-write, cache hits and swap happen
every few steps. Ids come from a Bundle that keeps freed ids, so unknown-id errors arise naturally;
bad inputs (negative tokens, empty prompts, bad modes, duplicate ids) have rules of their own.
Every error must leave the state exactly as it was, and freeing everything at the end must return
both pools to full. Every operation is timed (`fuzz/guard.py`): a hang is a failure with its program.
"""

from collections import Counter

from hypothesis import event, strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, precondition, rule

from pagedkv.spec import DuplicateSequence, KVSpec, OutOfBlocks, PagedKVError

from .guard import TimedMachine, call_text, run_bounded
from .profiles import settings_for
from .strategies import (CACHE_HIT, COW, EVICTION, OUT_OF_BLOCKS, RECOMPUTE, STEP_PREEMPT, SWAP, FreshIds,
                         bind, count_path, summary, pool_configs, prompts as prompt_strategy, tokens)

#: Paths the CI profile must reach; `run_spec_check` reports how often each was taken.
PATHS = (COW, EVICTION, CACHE_HIT, OUT_OF_BLOCKS, SWAP, RECOMPUTE, STEP_PREEMPT)

SHARED_PREFIXES = ((), (1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (5, 5, 5, 5, 5, 5))
ALPHABET = 10
tokens_st = tokens(ALPHABET)
prompts = prompt_strategy(SHARED_PREFIXES, ALPHABET, max_suffix=6)
configs = pool_configs(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4),
                       num_cpu_blocks=st.integers(0, 6), prefix_caching=st.sampled_from([True, True, False]))


class SpecMachine(TimedMachine):
    """White-box check of the spec. A run bound with `tally=` collects examples, steps and paths
    there; unbound, each example counts into a tally of its own."""

    seq_ids = Bundle("seq_ids")
    tally = None

    def __init__(self) -> None:
        super().__init__()
        self.tally = self.tally if self.tally is not None else Counter()

    @initialize(config=configs)
    def setup(self, config):
        self.kv = self.timed(f"KVSpec(**{config!r})", lambda: KVSpec(**config))
        self.new_id = FreshIds()
        self.tally["examples"] += 1

    # -------------------------------------------------------------- helpers

    def run_checked(self, operation, *args):
        """Run one operation; on a typed error require the state untouched. Returns (ok, result)."""
        self.tally["steps"] += 1
        before = self.kv.snapshot()
        indexed_before = self.kv.cached_blocks()
        try:
            result = self.timed(call_text(operation, *args), lambda: getattr(self.kv, operation)(*args))
        except PagedKVError as error:
            assert self.kv.snapshot() == before, f"failed {operation}{args} changed the state"
            count_path(self.tally, OUT_OF_BLOCKS, isinstance(error, OutOfBlocks))
            event(f"{operation} -> {type(error).__name__}")
            return False, error
        count_path(self.tally, EVICTION, indexed_before.items() - self.kv.cached_blocks().items())  # only eviction unindexes
        event(f"{operation} ok")
        return True, result

    def running(self):
        return [s for s in self.kv.seq_ids() if self.kv.status(s) == "running"]

    # -------------------------------------------------------------- operations

    @rule(target=seq_ids, prompt=prompts)
    def add(self, prompt):
        seq_id = self.new_id()
        ok, cached = self.run_checked("add", seq_id, prompt)
        if ok and cached:
            count_path(self.tally, CACHE_HIT)
        return seq_id

    @rule(seq_id=seq_ids, token=tokens_st)
    def append(self, seq_id, token):
        ok, copies = self.run_checked("append", seq_id, token)
        if ok and copies:
            count_path(self.tally, COW)

    @precondition(lambda self: self.running())
    @rule(data=st.data(), tokens=st.lists(tokens_st, min_size=1, max_size=3))
    def decode_running(self, data, tokens):
        """Append a few tokens to a live sequence: where forks diverge and copy-on-write happens."""
        seq_id = data.draw(st.sampled_from(self.running()))
        for token in tokens:
            self.append(seq_id, token)

    @precondition(lambda self: self.running())
    @rule(target=seq_ids, data=st.data(), tokens=st.tuples(tokens_st, tokens_st))
    def sample_in_parallel(self, data, tokens):
        """Fork a live sequence and let parent and child each decode a different token."""
        parent = data.draw(st.sampled_from(self.running()))
        child = self.fork(parent)
        self.append(parent, tokens[0])
        self.append(child, tokens[1])
        return child

    @rule(target=seq_ids, parent=seq_ids)
    def fork(self, parent):
        child = self.new_id()
        self.run_checked("fork", parent, child)
        return child

    @rule(seq_id=seq_ids)
    def free(self, seq_id):
        self.run_checked("free", seq_id)

    @rule(seq_id=seq_ids, mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, seq_id, mode):
        ok, _ = self.run_checked("preempt", seq_id, mode)
        if ok:
            count_path(self.tally, SWAP if mode == "swap" else RECOMPUTE)

    @rule(seq_id=seq_ids)
    def resume(self, seq_id):
        self.run_checked("resume", seq_id)

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def step(self, data):
        batch = data.draw(st.lists(st.sampled_from(self.running()), unique=True))
        tokens = {seq_id: data.draw(tokens_st) for seq_id in batch}
        ok, result = self.run_checked("step", tokens)
        assert ok, f"step must not fail on running sequences: {result!r}"
        if result.preempted:
            count_path(self.tally, STEP_PREEMPT)
        if result.copies:
            count_path(self.tally, COW)

    # -------------------------------------------------------------- bad inputs

    @rule(seq_id=seq_ids, prompt=prompts)
    def add_existing_id(self, seq_id, prompt):
        exists = seq_id in self.kv.seq_ids()
        ok, error = self.run_checked("add", seq_id, prompt)
        if exists:
            assert isinstance(error, DuplicateSequence), f"add of existing id gave {error!r}"

    @rule(data=st.data())
    def malformed_or_unknown(self, data):
        """One bad call: a malformed argument or an id that was never added. All must fail."""
        seq_id = data.draw(st.sampled_from(self.kv.seq_ids() or [0]))
        ghost = self.new_id.last + 1000
        operation, *args = data.draw(st.sampled_from([
            ("add", self.new_id.last + 500, []), ("add", self.new_id.last + 500, [1, -3]),
            ("add", self.new_id.last + 500, "abc"), ("add", self.new_id.last + 500, [1.5]), ("add", "x", [1]),
            ("append", seq_id, -1), ("append", seq_id, 2.0), ("append", seq_id, True),
            ("preempt", seq_id, "discard"), ("step", [seq_id]), ("step", {seq_id: -1}),
            ("refcount", self.kv.num_blocks), ("refcount", -1),
            ("append", ghost, 1), ("free", ghost), ("fork", ghost, ghost + 1), ("preempt", ghost, "swap"),
            ("resume", ghost), ("step", {ghost: 1}),
        ]))
        ok, _ = self.run_checked(operation, *args)
        assert not ok, f"{operation}{tuple(args)} should have failed"

    # -------------------------------------------------------------- invariants

    @invariant()
    def invariants_hold(self):
        self.timed("check()", self.kv.check, record=False)

    def teardown(self):
        if not hasattr(self, "kv") or self.hung:
            return
        for seq_id in self.kv.seq_ids():
            self.timed(call_text("free", seq_id), lambda s=seq_id: self.kv.free(s))
        self.timed("check()", self.kv.check, record=False)
        assert self.kv.num_free_blocks() == self.kv.num_blocks, "blocks leaked after freeing everything"
        assert self.kv.num_free_cpu_blocks() == self.kv.num_cpu_blocks, "cpu blocks leaked"


def run_spec_machine(profile: str, **overrides) -> Counter:
    """Run the spec's stateful check under `profile`; return the tally of examples, steps, paths."""
    tally = Counter()
    run_bounded(bind(SpecMachine, tally=tally), settings_for(profile, **overrides))
    return tally


def run_spec_check(profile: str) -> dict:
    """The `pagedkv check` entry: the stateful check, and every interesting path reached."""
    tally = run_spec_machine(profile)
    missed = [path for path in PATHS if not tally[path]]
    paths = summary(tally, PATHS)
    return {
        "name": "spec-stateful",
        "covered": f"{tally['examples']} examples, {tally['steps']} steps ({paths})",
        "passed": not missed,
        "detail": f"paths never reached: {', '.join(missed)}" if missed else "",
    }
