"""The differential machine (BlockManager vs KVSpec) and the scheduler machine under pytest, bounded
like CI; a planted hang in the spec ends within its time bound as a failure naming the program."""
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from pagedkv.fuzz.differential import (DifferentialMachine, SchedulerMachine, differential_settings,
                                       run_differential_check)
from pagedkv.fuzz.guard import HangFound, run_bounded
from pagedkv.spec import KVSpec


def test_differential_machine():
    run_bounded(DifferentialMachine, differential_settings("ci"))


def test_scheduler_against_spec_step():
    run_bounded(SchedulerMachine, differential_settings("ci"))


def test_run_differential_check_reports():
    report = run_differential_check("ci", max_examples=5, stateful_step_count=10)   # the report's shape
    assert report["name"] == "differential" and report["passed"], report
    assert "examples" in report["covered"]


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
