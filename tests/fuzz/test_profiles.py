"""Effort profiles are namespaced, and a machine's tally belongs to one run."""

import importlib

from hypothesis import settings

import pagedkv.fuzz.profiles as profiles
from pagedkv.fuzz.spec_machine import SpecMachine, run_spec_machine


def test_importing_the_kit_leaves_the_users_profiles_alone():
    settings.register_profile("ci", max_examples=7)
    settings.register_profile("dev", max_examples=9)
    importlib.reload(profiles)
    assert settings.get_profile("ci").max_examples == 7 and settings.get_profile("dev").max_examples == 9
    assert profiles.settings_for("ci").max_examples == profiles.EFFORT["ci"].max_examples
    assert profiles.settings_for("ci").derandomize and profiles.settings_for("ci").database is None


def test_each_run_counts_into_its_own_tally():
    first = run_spec_machine("ci", max_examples=5, stateful_step_count=5)
    second = run_spec_machine("ci", max_examples=5, stateful_step_count=5)
    assert first == second and first["examples"] >= 5   # derandomized: the same run, not a running total
    assert SpecMachine.tally is None                      # nothing left on the shared class
