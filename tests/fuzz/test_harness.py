"""The conformance harness itself: hand-written programs, capabilities, and oracles that name themselves."""

from collections import Counter

import pytest
from hypothesis import Phase

import bug_zoo
from pagedkv.fuzz.campaign import check
from pagedkv.fuzz.harness import ConfigSpaceError, Conformance, machine_for, replay
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.fuzz.subjects import Subject
from pagedkv.fuzz.testing import ConformanceFailure, conformance_test, run_conformance
from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidState, KVSpec, OutOfBlocks, blocks_needed

CONFIG = {"num_blocks": 3, "block_size": 2, "prefix_caching": True, "num_cpu_blocks": 2}
SHARED_TAIL = [("add", (1, [0, 1, 2])), ("fork", (1, 2)), ("append", (2, 3)), ("append", (1, 0))]


def test_spec_passes_a_program_with_cow_hits_swap_and_errors():
    replay(KVSpec, CONFIG, SHARED_TAIL + [
        ("free", (2,)), ("add", (3, [0, 1, 1])), ("swap_out", (3,)), ("swap_in", (3,)),
        ("free", (9,)), ("add", (1, [5])), ("append", (4, 1)),
    ])


@pytest.mark.parametrize("bug, oracle", [
    (bug_zoo.CowInPlace, "cow_exact"), (bug_zoo.FreeStillShared, "free_count"),
    (bug_zoo.DoubleFreeAccepted, "id_errors"),
])
def test_a_broken_subject_fails_the_program_naming_the_oracle(bug, oracle):
    program = SHARED_TAIL + [("free", (2,)), ("free", (2,))]
    config = dict(CONFIG, num_blocks=4, prefix_caching=False, num_cpu_blocks=0)
    with pytest.raises(OracleFailure) as caught:
        replay(bug, config, program)
    assert caught.value.oracle == oracle
    assert caught.value.report["trace"][0] == "add(seq=1, tokens=[0, 1, 2]) -> 0"


class Recording(bug_zoo.Reference):
    """The reference, declaring only fork, recording which methods and options the harness used."""

    capabilities = frozenset({"fork"})
    seen = Counter()

    def __init__(self, num_blocks, block_size, *, prefix_caching=False, num_cpu_blocks=0):
        super().__init__(num_blocks, block_size, prefix_caching=prefix_caching)
        self.seen["built with prefix caching"] += prefix_caching

    def __getattribute__(self, name):
        if not name.startswith("_"):
            type(self).seen[name] += 1
        return super().__getattribute__(name)


def test_only_declared_capabilities_are_exercised():
    tally, failure = check(Subject("recording", Recording, Recording.capabilities), "ci", max_examples=30)
    assert failure is None
    assert Recording.seen["fork"] and Recording.seen["append"]
    assert not Recording.seen["built with prefix caching"] and not Recording.seen["swap_out"]


class Crashing(bug_zoo.Reference):
    def free(self, seq_id):
        raise RuntimeError("segfault, politely")


def test_a_subject_raising_a_foreign_exception_is_the_crash_oracle():
    with pytest.raises(OracleFailure) as caught:
        replay(Crashing, dict(CONFIG, prefix_caching=False), [("add", (1, [0])), ("free", (1,))])
    assert caught.value.oracle == "crash" and "segfault" in caught.value.message


# ---------------------------------------------------------------------- policy any

class StateBeforeIds(KVSpec):
    """Correct, another error order: fork checks the parent's status before the child id."""

    def fork(self, parent_id, child_id):
        if parent_id in self.seqs and self.status(parent_id) != "running":
            raise InvalidState(f"cannot fork sequence {parent_id!r}: it is {self.status(parent_id)}")
        return super().fork(parent_id, child_id)


SWAPPED_PARENT_INTO_EXISTING_CHILD = [("add", (1, [0, 1, 2])), ("add", (2, [3])), ("swap_out", (1,)),
                                      ("fork", (1, 2))]


def test_when_several_errors_apply_any_accepts_either_and_spec_demands_its_order():
    replay(StateBeforeIds, CONFIG, SWAPPED_PARENT_INTO_EXISTING_CHILD, policy="any")
    with pytest.raises(OracleFailure) as caught:
        replay(StateBeforeIds, CONFIG, SWAPPED_PARENT_INTO_EXISTING_CHILD, policy="spec")
    assert caught.value.oracle == "id_errors"


@pytest.mark.parametrize("policy, oracle", [("spec", "cache_hit"), ("any", "completeness")])
def test_a_cache_that_forgets_released_blocks_is_caught(policy, oracle):
    config = dict(CONFIG, num_blocks=4, num_cpu_blocks=0)
    with pytest.raises(OracleFailure) as caught:
        replay(bug_zoo.ForgetsReleased, config, [("add", (1, [0, 1, 2])), ("free", (1,)), ("add", (2, [0, 1, 3]))],
               policy=policy)
    assert caught.value.oracle == oracle and "add(2)" in caught.value.message


def test_completeness_lapses_once_the_holder_is_handed_out_again():
    """After block 0 ([0, 1]) is taken for other tokens, a miss on [0, 1] is legal under `any`."""
    config = dict(CONFIG, num_blocks=2, num_cpu_blocks=0)
    program = [("add", (1, [0, 1, 2])), ("free", (1,)), ("add", (2, [3, 3, 3])), ("free", (2,)),
               ("add", (3, [0, 1, 2]))]
    replay(bug_zoo.ForgetsReleased, config, program, policy="any")


class Conservative(bug_zoo.Reference):
    """Admission that ignores its hits when counting what it needs (refuses early, atomically)."""

    def _allocate(self, hits, needed):
        if needed + len(hits) > self.num_free_blocks():
            raise OutOfBlocks(needed + len(hits), self.num_free_blocks())
        return super()._allocate(hits, needed)


class DeclaredConservative(Conservative):
    capabilities = Conservative.capabilities | {"conservative_admission"}


LIVE_HIT_FITS = [("add", (1, [0, 1, 2])), ("add", (2, [0, 1, 3]))]   # N=3: a live hit plus the 1 free block


def test_a_spurious_refusal_is_oom_exact_unless_conservative_admission_is_declared():
    config = dict(CONFIG, num_blocks=3, num_cpu_blocks=0)
    with pytest.raises(OracleFailure) as caught:
        replay(Conservative, config, LIVE_HIT_FITS, policy="any")
    assert caught.value.oracle == "oom_exact" and "spurious" in caught.value.message
    kv = Conformance(DeclaredConservative, config, policy="any")
    for op, args in LIVE_HIT_FITS:
        getattr(kv, op)(*args)
        kv.check_all()
    assert kv.tally["oom_conservative"] == 1 and kv.tally["out_of_blocks"] == 1


def test_hits_are_checked_against_the_content_they_claim():
    """A weak hash that serves another prompt's block: `any` names the block and what it holds."""
    config = dict(CONFIG, num_blocks=6, num_cpu_blocks=0)
    weak = bug_zoo.UnconfirmedWeakHash(6, 2)
    other = next([a, b] for a in range(8) for b in range(8)
                 if [a, b] != [0, 1] and weak._hash(0, (a, b)) == weak._hash(0, (0, 1)))
    with pytest.raises(OracleFailure) as caught:
        replay(bug_zoo.UnconfirmedWeakHash, config, [("add", (1, [0, 1, 2])), ("add", (2, other + [2]))],
               policy="any")
    assert caught.value.oracle == "cache_hit" and "holds" in caught.value.message


# ---------------------------------------------------------------------- declared configurations

@pytest.mark.parametrize("space, reason", [
    ({"block_size": (16,)}, "unknown keys"),
    ({"block_sizes": (0, 16)}, "ints >= 1"),
    ({"block_sizes": ()}, "ints >= 1"),
    ({"prefix_caching": (True,)}, "does not declare"),
    ({"prefix_caching": ("yes",)}, "tuple of bools"),
    ({"num_blocks": (4, 8)}, "range"),
    ({"num_blocks": range(0, 4)}, ">= 1"),
    ({"num_cpu_blocks": range(0)}, "non-empty"),
])
def test_a_bad_config_space_is_refused_with_the_reason(space, reason):
    with pytest.raises(ConfigSpaceError, match=reason):
        machine_for(KVSpec, {"fork"}, config_space=space)


class Restricted(bug_zoo.Reference):
    """Prefix caching always on, block sizes 16 or 32 only; records every configuration it is built with."""

    config_space = {"block_sizes": (16, 32), "prefix_caching": (True,), "num_blocks": range(3, 7)}
    built = []

    def __init__(self, num_blocks, block_size, *, prefix_caching=False, num_cpu_blocks=0):
        if block_size not in (16, 32) or not prefix_caching:
            raise ValueError(f"unsupported block_size={block_size} prefix_caching={prefix_caching}")
        super().__init__(num_blocks, block_size, prefix_caching=prefix_caching)
        self.built.append((num_blocks, block_size, prefix_caching, num_cpu_blocks))


def test_configurations_are_drawn_from_the_declared_space():
    Restricted.built.clear()
    run_conformance(Restricted, policy="any", max_examples=25)
    assert {size for _, size, _, _ in Restricted.built} == {16, 32}
    assert all(3 <= blocks <= 6 and caching for blocks, _, caching, _ in Restricted.built)


# ---------------------------------------------------------------------- the pytest entry point

class TwoBugs(bug_zoo.TailFreedTwice, bug_zoo.DoubleFreeAccepted):
    """The tail freed twice *and* a double free accepted: two distinct oracles. (Block ids from 1 in
    place of the first masked the double free once the machine's `churn` rule filled pools often.)"""


def test_the_entry_point_reports_every_distinct_oracle_with_readable_programs():
    test = conformance_test(TwoBugs, policy="any", max_examples=60)
    assert test.__name__.startswith("test_")
    with pytest.raises(ConformanceFailure) as caught:
        test()
    assert {failure["oracle"] for failure in caught.value.failures} == {"free_count", "id_errors"}
    text = str(caught.value)
    assert "COUNTEREXAMPLE" in text and "add(seq=" in text and "@reproduce_failure" not in text


def test_the_entry_point_passes_a_correct_subject():
    conformance_test(bug_zoo.Reference, max_examples=20)()


class DedupOnFill(bug_zoo.Reference):
    """vLLM v0 BMv2's promotion: a tail that fills and equals a cached block is replaced by that block
    (the copy-on-write target, if any, is dropped); the returned copies still name the target."""

    def append(self, seq_id, token):
        copies = super().append(seq_id, token)
        seq = self.seqs[seq_id]
        j = len(seq.table) - 1
        if self.prefix_caching and len(seq.tokens) % self.B == 0:
            h = self._hashes(seq.tokens, j + 1)[-1]
            equal = [b for b in self.index.get(h, ()) if b != seq.table[j] and self._confirmed(b, seq.tokens, j)]
            if equal:
                tail, seq.table[j] = seq.table[j], self._share(min(equal))
                self._drop(tail)
        return copies


class DeclaredDedup(DedupOnFill):
    capabilities = DedupOnFill.capabilities | {"dedup_on_fill"}


#: Seq 3 forks seq 2's partial [0] and writes 1: the copy (1 -> 2) fills to [0, 1], equal to block 0.
COW_THAT_FILLS_AN_EQUAL_BLOCK = [("add", (1, [0, 1])), ("add", (2, [0])), ("fork", (2, 3)), ("append", (3, 1))]


def test_a_cow_target_replaced_by_an_equal_cached_block_is_accepted_only_when_declared():
    config = dict(CONFIG, num_blocks=4, num_cpu_blocks=0)
    with pytest.raises(OracleFailure) as caught:
        replay(DedupOnFill, config, COW_THAT_FILLS_AN_EQUAL_BLOCK, policy="any")
    assert caught.value.oracle == "cow_exact"
    replay(DeclaredDedup, config, COW_THAT_FILLS_AN_EQUAL_BLOCK, policy="any")


def test_dedup_on_fill_does_not_excuse_a_table_naming_other_content():
    """Declared dedup, but the block the table names holds [0, 2], not the [0, 1] just written."""
    class WrongDedup(DeclaredDedup):
        def append(self, seq_id, token):
            return super().append(seq_id, 2 if token == 1 else token)

    config = dict(CONFIG, num_blocks=5, num_cpu_blocks=0)
    with pytest.raises(OracleFailure) as caught:
        replay(WrongDedup, config, [("add", (1, [0, 2])), ("add", (2, [0])), ("fork", (2, 3)), ("append", (3, 1))],
               policy="any")
    assert caught.value.oracle in ("cow_exact", "readback")


class ConservativeAppend(bug_zoo.Reference):
    """vLLM v0's worst-case heuristic: an append is refused when no block is free, needed or not."""

    capabilities = bug_zoo.Reference.capabilities | {"conservative_admission"}

    def append(self, seq_id, token):
        self._get(seq_id)
        self._require(1)
        return super().append(seq_id, token)


def test_a_conservative_append_refusal_is_allowed_and_counted():
    kv = Conformance(ConservativeAppend, dict(CONFIG, num_blocks=2, num_cpu_blocks=0), policy="any")
    for op, args in [("add", (1, [0, 1, 2])), ("append", (1, 3))]:   # the tail has room, no block is free
        getattr(kv, op)(*args)
        kv.check_all()
    assert kv.tally["oom_conservative"] == 1


class ServesHighestHolder(bug_zoo.Reference):
    """Correct, another choice among equal blocks: a hit serves the highest-numbered holder."""

    def _hits(self, tokens):
        hits = []
        for j, h in enumerate(self._hashes(tokens, (len(tokens) - 1) // self.B) if self.prefix_caching else []):
            confirmed = [block for block in self.index.get(h, ()) if self._confirmed(block, tokens, j)]
            if not confirmed:
                break
            hits.append(max(confirmed))
        return hits


def test_serving_the_free_copy_of_a_duplicate_may_run_out_where_the_spec_does_not():
    """Issue 19, family 1: [0, 1] is held by live block 0 and by released block 2. Serving block 2
    costs a free block, so admitting 3 blocks with 2 free is refused: legal under `any` only."""
    config = dict(CONFIG, num_blocks=4, num_cpu_blocks=0)
    program = [("add", (1, [0, 1, 5])), ("add", (2, [0, 1])), ("free", (2,)), ("add", (3, [0, 1, 7, 8, 9]))]
    replay(ServesHighestHolder, config, program, policy="any")
    with pytest.raises(OracleFailure) as caught:
        replay(ServesHighestHolder, config, program, policy="spec")
    assert caught.value.oracle == "oom_exact"


class CapacityBeforeIds(bug_zoo.Reference):
    """Another legal error order: admission checks capacity before the id."""

    def add(self, seq_id, tokens):
        self._require(blocks_needed(len(tokens), self.B) - len(self._hits(tokens)))
        return super().add(seq_id, tokens)


def test_a_duplicate_add_that_also_does_not_fit_may_raise_either_error_under_any():
    config = dict(CONFIG, num_blocks=2, num_cpu_blocks=0)
    program = [("add", (1, [0, 1, 2])), ("add", (1, [3, 3, 3]))]
    replay(CapacityBeforeIds, config, program, policy="any")
    with pytest.raises(OracleFailure) as caught:
        replay(CapacityBeforeIds, config, program, policy="spec")
    assert caught.value.oracle == "id_errors"



class DefaultCpuPool(BlockManager):
    """The issue-18 mutant the harness once missed: the allocator's CPU pool defaults to 1 block, the
    spec's to none."""

    def __init__(self, num_blocks, block_size, *, num_cpu_blocks=1, prefix_caching=False, **options):
        super().__init__(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks, prefix_caching=prefix_caching,
                         **options)


@pytest.mark.parametrize("policy", ["spec", "any"])
def test_a_subject_declaring_spec_defaults_is_built_with_them_and_held_to_them(policy):
    # (BlockManager itself, which declares spec_defaults, passes the conformance check of `pagedkv check`.)
    subject = Subject("test:DefaultCpuPool", DefaultCpuPool, DefaultCpuPool.capabilities)
    _, failure = check(subject, "ci", policy=policy, phases=[Phase.generate])   # found, not shrunk
    assert failure["oracle"] == "oom_exact" and "missing OutOfBlocks" in failure["message"]
    assert "num_cpu_blocks" not in failure["config"]   # built with its own default, which is not the spec's


# ---------------------------------------------------------------------- batch tables

class BatchTables(bug_zoo.Reference):
    """The reference with `block_tables(batch)` (capability batch_tables), read afresh every call."""

    capabilities = bug_zoo.Reference.capabilities | {"batch_tables"}

    def block_tables(self, seq_ids):
        tables = [self.block_table(seq) for seq in seq_ids]
        width = max(map(len, tables), default=0)
        return [table + [-1] * (width - len(table)) for table in tables]


class MemoByShape(BatchTables):
    """A batch memo that every change forgets but that is keyed by the batch's shape, not its
    sequences: a read of other sequences at the same size gets the last batch's tables. (The shape of
    issue 18's `RowTables._gather_again` mutant, whose memo compared the rows with the last width.)"""

    def __init__(self, *args, **options):
        super().__init__(*args, **options)
        self.memo = None

    def block_tables(self, seq_ids):
        tables = super().block_tables(seq_ids)
        shape = (len(tables), len(tables[0]) if tables else 0)
        if self.memo is None or self.memo[0] != shape:
            self.memo = (shape, tables)
        return self.memo[1]

    def __getattribute__(self, name):
        if name in ("add", "append", "fork", "free"):
            object.__setattr__(self, "memo", None)
        return super().__getattribute__(name)


class ManagerWithBatchTables(BlockManager):
    capabilities = BlockManager.capabilities | {"batch_tables"}


class CountedReads(BatchTables):
    reads = Counter()

    def block_tables(self, seq_ids):
        self.reads["batches"] += 1
        self.reads["alone" if len(seq_ids) == 1 else "together"] += 1
        return super().block_tables(seq_ids)


@pytest.mark.parametrize("policy", ["spec", "any"])
def test_correct_batch_tables_pass_and_are_read_alone_and_together(policy):
    CountedReads.reads.clear()
    _, failure = check(Subject("test:CountedReads", CountedReads, CountedReads.capabilities), "ci",
                       policy=policy, max_examples=40)
    assert failure is None and CountedReads.reads["alone"] and CountedReads.reads["together"]
    _, failure = check(Subject("test:Manager", ManagerWithBatchTables, ManagerWithBatchTables.capabilities),
                       "ci", policy=policy, max_examples=40)
    assert failure is None


def test_a_batch_memo_keyed_by_the_batch_shape_is_the_batch_tables_oracle():
    _, failure = check(Subject("test:MemoByShape", MemoByShape, MemoByShape.capabilities), "ci",
                       phases=[Phase.generate])
    assert failure["oracle"] == "batch_tables"
    assert any(step.startswith("block_tables(") for step in failure["trace"])


def test_a_batch_read_is_replayed_with_the_same_list_object_when_the_program_says_so():
    class Identity(BatchTables):
        passed = []

        def block_tables(self, seq_ids):
            self.passed.append(seq_ids)
            return super().block_tables(seq_ids)

    config = {"num_blocks": 4, "block_size": 2, "prefix_caching": False, "num_cpu_blocks": 0}
    replay(Identity, config, [("add", (1, [0, 1, 2])), ("add", (2, [3])), ("block_tables", ([2, 1], False)),
                              ("block_tables", ([2, 1], True)), ("block_tables", ([2, 1], False))],
           capabilities=Identity.capabilities)
    first, again, fresh = Identity.passed
    assert first is again and fresh is not first and first == fresh == [2, 1]


def test_a_replayed_batch_read_of_a_sequence_that_no_longer_runs_is_skipped():
    # What the campaign's step dropping replays: the add of 2 dropped, the read of [2, 1] stays.
    config = {"num_blocks": 4, "block_size": 2, "prefix_caching": False, "num_cpu_blocks": 0}
    replay(MemoByShape, config, [("add", (1, [0, 1, 2])), ("block_tables", ([2, 1], False)),
                                 ("block_tables", ([1], False))], capabilities=MemoByShape.capabilities)


def test_a_subject_declaring_batch_tables_must_have_them():
    from pagedkv.fuzz.subjects import UsageError, _probe

    class ClaimsBatchTables(bug_zoo.Reference):
        capabilities = bug_zoo.Reference.capabilities | {"batch_tables"}

    with pytest.raises(UsageError, match=r"lacks protocol method\(s\) block_tables"):
        _probe("test:ClaimsBatchTables", ClaimsBatchTables)
