"""Historical vLLM releases as conformance subjects: `pagedkv fuzz vllm@VERSION` (issue 19).

`release(version)` returns the factory of one pinned release, its wheel installed into pagedkv's
wheel cache on first use (`wheels.install`, never the user's environment). Releases whose scheduler
drives the v1 `KVCacheManager` use the v1 adapter of their own API; the v0 releases drive the v0
block manager v2 (`vllm/core/block_manager_v2.py`), which has fork, copy-on-write and swap.
"""

from . import vllm_v1

#: release -> the factory maker for it.
RELEASES = {vllm_v1.VERSION: lambda: vllm_v1.make}


def release(version: str):
    """The subject factory of vLLM `version`. Raises ValueError for a release with no adapter."""
    if version not in RELEASES:
        raise ValueError(f"no adapter for vllm {version}; adapted releases: {', '.join(sorted(RELEASES))}")
    return RELEASES[version]()
