"""The differential machine (BlockManager vs KVSpec) and the scheduler machine under pytest, bounded
like CI; a planted hang in the spec ends within its time bound as a failure naming the program."""
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from pagedkv.fuzz.differential import (DifferentialMachine, SchedulerMachine, differential_settings,
                                       run_differential_check)
from pagedkv.fuzz.guard import HangFound, run_bounded
from pagedkv.impl import BlockManager
from pagedkv.spec import InvalidArgument, KVSpec, UnknownSequence


def test_differential_machine():
    run_bounded(DifferentialMachine, differential_settings("ci"))


def test_scheduler_against_spec_step():
    run_bounded(SchedulerMachine, differential_settings("ci"))


def test_run_differential_check_reports():
    report = run_differential_check("ci", max_examples=5, stateful_step_count=10)   # the report's shape
    assert report["name"] == "differential" and report["passed"], report
    assert "examples" in report["covered"]


def test_run_differential_check_reports_a_divergence(monkeypatch):
    """A BlockManager that miscounts its evictable blocks once any exist is reported as failed,
    with the divergence and a counterexample, not raised."""
    counted = BlockManager.num_evictable_blocks
    monkeypatch.setattr(BlockManager, "num_evictable_blocks", lambda self: counted(self) * 2)
    report = run_differential_check("ci", max_examples=50, stateful_step_count=20,
                                    phases=(Phase.generate,))   # the first failure, unshrunk
    assert not report["passed"] and "divergence" in report["detail"], report
    assert report["counterexamples"], report


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError):
        run_differential_check("nightly")


class StepNeverReturns(KVSpec):
    """A planted hang: the spec's step never returns (tests/fuzz/test_spec_machine.py plants the
    realistic one, a step whose victim is never preempted)."""

    def step(self, tokens):
        while True:
            pass


QUICK = settings(max_examples=300, stateful_step_count=30, deadline=None, database=None, derandomize=True,
                 phases=[Phase.generate], suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("machine, first, hung", [
    (DifferentialMachine, "KVSpec/BlockManager(**{", "step({"),
    (SchedulerMachine, "Scheduler(BlockManager(**{", "schedule()"),   # the spec's step replays it
])
def test_a_hang_in_the_spec_is_a_timeout_naming_its_program(monkeypatch, machine, first, hung):
    monkeypatch.setattr("pagedkv.fuzz.differential.KVSpec", StepNeverReturns)
    started = time.monotonic()
    with pytest.raises(HangFound) as found:
        run_bounded(machine, QUICK, seconds=0.5)
    assert time.monotonic() - started < 10   # one timeout: a hang is never shrunk
    assert "did not return within 0.5 s" in str(found.value)
    program = [note.strip() for note in found.value.__notes__[1:]]
    assert program[0].startswith(first) and program[-1].startswith(hung)


def test_the_check_reports_a_hang_with_its_program(monkeypatch):
    monkeypatch.setattr("pagedkv.fuzz.differential.KVSpec", StepNeverReturns)
    monkeypatch.setattr("pagedkv.fuzz.guard.DEFAULT_TIMEOUT", 0.5)
    report = run_differential_check("ci")
    assert not report["passed"] and report["detail"].startswith("divergence: HangFound: timeout: step({")
    [example] = report["counterexamples"]
    assert example["program"].splitlines()[-1].strip().startswith("step({")


class Alias(int):
    """An int of one value that hashes as and compares equal to another."""

    def __new__(cls, value, looks_like):
        alias = super().__new__(cls, value)
        alias.looks_like = looks_like
        return alias

    def __hash__(self):
        return hash(self.looks_like)

    def __eq__(self, other):
        return self.looks_like == other

    def __ne__(self, other):
        return not self.__eq__(other)

    def __lt__(self, other):
        return self.looks_like < other

    def __le__(self, other):
        return self.looks_like <= other

    def __gt__(self, other):
        return self.looks_like > other

    def __ge__(self, other):
        return self.looks_like >= other


@pytest.mark.parametrize("make", [KVSpec, BlockManager], ids=["spec", "impl"])
def test_ids_and_tokens_are_read_by_value_not_through_an_int_subclass(make):
    """Spec and production alike read an id or token by its value: an int 99 that compares as
    sequence 1 names no sequence, and tokens 9, 9 that compare as the cached 5, 6 hit nothing
    (the spec served them the KV of 5, 6, its invariants judged by the same lying `==`)."""
    subject = make(8, 2, prefix_caching=True)
    subject.add(1, [5, 6, 7])
    with pytest.raises(UnknownSequence):
        subject.free(Alias(99, 1))
    assert subject.seq_ids() == [1]
    subject.add(2, [5, 6, 7])
    subject.free(2)                                    # (5, 6) cached and evictable
    assert subject.add(3, [Alias(9, 5), Alias(9, 6), 1]) == 0
    assert [type(t) for t in subject.tokens(3)] == [int] * 3 and subject.tokens(3) == [9, 9, 1]
    with pytest.raises(InvalidArgument, match="twice"):
        subject.step({3: 1, Alias(3, 30): 2})
    subject.free(Alias(3, 30))                         # sequence 3 by value
    assert subject.seq_ids() == [1]
    for block in (Alias(99, 1), Alias(-8, 1)):         # out of range by value, in range by comparison
        with pytest.raises(InvalidArgument, match="block id"):
            subject.refcount(block)
    assert subject.refcount(Alias(subject.block_table(1)[0], 99)) == 1
    subject.check()
