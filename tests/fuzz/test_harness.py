"""The conformance harness itself: hand-written programs, capabilities, and oracles that name themselves."""

from collections import Counter

import pytest

import bug_zoo
from pagedkv.fuzz.campaign import check
from pagedkv.fuzz.harness import replay
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.fuzz.subjects import Subject
from pagedkv.spec import KVSpec

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
