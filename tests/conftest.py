"""Load the pagedkv Hypothesis profile: PAGEDKV_PROFILE, else `ci` under CI, else `dev`."""
import pytest
from hypothesis import settings

from pagedkv.fuzz.profiles import default_profile, hypothesis_profile

settings.load_profile(hypothesis_profile(default_profile()))


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests (larger shapes, bfloat16) are deselected, not skipped, on machines without CUDA:
    the same tests run at CPU size unmarked, so nothing is silently left out of a CPU run."""
    import torch

    if torch.cuda.is_available():
        return
    gpu_only = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_only:
        config.hook.pytest_deselected(items=gpu_only)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
        config.stash[GPU_DESELECTED] = len(gpu_only)


GPU_DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    """Say why tests were deselected, rather than leave a bare count in the last line."""
    count = config.stash.get(GPU_DESELECTED, 0)
    if count:
        terminalreporter.write_line(f"{count} GPU test{'s' if count > 1 else ''} deselected: no CUDA device here "
                                    "(the same tests run at CPU size unmarked; scripts/gpu_check.sh runs them on a GPU)")


@pytest.fixture(autouse=True)
def piped_width(monkeypatch):
    """Commands print tables at the terminal's width, and COLUMNS sets it. Tests read output as piped
    output (natural width, nothing folded), whatever terminal or CI runner pytest itself runs in."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(autouse=True, scope="session")
def same_examples_on_every_worker():
    """Hypothesis mixes literals from every *local* module imported so far into its draws. Which
    modules a pytest-xdist worker has imported depends on which tests it happened to run first, so a
    derandomized run would draw different programs on different workers and machines, and tests that
    assert what a run reaches or which oracle fires first would depend on scheduling. Pin that pool
    to empty for the whole session. (Internal API: if Hypothesis renames it, this fails loudly.)"""
    from hypothesis.internal.conjecture import providers

    patch = pytest.MonkeyPatch()
    empty = providers.Constants()
    patch.setattr(providers, "_get_local_constants", lambda: empty)
    providers.CONSTANTS_CACHE.cache.clear()
    yield
    patch.undo()
    providers.CONSTANTS_CACHE.cache.clear()
