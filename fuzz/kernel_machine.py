"""The production allocator and the kernels on one real KV cache: a Hypothesis state machine.

Each example builds a `BlockManager` and a real cache (`PagedCache`: K and V [N, B, Hkv, D] plus a
CPU swap pool, NaN wherever no valid token is held) and runs a program of adds (with shared
prefixes, so prefix-cache hits happen), appends, forks, frees, preemptions (recompute and swap),
resumes and batched steps, or (with `scheduled`) lets a `Scheduler` drive the manager through
requests and engine steps. After every operation it does what an engine does: the copies the
manager queued (`take_copies`, performed phase by phase in call order by `perform_copies`), NaN
into every block that went back to the free queue, and `write_kv` of fresh K/V for the tokens the
operation computed at the manager's `slot_mapping` (for a prefix-cache hit only the uncached ones).

K/V of a position is a function of its token prefix (`kernel_corpus.kv_values`), so cached blocks
legitimately hold the same K/V as a recomputation would. The test keeps every sequence's tokens
itself; after each operation, for every running sequence (decode) and every sequence just added
or resumed (prefill), the cache read through the manager's `block_tables` must equal the K/V of
that history bit for bit, and `paged_decode` / `paged_prefill` must match dense attention over it.
A wrong table, a dropped copy, a stale or unwritten slot, or a kernel bug all fail here.

Every checked batch can be recorded as a `kernel_corpus` case (`generate_cases`), and the case of a
shrunk failure is appended to the failure corpus named by PAGEDKV_KERNEL_FAILURES.
"""

import os
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import event, seed as hypothesis_seed, strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from pagedkv.impl import BlockManager, Scheduler, SchedulerConfig
from pagedkv.impl.engine import perform_copies
from pagedkv.kernels import write_kv
from pagedkv.spec import PagedKVError

from .kernel_corpus import (FAILURES_ENV, Heads, check_attention, kv_values, make_case, prefix_keys, queries,
                            read_back_problem, save_failures)
from .kernel_kit.protocol import Requirement, load_kernel, skip_reason
from .findings import counterexamples
from .profiles import EFFORT, kernel_settings_for, settings_for
from .spec_machine import ALPHABET, SHARED_PREFIXES, tokens_st
from .strategies import (CACHE_HIT, COW, RECOMPUTE, RESUME, SCHEDULER_STEP, STEP_PREEMPT, SWAP, FreshIds,
                         bind, count_path, summary, pool_configs, prompts)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: The smallest GQA shape worth having: one KV head shared by a group of 3 (not a power of two).
HEADS = Heads(num_kv_heads=1, group=3, head_dim=16)
PATHS = (CACHE_HIT, COW, SWAP, RECOMPUTE, RESUME, STEP_PREEMPT, SCHEDULER_STEP)


@dataclass(frozen=True)
class Limits:
    """How large the drawn pools, blocks and prompts get."""

    max_blocks: int = 24
    max_block_size: int = 8
    max_prompt: int = 6   # tokens after the shared prefix

    def configs(self):
        return pool_configs(num_blocks=st.integers(4, self.max_blocks), block_size=st.integers(1, self.max_block_size),
                            num_cpu_blocks=st.integers(0, self.max_blocks // 2), prefix_caching=st.booleans(),
                            kv_seed=st.integers(0, 2 ** 32 - 1))

    def scheduler_configs(self):
        """The cost model picks swap for cheap KV (small kv_bytes_per_token), recompute for dear."""
        return st.builds(SchedulerConfig, max_num_seqs=st.integers(1, 8), watermark=st.sampled_from([0.0, 0.1]),
                         kv_bytes_per_token=st.sampled_from([1024, 10 ** 7]))

    def prompts(self):
        return prompts(SHARED_PREFIXES, ALPHABET, max_suffix=self.max_prompt)


class PagedCache:
    """A real KV cache and its CPU swap pool, NaN where nothing is held, with a shadow `keys` of the
    content key each slot holds (-1: none) so that a batch can be written down as a case."""

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int, heads: Heads, kv_seed: int):
        shape = (block_size, heads.num_kv_heads, heads.head_dim)
        self.k = torch.full((num_blocks, *shape), float("nan"), device=DEVICE)
        self.v = self.k.clone()
        self.cpu_k = torch.full((num_cpu_blocks, *shape), float("nan"))
        self.cpu_v = self.cpu_k.clone()
        self.keys = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self.cpu_keys = np.full((num_cpu_blocks, block_size), -1, dtype=np.int64)
        self.block_size, self.heads, self.kv_seed = block_size, heads, kv_seed

    def write(self, slots: torch.Tensor, keys: list) -> None:
        k, v = kv_values(self.kv_seed, keys, self.heads)
        write_kv(k.to(DEVICE), v.to(DEVICE), self.k, self.v, slots)
        where = slots.cpu().numpy()
        self.keys[where // self.block_size, where % self.block_size] = keys

    def perform(self, copies) -> None:
        """The manager's queued copies, phase by phase in call order (the engine's own helper)."""
        perform_copies(copies, [(self.k, self.v)], [(self.cpu_k, self.cpu_v)], shadows=[(self.keys, self.cpu_keys)])

    def poison(self, blocks: list, cpu_blocks: list) -> None:
        self.k[blocks] = self.v[blocks] = float("nan")
        self.cpu_k[cpu_blocks] = self.cpu_v[cpu_blocks] = float("nan")
        self.keys[blocks] = -1
        self.cpu_keys[cpu_blocks] = -1

    def contents(self, blocks) -> dict:
        """Block -> the content key of each slot (None: nothing written), for a case."""
        return {b: [None if key < 0 else int(key) for key in self.keys[b]] for b in blocks}


def free_blocks(bm) -> tuple[list, list]:
    """Free GPU blocks that hold no cached content (evictable ones keep their KV for cache hits)
    and free CPU blocks."""
    held_cpu = {b for s in bm.seq_ids() for b in bm.cpu_block_table(s)}
    return bm.uncached_free_blocks(), [b for b in range(bm.num_cpu_blocks) if b not in held_cpu]


class KernelMachine(RuleBasedStateMachine):
    """`manager_factory`, `scheduled`, `limits`, `heads`, `run_kernels`, `record` (a callable taking
    each checked batch's case, or None), `tally` and `failures` (a list collecting the cases of
    final, shrunk failures) are set per run by `bind`; unbound, each example gets its own."""

    manager_factory = BlockManager
    scheduled = False
    limits = Limits()
    heads = HEADS
    run_kernels = True
    target = None      # the kernel under test (a kernel_kit LoadedKernel); None: pagedkv's own
    record = None
    tally = None
    failures = None

    def __init__(self) -> None:
        super().__init__()
        self.tally = self.tally if self.tally is not None else Counter()
        self.failures = self.failures if self.failures is not None else []

    @initialize(data=st.data())
    def setup(self, data):
        config = data.draw(self.limits.configs(), label="config")
        self.kv_seed = config.pop("kv_seed")
        self.bm = self.manager_factory(**config, device=DEVICE)
        self.scheduler = (Scheduler(self.bm, data.draw(self.limits.scheduler_configs(), label="scheduler"))
                          if self.scheduled else None)
        self.prompts = {}   # scheduled: seq id -> its prompt, until admitted
        self.sampled = {}   # scheduled: seq id -> the token sampled for it, not yet written
        self.cache = PagedCache(config["num_blocks"], config["block_size"], config["num_cpu_blocks"],
                                self.heads, self.kv_seed)
        self.tokens = {}    # seq id -> its tokens as this test gave them (never read from the manager)
        self.prefill = {}   # seq id -> positions computed or restored since the last check
        self.changed = False
        self.fresh = FreshIds()
        self.checks = 0
        self.tally["examples"] += 1

    # -------------------------------------------------------------- engine side of an operation

    def run_on_engine(self, operation, *args):
        """Run one manager operation and, if it succeeds, the copies and NaN fill it calls for."""
        self.tally["steps"] += 1
        try:
            result = getattr(self.bm, operation)(*args)
        except PagedKVError as error:
            event(f"{operation} -> {type(error).__name__}")
            return False, error
        self.cache.perform(self.bm.take_copies())
        self.cache.poison(*free_blocks(self.bm))
        self.changed = True
        return True, result

    def compute(self, seq_ids: list, counts: list, slots=None) -> None:
        """Write K/V for the last `counts[i]` tokens of each sequence at `slots` (by default, where
        the manager's `slot_mapping` puts them)."""
        keys = [key for s, n in zip(seq_ids, counts) for key in prefix_keys(self.tokens[s])[len(self.tokens[s]) - n:]]
        if keys:
            self.cache.write(self.bm.slot_mapping(seq_ids, counts) if slots is None else slots, keys)

    def count(self, path: str, taken) -> None:
        count_path(self.tally, path, bool(taken))

    def by_hand(self) -> bool:
        return self.scheduler is None

    def running(self) -> list:
        return [s for s in self.tokens if self.bm.status(s) == "running"]

    def paused(self) -> list:
        return [s for s in self.tokens if self.bm.status(s) != "running"]

    # -------------------------------------------------------------- operations

    @precondition(lambda self: self.by_hand())
    @rule(data=st.data())
    def add(self, data):
        prompt, seq_id = data.draw(self.limits.prompts(), label="prompt"), self.fresh()
        ok, cached = self.run_on_engine("add", seq_id, prompt)
        if ok:
            self.tokens[seq_id] = list(prompt)
            self.compute([seq_id], [len(prompt) - cached])
            self.prefill[seq_id] = len(prompt) - cached
            self.count(CACHE_HIT, cached)

    @precondition(lambda self: self.by_hand() and self.running())
    @rule(data=st.data(), token=tokens_st)
    def append(self, data, token):
        self.append_to(data.draw(st.sampled_from(self.running()), label="seq"), token)

    def append_to(self, seq_id, token):
        ok, copies = self.run_on_engine("append", seq_id, token)
        if ok:
            self.tokens[seq_id].append(token)
            self.compute([seq_id], [1])
            self.count(COW, copies)

    @precondition(lambda self: self.by_hand() and self.running())
    @rule(data=st.data(), diverge=st.none() | st.tuples(tokens_st, tokens_st))
    def fork(self, data, diverge):
        """Fork a running sequence; with `diverge`, parent and child each decode a token at once
        (sampling in parallel: a shared partial tail is copied on write)."""
        parent, child = data.draw(st.sampled_from(self.running()), label="parent"), self.fresh()
        ok, _ = self.run_on_engine("fork", parent, child)
        if ok:
            self.tokens[child] = list(self.tokens[parent])
            if diverge:
                self.append_to(parent, diverge[0])
                self.append_to(child, diverge[1])

    @precondition(lambda self: self.by_hand() and self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)), label="seq")
        ok, _ = self.run_on_engine("free", seq_id)
        if ok:
            del self.tokens[seq_id]
            self.prefill.pop(seq_id, None)

    @precondition(lambda self: self.by_hand() and self.running())
    @rule(data=st.data(), mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, data, mode):
        ok, _ = self.run_on_engine("preempt", data.draw(st.sampled_from(self.running()), label="seq"), mode)
        self.count(SWAP if mode == "swap" else RECOMPUTE, ok)

    @precondition(lambda self: self.by_hand() and self.paused())
    @rule(data=st.data())
    def resume(self, data):
        """Recompute: the uncached tokens are computed again. Swap: the blocks come back by copy,
        and prefill over the whole sequence checks them."""
        seq_id = data.draw(st.sampled_from(self.paused()), label="seq")
        swapped = self.bm.status(seq_id) == "swapped"
        ok, _ = self.run_on_engine("resume", seq_id)
        if ok:
            computed = 0 if swapped else len(self.tokens[seq_id]) - self.bm.cached_tokens(seq_id)
            self.compute([seq_id], [computed])
            self.prefill[seq_id] = len(self.tokens[seq_id]) if swapped else computed
            self.count(RESUME, True)

    @precondition(lambda self: self.by_hand() and self.running())
    @rule(data=st.data())
    def step(self, data):
        batch = data.draw(st.lists(st.sampled_from(self.running()), min_size=1, unique=True), label="batch")
        tokens = {seq_id: data.draw(tokens_st, label="token") for seq_id in batch}
        ok, result = self.run_on_engine("step", tokens)
        assert ok, f"step must not fail on running sequences: {result!r}"
        for seq_id in result.appended:
            self.tokens[seq_id].append(tokens[seq_id])
        self.compute(result.appended, [1] * len(result.appended))
        self.count(STEP_PREEMPT, result.preempted)
        self.count(COW, result.copies)

    # -------------------------------------------------------------- the scheduler drives

    @precondition(lambda self: self.scheduler)
    @rule(data=st.data(), n=st.integers(1, 3), max_new_tokens=st.integers(1, 16))
    def request(self, data, n, max_new_tokens):
        prompt = data.draw(self.limits.prompts(), label="prompt")
        try:
            seq_ids = self.scheduler.add_request(self.fresh(), prompt, max_new_tokens, n)
        except PagedKVError as error:   # a request that can never be admitted is refused up front
            event(f"request -> {type(error).__name__}")
            return
        self.prompts.update(dict.fromkeys(seq_ids, prompt))

    @precondition(lambda self: self.scheduler and self.scheduler.has_unfinished())
    @rule(data=st.data())
    def engine_step(self, data):
        """One engine step: schedule, copy, write K/V at the scheduler's slot mapping, sample a
        token for every sequence that ran (forked children sample from their parent's logits)."""
        self.tally["steps"] += 1
        out = self.scheduler.schedule()
        for seq_id in out.aborted:   # freed: the whole pool cannot hold its next token
            del self.tokens[seq_id], self.sampled[seq_id]
        for prefill in out.prefills:   # a new admission, or a recompute victim re-prefilled with its pending token
            seq_id = prefill.seq_id
            if seq_id in self.tokens:
                self.tokens[seq_id].append(self.sampled.pop(seq_id))
                self.count(RESUME, True)
            else:
                self.tokens[seq_id] = list(self.prompts.pop(seq_id))
            self.prefill[seq_id] = prefill.num_computed_tokens
            self.count(CACHE_HIT, prefill.num_cached_tokens)
        for child, parent in out.forked.items():
            self.tokens[child] = list(self.tokens[parent])
            del self.prompts[child]
        for seq_id in out.decodes:
            self.tokens[seq_id].append(self.sampled.pop(seq_id))
        self.prefill.update({seq_id: len(self.tokens[seq_id]) for seq_id in out.swapped_in})
        self.cache.perform(out.copies)
        self.compute(out.seq_ids, [p.num_computed_tokens for p in out.prefills] + [1] * len(out.decodes),
                     out.slot_mapping)
        ran = out.seq_ids + list(out.forked)
        sampled = {seq_id: data.draw(tokens_st, label="sampled") for seq_id in ran}
        finished = self.scheduler.update(sampled)
        for seq_id in finished:
            del self.tokens[seq_id]
        self.sampled.update((s, t) for s, t in sampled.items() if s not in finished)
        self.cache.poison(*free_blocks(self.bm))
        self.changed = bool(ran or out.preempted or out.swapped_out or out.aborted)
        self.count(SCHEDULER_STEP, ran)
        self.count(STEP_PREEMPT, out.preempted or out.swapped_out)
        self.count(SWAP, out.swapped_out)
        self.count(RECOMPUTE, out.preempted)
        self.count(RESUME, out.swapped_in)
        self.count(COW, len(out.copies.cow))

    # -------------------------------------------------------------- checks

    @invariant()
    def every_sequence_reads_its_own_kv(self):
        if not self.changed:
            return
        self.changed = False
        running = self.running()
        prefill = {s: n for s, n in self.prefill.items() if s in running and n}
        self.prefill = {}
        if running:
            self.check_batch("decode", dict.fromkeys(running, 1))
        if prefill:
            self.check_batch("prefill", prefill)

    def check_batch(self, kernel: str, num_queries: dict) -> None:
        """Read back through the tables, then (if `run_kernels`) run the kernel; record the case."""
        seq_ids = list(num_queries)
        tables, lens = self.bm.block_tables(seq_ids), self.bm.seq_lens(seq_ids)
        histories = [tuple(t.to(DEVICE) for t in kv_values(self.kv_seed, prefix_keys(self.tokens[s]), self.heads))
                     for s in seq_ids]
        self.checks += 1
        query_seed = hash((self.kv_seed, self.checks))
        problem = self.length_problem(seq_ids, lens) or read_back_problem(self.cache.k, self.cache.v, tables, lens,
                                                                           histories)
        skip = self.target and skip_reason(self.target.declared, Requirement(
            kernel, self.bm.block_size, self.heads.head_dim, torch.float32, self.heads.group, frozenset()))
        if problem is None and self.run_kernels and skip:
            self.tally["skipped_checks"] += 1   # outside what the kernel under test declares
        elif problem is None and self.run_kernels:
            q = queries(query_seed, sum(num_queries.values()), self.heads).to(DEVICE)
            ok, detail = check_attention(kernel, q, self.cache.k, self.cache.v, tables, lens,
                                         list(num_queries.values()), histories, target=self.target)
            problem = None if ok else detail
            self.tally[f"{kernel}_checks"] += 1
        case = self.case(kernel, num_queries, tables, query_seed)
        if self.record:
            self.record(case)
        if problem is not None:
            if current_build_context().is_final:
                self.failures.append(case)
            raise AssertionError(f"{kernel} batch {seq_ids}: {problem}")

    def length_problem(self, seq_ids, lens):
        for seq_id, length in zip(seq_ids, lens.tolist()):
            if length != len(self.tokens[seq_id]):
                return f"sequence {seq_id} has length {length} in the manager, {len(self.tokens[seq_id])} here"
        return None

    def case(self, kernel, num_queries: dict, tables, query_seed: int) -> dict:
        rows = [_trim_padding(row) for row in tables.cpu().tolist()]
        blocks = {b for row in rows for b in row if 0 <= b < self.bm.num_blocks}
        seqs = [{"tokens": list(self.tokens[s]), "table": row, "queries": n}
                for (s, n), row in zip(num_queries.items(), rows)]
        return make_case(kernel=kernel, block_size=self.bm.block_size, num_blocks=self.bm.num_blocks,
                         heads=self.heads, kv_seed=self.kv_seed, query_seed=query_seed, seqs=seqs,
                         blocks=self.cache.contents(blocks))

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq_id in list(self.tokens):
            self.bm.free(seq_id)
        assert self.bm.num_free_blocks() == self.bm.num_blocks, "blocks leaked after freeing everything"


def _trim_padding(row: list) -> list:
    """A table row without its trailing -1 padding (a -1 inside the row is kept: it is a bug to show)."""
    while row and row[-1] < 0:
        row = row[:-1]
    return row


# ------------------------------------------------------------------ runs

def run_kernel_machine(profile: str, *, failures_path=None, seed=None, settings=None, **attributes) -> Counter:
    """Run the machine under `profile` (scaled down by profiles.KERNEL_EFFORT) or explicit `settings`, with
    class `attributes` overridden. The cases of shrunk failures are appended to `failures_path`
    (default: $PAGEDKV_KERNEL_FAILURES) before the failure propagates. Returns the tally."""
    tally, failures = Counter(), []
    machine = bind(KernelMachine, tally=tally, failures=failures, **attributes)
    if seed is not None:
        machine = hypothesis_seed(seed)(machine)
    settings = settings or kernel_settings_for(profile)
    failures_path = failures_path or os.environ.get(FAILURES_ENV)
    try:
        run_state_machine_as_test(machine, settings=settings)
    finally:
        if failures and failures_path:
            save_failures(failures_path, failures)
    return tally


def run_kernel_state_check(profile: str, kernel: str | None = None) -> dict:
    """The `pagedkv check` entry: the machine passes, by hand and scheduled, and reaches every path.
    `kernel` ("module:factory", see kernel_kit.protocol) replaces pagedkv's kernels; batches outside
    what it declares are read back but not run, and counted as skipped."""
    target = load_kernel(kernel) if kernel else None
    try:
        tally = run_kernel_machine(profile, target=target) + run_kernel_machine(profile, scheduled=True, target=target)
    except Exception as error:  # the machine's failure, already shrunk (and saved if a path is set)
        saved = os.environ.get(FAILURES_ENV)
        return {"name": "kernel-state", "covered": "-", "passed": False, "counterexamples": counterexamples(error),
                "detail": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                          + (f" (case appended to {saved})" if saved else "")}
    missed = [path for path in PATHS if not tally[path]]
    problems = [f"paths never reached: {', '.join(missed)}"] if missed else []
    if not tally["decode_checks"] + tally["prefill_checks"]:   # a kernel that declares none of the machine's
        problems.append(f"no batch was within the kernel's declarations (block sizes 1..{Limits().max_block_size}, "
                        f"heads {HEADS}, float32): nothing was run")
    paths = summary(tally, PATHS)
    return {
        "name": "kernel-state",
        "covered": (f"{tally['examples']} examples, {tally['steps']} steps, {tally['decode_checks']} decode + "
                    f"{tally['prefill_checks']} prefill kernel checks"
                    + (f" of {target.target} ({tally['skipped_checks']} skipped)" if target else "") + f" ({paths})"),
        "passed": not problems,
        "detail": "; ".join(problems),
    }


def generate_cases(count: int, *, seed: int, limits: Limits = Limits(), heads: Heads = HEADS,
                   run_kernels: bool = False, failures_path=None, target=None) -> list:
    """`count` cases sampled uniformly (seeded) from every batch the machine checks in two runs (by
    hand and scheduled) seeded by `seed`, together long enough to see about four times that many."""
    rng, seen, cases = random.Random(seed), [0], []

    def record(case):
        seen[0] += 1
        if len(cases) < count:
            cases.append(case)
        elif (slot := rng.randrange(seen[0])) < count:
            cases[slot] = case

    steps = EFFORT["dev"].stateful_step_count
    settings = settings_for("dev", max_examples=max(2, -(-2 * count // steps)), stateful_step_count=steps,
                            database=None)
    for scheduled in (False, True):
        run_kernel_machine("dev", failures_path=failures_path, seed=seed, settings=settings, scheduled=scheduled,
                           limits=limits, heads=heads, run_kernels=run_kernels, record=staticmethod(record),
                           target=target)
    return cases
