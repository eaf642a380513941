"""Differential check: the production `BlockManager` against the spec `KVSpec`, step by step.

One Hypothesis state machine applies every operation to both and, after each, compares every
observable: the error type (and OutOfBlocks' needed/available), return values (cached-token counts,
copy lists), and for every sequence its length, tokens (which the manager reads back through its
block table, so they stand in for the spec's `read`), status, cached tokens, GPU and CPU block
tables; then free/evictable/active/CPU-free counts and ref counts. Block ids are compared up to one
renaming, a bijection spec id <-> impl id grown as ids appear and never allowed to conflict over the
whole run. A failed operation must leave the manager's observables as they were.

Batched operations (`append_batch`, `block_tables`, `slot_mapping`) are compared with the same
operations done one at a time on the spec; `step` with the spec's `step`; and a second machine
replays the `Scheduler`'s steps on the spec. Pools are tiny so exhaustion, eviction,
copy-on-write, swap and cache hits happen every few steps.
"""

import copy
import math
import time
from collections import Counter

from hypothesis import event, strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv.impl import BlockManager, Scheduler, SchedulerConfig
from pagedkv.spec import RUNNING, InvalidArgument, KVSpec, OutOfBlocks, PagedKVError, slot_of

from .findings import counterexamples
from .guard import TimedMachine, call_text, run_bounded, timed_check
from .profiles import check_profile, settings_for
from .strategies import (CACHE_HIT, COW, EVICTION, OUT_OF_BLOCKS, FreshIds, bind, pool_configs,
                         prompts as prompt_strategy, tokens)

SHARED_PREFIXES = ((), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 7, 7), (5, 5, 5, 5))
ALPHABET = 8
tokens_st = tokens(ALPHABET)
prompts = prompt_strategy(SHARED_PREFIXES, ALPHABET, max_suffix=5)
seq_ids_st = st.integers(0, 6)
#: The counters of `BlockManager.metrics()` the differential machine recounts from the spec's results.
STATS = ("prompt_tokens", "cached_tokens", "copies", "swap_outs", "swap_ins", "preempt_recompute", "preempt_swap")
configs = pool_configs(num_blocks=st.integers(1, 12), block_size=st.integers(1, 5),
                       num_cpu_blocks=st.integers(0, 6), prefix_caching=st.sampled_from([True, True, False]))


class Renaming:
    """A bijection between two implementations' block ids, extended as new ids appear."""

    def __init__(self, kind: str):
        self.kind, self.forward, self.backward = kind, {}, {}

    def match(self, spec_id: int, impl_id: int) -> None:
        known = self.forward.setdefault(spec_id, impl_id)
        assert known == impl_id, f"{self.kind} block {spec_id} was impl {known}, now {impl_id}"
        back = self.backward.setdefault(impl_id, spec_id)
        assert back == spec_id, f"impl {self.kind} block {impl_id} was spec {back}, now {spec_id}"

    def match_lists(self, spec_ids, impl_ids) -> None:
        assert len(spec_ids) == len(impl_ids), f"{self.kind} lists differ: {spec_ids} vs {impl_ids}"
        for s, i in zip(spec_ids, impl_ids):
            self.match(s, i)


class TalliedMachine(TimedMachine):
    """Counts examples, steps and interesting paths for the report (shared by both machines). A run
    bound with `tally=` counts there; unbound, each example counts into a tally of its own. Every
    operation on the spec, the manager or the scheduler is timed (`fuzz/guard.py`)."""

    tally = None

    def __init__(self) -> None:
        super().__init__()
        self.tally = self.tally if self.tally is not None else Counter()

    def count(self, path: str) -> None:
        """An interesting path: a Hypothesis event, and counted for the report."""
        event(path)
        self.tally[path] += 1


class DifferentialMachine(TalliedMachine):
    @initialize(config=configs)
    def setup(self, config):
        self.spec, self.impl = self.timed(f"KVSpec/BlockManager(**{config!r})", lambda: (
            KVSpec(**config), BlockManager(**config, max_seqs=2, max_blocks_per_seq=1)))
        self.gpu, self.cpu = Renaming("gpu"), Renaming("cpu")
        self.stats = dict.fromkeys(STATS, 0)   # what `metrics()` must count, from the spec's results
        self.fresh = FreshIds(start=6)   # fresh ids start above the small ids `wrong_ids` uses
        self.tally["examples"] += 1
        self.count(f"prefix_caching={config['prefix_caching']}")

    # -------------------------------------------------------------- driving both

    def apply_to_both(self, operation, *args):
        """Apply one operation to both; errors must agree and leave the manager untouched."""
        self.tally["steps"] += 1
        evictions = self.impl.num_evictions()
        before = self.observables()
        (spec_error, spec_result), (impl_error, impl_result) = self.timed(
            call_text(operation, *args), lambda: self.outcomes(operation, args))
        assert type(spec_error) is type(impl_error), \
            f"{operation}{args}: spec {spec_error!r}, impl {impl_error!r}"
        if isinstance(spec_error, OutOfBlocks):
            assert (spec_error.needed, spec_error.available, spec_error.pool) == \
                   (impl_error.needed, impl_error.available, impl_error.pool), f"{spec_error} vs {impl_error}"
            self.count(OUT_OF_BLOCKS)
            self.count(f"{OUT_OF_BLOCKS} ({spec_error.pool})")
        if spec_error is not None:
            assert self.observables() == before, f"failed {operation}{args} changed the manager"
            self.count(f"error {type(spec_error).__name__}")
        if self.impl.num_evictions() > evictions:
            self.count(EVICTION)
        if spec_error is None:
            self.account(operation, args, spec_result)
        return spec_error is None, spec_result, impl_result

    def account(self, operation, args, result) -> None:
        """Count what the spec's successful `operation` did, as `metrics()` must count it."""
        stats = self.stats
        if operation == "add":
            stats["prompt_tokens"] += len(args[1])
            stats["cached_tokens"] += result
        elif operation in ("preempt", "swap_out"):
            mode = "swap" if operation == "swap_out" else (args[1:] or ("recompute",))[0]
            stats[f"preempt_{mode}"] += 1
            stats["swap_outs"] += len(result)
        elif operation in ("resume", "swap_in") and result:
            stats["swap_ins"] += len(result)
        elif operation == "resume":   # a recompute victim: allocated again like a prompt
            stats["prompt_tokens"] += self.spec.length(args[0])
            stats["cached_tokens"] += self.spec.cached_tokens(args[0])
        elif operation == "step":
            stats["preempt_recompute"] += len(result.preempted)
            stats["copies"] += len(result.copies)
        elif operation == "append":
            stats["copies"] += len(result)

    def outcomes(self, operation, args) -> list:
        """(error, result) of the operation on the spec, then on the manager."""
        outcomes = []
        for subject in (self.spec, self.impl):
            try:
                outcomes.append((None, getattr(subject, operation)(*args)))
            except PagedKVError as error:
                outcomes.append((error, None))
        return outcomes

    def match_copies(self, spec_copies, impl_copies, src: Renaming, dst: Renaming) -> None:
        assert len(spec_copies) == len(impl_copies), f"copies {spec_copies} vs {impl_copies}"
        for (s_src, s_dst), (i_src, i_dst) in zip(spec_copies, impl_copies):
            src.match(s_src, i_src)
            dst.match(s_dst, i_dst)

    # -------------------------------------------------------------- rules

    def pick(self, data, wanted=lambda status: True) -> int:
        """An existing sequence whose status is wanted (the rule's precondition says there is
        one); the `wrong_ids` rule covers unknown and duplicate ids on purpose."""
        return data.draw(st.sampled_from(self.ids(wanted)), label="seq_id")

    def ids(self, wanted=lambda status: True) -> list:
        return [s for s in self.spec.seq_ids() if wanted(self.spec.status(s))]

    @rule(data=st.data(), tokens=prompts)
    def add(self, data, tokens):
        ok, spec_cached, impl_cached = self.apply_to_both("add", self.fresh(), tokens)
        if ok:
            assert spec_cached == impl_cached, f"cached tokens {spec_cached} vs {impl_cached}"
            if spec_cached:
                self.count(CACHE_HIT)

    @precondition(lambda self: self.ids(RUNNING.__eq__))
    @rule(data=st.data(), token=tokens_st)
    def append(self, data, token):
        self.write(self.pick(data, RUNNING.__eq__), token)

    def write(self, seq_id, token):
        ok, spec_copies, impl_copies = self.apply_to_both("append", seq_id, token)
        if ok:
            self.match_copies(spec_copies, impl_copies, self.gpu, self.gpu)
            if spec_copies:
                self.count(COW)

    @precondition(lambda self: self.ids(RUNNING.__eq__))
    @rule(data=st.data())
    def fork(self, data):
        self.apply_to_both("fork", self.pick(data, RUNNING.__eq__), self.fresh())

    @precondition(lambda self: self.ids(RUNNING.__eq__))
    @rule(data=st.data(), token=tokens_st)
    def fork_and_write(self, data, token):
        """A sampled sibling writes at once: copy-on-write when the shared tail is partly full."""
        child = self.fresh()
        if self.apply_to_both("fork", self.pick(data, RUNNING.__eq__), child)[0]:
            self.write(child, token)

    @precondition(lambda self: self.ids())
    @rule(data=st.data())
    def free(self, data):
        self.apply_to_both("free", self.pick(data))

    @precondition(lambda self: self.ids(RUNNING.__eq__))
    @rule(data=st.data(), mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, data, mode):
        ok, spec_copies, impl_copies = self.apply_to_both("preempt", self.pick(data, RUNNING.__eq__), mode)
        if ok:
            self.match_copies(spec_copies, impl_copies, self.gpu, self.cpu)
            self.count(f"preempt {mode}")

    @precondition(lambda self: self.ids(RUNNING.__eq__))
    @rule(data=st.data())
    def swap_out(self, data):
        ok, spec_copies, impl_copies = self.apply_to_both("swap_out", self.pick(data, RUNNING.__eq__))
        if ok:
            self.match_copies(spec_copies, impl_copies, self.gpu, self.cpu)

    @precondition(lambda self: self.ids(RUNNING.__ne__))
    @rule(data=st.data(), swap_only=st.booleans())
    def resume(self, data, swap_only):
        operation = "swap_in" if swap_only else "resume"
        ok, spec_copies, impl_copies = self.apply_to_both(operation, self.pick(data, RUNNING.__ne__))
        if ok:
            self.match_copies(spec_copies, impl_copies, self.cpu, self.gpu)
            self.count("resume swapped" if spec_copies else "resume waiting")

    @rule(data=st.data())
    def step(self, data):
        tokens = data.draw(st.dictionaries(st.sampled_from(self.ids(RUNNING.__eq__) or [99]), tokens_st))
        ok, spec_result, impl_result = self.apply_to_both("step", tokens)
        if ok:
            assert spec_result.appended == impl_result.appended, f"{spec_result} vs {impl_result}"
            assert spec_result.preempted == impl_result.preempted, f"{spec_result} vs {impl_result}"
            self.match_copies(spec_result.copies, impl_result.copies, self.gpu, self.gpu)
            if spec_result.preempted:
                self.count("step preempted")

    @precondition(lambda self: self.ids(RUNNING.__eq__))
    @rule(data=st.data())
    def append_batch(self, data):
        """The manager's batch against the spec's one-at-a-time appends in the same order."""
        seq_ids = data.draw(st.permutations(self.ids(RUNNING.__eq__)))
        seq_ids = seq_ids[:data.draw(st.integers(1, len(seq_ids)))]
        tokens = data.draw(st.lists(tokens_st, min_size=len(seq_ids), max_size=len(seq_ids)))
        self.tally["steps"] += 1
        trial = copy.deepcopy(self.spec)
        before = self.observables()
        spec_copies, impl_copies = self.timed(call_text("append_batch", seq_ids, tokens), lambda: (
            _unless_out_of_blocks(lambda: [c for s, t in zip(seq_ids, tokens) for c in trial.append(s, t)]),
            _unless_out_of_blocks(lambda: self.impl.append_batch(seq_ids, tokens))))
        if impl_copies is None:
            assert spec_copies is None, "batch refused although one-at-a-time appends fit"
            assert self.observables() == before, "a refused batch changed the manager"
            self.count("batch refused")
            return
        assert spec_copies is not None, "batch accepted although one-at-a-time appends run out"
        self.spec = trial
        self.stats["copies"] += len(spec_copies)
        self.match_copies(spec_copies, impl_copies, self.gpu, self.gpu)
        self.count(f"batch of {min(len(seq_ids), 3)}{'+' if len(seq_ids) > 3 else ''}")

    @rule(data=st.data(), operation=st.sampled_from(["add", "append", "fork", "free", "preempt",
                                                       "resume", "swap_in", "swap_out"]))
    def wrong_ids(self, data, operation):
        """Unknown or duplicate ids: any small id, existing or not."""
        seq_id = data.draw(seq_ids_st, label="seq_id")
        args = {"add": (seq_id, [1]), "append": (seq_id, 1), "fork": (seq_id, self.fresh())}
        self.apply_to_both(operation, *args.get(operation, (seq_id,)))

    @rule(seq_id=seq_ids_st, bad=st.sampled_from([("append", -1), ("append", True), ("append", 1.5),
                                                   ("add", []), ("add", [3, -1]), ("add", "ab"),
                                                   ("preempt", "swapp"), ("preempt", None),
                                                   ("refcount", -1), ("refcount", 99), ("refcount", 1.0)]))
    def bad_argument(self, seq_id, bad):
        operation, argument = bad
        self.apply_to_both(operation, *((argument,) if operation == "refcount" else (seq_id, argument)))

    # -------------------------------------------------------------- comparing

    @timed_check
    def observables(self) -> dict:
        """Everything the manager shows from outside (block ids as they are)."""
        m = self.impl
        return {
            "seqs": {s: (m.length(s), m.tokens(s), m.status(s), m.cached_tokens(s), m.block_table(s),
                         m.cpu_block_table(s)) for s in m.seq_ids()},
            "counts": (m.num_free_blocks(), m.num_evictable_blocks(), m.num_active_blocks(),
                       m.num_free_cpu_blocks()),
            "refcounts": [m.refcount(b) for b in range(m.num_blocks)],
        }

    @invariant()
    @timed_check
    def same_observables(self):
        if not hasattr(self, "spec"):
            return
        spec, impl = self.spec, self.impl
        assert spec.seq_ids() == impl.seq_ids()
        for s in spec.seq_ids():
            assert (spec.length(s), spec.tokens(s), spec.status(s), spec.cached_tokens(s)) == \
                   (impl.length(s), impl.tokens(s), impl.status(s), impl.cached_tokens(s)), f"sequence {s}"
            self.gpu.match_lists(spec.block_table(s), impl.block_table(s))
            self.cpu.match_lists(spec.cpu_block_table(s), impl.cpu_block_table(s))
        for name in ("num_free_blocks", "num_evictable_blocks", "num_active_blocks", "num_free_cpu_blocks"):
            assert getattr(spec, name)() == getattr(impl, name)(), name
        spec_refs = [spec.refcount(b) for b in range(spec.num_blocks)]
        assert sorted(spec_refs) == sorted(impl.refcount(b) for b in range(impl.num_blocks))
        for block, refs in enumerate(spec_refs):
            if block in self.gpu.forward:
                assert impl.refcount(self.gpu.forward[block]) == refs, f"ref count of block {block}"
        metrics = impl.metrics()
        assert {name: metrics[name] for name in STATS} == self.stats, "metrics() counts what the spec did"
        impl.check()

    @invariant()
    @timed_check
    def batched_queries_agree(self):
        """`block_tables` and `slot_mapping` for all running sequences equal the per-sequence
        tables and slots."""
        if not hasattr(self, "spec") or not self.ids(RUNNING.__eq__):
            return
        running = self.ids(RUNNING.__eq__)
        tables = self.impl.block_tables(running).tolist()
        slots = self.impl.slot_mapping(running).tolist()
        B = self.impl.block_size
        for s, row, slot in zip(running, tables, slots):
            table = self.impl.block_table(s)
            assert row[:len(table)] == table and set(row[len(table):]) <= {-1}, f"table row of {s}"
            assert slot == slot_of(table, self.impl.length(s) - 1, B), f"slot of {s}"
        prefill = self.impl.slot_mapping(running, [self.impl.length(s) for s in running]).tolist()
        assert prefill == [slot_of(self.impl.block_table(s), p, B) for s in running
                           for p in range(self.impl.length(s))]


def _unless_out_of_blocks(thunk):
    """`thunk()`, or None where it raised OutOfBlocks."""
    try:
        return thunk()
    except OutOfBlocks:
        return None


#: The scheduler machine's pools: big enough for most requests to fit (and for many to run at once).
scheduler_pools = pool_configs(num_blocks=st.integers(2, 16), block_size=st.integers(1, 4),
                               num_cpu_blocks=st.integers(0, 8), prefix_caching=st.sampled_from([True, True, False]))
#: Scheduler configurations: the defaults, or a drawn slot limit and watermark with a cost model that
#: prefers swap (the default rates: a swap moves a token's KV faster than a prefill recomputes it) or
#: recompute (a prefill of 10^9 tokens a second).
scheduler_configs = st.one_of(st.just(SchedulerConfig()), st.builds(
    SchedulerConfig, max_num_seqs=st.integers(1, 16), watermark=st.sampled_from([0.0, 0.2]),
    prefill_tokens_per_s=st.sampled_from([10_000.0, 1e9])))


class SchedulerMachine(TalliedMachine):
    """The Scheduler's steps replayed on the spec: its decode phase is the spec's `step` (the same
    victims, latest admitted first, each preempted by the mode the scheduler chose: with a CPU pool
    some are swapped), then its swap-ins, resumes and admissions are the spec's swap_in / resume /
    add / fork plus the pending token's append. Managers are built with the spec's defaults or with
    every argument drawn, schedulers with the default configuration or a drawn one."""

    @initialize(config=scheduler_pools, defaults=st.booleans(), scheduler_config=scheduler_configs)
    def setup(self, config, defaults, scheduler_config):
        if defaults:   # only the pool's size: the spec's and the manager's defaults for the rest
            config = {name: config[name] for name in ("num_blocks", "block_size")}
        self.spec, self.bm = KVSpec(**config), BlockManager(**config)
        self.scheduler = self.timed(f"Scheduler(BlockManager(**{config!r}), {scheduler_config!r})",
                                    lambda: Scheduler(self.bm, scheduler_config))
        self.gpu, self.cpu = Renaming("gpu"), Renaming("cpu")
        self.prompt_of = {}
        self.tally["examples"] += 1

    @rule(prompt=prompts, max_new_tokens=st.integers(1, 8), n=st.integers(1, 3))
    def add_request(self, prompt, max_new_tokens, n):
        args = (len(self.prompt_of), prompt, max_new_tokens, n)
        # Never admittable: the prompt exceeds the pool above the watermark, or its n samples
        # (admitted together, one slot each) exceed the sequence slots. Such a request is refused.
        if not self.scheduler.can_ever_fit(len(prompt), 0) or n > self.scheduler.config.max_num_seqs:
            try:
                self.timed(call_text("add_request", *args), lambda: self.scheduler.add_request(*args))
            except InvalidArgument:
                self.count("scheduler refused")
                return
            raise AssertionError(f"a request of {n} samples of {len(prompt)} tokens that can never be admitted "
                                 f"was queued")
        for seq_id in self.timed(call_text("add_request", *args), lambda: self.scheduler.add_request(*args)):
            self.prompt_of[seq_id] = prompt

    @rule(data=st.data())
    def step(self, data):
        self.tally["steps"] += 1
        pending = dict(self.scheduler.pending)
        out = self.timed("schedule()", self.scheduler.schedule)
        self.replay_on_spec(out, pending)
        if not (out.preempted or out.swapped_out):
            self.admitted_greedily()
        sampled = {s: data.draw(tokens_st, label="token") for s in out.seq_ids + list(out.forked)}
        for seq_id in self.timed(call_text("update", sampled), lambda: self.scheduler.update(sampled)):
            self.spec.free(seq_id)
            self.count("scheduler finished")
        forgotten = set(self.scheduler.pending) - set(self.spec.seq_ids())
        assert not forgotten, f"the scheduler keeps tokens pending for finished or aborted sequences {forgotten}"
        self.timed("check()", self.bm.check, record=False)

    @timed_check
    def admitted_greedily(self) -> None:
        """After a step that preempted nothing, no queue head that has a sequence slot fits in the
        blocks above the watermark: admission stops only for a slot or for blocks."""
        scheduler, bm = self.scheduler, self.bm
        above_watermark = bm.num_free_blocks() - math.ceil(scheduler.config.watermark * bm.num_blocks)
        for sequences, blocks in scheduler.admission_heads():
            assert not (len(bm.running()) + sequences <= scheduler.config.max_num_seqs and blocks <= above_watermark), \
                f"a queue head of {sequences} sequences and {blocks} blocks fits but waits"

    @timed_check
    def replay_on_spec(self, out, pending: dict) -> None:
        """The scheduled step on the spec: its decode step, the aborts, swap-ins and admissions,
        then every table."""
        appended = self.replay_decode(out, pending)
        assert out.decodes == appended + out.swapped_in, f"decodes {out.decodes} vs spec {appended} + swap-ins"
        for seq_id in out.aborted:            # outgrew the whole pool: freed, never resumed
            assert self.spec.status(seq_id) != RUNNING
            self.spec.free(seq_id)
            self.count("scheduler aborted")
        for seq_id in out.swapped_in:
            self.spec.swap_in(seq_id)
            self.spec.append(seq_id, pending[seq_id])
            self.count("scheduler swapped in")
        for prefill in out.prefills:
            seq_id = prefill.seq_id
            if seq_id in self.spec.seqs:      # a recompute victim: re-prefill plus its pending token
                self.spec.resume(seq_id)
                self.spec.append(seq_id, pending[seq_id])
                self.count("scheduler resumed")
            else:
                assert self.spec.add(seq_id, self.prompt_of[seq_id]) == prefill.num_cached_tokens
            assert self.spec.cached_tokens(seq_id) == prefill.num_cached_tokens
            for child in [c for c, parent in out.forked.items() if parent == seq_id]:
                self.spec.fork(seq_id, child)
        tables = out.block_tables.tolist()
        for seq_id, row in zip(out.seq_ids, tables):
            self.gpu.match_lists(self.spec.block_table(seq_id), row[:len(self.spec.block_table(seq_id))])
        for seq_id in self.spec.seq_ids():
            self.gpu.match_lists(self.spec.block_table(seq_id), self.bm.block_table(seq_id))
            self.cpu.match_lists(self.spec.cpu_block_table(seq_id), self.bm.cpu_block_table(seq_id))
        assert self.spec.num_free_blocks() == self.bm.num_free_blocks()
        assert self.spec.num_free_cpu_blocks() == self.bm.num_free_cpu_blocks()
        self.same_step_tensors(out)

    def same_step_tensors(self, out) -> None:
        """The step's lengths, and its slot mapping: each prefill's computed tokens, then each
        decode's one new token, at the slots the spec's tables name (renamed to the manager's)."""
        B = self.spec.block_size
        assert out.seq_lens.tolist() == [self.spec.length(s) for s in out.seq_ids], "seq_lens"
        written = [(p.seq_id, range(self.spec.length(p.seq_id) - p.num_computed_tokens, self.spec.length(p.seq_id)))
                   for p in out.prefills] + [(s, [self.spec.length(s) - 1]) for s in out.decodes]
        slots = [self.gpu.forward[self.spec.block_table(s)[position // B]] * B + position % B
                 for s, positions in written for position in positions]
        assert out.slot_mapping.tolist() == slots, f"slot mapping {out.slot_mapping.tolist()} vs spec {slots}"

    def documented_mode(self, victim: int) -> str:
        """SchedulerConfig's cost model on the spec's state: swap when the CPU pool takes all of the
        victim's blocks and moving them out and back costs less time than prefilling its tokens."""
        config, blocks = self.scheduler.config, len(self.spec.block_table(victim))
        swap_s = 2 * blocks * self.spec.block_size * config.kv_bytes_per_token / config.swap_bytes_per_s
        recompute_s = self.spec.length(victim) / config.prefill_tokens_per_s
        return "swap" if blocks <= self.spec.num_free_cpu_blocks() and swap_s < recompute_s else "recompute"

    def replay_decode(self, out, pending: dict) -> list:
        """The spec's `step` over every running sequence's pending token, with the scheduler's
        victims (the spec's: swap frees the same GPU blocks as recompute) preempted by the mode the
        scheduler chose, which must be the cost model's. Returns the sequences it appended to."""
        batch = {s: pending[s] for s in self.spec.seq_ids() if self.spec.status(s) == RUNNING}
        if not out.swapped_out:   # all by recompute, the spec's own step (the CPU pool stays as it is)
            modes = {s: self.documented_mode(s) for s in batch}
            result = self.spec.step(batch)
            assert out.preempted == result.preempted, f"victims {out.preempted} vs spec {result.preempted}"
            assert all(modes[v] == "recompute" for v in result.preempted), \
                f"victims {result.preempted} preempted by recompute, the cost model says {modes}"
            if result.preempted:
                self.count("scheduler preempted")
            return result.appended
        victims = copy.deepcopy(self.spec).step(batch).preempted
        swapped = set(out.swapped_out)
        assert (out.preempted, out.swapped_out) == ([v for v in victims if v not in swapped],
                                                    [v for v in victims if v in swapped]), \
            f"victims {out.preempted} + swapped {out.swapped_out} vs spec {victims}"
        for victim in victims:
            mode = self.documented_mode(victim)
            assert (victim in swapped) == (mode == "swap"), f"victim {victim} preempted, the cost model says {mode}"
            self.spec.preempt(victim, mode)
            batch.pop(victim, None)
        self.count("scheduler swapped out")
        result = self.spec.step(batch)
        assert result.preempted == [], f"the spec still preempts {result.preempted} after the scheduler's victims"
        return result.appended


def differential_settings(profile: str, **overrides):
    """`profile`'s settings for both machines: no example database, the failing blob printed."""
    return settings_for(profile, database=None, print_blob=True, **overrides)


def run_differential_check(profile: str, **overrides) -> dict:
    """Run both machines under a profile (with settings `overrides`); a dict for `pagedkv check`'s report."""
    check_profile(profile)
    chosen = differential_settings(profile, **overrides)
    tally, found = Counter(), []
    started = time.monotonic()
    try:
        run_bounded(bind(DifferentialMachine, tally=tally), chosen)
        run_bounded(bind(SchedulerMachine, tally=tally), chosen)
        passed, detail = True, "BlockManager and Scheduler match KVSpec on every observable"
    except Exception as failure:  # noqa: BLE001 -- any failure is a finding to report
        passed, detail = False, f"divergence: {type(failure).__name__}: {failure}"
        found = counterexamples(failure)
    paths = ", ".join(f"{path} {n}" for path, n in sorted(tally.items()) if path not in ("examples", "steps"))
    return {"name": "differential", "covered": f"{tally['examples']} examples / {tally['steps']} steps",
            "passed": passed, "detail": f"{detail} ({time.monotonic() - started:.1f}s); paths: {paths}",
            "counterexamples": found}
