"""The spec's stateful check passes and, in the CI profile, reaches every interesting path."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.fuzz.spec_machine import PATHS, SpecMachine, run_spec_machine
from pagedkv.spec import KVSpec


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
    quick = settings(max_examples=200, stateful_step_count=20, deadline=None, database=None,
                     derandomize=True, phases=[Phase.generate], report_multiple_bugs=False,
                     suppress_health_check=list(HealthCheck))
    with pytest.raises(AssertionError, match="refcount|leaked|conservation"):
        run_state_machine_as_test(SpecMachine, settings=quick)
