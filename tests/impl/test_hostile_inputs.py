"""Hostile values at every public method of BlockManager and Scheduler: each raises a typed
`pagedkv.spec` error (never a bare TypeError/KeyError/RuntimeError/AssertionError) and leaves the
state exactly as it was (issue 12, items 1 and 5).

Two layers: a matrix of named hostile values per argument kind (type, range, device, aliasing), and
a Hypothesis property that throws arbitrary values at a random argument of a random method.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from managers import mixed_manager
from pagedkv.impl import BlockManager, Scheduler, SchedulerConfig
from pagedkv.spec import InvalidArgument, InvalidState, KVSpec, PagedKVError

from test_fault_injection import manager_state, scheduler_state


class Liar(int):
    """An int whose `__eq__`/`__hash__` claim it is every other int, and whose `__int__` lies."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0

    def __int__(self):
        return 99


def manager():
    return mixed_manager()


def scheduler():
    """Sequences 0 (ran last step, awaiting its sample) and 1 (waiting: the pool is full)."""
    s = Scheduler(BlockManager(4, 2), SchedulerConfig(watermark=0.0))
    s.add_request("a", [1, 2, 3], 4)
    s.add_request("b", [4, 5, 6, 7, 8], 4)   # 3 blocks: waits while "a" holds 2 of the 4
    s.schedule()
    return s


# ------------------------------------------------------------------ hostile values by kind

NOT_INTS = [None, True, False, 1.0, math.nan, math.inf, "1", b"1", [1], (1,), {1: 1}, np.int64(1), np.float32(1),
            torch.tensor(1), object()]
SEQ_IDS = NOT_INTS + [99, -1, 2 ** 70]                                   # wrong type or unknown
TOKENS = [t for t in NOT_INTS if t is not np.int64] + [-1, 2 ** 63, 2 ** 64, -2 ** 63]
PROMPTS = [None, [], "ab", b"ab", 3, {1: 2}, np.array([1.0, 2.0]), np.array([[1, 2]]), np.array([], dtype=np.int64),
           np.array([-1]), np.array([True, False]), np.array([2 ** 63], dtype=np.uint64), torch.tensor([1.0]),
           torch.tensor([1, 2], dtype=torch.int32).expand(2, 2), [None], [1.0], [True],
           [-1], [2 ** 63], [1, "2"], [np.int64(1)], [[1]], list(range(100))]   # the last never fits
# The Scheduler takes numpy integer tokens (an engine's sampled ids), normalised to int.
SCHEDULER_PROMPTS = [p for p in PROMPTS if not (isinstance(p, list) and p and isinstance(p[0], np.integer))] \
    + [[np.float64(1)], [np.int64(-1)], [np.uint64(2 ** 63)], np.array([1, 2]), torch.tensor([1, 2])]
MODES = [None, "swapp", "SWAP", b"swap", 1, ["swap"], True]
META = "meta"   # a device whose tensors hold no values
BATCH_IDS = [None, 1, "12", {1: 1}, [1, 1], [1, None], [True], [1.0], [99], np.array([1.0]),
             torch.tensor([1, 2], device=META),
             torch.tensor([1.0]), np.array([[1]]), np.array([True]), [1, 2, 1]]
BATCH_TOKENS = [None, 7, "ab", [1, None], [1.5, 1], [-1, 1], [2 ** 63, 1], [1], [1, 2, 3],
                np.array([1.0, 2.0]), np.array([[1, 2]]), np.array([1, 2 ** 64 - 1], dtype=np.uint64),
                torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], requires_grad=True),
                torch.tensor([1, 2], dtype=torch.bfloat16), torch.tensor([True, False]), [True, False],
                torch.tensor([5, 6], device=META), torch.tensor([[5, 6]])]
COUNTS = [1.5, "2", True, None, math.nan, math.inf, -1, 10 ** 9, [1], [1, 1, 1], [1.5, 1], [1, None],
          np.array([1.0, 1.0]), [True, 1], torch.tensor([1, 1], device=META), 2 ** 63]
STEP_TOKENS = [None, [1], {1: None}, {1: -1}, {None: 1}, {1.0: 1}, {99: 1}, {3: 1}, {True: 1}, {1: 1.5}]
BLOCKS = [-1, 8, 1.0, True, None, "0", np.int64(0)]
RUNNING_BATCH = [1, 2]

# (method, arguments, the argument to corrupt, hostile values for it)
MANAGER_MATRIX = [
    ("add", [9, [1, 2]], 0, SEQ_IDS[:-3] + [1]),              # 1: a duplicate
    ("add", [9, [1, 2]], 1, PROMPTS),
    ("append", [1, 5], 0, SEQ_IDS + [3, 4]),                  # 3 waiting, 4 swapped
    ("append", [1, 5], 1, TOKENS),
    ("fork", [1, 9], 0, SEQ_IDS + [3]),
    ("fork", [1, 9], 1, SEQ_IDS[:-3] + [2]),
    ("free", [1], 0, SEQ_IDS),
    ("preempt", [1, "swap"], 0, SEQ_IDS + [3, 4]),
    ("preempt", [1, "recompute"], 1, MODES),
    ("resume", [3], 0, SEQ_IDS + [1]),
    ("swap_out", [1], 0, SEQ_IDS + [3]),
    ("swap_in", [4], 0, SEQ_IDS + [1, 3]),
    ("step", [{1: 5}], 0, STEP_TOKENS),
    ("step", [{1: 5}, lambda s: "swap"], 1, [None, "swap", 1]),
    ("append_batch", [RUNNING_BATCH, [5, 6]], 0, BATCH_IDS + [[1, 3], [1, 4]]),
    ("append_batch", [RUNNING_BATCH, [5, 6]], 1, BATCH_TOKENS),
    ("decode", [RUNNING_BATCH, [5, 6]], 0, BATCH_IDS + [[1, 3], [1, 4]]),
    ("decode", [RUNNING_BATCH, [5, 6]], 1, BATCH_TOKENS),
    ("blocks_for_append", [RUNNING_BATCH], 0, BATCH_IDS + [[3], [4]]),
    ("block_tables", [RUNNING_BATCH], 0, BATCH_IDS),
    ("seq_lens", [RUNNING_BATCH], 0, BATCH_IDS),
    ("slot_mapping", [RUNNING_BATCH, 1], 0, BATCH_IDS + [[3]]),
    ("slot_mapping", [RUNNING_BATCH, 1], 1, COUNTS),
    ("block_table", [1], 0, SEQ_IDS),
    ("cpu_block_table", [4], 0, SEQ_IDS),
    ("length", [1], 0, SEQ_IDS),
    ("tokens", [1], 0, SEQ_IDS),
    ("status", [1], 0, SEQ_IDS),
    ("cached_tokens", [1], 0, SEQ_IDS),
    ("cached_prefix_tokens", [[1, 2, 3]], 0, PROMPTS[:-1]),
    ("refcount", [0], 0, BLOCKS),
    ("transaction", [lambda: None], 0, [None, 1, "body"]),
]


def matrix_cases(matrix):
    for method, args, position, values in matrix:
        for value in values:
            yield pytest.param(method, args, position, value, id=f"{method}[{position}]={stable_repr(value)}"[:70])


def stable_repr(value) -> str:
    """A test id every xdist worker spells alike (a bare object's repr holds its address)."""
    return "object()" if type(value) is object else repr(value)


def assert_refused(subject, observe, method, args, position, value):
    before = observe(subject)
    args = list(args)
    args[position] = value
    with pytest.raises(PagedKVError):
        getattr(subject, method)(*args)
    assert observe(subject) == before, f"{method} with {value!r} changed the state"
    (subject.bm if isinstance(subject, Scheduler) else subject).check()


@pytest.mark.parametrize("method, args, position, value", list(matrix_cases(MANAGER_MATRIX)))
def test_manager_refuses_hostile_values(method, args, position, value):
    assert_refused(manager(), manager_state, method, args, position, value)


def test_every_public_manager_method_is_in_the_matrix():
    """A new public method must get its hostile values here (queries without arguments excepted)."""
    public = {name for name in dir(BlockManager) if not name.startswith("_") and callable(getattr(BlockManager, name))}
    no_arguments = {"take_copies", "seq_ids", "running", "num_free_blocks", "num_evictable_blocks",
                    "num_active_blocks", "num_free_cpu_blocks", "num_evictions", "uncached_free_blocks", "metrics",
                    "check"}
    assert public - no_arguments == {method for method, *_ in MANAGER_MATRIX}


def crowded():
    bm = BlockManager(3, 2)
    for seq_id in range(3):
        bm.add(seq_id, [1, 2])               # the next step needs 3 new blocks: two victims
    return bm


@pytest.mark.parametrize("answer", ["bogus", None, 1, lambda s: "swap"])
def test_a_bad_preempt_mode_answer_is_refused_mid_step_and_changes_nothing(answer):
    bm = crowded()
    before = manager_state(bm)
    with pytest.raises(InvalidArgument, match="preempt mode"):
        bm.step({0: 1, 1: 1, 2: 1}, preempt_mode=lambda victim: answer)
    assert manager_state(bm) == before


def test_a_raising_preempt_mode_changes_nothing():
    bm = crowded()
    before = manager_state(bm)

    def refuses(victim):
        raise RuntimeError(f"no policy for {victim}")

    with pytest.raises(RuntimeError, match="no policy"):
        bm.step({0: 1, 1: 1, 2: 1}, preempt_mode=refuses)
    assert manager_state(bm) == before


SCHEDULER_MATRIX = [
    ("add_request", ["r", [1, 2], 3, 1, None], 1, SCHEDULER_PROMPTS),
    ("add_request", ["r", [1, 2], 3, 1, None], 2, [0, -1, 1.5, True, None, "3", np.int64(3), 2.0]),
    ("add_request", ["r", [1, 2], 3, 1, None], 3, [0, -1, 1.5, True, None, "1", np.int64(1), 257, 10 ** 10]),
    ("add_request", ["r", [1, 2], 3, 1, None], 4, [-1, 1.5, True, "x", 2 ** 63, [1]]),
    ("update", [{0: 5}], 0, [None, [0], 5, {99: 5}, {1: 5}, {0: -1}, {0: None}, {0: 1.5}, {"0": 5},
                             {True: 5}, {0: True}, {0: 2 ** 63}]),
    ("can_ever_fit", [3, 1], 0, [-1, 1.5, None, True, "3"]),
    ("can_ever_fit", [3, 1], 1, [-1, 1.5, None, True, "3"]),
    ("preempt_mode", [0], 0, SEQ_IDS),
]


@pytest.mark.parametrize("method, args, position, value", list(matrix_cases(SCHEDULER_MATRIX)))
def test_scheduler_refuses_hostile_values(method, args, position, value):
    assert_refused(scheduler(), scheduler_state, method, args, position, value)


def test_every_public_scheduler_method_is_in_the_matrix():
    public = {name for name in dir(Scheduler) if not name.startswith("_") and callable(getattr(Scheduler, name))}
    no_arguments = {"schedule", "has_unfinished", "admission_heads", "waits_for_blocks"}
    assert public - no_arguments == {method for method, *_ in SCHEDULER_MATRIX}


def test_a_request_of_more_samples_than_sequence_slots_is_refused_and_the_most_is_admitted():
    """n samples are admitted together, one slot each: n > max_num_seqs could never run (and a
    huge n once raised a bare MemoryError building its ids)."""
    s = Scheduler(BlockManager(8, 2), SchedulerConfig(watermark=0.0, max_num_seqs=3))
    with pytest.raises(InvalidArgument, match="max_num_seqs=3"):
        s.add_request("r", [1, 2, 3], 2, n=4)
    assert not s.has_unfinished()
    seq_ids = s.add_request("r", [1, 2, 3], 2, n=3)
    out = s.schedule()
    assert [p.seq_id for p in out.prefills] + sorted(out.forked) == seq_ids


def test_schedule_refuses_to_run_before_every_sample_is_in():
    s = scheduler()
    before = scheduler_state(s)
    with pytest.raises(InvalidState, match="no sample yet"):
        s.schedule()
    assert scheduler_state(s) == before
    s.update({0: 5})
    assert s.schedule().decodes == [0]


# ------------------------------------------------------------------ construction

@pytest.mark.parametrize("kwargs", [
    {"prefix_caching": "no"}, {"prefix_caching": 1}, {"prefix_caching": None},
    {"device": "cuda:99"}, {"device": "nonsense"}, {"device": 0}, {"device": "meta"},
    {"num_blocks": 2.0}, {"num_blocks": np.int64(4)}, {"block_size": True}, {"num_cpu_blocks": -1},
    {"max_seqs": 0}, {"max_blocks_per_seq": 1.5},
])
def test_manager_construction_refuses(kwargs):
    with pytest.raises(InvalidArgument):
        BlockManager(**{"num_blocks": 4, "block_size": 2, **kwargs})


class Inflated(int):
    """An int whose arithmetic and comparisons disagree with its value."""

    def __add__(self, other):
        return int(self) + other + 3

    __radd__ = __add__

    def __mod__(self, other):
        return 0

    def __ge__(self, other):
        return True

    def __lt__(self, other):
        return True


@pytest.mark.parametrize("subject", [KVSpec, BlockManager])
def test_constructor_sizes_are_stored_as_plain_ints(subject):
    """A pool sized by an int subclass ran its ring arithmetic through the subclass's operators: a
    successful free put block ids past a 4-block pool on the free list."""
    pool = subject(Inflated(4), Inflated(2), num_cpu_blocks=Inflated(1))
    assert [type(size) for size in (pool.num_blocks, pool.block_size, pool.num_cpu_blocks)] == [int] * 3
    pool.add(1, [1, 2, 3])
    pool.free(1)
    pool.check()
    assert pool.num_free_blocks() == 4
    with pytest.raises(InvalidArgument, match="num_blocks must be >= 1"):
        subject(Inflated(0), 2)                   # >= 1 by its comparison, 0 by value


@pytest.mark.parametrize("value", ["no", 1, None, np.bool_(True)])
def test_spec_and_manager_refuse_a_non_bool_prefix_caching(value):
    """`prefix_caching="no"` used to switch caching on (a truthy string), in both."""
    for subject in (KVSpec, BlockManager):
        with pytest.raises(InvalidArgument, match="prefix_caching"):
            subject(4, 2, prefix_caching=value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_a_typed_error():
    with pytest.raises(InvalidArgument, match="CUDA is not available"):
        BlockManager(4, 2, device="cuda")


@pytest.mark.parametrize("field, value", [
    ("watermark", -1.0), ("watermark", 1.0), ("watermark", math.nan), ("watermark", "0.1"), ("watermark", True),
    ("max_num_seqs", 0), ("max_num_seqs", 1.5), ("max_num_seqs", True),
    ("prefill_tokens_per_s", 0.0), ("prefill_tokens_per_s", -1.0), ("prefill_tokens_per_s", math.inf),
    ("swap_bytes_per_s", 0), ("swap_bytes_per_s", math.nan), ("kv_bytes_per_token", 0), ("kv_bytes_per_token", 1.5),
])
def test_scheduler_config_refuses(field, value):
    with pytest.raises(InvalidArgument, match=field):
        SchedulerConfig(**{field: value})


class Scaled(float):
    """A float whose products and comparisons disagree with its value."""

    def __mul__(self, other):
        return -100.0

    __rmul__ = __mul__

    def __ge__(self, other):
        return True

    def __lt__(self, other):
        return True


def test_scheduler_config_reads_reals_by_value():
    """A watermark whose product with the pool read -100 blocks over-committed admission and
    wedged every later schedule()."""
    config = SchedulerConfig(watermark=Scaled(0.25), prefill_tokens_per_s=Scaled(8.0), swap_bytes_per_s=np.float32(4))
    assert (type(config.watermark), config.watermark, config.prefill_tokens_per_s) == (float, 0.25, 8.0)
    assert type(config.swap_bytes_per_s) is float and Scheduler(BlockManager(8, 2), config).watermark_blocks == 2
    for bad in (Scaled(-1.0), Scaled(1.0), 10**400):
        with pytest.raises(InvalidArgument, match="watermark"):
            SchedulerConfig(watermark=bad)


def test_a_scheduler_refuses_a_manager_that_already_holds_sequences():
    """The scheduler numbers sequences from 0: on a manager holding sequence 0 every schedule()
    failed with DuplicateSequence, for good."""
    bm = BlockManager(8, 2)
    bm.add(0, [1])
    with pytest.raises(InvalidArgument, match="holds no sequences"):
        Scheduler(bm)


@pytest.mark.parametrize("args", [(None,), ("bm",), (KVSpec(4, 2),), (BlockManager(4, 2), {"watermark": 0.1})])
def test_scheduler_construction_refuses(args):
    with pytest.raises(InvalidArgument):
        Scheduler(*args)


# ------------------------------------------------------------------ normalised at the door

def test_numpy_prompt_tokens_are_normalised_and_run():
    """The issue's repro: a prompt of numpy scalars was queued, then broke every later step."""
    s = Scheduler(BlockManager(16, 2), SchedulerConfig(watermark=0.0))
    s.add_request("a", [1, 2], 3)
    [seq] = s.add_request("b", list(np.array([5, 6, 7])), max_new_tokens=5)
    assert all(type(t) is int for t in s.waiting[-1].prompt)
    for _ in range(10):
        out = s.schedule()
        s.update({q: 7 for q in out.seq_ids + list(out.forked)})
        if not s.has_unfinished():
            break
    assert not s.has_unfinished()


def test_a_lying_int_subclass_gets_no_other_prompts_kv():
    """`Liar(5)` equals (and hashes like) every int: stored as it is, it would hit [1, 2]'s block."""
    bm = BlockManager(8, 2, prefix_caching=True)
    bm.add(1, [1, 2, 3])
    assert bm.add(2, [Liar(5), Liar(6), 3]) == 0            # by value (5, 6): no hit on (1, 2)
    assert bm.tokens(2) == [5, 6, 3] and all(type(t) is int for t in bm.tokens(2))
    bm.append(2, Liar(4))
    assert bm.tokens(2)[-1] == 4
    s = Scheduler(BlockManager(8, 2))
    s.add_request("a", [Liar(7)], 2, eos=Liar(8))
    assert s.waiting[0].prompt == [7] and type(s.waiting[0].prompt[0]) is int and type(s.waiting[0].eos) is int


def test_a_lying_int_subclass_cannot_alias_a_sequence_id():
    bm = BlockManager(8, 2)
    bm.add(1, [1])
    bm.add(Liar(2), [2])                  # sequence 2, not "equal to 1"
    assert bm.seq_ids() == [1, 2] and all(type(s) is int for s in bm.seq_ids())
    bm.free(Liar(1))
    assert bm.seq_ids() == [2]


def test_the_batch_memo_does_not_skip_the_type_checks():
    """`append_batch([False, True], ...)` was refused, then accepted once `block_tables([0, 1])`
    had remembered that batch ([False, True] == [0, 1])."""
    bm = BlockManager(8, 2)
    bm.add(0, [1])
    bm.add(1, [2])
    bm.block_tables([0, 1])
    before = manager_state(bm)
    for batch in ([False, True], [0.0, 1.0]):
        with pytest.raises(InvalidArgument):
            bm.append_batch(batch, [5, 6])
    assert manager_state(bm) == before


@pytest.mark.parametrize("bad", [False, 0.0])
def test_the_batch_memo_sees_a_list_changed_in_place(bad):
    """The very list the memo remembers, its first id replaced in place by an equal bool or float:
    `[False, 1] == [0, 1]`, so the memo once handed back its rows and appended to sequence 0."""
    bm = BlockManager(8, 2)
    bm.add(0, [1])
    bm.add(1, [2])
    batch = [0, 1]
    bm.block_tables(batch)
    before = manager_state(bm)
    batch[0] = bad
    with pytest.raises(InvalidArgument):
        bm.append_batch(batch, [5, 6])
    assert manager_state(bm) == before
    batch[0] = 0
    bm.append_batch(batch, [5, 6])
    assert [bm.length(0), bm.length(1)] == [2, 2]


def test_blocks_for_append_refuses_sequences_that_do_not_run():
    bm = manager()
    for seq_id in (3, 4):
        with pytest.raises(InvalidState):
            bm.blocks_for_append([seq_id])


def test_update_of_a_preempted_sequence_is_refused_and_the_run_goes_on():
    """A sequence preempted by the step whose samples the caller holds: before, `update` freed it
    at max_new_tokens while it stayed queued, and the next `schedule()` raised UnknownSequence."""
    bm = BlockManager(3, 2)
    s = Scheduler(bm, SchedulerConfig(watermark=0.0, prefill_tokens_per_s=1e12, swap_bytes_per_s=1.0))
    for name in "abc":
        s.add_request(name, [1, 2], 2)
    out = s.schedule()
    s.update({q: 7 for q in out.seq_ids})
    out = s.schedule()                          # needs 3 new blocks: 2 and 1 are preempted
    assert out.preempted == [2, 1]
    before = scheduler_state(s)
    with pytest.raises(InvalidState):
        s.update({0: 7, 2: 7})
    assert scheduler_state(s) == before
    finished = []
    for _ in range(20):
        finished += s.update({q: 7 for q in out.seq_ids + list(out.forked)})
        if not s.has_unfinished():
            break
        out = s.schedule()
    assert sorted(finished) == [0, 1, 2] and bm.num_free_blocks() == 3


def test_schedule_is_atomic_when_the_manager_fails_inside(monkeypatch):
    s = Scheduler(BlockManager(8, 2), SchedulerConfig(watermark=0.0))
    s.add_request("a", [1, 2, 3], 3)
    out = s.schedule()
    s.update({q: 7 for q in out.seq_ids})
    s.add_request("b", [4, 5], 3, n=2)
    before = scheduler_state(s)
    fork = BlockManager.fork

    def fork_fails(self, parent, child):
        raise MemoryError("no room for the child's row")

    monkeypatch.setattr(BlockManager, "fork", fork_fails)
    with pytest.raises(MemoryError):
        s.schedule()                            # decoded 0, admitted b, then its fork failed
    assert scheduler_state(s) == before
    monkeypatch.setattr(BlockManager, "fork", fork)
    out = s.schedule()
    assert out.decodes == [0] and [p.seq_id for p in out.prefills] == [1] and out.forked == {2: 1}


# ------------------------------------------------------------------ anything at all

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True), st.text(max_size=3),
    st.binary(max_size=3), st.lists(st.one_of(st.integers(-3, 2 ** 64), st.floats(), st.none(), st.booleans()),
                                    max_size=4),
    st.dictionaries(st.one_of(st.integers(-2, 9), st.text(max_size=1)), st.one_of(st.integers(-2, 9), st.none()),
                    max_size=3),
    st.builds(np.array, st.lists(st.floats(allow_nan=False, width=32), max_size=3)),
    st.sampled_from([np.int64(1), np.float32(2), torch.tensor([1.0]), torch.tensor([1, 2], dtype=torch.bfloat16),
                     torch.tensor([1, 2]).to_sparse(), Inflated(1), [Inflated(2), 1], (Inflated(0),)]),
)


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(MANAGER_MATRIX + SCHEDULER_MATRIX), value=ANYTHING)
def test_arbitrary_values_are_refused_with_typed_errors_or_accepted(case, value):
    """Any value: the call either succeeds (the value was valid) or raises a typed error with the
    state unchanged. A bare TypeError/ValueError/KeyError/IndexError is a failure."""
    method, args, position, _ = case
    subject, observe = (manager(), manager_state) if case in MANAGER_MATRIX else (scheduler(), scheduler_state)
    before = observe(subject)
    args = list(args)
    args[position] = value
    try:
        getattr(subject, method)(*args)
    except PagedKVError:
        assert observe(subject) == before
    (subject.bm if isinstance(subject, Scheduler) else subject).check()
