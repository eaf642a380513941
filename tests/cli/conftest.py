"""The CLI remembers step durations under $XDG_CACHE_HOME; tests must not leave theirs in the
user's cache (nor read a real run's)."""
import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"
