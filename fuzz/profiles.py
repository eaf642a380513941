"""Hypothesis profiles for pagedkv: `ci` (deterministic, bounded), `dev`, `deep`.

Hypothesis registers and, when the CI environment variable is set, loads its own `ci` profile at
import time. We replace it on purpose with ours, built on top of Hypothesis's (derandomized, no
database, no deadline), so `CI=true` and `--profile ci` mean the same bounded run everywhere.
"""

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings


@dataclass(frozen=True)
class Effort:
    """How hard each check works under a profile."""

    max_examples: int
    stateful_step_count: int


EFFORT = {
    "ci": Effort(max_examples=150, stateful_step_count=40),
    "dev": Effort(max_examples=500, stateful_step_count=60),
    "deep": Effort(max_examples=5000, stateful_step_count=120),
}
PROFILES = tuple(EFFORT)

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]

settings.register_profile(
    "ci", settings.get_profile("ci"),
    max_examples=EFFORT["ci"].max_examples, stateful_step_count=EFFORT["ci"].stateful_step_count,
    derandomize=True, database=None, deadline=None, suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "dev", max_examples=EFFORT["dev"].max_examples, stateful_step_count=EFFORT["dev"].stateful_step_count,
    deadline=None, suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "deep", max_examples=EFFORT["deep"].max_examples, stateful_step_count=EFFORT["deep"].stateful_step_count,
    deadline=None, suppress_health_check=_SLOW_OK,
)


def default_profile() -> str:
    """`PAGEDKV_PROFILE` if set, else `ci` under CI, else `dev`."""
    name = os.environ.get("PAGEDKV_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if name not in EFFORT:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}")
    return name


def settings_for(profile: str, **overrides) -> settings:
    """The Hypothesis settings of `profile`, with per-check overrides."""
    return settings(settings.get_profile(profile), **overrides)
