"""Proof of power: under the CI profile the conformance harness catches every bug in the zoo, with
the oracle named here, and the correct subjects pass the very same runs.

Shrinking is left to `pagedkv fuzz` (tests/fuzz/test_campaign.py): here each run stops at its first
counterexample, so the whole zoo fits the CI budget. The CI profile is derandomized and
tests/conftest.py pins Hypothesis' pool of local constants, so which oracle fires is the same on
every worker and machine.
"""

import pytest
from hypothesis import Phase

import bug_zoo
from pagedkv.fuzz.campaign import check
from pagedkv.fuzz.oracles import ORACLES
from pagedkv.fuzz.subjects import Subject, resolve

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]

#: bug -> the oracle that catches it first (unshrunk, CI profile)
ZOO = {
    "CowInPlace": "cow_exact",
    "CowLeaksSource": "cow_exact",      # the leaked refcount makes an unshared tail look shared
    "FreeStillShared": "free_count",
    "ForkNoRefcount": "free_count",     # freeing the parent frees blocks the child still holds
    "EvictedStillIndexed": "oom_exact",  # a stale hit makes a prompt need fewer blocks than the spec says
    "HashNotChained": "cache_hit",
    "UnconfirmedWeakHash": "cache_hit",
    "AllocationNotUndone": "atomic_failure",
    "DoubleFreeAccepted": "id_errors",
    "NewBlockLate": "table_shape",
    "NewBlockEarly": "table_shape",
    "TailFreedTwice": "free_count",
    "BlockIdsFromOne": "block_range",
}


def zoo_subject(name: str) -> Subject:
    factory = getattr(bug_zoo, name)
    return Subject(f"bug_zoo:{name}", factory, factory.capabilities)


def test_zoo_names_real_oracles():
    assert set(ZOO.values()) <= set(ORACLES)
    assert len(ZOO) >= 11


@pytest.mark.parametrize("name", sorted(ZOO))
def test_ci_profile_catches_bug(name):
    tally, failure = check(zoo_subject(name), "ci", phases=NO_SHRINK)
    assert failure is not None, f"{name} escaped {tally['examples']} examples"
    assert failure["oracle"] == ZOO[name], f"{name}: {failure['oracle']} fired: {failure['message']}"


@pytest.mark.parametrize("target", ["reference", "spec", "impl"])
def test_correct_subjects_pass_the_same_runs(target):
    subject = zoo_subject("Reference") if target == "reference" else resolve(target)
    tally, failure = check(subject, "ci", phases=NO_SHRINK)
    assert failure is None, f"{failure['oracle']}: {failure['message']}\n" + "\n".join(failure["trace"])
    assert tally["examples"] >= 100 and tally["cow"] and tally["hit"] and tally["oom"] and tally["eviction"]
