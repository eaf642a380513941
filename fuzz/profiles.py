"""Effort profiles for pagedkv's checks: `ci` (deterministic, bounded), `dev`, `deep`.

One table of efforts serves every Hypothesis machine (spec, differential, conformance); the kernel
machine, whose every step launches kernels (milliseconds each under Triton's interpreter), runs a
scaled-down table of its own. The Hypothesis profiles are registered under namespaced names
(`pagedkv-ci`, `pagedkv-dev`, `pagedkv-deep`) so that importing the kit never replaces a profile of
the user's own test suite (Hypothesis' built-in `ci` included); the effort names stay `ci`, `dev`,
`deep` on the command line.
"""

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings


@dataclass(frozen=True)
class Effort:
    """How hard each check works under a profile."""

    max_examples: int
    stateful_step_count: int


#: ci: 150 programs of up to 40 steps. (The differential check once ran its own 120 x 50: the same
#: 6,000-step budget, now drawn from this one table.)
EFFORT = {
    "ci": Effort(max_examples=150, stateful_step_count=40),
    "dev": Effort(max_examples=500, stateful_step_count=60),
    "deep": Effort(max_examples=5000, stateful_step_count=120),
}
#: The kernel machine's share of each profile: fewer, shorter runs.
KERNEL_EFFORT = {
    "ci": Effort(max_examples=8, stateful_step_count=30),
    "dev": Effort(max_examples=40, stateful_step_count=30),
    "deep": Effort(max_examples=400, stateful_step_count=60),
}
PROFILES = tuple(EFFORT)
NAMESPACE = "pagedkv-"

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


def hypothesis_profile(profile: str) -> str:
    """The name the Hypothesis profile of effort `profile` is registered under."""
    check_profile(profile)
    return NAMESPACE + profile


def check_profile(profile: str) -> None:
    if profile not in EFFORT:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")


def _register() -> None:
    """ci is derandomized with no database, so every run of it draws the same programs."""
    fixed = {"ci": {"derandomize": True, "database": None, "print_blob": True}}
    for profile, effort in EFFORT.items():
        settings.register_profile(hypothesis_profile(profile), max_examples=effort.max_examples,
                                  stateful_step_count=effort.stateful_step_count, deadline=None,
                                  suppress_health_check=_SLOW_OK, **fixed.get(profile, {}))


_register()


def default_profile() -> str:
    """`PAGEDKV_PROFILE` if set, else `ci` under CI, else `dev`."""
    name = os.environ.get("PAGEDKV_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    check_profile(name)
    return name


def settings_for(profile: str, **overrides) -> settings:
    """The Hypothesis settings of `profile`, with per-check overrides."""
    return settings(settings.get_profile(hypothesis_profile(profile)), **overrides)


def kernel_settings_for(profile: str, **overrides) -> settings:
    """`profile`'s settings scaled down to the kernel machine's effort."""
    effort = KERNEL_EFFORT[profile]
    return settings_for(profile, max_examples=effort.max_examples,
                        stateful_step_count=effort.stateful_step_count, **overrides)
