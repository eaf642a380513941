"""What every pagedkv Hypothesis machine draws from, and how it counts what it covered.

Four machines (the spec's stateful check, the differential check, the conformance harness, the
kernel machine) draw tokens, prompts cut from shared prefixes, and pool configurations; each hands
out fresh sequence ids and tallies examples, steps and the interesting paths it took. One module
owns each of these so the machines differ only in their sizes (alphabets, pool ranges), not in how
they draw, and so a path has one name everywhere (`PATHS`).

A machine's tally (a Counter) is per run: `bind(Machine, tally=Counter())` makes a subclass for one run, so no
mutable state lives on a class that several runs share.
"""

from collections import Counter

from hypothesis import event, strategies as st
from hypothesis.control import currently_in_test_context

# ---------------------------------------------------------------------- path names

COW = "cow"                        # append returned a copy-on-write
EVICTION = "eviction"              # a released cached block was evicted to make room
CACHE_HIT = "cache_hit"            # add (or resume) served prompt tokens from the prefix cache
OUT_OF_BLOCKS = "out_of_blocks"    # an operation raised OutOfBlocks
SWAP = "swap"                      # a sequence was swapped out or in
RECOMPUTE = "recompute"            # a sequence was preempted by recompute
STEP_PREEMPT = "step_preempt"      # a batched step preempted to make room
RESUME = "resume"                  # a preempted sequence came back
SCHEDULER_STEP = "scheduler_step"  # the Scheduler ran a step with work in it
#: One name per path, whatever the machine.
PATHS = (COW, EVICTION, CACHE_HIT, OUT_OF_BLOCKS, SWAP, RECOMPUTE, STEP_PREEMPT, RESUME, SCHEDULER_STEP)


def count_path(tally: Counter, path: str, taken=True) -> None:
    """Count `path` in a run's tally (a Counter of examples, steps and paths) when it was `taken`, and
    record it as a Hypothesis event inside a test (`--hypothesis-show-statistics` shows it)."""
    if taken:
        tally[path] += 1
        record_event(f"path: {path}")


def summary(tally: Counter, paths=PATHS) -> str:
    return ", ".join(f"{path}={tally[path]}" for path in paths)


def record_event(text: str) -> None:
    """A Hypothesis event inside a test; nothing when a program is replayed outside one."""
    if currently_in_test_context():
        event(text)


def bind(machine: type, **attributes) -> type:
    """A subclass of `machine` for one run, with `attributes` (a fresh `Tally`, a factory, ...)."""
    return type(f"{machine.__name__}Run", (machine,), attributes)


class FreshIds:
    """Sequence ids never used before in this example: `start + 1`, `start + 2`, ..."""

    def __init__(self, start: int = 0):
        self.last = start

    def __call__(self) -> int:
        self.last += 1
        return self.last


# ---------------------------------------------------------------------- tokens and prompts

def tokens(alphabet: int) -> st.SearchStrategy:
    """One token id of a small alphabet: small alphabets make shared prefixes and collisions common."""
    return st.integers(min_value=0, max_value=alphabet - 1)


def token_lists(alphabet: int, min_size: int = 0, max_size: int = None) -> st.SearchStrategy:
    """Token lists drawn as one byte string: one choice instead of one per token (fast, shrinks well)."""
    return st.binary(min_size=min_size, max_size=max_size).map(lambda raw: [byte % alphabet for byte in raw])


def prompts(shared_prefixes, alphabet: int, max_suffix: int) -> st.SearchStrategy:
    """A non-empty prompt: one of `shared_prefixes` (so prefix-cache hits happen) plus a few tokens."""
    return st.builds(lambda prefix, suffix: list(prefix) + suffix, st.sampled_from(shared_prefixes),
                     st.lists(tokens(alphabet), max_size=max_suffix)).filter(bool)


# ---------------------------------------------------------------------- pools

def pool_configs(**fields) -> st.SearchStrategy:
    """A configuration dict drawn field by field in the order given (`num_blocks=st.integers(1, 12)`,
    ...); a plain value is drawn as itself."""
    return st.fixed_dictionaries({name: value if isinstance(value, st.SearchStrategy) else st.just(value)
                                  for name, value in fields.items()})
