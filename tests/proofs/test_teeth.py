"""The proofs have teeth: each known-wrong transition yields a counterexample in domain terms."""
import pytest

from pagedkv.proofs.mutants import MUTANTS, hunt
from pagedkv.proofs.report import CI_BOUNDS


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_wrong_transition_is_caught(mutant):
    found = hunt(mutant, CI_BOUNDS)
    assert found is not None, f"no counterexample for {mutant.name}"
    text = found.render()
    for term in ("ref counts", "free queue", "evictable", "table", "before:", "after:", found.call.split("(")[0]):
        assert term in text
    print(f"{mutant.name}:\n{text}")
