"""The cache-ops sweep of `pagedkv check` passes on the real kernels and reports a planted bug."""

import pytest

from pagedkv.kernels import check


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(check.PROFILES, "tiny", dict(cases=2, seed=7))
    return "tiny"


def test_cache_ops_sweep_passes(tiny):
    assert check.run_cache_ops_sweep(tiny) == (2, [])


def test_a_copy_that_does_nothing_is_reported(tiny, monkeypatch):
    monkeypatch.setattr(check, "copy_blocks", lambda k, v, pairs: None)
    count, failures = check.run_cache_ops_sweep(tiny)
    assert count == 2 and len(failures) == 2 and all("copy MISMATCH" in f for f in failures), failures


def test_unknown_profile():
    with pytest.raises(ValueError, match="profile"):
        check.run_cache_ops_sweep("nope")
