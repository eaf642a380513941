"""Real bugs as the kit's test (issue 19): historical vLLM releases, their block managers run unchanged
from their wheels (installed into pagedkv's wheel cache on first use; nothing is skipped when that
fails), each buggy release caught by the ci profile under `--policy any`, each fixed one passing it."""

import time

import pytest
from hypothesis import Phase

from pagedkv.fuzz.adapters import vllm_v0
from pagedkv.fuzz.campaign import check
from pagedkv.fuzz.subjects import resolve
from pagedkv.spec import OutOfBlocks

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]

#: buggy release -> (the bug, the oracles that are its symptoms).
BUGGY = {
    # a full-prompt hit recomputes only the last token: the re-allocated block's other slots are never
    # written, and the hit is not whole blocks (fixed by vLLM #11186)
    "0.6.4.post1": ("full hit recomputes one token", ("cache_hit", "readback")),
    # allocate_slots touches the hit blocks before its free-block check: a refused request leaks them
    # (vLLM #11562, fixed by #11565)
    "0.6.6.post1": ("refused allocation leaks its hit blocks", ("free_count", "atomic_failure", "oom_exact")),
}
FIXED = ("0.7.0",)


def test_unknown_release_is_a_clear_error():
    with pytest.raises(ValueError, match="no adapter for vllm 0.0.1; adapted releases: 0.33.0, 0.6.4.post1"):
        vllm_v0.release("0.0.1")


def test_full_hit_rules_of_each_release():
    """The scheduler's own rule for a prompt whose every block hit, as each release runs it."""
    served = {}
    for version in ("0.6.4.post1", "0.6.6.post1", "0.7.0"):
        subject = vllm_v0.release(version)(num_blocks=4, block_size=2, prefix_caching=True, num_cpu_blocks=0)
        subject.add(1, [1, 2, 3, 4])
        subject.free(1)
        served[version] = subject.add(2, [1, 2, 3, 4])
    assert served == {"0.6.4.post1": 3, "0.6.6.post1": 2, "0.7.0": 2}


def test_refused_allocation_leaks_in_0_6_6_post1_only():
    """#11562 by hand: a prompt whose hit blocks are free but whose new block is not."""
    leaks = {}
    for version in ("0.6.6.post1", "0.7.0"):
        subject = vllm_v0.release(version)(num_blocks=2, block_size=2, prefix_caching=True, num_cpu_blocks=0)
        subject.add(1, [1, 2, 3])
        subject.free(1)                       # [1, 2] cached and free; 2 blocks free
        subject.add(2, [5, 6, 7])             # takes both (evicting [1, 2])
        subject.free(2)
        with pytest.raises(OutOfBlocks):      # hits [5, 6], needs 2 more: refused
            subject.add(3, [5, 6, 7, 8, 9])
        leaks[version] = subject.num_free_blocks()
    assert leaks == {"0.6.6.post1": 1, "0.7.0": 2}


@pytest.mark.parametrize("version", sorted(BUGGY))
def test_ci_profile_catches_the_release_bug(version):
    bug, symptoms = BUGGY[version]
    started = time.monotonic()
    tally, failure = check(resolve(f"vllm@{version}"), "ci", "any", phases=NO_SHRINK)
    assert failure is not None, f"vllm {version} ({bug}) escaped {tally['examples']} examples"
    assert failure["oracle"] in symptoms, f"vllm {version}: {failure['oracle']} fired: {failure['message']}"
    print(f"vllm {version}: {failure['oracle']} after {tally['examples']} examples, "
          f"{time.monotonic() - started:.1f} s")


@pytest.mark.parametrize("version", FIXED)
def test_fixed_release_passes_the_ci_profile(version):
    tally, failure = check(resolve(f"vllm@{version}"), "ci", "any", phases=NO_SHRINK)
    assert failure is None, f"{failure['oracle']}: {failure['message']}\n" + "\n".join(failure["trace"])
    assert tally["examples"] >= 100 and tally["cache_hit"] and tally["eviction"]
