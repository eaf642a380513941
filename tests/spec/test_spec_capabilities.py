"""The spec as a conformance subject: it declares every rule it is the reference for, so
`pagedkv fuzz spec` draws those rules against it (an undeclared capability is silently skipped)."""

from hypothesis import find

from pagedkv.fuzz.harness import configs
from pagedkv.fuzz.subjects import resolve

# docs/conformance.md: the spec answers fork, prefix caching (with completeness), swap, and its own
# constructor defaults (`spec_defaults`: "pagedkv's own KVSpec and BlockManager declare it").
SPEC_RULES = {"fork", "prefix_caching", "swap", "complete_cache", "spec_defaults"}


def test_the_spec_subject_declares_the_rules_it_answers():
    assert SPEC_RULES <= resolve("spec").capabilities


def test_the_harness_draws_prefix_cached_builds_with_a_cpu_pool_against_the_spec():
    """The configs the harness draws for the spec reach a prefix-cached build with a CPU pool."""
    config = find(configs(resolve("spec").capabilities), lambda c: c["prefix_caching"] and c["num_cpu_blocks"] > 0)
    assert config["prefix_caching"] and config["num_cpu_blocks"] > 0
