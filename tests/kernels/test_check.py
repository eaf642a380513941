"""run_kernel_check returns the gate's record; a tiny profile keeps this quick."""

import pytest

from pagedkv.kernels import check


def test_run_kernel_check_tiny_profile(monkeypatch):
    monkeypatch.setitem(check.PROFILES, "tiny", dict(cases=5, long=20, seed=7))
    result = check.run_kernel_check("tiny")
    assert set(result) == {"name", "covered", "passed", "detail"}
    assert result["name"] == "kernels"
    assert result["covered"].startswith("5 cases")
    assert result["passed"] is True, result["detail"]


def test_unknown_profile():
    with pytest.raises(ValueError, match="profile"):
        check.run_kernel_check("nope")
