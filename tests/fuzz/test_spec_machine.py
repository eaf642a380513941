"""The spec's stateful check passes and, in the CI profile, reaches every interesting path; a planted
bug fails it, and a planted hang ends within its time bound as a failure naming the program."""

import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.fuzz.guard import HangFound, run_bounded
from pagedkv.fuzz.spec_machine import PATHS, SpecMachine, run_spec_machine
from pagedkv.spec import KVSpec

QUICK = settings(max_examples=200, stateful_step_count=20, deadline=None, database=None,
                 derandomize=True, phases=[Phase.generate], report_multiple_bugs=False,
                 suppress_health_check=list(HealthCheck))


def test_ci_profile_reaches_every_path():
    tally = run_spec_machine("ci")
    assert {path: tally[path] for path in PATHS if tally[path] == 0} == {}
    assert tally["examples"] >= 100 and tally["steps"] > 1000


class LeakyRelease(KVSpec):
    """A planted bug: releasing forgets the first block of every table."""

    def _release(self, table):
        super()._release(table[1:])


def test_machine_catches_a_planted_bug(monkeypatch):
    monkeypatch.setattr("pagedkv.fuzz.spec_machine.KVSpec", LeakyRelease)
    with pytest.raises(AssertionError, match="refcount|leaked|conservation"):
        run_state_machine_as_test(SpecMachine, settings=QUICK)


class StepNeverPreempts(KVSpec):
    """The mutant that once hung the spec check forever (the preemption in `step` deleted): a step
    that must preempt picks its victim, which stays on the GPU, so it picks it again and again."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stepping = False   # part of the state from the start, so a failed step leaves it as it was

    def step(self, tokens):
        self.stepping = True
        try:
            return super().step(tokens)
        finally:
            self.stepping = False

    def preempt(self, seq_id, mode="recompute"):
        return [] if self.stepping else super().preempt(seq_id, mode)


def hang_of(run, bound: float) -> tuple:
    """The HangFound `run()` raises, and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(HangFound) as found:
        run()
    return found.value, time.monotonic() - started


def test_a_hanging_step_is_a_timeout_naming_its_program_within_the_bound(monkeypatch):
    monkeypatch.setattr("pagedkv.fuzz.spec_machine.KVSpec", StepNeverPreempts)
    hang, seconds = hang_of(lambda: run_bounded(SpecMachine, QUICK, seconds=0.5), 0.5)
    assert str(hang).startswith("timeout: step({") and "did not return within 0.5 s" in str(hang)
    program = [note.strip() for note in hang.__notes__[1:]]
    assert program[0].startswith("KVSpec(**{") and program[-1].startswith("step({")
    assert seconds < 20   # one timeout, not a shrink of it (each attempt would cost another)


def test_the_check_reports_a_hang_with_its_program(monkeypatch):
    from pagedkv.cli.check import run_check
    from pagedkv.fuzz import spec_machine

    monkeypatch.setattr(spec_machine, "KVSpec", StepNeverPreempts)
    monkeypatch.setattr("pagedkv.fuzz.guard.DEFAULT_TIMEOUT", 0.5)
    row = run_check("spec-stateful", "pagedkv.fuzz.spec_machine:run_spec_check", "ci")
    assert not row["passed"]
    [example] = row["counterexamples"]
    assert example["error"].startswith("HangFound: timeout: step(")
    assert "KVSpec(**{" in example["program"] and example["program"].rstrip().endswith(")")
