"""Explicit-state BMC over the executable spec: it passes on the spec and has teeth on broken ones."""

from pagedkv.proofs.explicit_bmc import Alphabet, canonical, check, explore
from pagedkv.spec import KVSpec


class ForgetsFirstBlock(KVSpec):
    """Releasing a table skips its first block: a leak."""

    def _release(self, table):
        super()._release(table[1:])


class CowKeepsSourceRef(KVSpec):
    """Copy-on-write that forgets to decrement the source's ref count."""

    def _copy_on_write(self, seq):
        copy = super()._copy_on_write(seq)
        self.ref_count[copy[0]] += 1
        return copy


def test_spec_passes_at_depth_5_and_reaches_the_hard_situations():
    passed, bounds, detail = check(Alphabet(), 5)
    assert passed, detail
    assert "depth 5" in bounds and "eviction" in detail


def test_a_leak_is_found():
    passed, _, detail = check(Alphabet(), 3, ForgetsFirstBlock)
    assert not passed and ("refcount" in detail or "full" in detail)


def test_a_cow_refcount_bug_is_found():
    result = explore(Alphabet(), 4, CowKeepsSourceRef)
    assert result.failures and any("refcount" in failure for failure in result.failures)


def test_symmetric_states_share_a_key():
    one, other = KVSpec(4, 2), KVSpec(4, 2)
    one.add(1, [5, 6, 7])
    other.add(3, [5, 6, 7])          # another id for the same sequence
    assert canonical(one) == canonical(other)
    other.add(1, [8])
    assert canonical(one) != canonical(other)
