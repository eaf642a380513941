"""Shapes the differential machine drew too rarely to notice (mutation testing found them): the
allocator's defaults are the spec's, and a step that must preempt after frees picks the spec's victim."""

import inspect

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.impl import BlockManager
from pagedkv.spec import KVSpec


def test_constructor_defaults_are_the_specs():
    spec = inspect.signature(KVSpec).parameters
    impl = inspect.signature(BlockManager).parameters
    shared = set(spec) & set(impl)
    assert {"num_blocks", "block_size", "num_cpu_blocks", "prefix_caching"} <= shared
    assert {name: impl[name].default for name in shared} == {name: spec[name].default for name in shared}


def test_defaults_behave_like_the_specs():
    # Built with defaults only, both refuse a swap for want of CPU blocks and cache nothing.
    for kv in (KVSpec(4, 2), BlockManager(4, 2)):
        kv.add(0, [1, 2, 3])
        kv.free(0)
        assert kv.add(1, [1, 2, 3]) == 0
        assert kv.num_free_cpu_blocks() == 0


def test_step_after_freeing_the_latest_admitted_preempts_the_specs_victim():
    # Three one-token sequences in three one-token blocks; freeing the last leaves 0 and 1 running:
    # the step needs two new blocks, one is free, so the latest admitted *live* one (1) goes.
    results = []
    for kv in (KVSpec(3, 1), BlockManager(3, 1)):
        for seq_id in range(3):
            kv.add(seq_id, [seq_id])
        kv.free(2)
        result = kv.step({0: 4, 1: 5})
        results.append((result.appended, result.preempted, kv.status(1)))
    assert results[0] == results[1] == ([0], [1], "waiting")


programs = st.fixed_dictionaries({
    "num_blocks": st.integers(2, 8),
    "block_size": st.integers(1, 3),
    "prompts": st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=6),
    "frees": st.lists(st.integers(0, 5), max_size=4),
    "steps": st.integers(1, 6),
})


@settings(max_examples=150, deadline=None, derandomize=True)
@given(programs)
def test_steps_after_frees_match_the_spec(program):
    """Admit what fits, free some (any order, repeats ignored), then decode step after step: every
    step appends and preempts the same sequences as the spec, and the pools agree."""
    runs = []
    for kv in (KVSpec(program["num_blocks"], program["block_size"]),
               BlockManager(program["num_blocks"], program["block_size"])):
        trace = []
        for seq_id, prompt in enumerate(program["prompts"]):
            try:
                kv.add(seq_id, prompt)
            except Exception as error:   # OutOfBlocks for the prompts that do not fit
                trace.append(("add", seq_id, type(error).__name__))
        for seq_id in program["frees"]:
            if seq_id in kv.seq_ids():
                kv.free(seq_id)
        for step in range(program["steps"]):
            running = [s for s in kv.seq_ids() if kv.status(s) == "running"]
            result = kv.step({s: step for s in running})
            trace.append((result.appended, result.preempted, kv.num_free_blocks(),
                          {s: (kv.status(s), kv.length(s)) for s in kv.seq_ids()}))
        runs.append(trace)
    assert runs[0] == runs[1]
