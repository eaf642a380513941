"""The differential machine (BlockManager vs KVSpec) under pytest, bounded like CI."""
import pytest
from hypothesis.stateful import run_state_machine_as_test

import pagedkv.spec.blocks as spec_blocks
from pagedkv.fuzz.differential import (DifferentialMachine, SchedulerMachine, differential_settings,
                                       run_differential_check)


def colliding_hash(parent_hash, block_tokens):
    return sum(block_tokens) % 2


class CollidingMachine(DifferentialMachine):
    hash_algo = staticmethod(colliding_hash)


def test_differential_machine():
    run_state_machine_as_test(DifferentialMachine, settings=differential_settings("ci"))


def test_scheduler_against_spec_step():
    run_state_machine_as_test(SchedulerMachine, settings=differential_settings("ci"))


def test_differential_under_forced_hash_collisions(monkeypatch):
    """Both sides hash every block into one of two buckets, so nearly every lookup meets a
    colliding block: hits must still be exactly the spec's content-confirmed ones."""
    monkeypatch.setattr(spec_blocks, "chain_hash", colliding_hash)
    run_state_machine_as_test(CollidingMachine, settings=differential_settings("ci"))


def test_run_differential_check_reports():
    report = run_differential_check("ci", max_examples=5, stateful_step_count=10)   # the report's shape
    assert report["name"] == "differential" and report["passed"], report
    assert "examples" in report["covered"]


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError):
        run_differential_check("nightly")
