"""The differential machine (BlockManager vs KVSpec) under pytest, bounded like CI."""
import pytest
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.fuzz.differential import (DifferentialMachine, SchedulerMachine, differential_settings,
                                       run_differential_check)


def test_differential_machine():
    run_state_machine_as_test(DifferentialMachine, settings=differential_settings("ci"))


def test_scheduler_against_spec_step():
    run_state_machine_as_test(SchedulerMachine, settings=differential_settings("ci"))


def test_run_differential_check_reports():
    report = run_differential_check("ci", max_examples=5, stateful_step_count=10)   # the report's shape
    assert report["name"] == "differential" and report["passed"], report
    assert "examples" in report["covered"]


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError):
        run_differential_check("nightly")
