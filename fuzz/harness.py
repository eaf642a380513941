"""The conformance harness: one Hypothesis state machine that drives any block manager.

A *subject* is anything built by `factory(num_blocks=, block_size=, prefix_caching=, num_cpu_blocks=)`
with the protocol methods of docs/design.md ("The conformance protocol"). The harness trusts nothing the
subject keeps: it holds its own ghost memory (flat slot -> `KV(prefix, token)`, one dict per pool),
writes every computed token into the slot the subject's block table names, performs the copies the
subject returns, and keeps its own model of each sequence's tokens. A `KVSpec` *shadow* runs the same
operations; it decides which errors are due (out of blocks included, cache hits counted in) and how
many prompt tokens the prefix cache must serve. After every operation the named oracles of
`oracles.ORACLES` are checked; the first that fails raises `OracleFailure` with the program so far.

`Conformance` is the driver (usable without Hypothesis: `replay` runs a saved program through it);
`machine_for` builds the Hypothesis `RuleBasedStateMachine` around it for one subject factory.
"""

from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule

from pagedkv.spec import (KV, DuplicateSequence, InvalidState, KVSpec, OutOfBlocks, PagedKVError,
                          UnknownSequence, blocks_needed, slot_of)

from .guard import SubjectFault
from .oracles import OracleFailure
from .strategies import (CACHE_HIT, COW, EVICTION, OUT_OF_BLOCKS, SWAP, FreshIds, note, pool_configs, record_event,
                         token_lists as byte_token_lists, tokens)

PROTOCOL = ("add", "append", "fork", "free", "block_table", "num_free_blocks")
SWAP_PROTOCOL = ("swap_out", "swap_in")
CAPABILITIES = frozenset({"fork", "prefix_caching", "swap"})
DEFAULT_CAPABILITIES = frozenset({"fork"})
#: Paths a campaign reports as covered.
PATHS = (COW, EVICTION, CACHE_HIT, OUT_OF_BLOCKS, SWAP)
#: Argument names of each operation, for readable programs.
ARG_NAMES = {"add": ("seq", "tokens"), "append": ("seq", "token"), "fork": ("parent", "child"),
             "free": ("seq",), "block_table": ("seq",), "swap_out": ("seq",), "swap_in": ("seq",)}
UNKNOWN_ID = 1_000_000  # ids from here up are never added
ID_ERRORS = (UnknownSequence, DuplicateSequence)


def format_step(op: str, args: tuple, result=None, error=None) -> str:
    call = ", ".join(f"{name}={value!r}" for name, value in zip(ARG_NAMES[op], args))
    outcome = f"raises {type(error).__name__}" if error is not None else repr(result)
    return f"{op}({call}) -> {outcome}"


def _attempt(target, op: str, args: tuple):
    """(result, error) of one call; only pagedkv errors count as errors, anything else propagates."""
    try:
        return getattr(target, op)(*args), None
    except PagedKVError as error:
        return None, error


class Conformance:
    """One subject, its spec shadow, the harness's ghost memory and sequence model, and the oracles."""

    def __init__(self, factory, config: dict, tally: Counter = None):
        self.config = dict(config)
        self.B = config["block_size"]
        self.shadow = KVSpec(**config)
        self.tally = tally if tally is not None else Counter()
        self.program, self.trace = [], []
        self.gpu, self.cpu = {}, {}     # ghost memory: flat slot -> KV
        self.tokens = {}                # live sequence -> its tokens, as the harness knows them
        self.cpu_tables = {}            # swapped sequence -> its CPU table, from swap_out's copies
        self.failed = False             # an oracle fired: teardown must not pile a second finding on it
        self.subject = self._guarded(lambda: factory(**config), "factory")

    # ------------------------------------------------------------------ oracles plumbing

    def expect(self, ok: bool, oracle: str, message) -> None:
        if not ok:
            self.failed = True
            raise OracleFailure(oracle, message() if callable(message) else message, self.report())

    def _guarded(self, thunk, what: str):
        """Run a subject call; anything but a pagedkv error is the `crash` oracle."""
        try:
            return thunk()
        except (PagedKVError, OracleFailure):
            raise
        except SubjectFault as fault:  # the call guard's finding (fuzz/guard.py): protocol, timeout, exit
            self.expect(False, fault.oracle, str(fault))
        except Exception as error:  # a subject bug surfaces as a named finding, not a harness crash
            self.expect(False, "crash", f"{what} raised {type(error).__name__}: {error}")

    def running(self) -> list:
        return [seq for seq in self.tokens if seq not in self.cpu_tables]

    def observe(self) -> dict:
        """What a failed operation must leave unchanged."""
        return {"tables": {seq: self._guarded(lambda s=seq: list(self.subject.block_table(s)), "block_table")
                           for seq in self.running()},
                "free": self._guarded(self.subject.num_free_blocks, "num_free_blocks")}

    def call(self, op: str, *args):
        """Run `op` on shadow and subject, compare their errors. Returns (ok, result, expected, before)."""
        self.program.append((op, args))
        self.tally["steps"] += 1
        indexed = set(self.shadow.block_hash.items())
        expected, expected_error = _attempt(self.shadow, op, args)
        note(self.tally, EVICTION, indexed - set(self.shadow.block_hash.items()))  # only eviction unindexes
        before = self.observe()
        result, error = self._guarded(lambda: _attempt(self.subject, op, args), op)
        self.trace.append(format_step(op, args, result, error))
        self._check_error(expected_error, error)
        if error is not None:
            note(self.tally, OUT_OF_BLOCKS, isinstance(error, OutOfBlocks))
            after = self.observe()
            self.expect(after == before, "atomic_failure",
                        lambda: f"{op} raised {type(error).__name__} but changed the state: {before} -> {after}")
        record_event(f"{op} -> {type(error).__name__ if error else 'ok'}")
        return error is None, result, expected, before

    def _check_error(self, expected, actual) -> None:
        kinds = type(expected), type(actual)
        if kinds[0] is kinds[1]:
            return
        said = (f"spec raises {type(expected).__name__ if expected else 'nothing'} ({expected or ''}), "
                f"subject raises {type(actual).__name__ if actual else 'nothing'} ({actual or ''})")
        if any(issubclass(kind, ID_ERRORS) for kind in kinds):
            self.expect(False, "id_errors", said)
        if OutOfBlocks in kinds:
            self.expect(False, "oom_exact", ("missing OutOfBlocks: " if expected else "spurious OutOfBlocks: ") + said)
        self.expect(False, "state_errors" if InvalidState in kinds else "crash", said)

    # ------------------------------------------------------------------ operations

    def add(self, seq: int, tokens: list) -> None:
        ok, cached, spec_cached, _ = self.call("add", seq, tokens)
        if not ok:
            return
        self.expect(cached == spec_cached, "cache_hit",
                    f"add({seq}) reports {cached} cached prompt tokens, the spec serves {spec_cached}")
        note(self.tally, CACHE_HIT, cached)
        self.tokens[seq] = list(tokens)
        self.write(seq, self.table(seq), range(cached, len(tokens)))

    def append(self, seq: int, token: int) -> None:
        ok, copies, _, before = self.call("append", seq, token)
        if not ok:
            return
        old, position = before["tables"][seq], len(self.tokens[seq])
        self.tokens[seq].append(token)
        new = self.table(seq)
        self.check_copies(seq, old, new, position, [tuple(pair) for pair in copies], before["tables"])
        self.copy(self.gpu, self.gpu, copies)
        note(self.tally, COW, copies)
        self.write(seq, new, [position])

    def fork(self, parent: int, child: int) -> None:
        ok, *_ = self.call("fork", parent, child)
        if ok:
            self.tokens[child] = list(self.tokens[parent])
            self.table(child)

    def free(self, seq: int) -> None:
        ok, *_ = self.call("free", seq)
        if ok:
            del self.tokens[seq]
            self.cpu_tables.pop(seq, None)

    def block_table(self, seq: int) -> None:
        self.call("block_table", seq)

    def swap_out(self, seq: int) -> None:
        ok, copies, *_ = self.call("swap_out", seq)
        if ok:
            self.cpu_tables[seq] = [cpu for _, cpu in copies]
            self.check_ids(seq, self.cpu_tables[seq], self.config["num_cpu_blocks"], "cpu")
            self.copy(self.gpu, self.cpu, copies)
            note(self.tally, SWAP)

    def swap_in(self, seq: int) -> None:
        ok, copies, *_ = self.call("swap_in", seq)
        if ok:
            del self.cpu_tables[seq]
            self.table(seq)
            self.copy(self.cpu, self.gpu, copies)
            note(self.tally, SWAP)

    # ------------------------------------------------------------------ ghost memory

    def copy(self, source: dict, dest: dict, pairs) -> None:
        for src, dst in pairs:
            for offset in range(self.B):
                dest[dst * self.B + offset] = source.get(src * self.B + offset)

    def write(self, seq: int, table: list, positions) -> None:
        tokens = self.tokens[seq]
        for i in positions:
            self.gpu[slot_of(table, i, self.B)] = KV(tuple(tokens[:i]), tokens[i])

    # ------------------------------------------------------------------ checks

    def table(self, seq: int) -> list:
        """The subject's table of a running sequence, after `table_shape` and `block_range`."""
        table = self._guarded(lambda: list(self.subject.block_table(seq)), "block_table")
        needed = blocks_needed(len(self.tokens[seq]), self.B)
        self.expect(len(table) == needed, "table_shape",
                    f"seq {seq} has {len(self.tokens[seq])} tokens in {len(table)} blocks {table}, needs {needed}")
        self.check_ids(seq, table, self.config["num_blocks"], "gpu")
        return table

    def check_ids(self, seq: int, table: list, pool_size: int, pool: str) -> None:
        self.expect(all(isinstance(b, int) and 0 <= b < pool_size for b in table), "block_range",
                    f"seq {seq}'s {pool} table {table} leaves 0..{pool_size - 1}")
        self.expect(len(set(table)) == len(table), "block_range", f"seq {seq}'s {pool} table {table} repeats a block")

    def check_copies(self, seq, old, new, position, copies, tables) -> None:
        others = set().union(*(t for s, t in tables.items() if s != seq))
        shared_partial_tail = position % self.B != 0 and old[-1] in others
        want = [(old[-1], new[-1])] if shared_partial_tail else []
        self.expect(copies == want and not (want and new[-1] in others | set(old)), "cow_exact",
                    f"append to seq {seq} at position {position} "
                    f"({'shared, partly filled' if shared_partial_tail else 'unshared or full'} tail) "
                    f"returned copies {copies}, expected {want or 'none'} (table {old} -> {new})")

    def readback(self, seq: int, table: list, memory: dict) -> None:
        tokens = self.tokens[seq]
        for i, token in enumerate(tokens):
            slot = slot_of(table, i, self.B)
            want, got = KV(tuple(tokens[:i]), token), memory.get(slot)
            self.expect(got == want, "readback",
                        lambda: f"seq {seq} position {i} (block {table[i // self.B]}, offset {i % self.B}) "
                                f"reads {got}, expected {want}")

    def check_all(self) -> None:
        """The state oracles, for every live sequence, after every step."""
        tables = {seq: self.table(seq) for seq in self.running()}
        live = set().union(*tables.values())
        free = self._guarded(self.subject.num_free_blocks, "num_free_blocks")
        self.expect(free == self.config["num_blocks"] - len(live), "free_count",
                    f"num_free_blocks() = {free}, but {len(live)} of {self.config['num_blocks']} blocks are in live "
                    f"tables (expected {self.config['num_blocks'] - len(live)} free)")
        for seq, table in tables.items():
            self.readback(seq, table, self.gpu)
        for seq, table in self.cpu_tables.items():
            self.readback(seq, table, self.cpu)

    def finish(self) -> None:
        """Free every live sequence; the whole pool must come back."""
        for seq in list(self.tokens):
            self.free(seq)
            self.check_all()

    # ------------------------------------------------------------------ reporting

    def report(self) -> dict:
        return {"config": self.config, "program": [[op, list(args)] for op, args in self.program],
                "trace": list(self.trace), "state": self.state()}

    def state(self) -> dict:
        """Tables, tokens and free count as the subject shows them (errors shown, not raised)."""
        def shown(thunk):
            try:
                return thunk()
            except Exception as error:  # the state dump must not hide the finding
                return f"<{type(error).__name__}: {error}>"
        seqs = {seq: {"tokens": list(tokens), "swapped": seq in self.cpu_tables,
                      "table": self.cpu_tables[seq] if seq in self.cpu_tables
                      else shown(lambda s=seq: list(self.subject.block_table(s)))}
                for seq, tokens in self.tokens.items()}
        return {"sequences": seqs, "num_free_blocks": shown(self.subject.num_free_blocks),
                "spec_num_free_blocks": self.shadow.num_free_blocks()}


def replay(factory, config: dict, program: list) -> None:
    """Run a saved program (as in `report()["program"]`) through the oracles; raise on the first that fires."""
    kv = Conformance(factory, config)
    for op, args in program:
        getattr(kv, op)(*args)
        kv.check_all()
    kv.finish()


# ---------------------------------------------------------------------- the Hypothesis machine

ALPHABET = 4  # a tiny alphabet: shared prefixes and hash bugs surface
tokens_st = tokens(ALPHABET)


def token_lists(min_size: int = 0, max_size: int = None) -> st.SearchStrategy:
    return byte_token_lists(ALPHABET, min_size, max_size)


def configs(capabilities) -> st.SearchStrategy:
    return pool_configs(
        num_blocks=st.one_of(st.integers(1, 3), st.integers(2, 8), st.integers(4, 24)),
        block_size=st.one_of(st.integers(1, 4), st.integers(5, 16)),
        prefix_caching=st.sampled_from([True, True, True, False]) if "prefix_caching" in capabilities else False,
        num_cpu_blocks=st.integers(0, 8) if "swap" in capabilities else 0,
    )


class ConformanceMachine(RuleBasedStateMachine):
    """Random programs over the protocol; subclasses made by `machine_for` bind the subject."""

    factory = staticmethod(KVSpec)
    capabilities = DEFAULT_CAPABILITIES
    tally = None     # a run's Counter, bound by `machine_for`; unbound, each example counts its own
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.tally = self.tally if self.tally is not None else Counter()

    @initialize(data=st.data())
    def setup(self, data):
        config = data.draw(configs(self.capabilities), label="config")
        B = config["block_size"]
        self.history = data.draw(st.lists(token_lists(B + 1, 3 * B), min_size=2, max_size=3),
                                 label="shared prefixes")
        self.suffixes = token_lists(max_size=B)
        self.fresh_id = FreshIds()
        self.tally["examples"] += 1
        self.kv = Conformance(self.factory, config, self.tally)

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def prompt(self, data) -> list:
        """A cut of a shared prefix or of an earlier sequence, plus a few new tokens: cache hits,
        evictions and re-hits of evicted prefixes come often."""
        base = self.history[data.draw(st.integers(0, len(self.history) - 1), label="prompt base")]
        cut = len(base) - data.draw(st.integers(0, len(base)), label="cut")
        return base[:cut] + data.draw(self.suffixes, label="new tokens") or base

    def remember(self, seq) -> None:
        if seq in self.kv.tokens:
            self.history.append(list(self.kv.tokens[seq]))

    @rule(target=seqs, data=st.data(), count=st.integers(1, 3))
    def add(self, data, count):
        """A few requests arrive."""
        seqs = [self.fresh_id() for _ in range(count)]
        for seq in seqs:
            self.kv.add(seq, self.prompt(data))
            self.remember(seq)
        return multiple(*seqs)

    @rule(seq=seqs, data=st.data())
    def add_existing(self, seq, data):
        """DuplicateSequence if `seq` is live; a legal reuse of the id if it was freed."""
        self.kv.add(seq, self.prompt(data))

    @rule(seq=seqs, token=tokens_st)
    def append(self, seq, token):
        self.kv.append(seq, token)

    @precondition(lambda self: self.kv.running())
    @rule(data=st.data(), tokens=st.lists(tokens_st, min_size=1, max_size=4))
    def decode(self, data, tokens):
        seq = data.draw(st.sampled_from(self.kv.running()), label="seq")
        for token in tokens:
            self.kv.append(seq, token)

    @precondition(lambda self: self.has("fork"))
    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        child = self.fresh_id()
        self.kv.fork(parent, child)
        return child

    @precondition(lambda self: self.has("fork") and self.kv.running())
    @rule(target=seqs, data=st.data(), tokens=st.tuples(tokens_st, tokens_st))
    def sample_in_parallel(self, data, tokens):
        """Fork a running sequence and let parent and child decode different tokens: copy-on-write."""
        parent, child = data.draw(st.sampled_from(self.kv.running()), label="parent"), self.fresh_id()
        self.kv.fork(parent, child)
        self.kv.append(parent, tokens[0])
        self.kv.append(child, tokens[1])
        return child

    @precondition(lambda self: self.has("fork"))
    @rule(parent=seqs, child=seqs)
    def fork_existing(self, parent, child):
        self.kv.fork(parent, child)

    @rule(seq=seqs)
    def free(self, seq):
        self.remember(seq)
        self.kv.free(seq)

    @precondition(lambda self: self.kv.running())
    @rule(data=st.data())
    def finish(self, data):
        """Free a running sequence: its cached blocks become evictable."""
        self.free(data.draw(st.sampled_from(self.kv.running()), label="seq"))

    @precondition(lambda self: self.has("swap"))
    @rule(seq=seqs)
    def swap_out(self, seq):
        self.kv.swap_out(seq)

    @precondition(lambda self: self.has("swap"))
    @rule(seq=seqs)
    def swap_in(self, seq):
        self.kv.swap_in(seq)

    @rule(data=st.data())
    def unknown_id(self, data):
        ops = ["append", "free", "block_table"] + ["fork"] * self.has("fork") + list(SWAP_PROTOCOL) * self.has("swap")
        op, ghost = data.draw(st.sampled_from(ops), label="op"), UNKNOWN_ID + self.fresh_id.last
        args = {"append": (ghost, 0), "fork": (ghost, self.fresh_id())}.get(op, (ghost,))
        getattr(self.kv, op)(*args)

    @invariant()
    def conforms(self):
        self.kv.check_all()

    def teardown(self):
        if hasattr(self, "kv") and not self.kv.failed:
            self.kv.finish()


def machine_for(factory, capabilities=DEFAULT_CAPABILITIES, tally: Counter = None, name: str = "subject") -> type:
    """A `ConformanceMachine` bound to one subject factory (and, for one run, a tally). `name` keys
    the example database."""
    attrs = {"factory": staticmethod(factory), "capabilities": frozenset(capabilities),
             "tally": tally if tally is not None else Counter()}
    return type(f"Conformance[{name}]", (ConformanceMachine,), attrs)
