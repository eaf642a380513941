"""Proof of power: under the CI profile the conformance harness catches every bug in the zoo, with
an oracle named here, under both policies (`spec`: the spec's exact choices; `any`: policy-free),
and the correct subjects pass the very same runs.

Shrinking is left to `pagedkv fuzz` (tests/fuzz/test_campaign.py): here each run stops at its first
counterexample, so the whole zoo fits the CI budget. The CI profile is derandomized and
tests/conftest.py pins Hypothesis' pool of local constants, so which oracle fires is the same on
every worker and machine.
"""

import pytest
from hypothesis import Phase

import bug_zoo
from pagedkv.fuzz.oracles import ORACLES
from pagedkv.fuzz.subjects import Subject, resolve
from pagedkv.fuzz.testing import ConformanceFailure, run_conformance

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
POLICIES = ("spec", "any")

#: bug -> the oracles whose firing is a symptom of exactly that bug; which one fires first depends on
#: the policy and on the first program Hypothesis draws that exposes it (its version changes the
#: draws), so the others listed are the bug's other faces.
ZOO = {
    "CowInPlace": ("cow_exact", "oom_exact"),           # no copy returned / no block needed when the spec needs one
    "CowLeaksSource": ("cow_exact", "free_count", "oom_exact"),  # the leaked ref keeps the source "shared": a copy, a refusal
    "FreeStillShared": ("free_count", "readback"),
    "ForkNoRefcount": ("cow_exact", "oom_exact", "free_count", "readback"),  # the child's blocks look exclusive
    "EvictedStillIndexed": ("oom_exact", "cache_hit", "completeness", "readback"),  # stale entries, new ones lost
    "HashNotChained": ("cache_hit", "oom_exact", "block_range", "readback"),  # a hit after a different prefix
    "UnconfirmedWeakHash": ("cache_hit", "oom_exact", "block_range", "readback"),  # one block hit twice, too
    "AllocationNotUndone": ("atomic_failure", "free_count"),       # the half-taken blocks stay taken
    "DoubleFreeAccepted": ("id_errors",),
    "NewBlockLate": ("table_shape", "oom_exact"),  # the short table, or no refusal where the late block was due
    "NewBlockEarly": ("table_shape", "oom_exact"),
    "TailFreedTwice": ("free_count",),
    "BlockIdsFromOne": ("block_range",),
    "ForgetsReleased": ("cache_hit", "completeness"),  # no hit across requests: spec counts / completeness
}


def first_failure(factory, policy: str, name: str) -> tuple:
    """(tally or None, the first failure or None) of a CI-profile run without shrinking."""
    try:
        return run_conformance(factory, policy=policy, phases=NO_SHRINK, report_multiple_bugs=False,
                               name=name), None
    except ConformanceFailure as caught:
        return None, caught.failures[0]


def zoo_subject(name: str) -> Subject:
    factory = getattr(bug_zoo, name)
    return Subject(f"bug_zoo:{name}", factory, factory.capabilities)


def test_zoo_names_real_oracles():
    assert {oracle for oracles in ZOO.values() for oracle in oracles} <= set(ORACLES)
    assert len(ZOO) >= 14


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(ZOO))
def test_ci_profile_catches_bug(name, policy):
    tally, failure = first_failure(getattr(bug_zoo, name), policy, f"bug_zoo:{name}")
    assert failure is not None, f"{name} escaped policy {policy}: {tally}"
    assert failure["oracle"] in ZOO[name], f"{name}: {failure['oracle']} fired: {failure['message']}"


def test_a_forgetful_cache_is_caught_by_completeness_under_any():
    _, failure = first_failure(bug_zoo.ForgetsReleased, "any", "bug_zoo:ForgetsReleased")
    assert failure["oracle"] == "completeness", failure["message"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("target", ["reference", "spec", "impl"])
def test_correct_subjects_pass_the_same_runs(target, policy):
    subject = zoo_subject("Reference") if target == "reference" else resolve(target)
    tally, failure = first_failure(subject.factory, policy, subject.target)
    assert failure is None, f"{failure['oracle']}: {failure['message']}\n" + "\n".join(failure["trace"])
    assert tally["examples"] >= 100 and tally["cow"] and tally["cache_hit"] and tally["out_of_blocks"] \
        and tally["eviction"]


def test_one_fifo_free_list_for_cached_and_uncached_blocks_passes_any():
    """Issue 13, item 2: evicting a released cached block while a never-cached one is free is legal."""
    tally, failure = first_failure(bug_zoo.SingleFreeList, "any", "bug_zoo:SingleFreeList")
    assert failure is None, f"{failure['oracle']}: {failure['message']}"
    assert tally["eviction"] and tally["cache_hit"]
