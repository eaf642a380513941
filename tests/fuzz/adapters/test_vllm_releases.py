"""Real bugs as the kit's test (issue 19): historical vLLM releases, their block managers run unchanged
from their wheels (installed into pagedkv's wheel cache on first use; nothing is skipped when that
fails), each buggy release caught by the ci profile under `--policy any`, each fixed one passing a
dev-profile run (the `slow` tests at the end; .ci/run runs them as their own step)."""

import contextlib
import io
import json
import re
import time

import pytest
from hypothesis import Phase

from pagedkv.fuzz import campaign
from pagedkv.fuzz.adapters import vllm_v0
from pagedkv.fuzz.campaign import Options, Result, check, report, run_campaign
from pagedkv.fuzz.harness import replay
from pagedkv.fuzz.oracles import OracleFailure
from pagedkv.fuzz.subjects import Subject, resolve
from pagedkv.spec import KVSpec, OutOfBlocks

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
#: The releases these tests run (their wheels: about 1.6 GB on a fresh machine, once).
USED = ("0.33.0", "0.6.4.post1", "0.6.6.post1", "0.7.0", "0.4.2", "0.4.3", "0.5.0.post1", "0.5.4", "0.5.5")


@pytest.fixture(scope="module", autouse=True)
def releases_loaded():
    """Install and load every release used here before any test: the kit times every factory call,
    and a first download inside one would be reported as the subject's `timeout`."""
    for version in USED:
        vllm_v0.release(version)


#: buggy release -> (its bugs, {oracle: what its message must say (a regex), for each symptom}).
BUGGY = {
    # a full-prompt hit recomputes only the last token: the re-allocated block's other slots are never
    # written, and the hit is not whole blocks (fixed by vLLM #11186)
    "0.6.4.post1": ("full hit recomputes one token", {"cache_hit": "", "readback": ""}),
    # allocate_slots touches the hit blocks before its free-block check: a refused request leaks them
    # (vLLM #11562, fixed by #11565)
    "0.6.6.post1": ("refused allocation leaks its hit blocks",
                    {"free_count": "", "atomic_failure": "", "oom_exact": ""}),
    # v0 BMv2: a block taken from the evictor stays in the cached-block map (vLLM #4764; 0.4.2's own
    # assertion in allocate_mutable trips on it), and one re-allocated from the evictor is created
    # computed=True (#5364): stale KV served as a hit
    "0.4.2": ("stale cached block served (#4764, #5364)",
              {"cache_hit": "", "readback": "", "crash": "AssertionError"}),
    "0.4.3": ("stale computed block served (#5364)", {"cache_hit": "", "readback": ""}),
    # #5364 as in 0.4.3, and #6849: get_num_blocks_touched counts an evictor-cached block as free and
    # as needing no block, so a swap it admitted raises NoFreeBlocksError (either pool)
    "0.5.0.post1": ("#5364, #6849", {"cache_hit": "", "readback": "", "crash": "NoFreeBlocksError"}),
    # #6849, and (0.5.1 .. 0.9.2, never fixed in v0) free() of a swapped-out sequence whose blocks
    # the scheduler stamped looks its CPU block ids up in the GPU allocator's tracker: KeyError
    "0.5.4": ("#6849; abort of a swapped-out request", {"crash": "NoFreeBlocksError|free raised KeyError|IndexError"}),
    "0.5.5": ("abort of a swapped-out request (unfixed)", {"crash": "free raised KeyError|IndexError"}),
}


def test_unknown_release_is_a_clear_error():
    with pytest.raises(ValueError, match="no adapter for vllm 0.0.1; adapted releases: 0.33.0, 0.4.2, 0.4.3, "
                                         "0.5.0.post1, 0.5.4, 0.5.5, 0.6.4.post1, 0.6.6.post1, 0.7.0$"):
        vllm_v0.release("0.0.1")


def test_full_hit_rules_of_each_release():
    """The scheduler's own rule for a prompt whose every block hit, as each release runs it."""
    served = {}
    for version in ("0.6.4.post1", "0.6.6.post1"):
        subject = vllm_v0.release(version)(num_blocks=4, block_size=2, prefix_caching=True, num_cpu_blocks=0)
        subject.add(1, [1, 2, 3, 4])
        subject.free(1)
        served[version] = subject.add(2, [1, 2, 3, 4])
    assert served == {"0.6.4.post1": 3, "0.6.6.post1": 2}


def test_refused_allocation_leaks_in_0_6_6_post1():
    """#11562 by hand: a prompt whose hit blocks are free but whose new block is not. 0.6.4.post1
    checks the free blocks before touching the hits; 0.6.6.post1 touches first and keeps them."""
    leaks = {}
    for version in ("0.6.4.post1", "0.6.6.post1"):
        subject = vllm_v0.release(version)(num_blocks=2, block_size=2, prefix_caching=True, num_cpu_blocks=0)
        subject.add(1, [1, 2, 3])
        subject.free(1)                       # [1, 2] cached and free; 2 blocks free
        subject.add(2, [5, 6, 7])             # takes both (evicting [1, 2])
        subject.free(2)
        with pytest.raises(OutOfBlocks):      # hits [5, 6], needs 2 more: refused
            subject.add(3, [5, 6, 7, 8, 9])
        leaks[version] = subject.num_free_blocks()
    assert leaks == {"0.6.4.post1": 2, "0.6.6.post1": 1}


@pytest.mark.parametrize("version", sorted(BUGGY))
def test_ci_profile_catches_the_release_bug(version):
    bug, symptoms = BUGGY[version]
    started = time.monotonic()
    tally, failure = check(resolve(f"vllm@{version}"), "ci", "any", phases=NO_SHRINK)
    assert failure is not None, f"vllm {version} ({bug}) escaped {tally['examples']} examples"
    assert failure["oracle"] in symptoms, f"vllm {version}: {failure['oracle']} fired: {failure['message']}"
    assert re.search(symptoms[failure["oracle"]], failure["message"]), failure["message"]
    print(f"vllm {version}: {failure['oracle']} after {tally['examples']} examples, "
          f"{time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------------- v0: block manager v2


def bmv2(version, num_blocks, block_size, num_cpu_blocks=0, prefix_caching=True):
    return vllm_v0.release(version)(num_blocks=num_blocks, block_size=block_size, prefix_caching=prefix_caching,
                                    num_cpu_blocks=num_cpu_blocks)


def replay_declared(make, config, program, fails_with=None):
    """Replay `program` on factory `make` under policy `any`, with what the factory declares: it must
    fail with an OracleFailure matching `fails_with` (a regex), or pass when that is None."""
    with pytest.raises(OracleFailure, match=fails_with) if fails_with else contextlib.nullcontext():
        replay(make, config, program, policy="any", capabilities=make.capabilities)


def test_block_manager_v2_declarations():
    assert vllm_v0.release("0.5.0.post1").capabilities == {"fork", "prefix_caching", "swap", "swap_sharing",
                                                           "conservative_admission", "dedup_on_fill"}
    assert not {"swap", "swap_sharing"} & vllm_v0.release("0.4.3").capabilities
    assert type(bmv2("0.5.4", 2, 2).manager).__name__ == "BlockSpaceManagerV2"


def test_fork_then_append_copies_the_shared_tail():
    subject = bmv2("0.5.0.post1", 6, 2)
    assert subject.add(1, [1, 2, 3]) == 0
    subject.fork(1, 2)
    assert subject.block_table(2) == subject.block_table(1)
    tail = subject.block_table(1)[-1]
    copies = subject.append(2, 9)
    assert copies == [(tail, subject.block_table(2)[-1])] and subject.block_table(2)[-1] != tail
    assert subject.block_table(2)[:-1] == subject.block_table(1)[:-1]
    assert subject.append(1, 4) == []                      # the parent's tail is its own again


def test_swap_round_trip_in_table_order():
    subject = bmv2("0.5.0.post1", 4, 2, num_cpu_blocks=3)
    subject.add(1, [1, 2, 3, 4, 5])
    table = subject.block_table(1)
    out = subject.swap_out(1)
    assert [gpu for gpu, _ in out] == table and sorted(cpu for _, cpu in out) == [0, 1, 2]
    assert subject.num_free_blocks() == 4
    back = subject.swap_in(1)
    assert [cpu for cpu, _ in back] == [cpu for _, cpu in out]
    assert [gpu for _, gpu in back] == subject.block_table(1)


def test_worst_case_append_refusal_changes_nothing():
    """can_append_slots counts the touched tail as needing a block: with no block free an append
    that fits in its tail is refused (conservative, declared); the sequence is left as it was."""
    subject = bmv2("0.5.4", 2, 2)
    subject.add(1, [1, 2, 3])
    with pytest.raises(OutOfBlocks):
        subject.append(1, 4)
    _, seq = subject._seq(1)
    assert seq.get_token_ids() == [1, 2, 3] and subject.block_table(1) and subject.num_free_blocks() == 0
    subject.free(1)
    assert subject.num_free_blocks() == 2


#: vLLM #5364: a block taken back from the evictor was created `computed=True`, so its stale KV
#: is reported as a prefix hit. The prompt's first block [0]*9 was never cached; the block handed to it
#: is seq 1's second block, holding [0]*9 after the prefix [0]*8 + [1].
STALE_HIT = ({"num_blocks": 2, "block_size": 9, "prefix_caching": True, "num_cpu_blocks": 0},
             [["add", [1, [0] * 8 + [1] + [0] * 9]], ["free", [1]], ["add", [2, [0] * 10]]])


#: vLLM #4764: a block taken back from the evictor stays in the allocator's cached-block map. Seq 2's
#: prompt takes seq 1's released [1, 2] block from the evictor; after seq 2 is freed, seq 3's prompt
#: [1, 2, ...] finds the stale entry and 0.4.2's allocator trips its own bookkeeping assertion
#: (`assert block.block_id not in self._blocks` in `allocate_mutable`).
EVICTOR_KEEPS_HASH = ({"num_blocks": 3, "block_size": 2, "prefix_caching": True, "num_cpu_blocks": 0},
                      [["add", [1, [1, 2, 3]]], ["free", [1]], ["add", [2, [5, 6, 7, 8, 9]]], ["free", [2]],
                       ["add", [3, [1, 2, 4]]]])


#: vLLM #6849: `get_num_blocks_touched` counts a full block whose content is cached as needing no
#: block, although that cached copy sits in the evictor and is counted free as well. Seq 1's full
#: [1, 2] is cached in the evictor after its swap-out, seq 2 takes the other free blocks, and
#: `can_swap_in` admits seq 1 with one block free for two: the swap raises NoFreeBlocksError.
SWAP_IN_OVERCOUNT = ({"num_blocks": 3, "block_size": 2, "prefix_caching": True, "num_cpu_blocks": 2},
                     [["add", [1, [1, 2, 3]]], ["swap_out", [1]], ["add", [2, [7, 8, 9]]], ["swap_in", [1]]])


#: fixed bug -> (its directed program, the factory it is driven by, the last release with the bug and
#: the failure it shows there, the release that fixed it). 0.5.5 is driven unstamped for #6849: with the
#: scheduler's stamps it refuses the swap-in on its unfixed abort bug (seq 1 is freed swapped out, KeyError).
FIXED_BUGS = {
    "#5364": (STALE_HIT, vllm_v0.release, "0.5.0.post1",
              r"\[cache_hit\] add\(2\) serves block 1 for prompt block 0", "0.5.4"),
    "#4764": (EVICTOR_KEEPS_HASH, vllm_v0.release, "0.4.2", r"\[crash\] add raised AssertionError", "0.4.3"),
    "#6849": (SWAP_IN_OVERCOUNT, vllm_v0.unstamped, "0.5.4", r"\[crash\] swap_in raised NoFreeBlocksError", "0.5.5"),
}


@pytest.mark.parametrize("bug", sorted(FIXED_BUGS))
@pytest.mark.parametrize("buggy", [True, False], ids=["before the fix", "after"])
def test_directed_program_fails_until_its_bug_is_fixed(bug, buggy):
    (config, program), factory, last_buggy, failure, fixed = FIXED_BUGS[bug]
    replay_declared(factory(last_buggy if buggy else fixed), config, program, fails_with=failure if buggy else None)


def test_dedup_on_fill_shares_the_cached_block_not_the_copy_target():
    """Issue 19, family 3 (correct behaviour, declared as `dedup_on_fill`): a copied-on-write tail that
    fills to the content of a cached block is replaced by that block. append returns the copy it asked
    for, (shared tail -> fresh target), while the table names the cached block, which already holds
    exactly the tokens [1, 2] after no prefix (so `cow_exact` fires and readback holds)."""
    subject = bmv2("0.5.0.post1", 6, 2)
    subject.add(1, [1, 2, 3])
    cached = subject.block_table(1)[0]                      # [1, 2], cached on allocation
    subject.free(1)
    subject.add(2, [1])
    subject.fork(2, 3)
    shared = subject.block_table(3)[0]
    (copy_pair,) = subject.append(3, 2)
    assert copy_pair[0] == shared and copy_pair[1] not in (shared, cached)
    assert subject.block_table(3) == [cached] and subject.block_table(2) == [shared]


def test_dedup_on_fill_is_accepted_when_declared_and_only_then():
    make = vllm_v0.release("0.5.0.post1")
    config = {"num_blocks": 6, "block_size": 2, "prefix_caching": True, "num_cpu_blocks": 0}
    program = [["add", [1, [1, 2, 3]]], ["free", [1]], ["add", [2, [1]]], ["fork", [2, 3]], ["append", [3, 2]]]
    replay_declared(make, config, program)
    with pytest.raises(OracleFailure, match=r"\[cow_exact\]"):
        replay(make, config, program, policy="any", capabilities=make.capabilities - {"dedup_on_fill"})


# ---------------------------------------------------------------------- v0: swap sharing (declared)

#: BMv2's swap-out maps a full block whose content a CPU block of another swapped sequence already
#: holds onto that block (prefix caching on the CPU pool too): two swaps, one CPU block.
CPU_SHARED = ({"num_blocks": 2, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 1},
              [["add", [1, [0]]], ["add", [2, [0]]], ["swap_out", [2]], ["swap_out", [1]]])
#: ... and its swap-in lands a full block on the GPU block a running sequence holds it in: no free block
#: for seq 1's two, yet it fits.
GPU_SHARED = ({"num_blocks": 2, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 2},
              [["add", [1, [0, 0]]], ["swap_out", [1]], ["add", [2, [0, 0]]], ["swap_in", [1]]])


@pytest.mark.parametrize("version", ["0.5.0.post1", "0.5.4", "0.5.5"])
@pytest.mark.parametrize("config, program", [CPU_SHARED, GPU_SHARED], ids=["cpu", "gpu"])
def test_swap_sharing_is_accepted_when_declared_and_only_then(version, config, program):
    make = vllm_v0.unstamped(version)   # the closing free of a swapped-out sequence: its KeyError (below)
    replay_declared(make, config, program)
    with pytest.raises(OracleFailure, match=r"\[oom_exact\] missing OutOfBlocks"):
        replay(make, config, program, policy="any", capabilities=make.capabilities - {"swap_sharing"})


@pytest.mark.parametrize("config, program", [
    ({"num_blocks": 4, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 4},
     [["add", [1, [0]]], ["add", [2, [0]]], ["swap_out", [1]], ["swap_out", [2]]]),
    ({"num_blocks": 4, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 2},
     [["add", [1, [0, 0]]], ["swap_out", [1]], ["add", [2, [0, 0]]], ["swap_in", [1]]]),
], ids=["cpu", "gpu"])
def test_undeclared_swap_sharing_fails_where_the_counts_fit_too(config, program):
    """With room to spare no count is off: an undeclared subject that shares on swap is still caught,
    by `swap_exact`, naming the declaration."""
    make = vllm_v0.unstamped("0.5.5")
    replay_declared(make, config, program)
    with pytest.raises(OracleFailure, match=r"\[swap_exact\] swap_(out|in)\([12]\) maps block 0 onto .* block \d, "
                                            r"which another sequence holds \(sharing on swap needs"):
        replay(make, config, program, policy="any", capabilities=make.capabilities - {"swap_sharing"})


class SharesOtherContent:
    """0.5.5's BMv2 with a planted bug: swap_out reports the last block copied onto the first CPU block
    of an already swapped-out sequence, whatever that block holds."""

    def __init__(self, **config):
        self.inner = vllm_v0.unstamped("0.5.5")(**config)
        self.capabilities = self.inner.capabilities
        self.swapped = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def swap_out(self, seq_id):
        copies = self.inner.swap_out(seq_id)
        if self.swapped:
            copies[-1] = (copies[-1][0], self.swapped[0])
        self.swapped.append(copies[0][1])
        return copies


def test_declared_swap_sharing_onto_other_content_is_caught():
    """The family is narrow: only onto a block holding exactly that full block's content."""
    config = {"num_blocks": 4, "block_size": 1, "prefix_caching": True, "num_cpu_blocks": 4}
    program = [["add", [1, [0]]], ["add", [2, [1]]], ["swap_out", [1]], ["swap_out", [2]]]
    with pytest.raises(OracleFailure, match=r"\[swap_exact\] swap_out\(2\) maps block 0 onto CPU block \d, which "
                                            r"another sequence holds, but it holds \[KV\(prefix=\(\), token=0\)\]"):
        replay(SharesOtherContent, config, program, policy="any", capabilities=SharesOtherContent(
            **config).capabilities)


# ---------------------------------------------------------------------- v0: free of a swapped-out sequence

#: Aborting a swapped-out request (the scheduler's `free_seq`): from 0.5.1 on, BMv2's free() applies
#: the scheduler's last-access stamp to the sequence's block ids, which are CPU ids now, through the
#: GPU allocator's tracker. No fix upstream before v0 was removed (issue 19).
FREE_SWAPPED = ({"num_blocks": 4, "block_size": 2, "prefix_caching": True, "num_cpu_blocks": 4},
                [["add", [1, [1, 2, 3]]], ["swap_out", [1]], ["free", [1]]])


@pytest.mark.parametrize("version, buggy", [("0.5.0.post1", False), ("0.5.4", True), ("0.5.5", True)])
def test_free_of_a_swapped_out_sequence_raises_from_0_5_1(version, buggy):
    make = vllm_v0.release(version)
    config, program = FREE_SWAPPED
    replay_declared(make, config, program,
                    fails_with=r"\[crash\] free raised KeyError: \d+" if buggy else None)
    unstamped = vllm_v0.unstamped(version)   # without the scheduler's stamps the path is never reached
    replay_declared(unstamped, config, program)


def test_unstamped_is_only_for_v0_releases():
    with pytest.raises(ValueError, match=r"no v0 adapter for vllm 0.7.0; v0 releases: 0.4.2, 0.4.3, "):
        vllm_v0.unstamped("0.7.0")


# ---------------------------------------------------------------------- the report: every distinct failure


class TwoBugs(KVSpec):
    """Two planted bugs on disjoint configurations: at an even block size add() claims the whole prompt
    was cached (`cache_hit`); at an odd one the free count is one short (`free_count`). Each fires in
    an example's first steps, so Hypothesis, which keeps looking for other bugs for a few calls after
    the first, meets both."""

    capabilities = frozenset({"fork", "prefix_caching"})

    def add(self, seq_id, tokens):
        cached = super().add(seq_id, tokens)
        return len(tokens) if self.block_size % 2 == 0 else cached

    def num_free_blocks(self):
        return super().num_free_blocks() - self.block_size % 2


def test_the_report_names_the_first_failure_and_every_distinct_one():
    """Issue 19, point 4: shrinking one oracle's counterexample cannot replace it by another's; the
    report leads with the oracle that fired first and lists every other one, each shrunk."""
    subject = Subject("two_bugs", TwoBugs, TwoBugs.capabilities, config_space={})
    tally, failure = check(subject, "ci", "any")
    found = {failure["oracle"]} | {other["oracle"] for other in failure["distinct"]}
    assert found == {"cache_hit", "free_count"}, found
    first = failure["first"]
    assert failure["oracle"] == first["oracle"] and first["seconds"] >= 0 and first["examples"] >= 1
    assert len(first["program"]) == first["steps"] >= len(failure["program"]) - 1   # shrunk, plus the finish
    text = io.StringIO()
    report(Result("two_bugs", "ci", False, 1.0, {key: tally.get(key, 0) for key in
                                                 ("examples", "steps", "runs", "cow", "eviction", "cache_hit",
                                                  "out_of_blocks", "swap")},
                  "-", 0, "any", failure=failure), text)
    other = ({"cache_hit", "free_count"} - {first["oracle"]}).pop()
    assert f"first failure: oracle {first['oracle']!r}" in text.getvalue()
    assert f"1 more distinct failure(s): {other}" in text.getvalue()
    assert text.getvalue().count("COUNTEREXAMPLE") == 2


def test_the_report_leads_with_the_distinct_failure_that_came_first():
    """vLLM 0.5.4's dev campaign: three crashes (KeyError in free, NoFreeBlocksError and IndexError in
    swap_out), the KeyError first; the headline is the KeyError's shrunk program, not another crash's."""
    def crash(message, steps):
        return {"oracle": "crash", "message": message, "program": [["free", [1]]] * steps}
    shrunk = [crash("swap_out raised IndexError: list index out of range", 9),
              crash("swap_out raised NoFreeBlocksError: ", 4), crash("free raised KeyError: 2", 3)]
    first = {**crash("free raised KeyError: 13", 18), "examples": 7, "at": 11.5}
    reported = campaign._reported(shrunk, [first], started=10.0)
    assert reported["message"] == "free raised KeyError: 2" and reported["distinct"] == shrunk[:2]
    assert reported["first"] == {"oracle": "crash", "message": "free raised KeyError: 13", "program": first["program"],
                                 "steps": 18, "examples": 7, "seconds": 1.5}


def test_a_campaign_reports_the_first_failure_and_every_distinct_one(tmp_path):
    """The CLI's path (replay, runs, shrinking, `drop_needless_steps` on each) on vLLM 0.6.6.post1:
    #11562's leak shows as `free_count` and as `atomic_failure` (a refused add that took a block)."""
    out, text = tmp_path / "report.json", io.StringIO()
    result = run_campaign(Options("vllm@0.6.6.post1", profile="ci", db=str(tmp_path / "db"), json_path=str(out)),
                          out=text)
    failure = json.loads(out.read_text())["failure"]
    oracles = [failure["oracle"]] + [other["oracle"] for other in failure["distinct"]]
    assert not result.passed and failure["first"]["oracle"] == failure["oracle"] == "free_count"
    assert sorted(oracles) == ["atomic_failure", "free_count"]
    assert failure["first"]["seconds"] > 0 and failure["first"]["steps"] == len(failure["first"]["program"])
    assert all(other["found_in"] == "generate" and other["program"] for other in failure["distinct"])
    assert "first failure: oracle 'free_count'" in text.getvalue()
    assert "1 more distinct failure(s): atomic_failure" in text.getvalue()


# ---------------------------------------------------------------------- fixed releases


#: v0's bugs on the abort of a swapped-out request (`free` of a swapped-out sequence), never fixed in
#: v0: the scheduler's access stamp looked up in the GPU allocator under CPU ids (KeyError, with prefix
#: caching), and the freed block objects, taken from the GPU allocator's BlockPool, returned into the
#: CPU allocator's smaller one, so a later swap draws a pool slot that does not exist (IndexError).
ABORT_OF_SWAPPED = r"free raised KeyError|raised IndexError: list index out of range"


@pytest.mark.parametrize("version, buggy", [("0.5.0.post1", False), ("0.5.4", True), ("0.5.5", True)])
@pytest.mark.parametrize("caching", [False, True])
def test_block_objects_of_a_freed_swapped_sequence_land_in_the_wrong_pool_from_0_5_1(version, buggy, caching):
    """Seq 5's block object was the GPU pool's fifth (slot 4); freed while swapped out, it goes back
    to the CPU allocator's pool of 4 slots (1 CPU block x 4), and seq 6's swap-out draws slot 4."""
    make = vllm_v0.unstamped(version)   # the stamps' KeyError would come first with prefix caching
    config = {"num_blocks": 8, "block_size": 1, "prefix_caching": caching, "num_cpu_blocks": 1}
    program = ([["add", [seq, [seq]]] for seq in range(1, 6)]
               + [["swap_out", [5]], ["free", [5]], ["add", [6, [6]]], ["swap_out", [6]]])
    replay_declared(make, config, program,
                    fails_with=r"\[crash\] swap_out raised IndexError: list index out of range" if buggy else None)


def fixed(version: str) -> Subject:
    """The subject of a dev-profile run: a v0 release without the scheduler's access stamps (so its
    KeyError does not end most examples with prefix caching on), a v1 release as shipped."""
    if version in vllm_v0.V0_RELEASES:
        make = vllm_v0.unstamped(version)
        return Subject(make.__name__, make, make.capabilities, config_space=make.config_space)
    return resolve(f"vllm@{version}")


#: release -> what a dev-profile run may report: v1's fixed releases nothing; 0.5.5 (which fixed
#: #6849 and has #4764 and #5364 fixed) only its unfixed abort-of-swapped bug.
FIXED = {"0.7.0": None, "0.33.0": None, "0.5.5": ABORT_OF_SWAPPED}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(FIXED))
def test_fixed_release_shows_no_failure_but_its_known_ones_in_a_dev_profile_run(version):
    started = time.monotonic()
    tally, failure = check(fixed(version), "dev", "any")
    reported = [failure, *failure["distinct"]] if failure else []
    unknown = [found for found in reported
               if FIXED[version] is None or found["oracle"] != "crash" or not re.search(FIXED[version], found["message"])]
    assert not unknown, [f"{found['oracle']}: {found['message']}" for found in unknown]
    print(f"vllm {version}: {tally['examples']} examples, {tally['steps']} steps, {time.monotonic() - started:.0f} s; "
          f"reported: {[found['message'] for found in reported]}")
