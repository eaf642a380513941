"""The conformance harness: one Hypothesis state machine that drives any block manager.

A *subject* is anything built by `factory(num_blocks=, block_size=, prefix_caching=, num_cpu_blocks=)`
with the protocol methods of docs/design.md ("The conformance protocol"). The harness trusts nothing the
subject keeps: it holds its own ghost memory (flat slot -> `KV(prefix, token)`, one dict per pool),
writes every computed token into the slot the subject's block table names, performs the copies the
subject returns, and keeps its own model of each sequence's tokens. After every operation the named
oracles of `oracles.ORACLES` are checked; each that fails raises its own `OracleFailure` subclass
with the program so far (so Hypothesis tells distinct oracles apart as distinct bugs).

Which errors are due and how many prompt tokens the prefix cache must serve is decided by a *judge*,
one per policy (`POLICIES`):

- `spec`: a `KVSpec` shadow runs the same operations, so the subject must make the spec's own
  choices (FIFO free queue, LRU eviction, tail released first, the spec's error order) exactly.
- `any`: policy-free. Where the spec has a free choice (which free block is taken, which released
  cached block is evicted, duplicates under one content, release order, which of several due errors
  is raised) the judge learns the subject's choice from what it did and checks only that it was
  legal: out of blocks is judged against the subject's own free count, hits must stay below the
  whole prompt, be whole blocks and read back right, and with the `complete_cache` capability a hit
  must cover every leading block whose newest holder is still intact (the *completeness* property,
  docs/conformance.md).

`Conformance` is the driver (usable without Hypothesis: `replay` runs a saved program through it);
`machine_for` builds the Hypothesis `RuleBasedStateMachine` around it for one subject factory.
"""

import inspect
import time
from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule

from pagedkv.spec import (KV, DuplicateSequence, InvalidState, KVSpec, OutOfBlocks, PagedKVError,
                          UnknownSequence, blocks_needed, slot_of)

from .events import EventCheck
from .guard import SubjectFault
from .oracles import OracleFailure, failure_class
from .strategies import (CACHE_HIT, COW, EVICTION, OUT_OF_BLOCKS, SWAP, FreshIds, count_path, pool_configs,
                         record_event, token_lists as byte_token_lists, tokens)

PROTOCOL = ("add", "append", "fork", "free", "block_table", "num_free_blocks")
SWAP_PROTOCOL = ("swap_out", "swap_in")
BATCH_PROTOCOL = ("block_tables",)
#: What a subject may declare. `complete_cache`: released full blocks keep serving their prefix
#: until handed out again (checked under policy `any`). `conservative_admission`: `add`, `append`
#: and `swap_in` may refuse with OutOfBlocks although the blocks were there (still atomically;
#: counted). `dedup_on_fill`: when a copied-on-write tail fills and equals a cached block, the table
#: may name the cached block instead of the copy's target (vLLM v0's block manager v2). `swap_sharing`:
#: swap_out may map a full block onto a CPU block of another swapped sequence that holds the same
#: content, and swap_in onto a running sequence's GPU block that holds it (v0's block manager v2,
#: prefix caching on both pools), so a swap may need fewer free blocks than the table has.
#: `kv_events`: the subject publishes its prefix index as events and shows the index itself
#: (`kv_events()`, `cache_index()`; fuzz/events.py), checked with prefix caching on.
#: `spec_defaults`: the factory defaults what the spec's constructor defaults, to the spec's values
#: (`SPEC_DEFAULTS`), so the harness sometimes builds it without them (pagedkv's own allocator).
#: `batch_tables`: `block_tables(seq_ids)` gives one padded table per running sequence of a batch, what
#: an engine's forward pass reads (`BATCH_PROTOCOL`); the harness reads sub-batches in any order, several
#: in a row between mutations, sometimes passing the very list again (pagedkv's own allocator).
CAPABILITIES = frozenset({"fork", "prefix_caching", "swap", "complete_cache", "conservative_admission",
                          "dedup_on_fill", "swap_sharing", "kv_events", "spec_defaults", "batch_tables"})
#: What KVSpec's constructor defaults: a subject declaring `spec_defaults` must default it alike.
SPEC_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(KVSpec).parameters.items()
                 if parameter.default is not parameter.empty}
DEFAULT_CAPABILITIES = frozenset({"fork"})
POLICIES = ("spec", "any")
#: Paths a campaign reports as covered.
PATHS = (COW, EVICTION, CACHE_HIT, OUT_OF_BLOCKS, SWAP)
#: Argument names of each operation, for readable programs.
ARG_NAMES = {"add": ("seq", "tokens"), "append": ("seq", "token"), "fork": ("parent", "child"),
             "free": ("seq",), "block_table": ("seq",), "swap_out": ("seq",), "swap_in": ("seq",),
             "block_tables": ("seqs", "same_list")}
UNKNOWN_ID = 1_000_000  # ids from here up are never added
ID_ERRORS = (UnknownSequence, DuplicateSequence)
#: Keys a subject's (or factory's) `config_space` may restrict.
CONFIG_SPACE_KEYS = ("block_sizes", "prefix_caching", "num_blocks", "num_cpu_blocks")


class ConfigSpaceError(ValueError):
    """A declared `config_space` that the kit cannot draw from; the message says why."""


def format_step(op: str, args: tuple, result=None, error=None) -> str:
    call = ", ".join(f"{name}={value!r}" for name, value in zip(ARG_NAMES[op], args))
    outcome = f"raises {type(error).__name__}" if error is not None else repr(result)
    return f"{op}({call}) -> {outcome}"


def _outcome(target, op: str, args: tuple):
    """(result, error) of one call; only pagedkv errors count as errors, anything else propagates."""
    try:
        return getattr(target, op)(*args), None
    except PagedKVError as error:
        return None, error


def _named(kinds) -> str:
    return " or ".join(sorted(kind.__name__ for kind in kinds)) or "nothing"


class SpecJudge:
    """Policy `spec`: a KVSpec shadow runs every operation first and says exactly what is due."""

    def __init__(self, kv):
        self.kv = kv
        self.shadow = KVSpec(**kv.config)

    def before(self, op: str, args: tuple) -> None:
        cached = self.shadow.cached_blocks()
        self.result, self.error = _outcome(self.shadow, op, args)
        count_path(self.kv.tally, EVICTION, cached.items() - self.shadow.cached_blocks().items())  # only eviction unindexes

    def check_error(self, op: str, args: tuple, before: dict, actual) -> None:
        expected = self.error
        kinds = type(expected), type(actual)
        if kinds[0] is kinds[1]:
            return
        said = (f"spec raises {type(expected).__name__ if expected else 'nothing'} ({expected or ''}), "
                f"subject raises {type(actual).__name__ if actual else 'nothing'} ({actual or ''})")
        if any(issubclass(kind, ID_ERRORS) for kind in kinds):
            self.kv.expect(False, "id_errors", said)
        if OutOfBlocks in kinds:
            self.kv.expect(False, "oom_exact", ("missing OutOfBlocks: " if expected else "spurious OutOfBlocks: ")
                           + said + self.kv.why_blocks(op, args, before))
        self.kv.expect(False, "state_errors" if InvalidState in kinds else "crash", said)

    def check_cached(self, seq: int, tokens: list, cached: int, table_of) -> None:
        self.kv.expect(cached == self.result, "cache_hit",
                       f"add({seq}) reports {cached} cached prompt tokens, the spec serves {self.result}")

    def spec_free_blocks(self):
        return self.shadow.num_free_blocks()

    def handed_out(self, blocks, live_before: set) -> None:
        """Nothing to learn: the shadow keeps its own cache (see AnyJudge.handed_out)."""

    def filled(self, block: int, content: tuple) -> None:
        """Nothing to learn: the shadow keeps its own cache (see AnyJudge.filled)."""


class AnyJudge:
    """Policy `any`: what is due is derived from the harness's own model of the subject (its live
    tables, as checked by the oracles, and the ghost memory), never from the spec's choices.

    Completeness bookkeeping: `newest[content]` is the block that most recently came to hold that
    full-block content (filled by writes, or copied back by swap-in); handing the block out again
    (as a fresh block of any table) ends its claim. A `complete_cache` subject must serve a prompt's
    leading blocks as long as each one's newest holder still has its claim."""

    def __init__(self, kv):
        self.kv = kv
        self.newest, self.claim = {}, {}   # content -> block; block -> content

    # -------------------------------------------------------------- what is due

    def due(self, op: str, args: tuple, before: dict) -> tuple:
        """(errors of which one must be raised, errors that may be raised) for `op` now."""
        kv, (seq, *rest) = self.kv, args
        live, swapped = seq in kv.tokens and seq not in kv.cpu_tables, seq in kv.cpu_tables
        known = live or swapped
        if op == "add":   # out of blocks is never due: the subject may find more hits than it must
            short = {OutOfBlocks} if self.oom_legal_add(rest[0], before) else set()
            return ({DuplicateSequence} if known else set()), short   # a capacity-first check may say so
        if op == "fork":
            must = {UnknownSequence} if not known else set()
            must |= {DuplicateSequence} if rest[0] in kv.tokens else set()
            must |= {InvalidState} if swapped else set()
            return must, set()
        if not known:
            return {UnknownSequence}, set()
        if op == "append":
            if swapped:
                return {InvalidState}, set()
            if self.append_needs_block(seq, before) and not self.free(before):
                return {OutOfBlocks}, set()
            return set(), ({OutOfBlocks} if self.conservative() else set())
        if op == "swap_out":
            if swapped:
                return {InvalidState}, set()
            return self.swap_due(len(before["tables"][seq]), kv.shareable(seq, kv.cpu, kv.swapped_cpu()),
                                 self.free_cpu(), conservative=False)
        if op == "swap_in":
            if live:
                return {InvalidState}, set()
            return self.swap_due(len(kv.cpu_tables[seq]), kv.shareable(seq, kv.gpu, kv.live(before)),
                                 self.free(before), conservative=self.conservative())
        return set(), set()   # free, block_table

    def swap_due(self, blocks: int, shareable: int, free: int, conservative: bool) -> tuple:
        """(must, may) of a swap of `blocks` blocks into a pool with `free` free blocks: OutOfBlocks
        is due when even sharing every `shareable` block (swap_sharing) does not fit, allowed when
        the swap fits only by sharing (the subject need not share) or the subject is conservative."""
        least = blocks - (shareable if "swap_sharing" in self.kv.capabilities else 0)
        must = {OutOfBlocks} if least > free else set()
        return must, ({OutOfBlocks} if conservative or blocks > free else set()) - must

    def oom_needed(self, op: str, args: tuple, before: dict, must: set) -> bool:
        """The refusal was forced: no legal way to do `op` fitted (for the precision figure)."""
        return OutOfBlocks in must or (op == "add" and self.oom_legal_add(args[1], before, conservative=False))

    def conservative(self) -> bool:
        return "conservative_admission" in self.kv.capabilities

    def free(self, before: dict) -> int:
        """Free GPU blocks as the harness counts them (free_count holds the subject to the same)."""
        return self.kv.config["num_blocks"] - len(set().union(*before["tables"].values()))

    def free_cpu(self) -> int:
        """CPU blocks in no swapped table (a block two swapped tables share counts once)."""
        return self.kv.config["num_cpu_blocks"] - len(self.kv.swapped_cpu())

    def append_needs_block(self, seq: int, before: dict) -> bool:
        table, position = before["tables"][seq], len(self.kv.tokens[seq])
        others = set().union(*(t for s, t in before["tables"].items() if s != seq))
        return position % self.kv.B == 0 or table[-1] in others

    def guaranteed(self, tokens: list) -> list:
        """The blocks a complete cache must serve for `tokens`: for each leading full block (never the
        last token) whose content's newest holder still has its claim, that holder; stops at the first
        block without one."""
        if "complete_cache" not in self.kv.capabilities or not self.kv.config["prefix_caching"]:
            return []
        B, holders = self.kv.B, []
        for j in range((len(tokens) - 1) // B):
            block = self.newest.get(tuple(tokens[:(j + 1) * B]))
            if block is None:
                break
            holders.append(block)
        return holders

    def oom_legal_add(self, tokens: list, before: dict, conservative: bool = None) -> bool:
        """OutOfBlocks is legal when even the costliest legal admission does not fit: the guaranteed
        hits served from a block outside every live table where one holds that content (it costs a
        block), every other prompt block taken fresh. A conservative subject may always refuse."""
        if self.conservative() if conservative is None else conservative:
            return True
        kv, live = self.kv, set().union(*before["tables"].values())
        cost = blocks_needed(len(tokens), kv.B)
        for j, _ in enumerate(self.guaranteed(tokens)):
            content = tuple(tokens[:(j + 1) * kv.B])
            if not any(block not in live and kv.holds(block, content) for block in range(kv.config["num_blocks"])):
                cost -= 1   # every holder is live: sharing it takes no free block
        return cost > self.free(before)

    # -------------------------------------------------------------- checks

    def before(self, op: str, args: tuple) -> None:
        pass

    def check_error(self, op: str, args: tuple, before: dict, actual) -> None:
        must, may = self.due(op, args, before)
        allowed = must | may
        kv, kind = self.kv, type(actual) if actual is not None else None
        said = f"due: {_named(must)}{f' (may: {_named(may)})' if may else ''}; subject raises {_named({kind} if kind else set())}"
        if kind is not None and kind in allowed:
            count_path(kv.tally, "oom_conservative", kind is OutOfBlocks and not self.oom_needed(op, args, before, must))
            return
        if kind is None and not must:
            self.check_accounting(op, args, before)
            return
        ids = {k for k in must | {kind} if k is not None and issubclass(k, ID_ERRORS)}
        if ids:
            kv.expect(False, "id_errors", said)
        if InvalidState in must | {kind}:
            kv.expect(False, "state_errors", said)
        if OutOfBlocks in must | {kind}:
            kv.expect(False, "oom_exact", ("missing OutOfBlocks: " if kind is None else "spurious OutOfBlocks: ")
                      + said + kv.why_blocks(op, args, before))
        kv.expect(False, "crash", said)

    def check_accounting(self, op: str, args: tuple, before: dict) -> None:
        """A successful allocation took no more blocks than were free (none from thin air)."""
        if op not in ("add", "append", "swap_in"):
            return
        kv = self.kv
        live_before = set().union(*before["tables"].values())
        after = kv._guarded(lambda: list(kv.subject.block_table(args[0])), "block_table")
        taken = set(after) - live_before
        kv.expect(len(taken) <= self.free(before), "oom_exact",
                  f"missing OutOfBlocks: {op}{args} took {len(taken)} blocks {sorted(taken)} but only "
                  f"{self.free(before)} were free")

    def check_cached(self, seq: int, tokens: list, cached: int, table_of) -> None:
        kv, B = self.kv, self.kv.B
        kv.expect(isinstance(cached, int) and 0 <= cached < len(tokens) and cached % B == 0
                  and (cached == 0 or kv.config["prefix_caching"]), "cache_hit",
                  f"add({seq}) of {len(tokens)} tokens reports {cached} cached tokens: a hit is whole blocks of "
                  f"{B}, leaves the last prompt token to compute, and needs prefix caching on")
        table = table_of()
        for j in range(cached // B):
            content = tuple(tokens[:(j + 1) * B])
            kv.expect(kv.holds(table[j], content), "cache_hit",
                      lambda: f"add({seq}) serves block {table[j]} for prompt block {j} ({list(content[j * B:])}), "
                              f"but it holds {kv.block_content(table[j])}")
        guaranteed = self.guaranteed(tokens)
        kv.expect(cached >= len(guaranteed) * B, "completeness",
                  lambda: f"add({seq}) serves {cached} cached tokens, but prompt block {cached // B} "
                          f"({list(tokens[cached // B * B:(cached // B + 1) * B])} after "
                          f"{list(tokens[:cached // B * B])}) is still held by block {guaranteed[cached // B]}, "
                          f"its newest holder, not handed out since: a complete cache serves "
                          f"{len(guaranteed) * B} tokens")

    def spec_free_blocks(self):
        return "n/a (policy any)"

    def handed_out(self, blocks, live_before: set) -> None:
        """`blocks` were taken as fresh blocks: whatever content they held loses its claim."""
        for block in blocks:
            content = self.claim.pop(block, None)
            if content is not None and self.newest.get(content) == block:
                del self.newest[content]
                count_path(self.kv.tally, EVICTION, block not in live_before)   # a released cached block, reused

    def filled(self, block: int, content: tuple) -> None:
        if self.kv.config["prefix_caching"]:
            old = self.newest.get(content)
            if old is not None:
                self.claim.pop(old, None)
            self.claim.pop(block, None)
            self.newest[content], self.claim[block] = block, content


JUDGES = {"spec": SpecJudge, "any": AnyJudge}


class Conformance:
    """One subject, its judge (`policy`), the harness's ghost memory and sequence model, and the oracles."""

    def __init__(self, factory, config: dict, tally: Counter = None, *, policy: str = "spec", capabilities=None,
                 found: list = None):
        if policy not in JUDGES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        # The subject is built with `config` as given (a spec_defaults draw leaves out the keys the
        # spec defaults); the harness and its judge read every key, the spec's defaults filled in.
        self.built_with, self.config, self.policy = dict(config), {**SPEC_DEFAULTS, **config}, policy
        self.B = config["block_size"]
        self.tally = tally if tally is not None else Counter()
        self.program, self.trace = [], []
        self.gpu, self.cpu = {}, {}     # ghost memory: flat slot -> KV
        self.tokens = {}                # live sequence -> its tokens, as the harness knows them
        self.cpu_tables = {}            # swapped sequence -> its CPU table, from swap_out's copies
        self.batch = None               # the list last passed to block_tables (passed again as the same object)
        self.failed = False             # an oracle fired: teardown must not pile a second finding on it
        self.found = found              # a run's list: its first failure is appended, before any shrinking
        self.capabilities = frozenset(capabilities if capabilities is not None else DEFAULT_CAPABILITIES)
        self.judge = JUDGES[policy](self)
        self.subject = self._guarded(lambda: factory(**self.built_with), "factory")
        if capabilities is None:
            self.capabilities = frozenset(getattr(self.subject, "capabilities", DEFAULT_CAPABILITIES))
        self.events = (EventCheck(self) if "kv_events" in self.capabilities and self.config["prefix_caching"]
                       else None)

    # ------------------------------------------------------------------ oracles plumbing

    def expect(self, ok: bool, oracle: str, message) -> None:
        if not ok:
            self.failed = True
            failure = failure_class(oracle)(oracle, message() if callable(message) else message, self.report())
            if self.found is not None and not self.found:
                self.found.append({"oracle": oracle, "message": failure.message, **failure.report,
                                   "examples": self.tally["examples"], "at": time.monotonic()})
            raise failure

    def _guarded(self, thunk, what: str):
        """Run a subject call; anything but a pagedkv error is the `crash` oracle. An OracleFailure the
        subject raises itself (an adapter's own check) is reported as the harness's own are: with the
        program so far, and as found before shrinking."""
        try:
            return thunk()
        except PagedKVError:
            raise
        except OracleFailure as failure:   # the harness's own oracles fire outside subject calls
            self.expect(False, failure.oracle, failure.message)
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

    def run_step(self, op: str, *args):
        """Run `op` on the subject, judge its error. Returns (ok, result, before)."""
        if self.events:
            self.events.settle()   # the previous step's events, before this one runs
        self.program.append((op, args))
        self.tally["steps"] += 1
        self.judge.before(op, args)
        before = self.observe()
        result, error = self._guarded(lambda: _outcome(self.subject, op, args), op)
        self.trace.append(format_step(op, args, result, error))
        self.judge.check_error(op, args, before, error)
        if error is not None:
            count_path(self.tally, OUT_OF_BLOCKS, isinstance(error, OutOfBlocks))
            after = self.observe()
            self.expect(after == before, "atomic_failure",
                        lambda: f"{op} raised {type(error).__name__} but changed the state: {before} -> {after}")
        record_event(f"{op} -> {type(error).__name__ if error else 'ok'}")
        return error is None, result, before

    def why_blocks(self, op: str, args: tuple, before: dict) -> str:
        """Why the operation needs the blocks it needs, for an `oom_exact` report."""
        free = before["free"]
        if op == "append" and args[0] in before["tables"]:
            table, position = before["tables"][args[0]], len(self.tokens[args[0]])
            sharers = [s for s, t in before["tables"].items() if s != args[0] and table and table[-1] in t]
            if position % self.B == 0:
                need = f"the tail is full at {position} tokens: a new block is needed"
            elif sharers:
                need = (f"the partly filled tail block {table[-1]} is shared with seq {sharers[0]}: "
                        f"copy-on-write needs a block")
            else:
                need = f"the tail block {table[-1]} has room and is not shared: no block is needed"
            return f" [{need}; {free} free]"
        if op == "add":
            return f" [the prompt needs {blocks_needed(len(args[1]), self.B)} blocks less its cache hits; {free} free]"
        if op == "swap_in" and args[0] in self.cpu_tables:
            return f" [swap-in needs {len(self.cpu_tables[args[0]])} blocks; {free} free]"
        return f" [{free} free]"

    # ------------------------------------------------------------------ operations

    def add(self, seq: int, tokens: list) -> None:
        ok, cached, before = self.run_step("add", seq, tokens)
        if not ok:
            return
        self.tokens[seq] = list(tokens)
        self.judge.check_cached(seq, tokens, cached, lambda: self.table(seq))
        count_path(self.tally, CACHE_HIT, cached)
        table = self.table(seq)
        self.judge.handed_out(table[cached // self.B:], self.live(before))
        self.write(seq, table, range(cached, len(tokens)))

    def append(self, seq: int, token: int) -> None:
        ok, copies, before = self.run_step("append", seq, token)
        if not ok:
            return
        old, position = before["tables"][seq], len(self.tokens[seq])
        self.tokens[seq].append(token)
        new = self.table(seq)
        self.check_copies(seq, old, new, position, [tuple(pair) for pair in copies], before["tables"])
        self.copy(self.gpu, self.gpu, copies)
        count_path(self.tally, COW, copies)
        self.judge.handed_out([block for block in new if block not in old], self.live(before))
        self.write(seq, new, [position])

    def fork(self, parent: int, child: int) -> None:
        ok, *_ = self.run_step("fork", parent, child)
        if ok:
            self.tokens[child] = list(self.tokens[parent])
            self.table(child)

    def free(self, seq: int) -> None:
        ok, *_ = self.run_step("free", seq)
        if ok:
            del self.tokens[seq]
            self.cpu_tables.pop(seq, None)

    def block_table(self, seq: int) -> None:
        self.run_step("block_table", seq)

    def block_tables(self, seqs: list, same_list: bool = False) -> None:
        """Capability `batch_tables`: the subject's tables of a batch of running sequences (`same_list`:
        the list object of the previous call, unchanged) must be each one's own table, checked by
        `table`, padded with -1 to the batch's widest. Engines pass one list step after step, so a
        subject may remember batches; a memo that is wrong shows here, not in `block_table`. A read
        naming a sequence that does not run (a replayed program with steps dropped) is skipped."""
        if not set(seqs) <= set(self.running()):
            return
        if not (same_list and self.batch == seqs):
            self.batch = list(seqs)
        self.program.append(("block_tables", (list(seqs), same_list)))
        self.tally["steps"] += 1
        got = self._guarded(lambda: self.subject.block_tables(self.batch), "block_tables")
        got = self._guarded(lambda: got.tolist() if hasattr(got, "tolist") else [list(row) for row in got],
                            "block_tables")
        self.trace.append(format_step("block_tables", (list(seqs), same_list), got))
        tables = [self.table(seq) for seq in seqs]
        width = max(map(len, tables), default=0)
        want = [table + [-1] * (width - len(table)) for table in tables]
        self.expect(got == want, "batch_tables",
                    lambda: f"block_tables({list(seqs)}) = {got}, but the sequences' own tables padded to width "
                            f"{width} are {want}")

    def swap_out(self, seq: int) -> None:
        ok, copies, _ = self.run_step("swap_out", seq)
        if ok:
            table = [cpu for _, cpu in copies]
            self.check_ids(seq, table, self.config["num_cpu_blocks"], "cpu")
            self.check_swap_targets(seq, table, self.cpu, self.swapped_cpu(), "swap_out")
            self.cpu_tables[seq] = table
            self.copy(self.gpu, self.cpu, copies)
            count_path(self.tally, SWAP)

    def swap_in(self, seq: int) -> None:
        ok, copies, before = self.run_step("swap_in", seq)
        if ok:
            del self.cpu_tables[seq]
            table = self.table(seq)
            self.check_swap_targets(seq, table, self.gpu, self.live(before), "swap_in")
            self.copy(self.cpu, self.gpu, copies)
            self.judge.handed_out(table, self.live(before))
            tokens = self.tokens[seq]
            for j in range(len(tokens) // self.B):
                self.judge.filled(table[j], tuple(tokens[:(j + 1) * self.B]))
            count_path(self.tally, SWAP)

    # ------------------------------------------------------------------ ghost memory

    @staticmethod
    def live(observed: dict) -> set:
        return set().union(*observed["tables"].values())

    def swapped_cpu(self) -> set:
        """CPU blocks some swapped sequence's table names."""
        return set().union(*self.cpu_tables.values())

    def copy(self, source: dict, dest: dict, pairs) -> None:
        for src, dst in pairs:
            for offset in range(self.B):
                dest[dst * self.B + offset] = source.get(src * self.B + offset)

    def write(self, seq: int, table: list, positions) -> None:
        tokens = self.tokens[seq]
        for i in positions:
            self.gpu[slot_of(table, i, self.B)] = KV(tuple(tokens[:i]), tokens[i])
            if (i + 1) % self.B == 0:
                self.judge.filled(table[i // self.B], tuple(tokens[:i + 1]))

    def holds(self, block: int, content: tuple, memory: dict = None) -> bool:
        """Ghost memory of `block` (GPU unless `memory` says) is the last full block of `content`
        (checked last slot first)."""
        B, start, memory = self.B, len(content) - self.B, self.gpu if memory is None else memory
        return all(memory.get(block * B + offset) == KV(content[:start + offset], content[start + offset])
                   for offset in reversed(range(B)))

    def shareable(self, seq: int, memory: dict, held: set) -> int:
        """How many of `seq`'s full blocks some block of `held` (in `memory`) already holds: what a
        swap with `swap_sharing` may map onto instead of a free block."""
        tokens = self.tokens[seq]
        contents = [tuple(tokens[:(j + 1) * self.B]) for j in range(len(tokens) // self.B)]
        return sum(any(self.holds(block, content, memory) for block in held) for content in contents)

    def block_content(self, block: int) -> list:
        return [self.gpu.get(block * self.B + offset) for offset in range(self.B)]

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
        if shared_partial_tail and self.deduplicated(seq, old, new, position, copies, others | set(old)):
            return
        want = [(old[-1], new[-1])] if shared_partial_tail else []
        self.expect(copies == want and not (want and new[-1] in others | set(old)), "cow_exact",
                    f"append to seq {seq} at position {position} "
                    f"({'shared, partly filled' if shared_partial_tail else 'unshared or full'} tail) "
                    f"returned copies {copies}, expected {want or 'none'} (table {old} -> {new})")

    def check_swap_targets(self, seq: int, table: list, memory: dict, held: set, op: str) -> None:
        """A swap copies into blocks no other sequence of the target pool holds; with `swap_sharing`
        a full block may land on one that already holds exactly its content (before the copy).
        Readback then checks every slot of both sequences."""
        tokens, pool = self.tokens[seq], "CPU" if op == "swap_out" else "GPU"
        for j, block in enumerate(table):
            if block not in held:
                continue
            content = tuple(tokens[:(j + 1) * self.B])
            full = (j + 1) * self.B <= len(tokens)
            self.expect("swap_sharing" in self.capabilities and full and self.holds(block, content, memory),
                        "swap_exact",
                        lambda: f"{op}({seq}) maps block {j} onto {pool} block {block}, which another sequence holds"
                                + (f", but it holds {[memory.get(block * self.B + o) for o in range(self.B)]}, "
                                   f"not that {'full ' if full else 'partly filled '}block"
                                   if "swap_sharing" in self.capabilities else
                                   " (sharing on swap needs the swap_sharing declaration)"))

    def deduplicated(self, seq, old, new, position, copies, taken) -> bool:
        """`dedup_on_fill`: the append filled its block, the table names a block already holding that
        full content, and the copy (if any) went from the old tail to a fresh target that the subject
        then dropped. Readback still checks every slot."""
        return ("dedup_on_fill" in self.capabilities and (position + 1) % self.B == 0
                and all(src == old[-1] and dst not in taken for src, dst in copies) and len(copies) <= 1
                and self.holds(new[-1], tuple(self.tokens[seq][:position + 1])))

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
        if self.events:
            self.events.check()

    def finish(self) -> None:
        """Free every live sequence; the whole pool must come back."""
        for seq in list(self.tokens):
            self.free(seq)
            self.check_all()

    # ------------------------------------------------------------------ reporting

    def report(self) -> dict:
        return {"config": self.built_with, "policy": self.policy,
                "program": [[op, list(args)] for op, args in self.program],
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
                "spec_num_free_blocks": self.judge.spec_free_blocks()}


def replay(factory, config: dict, program: list, *, policy: str = "spec", capabilities=None) -> None:
    """Run a saved program (as in `report()["program"]`) through the oracles; raise on the first that fires."""
    kv = Conformance(factory, config, policy=policy, capabilities=capabilities)
    for op, args in program:
        getattr(kv, op)(*args)
        kv.check_all()
    kv.finish()


# ---------------------------------------------------------------------- declared configurations

def check_config_space(space, capabilities) -> dict:
    """The validated `config_space` (None: nothing restricted). Raises ConfigSpaceError with the reason."""
    if space is None:
        return {}
    if not isinstance(space, dict):
        raise ConfigSpaceError(f"config_space must be a dict, got {type(space).__name__}")
    unknown = set(space) - set(CONFIG_SPACE_KEYS)
    if unknown:
        raise ConfigSpaceError(f"config_space has unknown keys {sorted(unknown)}; known: {list(CONFIG_SPACE_KEYS)}")
    checked = {}
    if "block_sizes" in space:
        sizes = tuple(space["block_sizes"])
        if not sizes or not all(type(b) is int and b >= 1 for b in sizes):
            raise ConfigSpaceError(f"config_space block_sizes must be ints >= 1, got {space['block_sizes']!r}")
        checked["block_sizes"] = sizes
    if "prefix_caching" in space:
        allowed = tuple(space["prefix_caching"])
        if not allowed or not all(type(v) is bool for v in allowed):
            raise ConfigSpaceError(f"config_space prefix_caching must be a tuple of bools, got {space['prefix_caching']!r}")
        if True in allowed and "prefix_caching" not in capabilities:
            raise ConfigSpaceError("config_space allows prefix_caching=True but the subject does not declare "
                                   "the 'prefix_caching' capability")
        checked["prefix_caching"] = allowed
    for key, least in (("num_blocks", 1), ("num_cpu_blocks", 0)):
        if key in space:
            values = space[key]
            if not isinstance(values, range) or not values or min(values) < least:
                raise ConfigSpaceError(f"config_space {key} must be a non-empty range of ints >= {least}, "
                                       f"got {values!r}")
            checked[key] = values
    return checked


def declared_config_space(factory, subject=None) -> dict:
    """The `config_space` the factory (or else the subject it built) declares, validated."""
    space = getattr(factory, "config_space", None)
    if space is None and subject is not None:
        space = getattr(subject, "config_space", None)
    capabilities = getattr(subject, "capabilities", getattr(factory, "capabilities", DEFAULT_CAPABILITIES))
    return check_config_space(space, frozenset(capabilities))


def probe_config(space: dict) -> dict:
    """The smallest configuration a declared space allows: what a probe subject is built with."""
    return {"num_blocks": min(space.get("num_blocks", [2])), "block_size": min(space.get("block_sizes", [2])),
            "prefix_caching": False if False in space.get("prefix_caching", (False,)) else True,
            "num_cpu_blocks": min(space.get("num_cpu_blocks", [0]))}


# ---------------------------------------------------------------------- the Hypothesis machine

ALPHABET = 4  # a tiny alphabet: shared prefixes and hash bugs surface
tokens_st = tokens(ALPHABET)


def token_lists(min_size: int = 0, max_size: int = None) -> st.SearchStrategy:
    return byte_token_lists(ALPHABET, min_size, max_size)


def configs(capabilities, space: dict = None) -> st.SearchStrategy:
    """Pool configurations: small pools and blocks by default, within a declared `config_space`."""
    space = space or {}
    caching = (st.sampled_from(space.get("prefix_caching", [True, True, True, False]))
               if "prefix_caching" in capabilities else False)
    return pool_configs(
        num_blocks=(st.sampled_from(space["num_blocks"]) if "num_blocks" in space
                    else st.one_of(st.integers(1, 3), st.integers(2, 8), st.integers(4, 24))),
        block_size=(st.sampled_from(space["block_sizes"]) if "block_sizes" in space
                    else st.one_of(st.integers(1, 4), st.integers(5, 16))),
        prefix_caching=caching,
        num_cpu_blocks=(0 if "swap" not in capabilities
                        else st.sampled_from(space["num_cpu_blocks"]) if "num_cpu_blocks" in space
                        else st.integers(0, 8)),
    )


class ConformanceMachine(RuleBasedStateMachine):
    """Random programs over the protocol; subclasses made by `machine_for` bind the subject."""

    factory = staticmethod(KVSpec)
    capabilities = DEFAULT_CAPABILITIES
    policy = "spec"
    config_space = ()    # the declared config_space's items (immutable; see `check_config_space`)
    tally = None     # a run's Counter, bound by `machine_for`; unbound, each example counts its own
    found = None     # a run's list for its first failure, bound by `machine_for`
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.tally = self.tally if self.tally is not None else Counter()

    @initialize(data=st.data())
    def setup(self, data):
        config = data.draw(configs(self.capabilities, dict(self.config_space)), label="config")
        if self.has("spec_defaults") and data.draw(st.booleans(), label="built with the spec's defaults"):
            config = self.with_spec_defaults(config)
        B = config["block_size"]
        self.history = data.draw(st.lists(token_lists(B + 1, 3 * B), min_size=2, max_size=3),
                                 label="shared prefixes")
        self.suffixes = token_lists(max_size=B)
        self.fresh_id = FreshIds()
        self.tally["examples"] += 1
        self.kv = Conformance(self.factory, config, self.tally, policy=self.policy, capabilities=self.capabilities,
                              found=self.found)

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def with_spec_defaults(self, config: dict) -> dict:
        """`config` without the keys the spec defaults, for a subject built with its own defaults
        (which must be the spec's): each such key the declared config space allows at its default."""
        space = dict(self.config_space)
        return {name: value for name, value in config.items()
                if name not in SPEC_DEFAULTS or SPEC_DEFAULTS[name] not in space.get(name, [SPEC_DEFAULTS[name]])}

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

    @rule(target=seqs)
    def repeat_latest(self):
        """The latest prompt (or finished sequence) again, in full: the request that must hit the
        blocks just cached, or find them evicted by what came since."""
        seq = self.fresh_id()
        self.kv.add(seq, list(self.history[-1]))
        self.remember(seq)
        return seq

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

    @precondition(lambda self: self.kv.config["prefix_caching"])
    @rule(data=st.data())
    def churn(self, data):
        """A request of new tokens that takes some or all of the free blocks, then finishes: the pool
        fills with released cached blocks, so what comes next evicts (and finds what it evicted)."""
        free = self.kv.config["num_blocks"] - len(self.kv.live(self.kv.observe()))
        size = data.draw(st.integers(1, max(1, free)), label="blocks") * self.kv.B
        seq = self.fresh_id()
        self.kv.add(seq, data.draw(token_lists(size, size), label="tokens"))
        self.remember(seq)
        self.kv.free(seq)

    @precondition(lambda self: self.has("batch_tables") and self.kv.running())
    @rule(data=st.data())
    def read_batches(self, data):
        """A forward pass or a few reads the tables of a batch: any running sequences in any order,
        sub-batches of one another, at widths that differ, the same list again between them; or each
        running sequence alone, in a drawn order (one row after another at one row's width)."""
        running = self.kv.running()
        if data.draw(st.booleans(), label="each sequence alone"):
            for seq in data.draw(st.permutations(running), label="order"):
                self.kv.block_tables([seq])
            return
        for _ in range(data.draw(st.integers(1, 4), label="reads")):
            batch = self.kv.batch
            if batch and set(batch) <= set(running) and data.draw(st.booleans(), label="the same list again"):
                self.kv.block_tables(batch, same_list=True)
            else:
                self.kv.block_tables(data.draw(st.lists(st.sampled_from(running), max_size=len(running),
                                                        unique=True), label="batch"))

    @precondition(lambda self: self.has("swap"))
    @rule(seq=seqs)
    def swap_out(self, seq):
        self.kv.swap_out(seq)

    @precondition(lambda self: self.has("swap"))
    @rule(seq=seqs)
    def swap_in(self, seq):
        self.kv.swap_in(seq)

    @precondition(lambda self: self.has("swap") and self.kv.running())
    @rule(data=st.data())
    def preempt(self, data):
        """Swap out a running sequence (the bundle's ids are mostly finished or unknown)."""
        self.kv.swap_out(data.draw(st.sampled_from(self.kv.running()), label="seq"))

    @precondition(lambda self: self.has("swap") and self.kv.cpu_tables)
    @rule(data=st.data())
    def resume(self, data):
        """Swap a swapped-out sequence back in: onto blocks freed, evicted or cached since."""
        self.kv.swap_in(data.draw(st.sampled_from(sorted(self.kv.cpu_tables)), label="seq"))

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


def machine_for(factory, capabilities=DEFAULT_CAPABILITIES, tally: Counter = None, name: str = "subject", *,
                policy: str = "spec", config_space: dict = None, found: list = None) -> type:
    """A `ConformanceMachine` bound to one subject factory (and, for one run, a tally and a `found`
    list that gets the run's first failure as found, before shrinking), judged under `policy`, drawing
    configurations from `config_space` (validated here). `name` keys the example database."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    space = check_config_space(config_space, frozenset(capabilities))
    attrs = {"factory": staticmethod(factory), "capabilities": frozenset(capabilities), "policy": policy,
             "config_space": tuple(space.items()), "tally": tally if tally is not None else Counter(),
             "found": found}
    return type(f"Conformance[{name}]", (ConformanceMachine,), attrs)
