"""Load the pagedkv Hypothesis profile: PAGEDKV_PROFILE, else `ci` under CI, else `dev`."""
from hypothesis import settings

from pagedkv.fuzz.profiles import default_profile

settings.load_profile(default_profile())


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
